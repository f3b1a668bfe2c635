"""Is a labelled run slower than the label's previous run, beyond the noise of both runs' steps?

Checked when a labelled run is recorded (``gpumagic.profile(label=...)``, ``%%gpuprofile --label``):
the report's top-level ``regression`` is None, or the comparison with the label's latest earlier
run (``compared_with``, ``change``, ``speedup``, ``speedup_ci``, ``conditions``, ``explained_by``),
and a note says it first. A difference in conditions that alone can make the run this much
slower (other processes' load, cores, device, GPU clocks, capture options) is named instead of
calling it a regression.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumagic.tuning import runs, stats
from gpumagic.tuning.comparison import Comparison

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Report


def regression(report: Report, label: str) -> dict[str, Any] | None:
    """How ``report`` compares with the latest earlier run labelled ``label`` — before it is
    recorded — or None when the label has no earlier run or this one is not slower beyond the
    noise of both runs' steps (:mod:`gpumagic.tuning.stats`). ``explained_by`` names a difference
    in conditions (other processes' load, cores, device, GPU clocks, capture options) that alone
    can make a run this much slower; the view then names it instead of calling it a regression."""
    if not label:
        return None
    try:
        earlier = runs.find(label)
        before = runs.get(label)
    except (runs.UnknownRunError, runs.HistoryError):
        return None
    d = Comparison(before, report, earlier.ref, "this run").data
    if d["change"] != "slower":
        return None
    explaining = [c["sentence"] for c in d["conditions_detail"] if c["explains"]]
    return {"compared_with": earlier.ref, "change": d["change"], "speedup": d["speedup"],
            "speedup_ci": d["speedup_ci"], "conditions": d["conditions"],
            "explained_by": explaining[0] if explaining else None}


def regression_note(r: dict[str, Any]) -> str:
    """The report's note for :func:`regression`'s result."""
    ci = r["speedup_ci"]
    shown = stats.fmt_speedup(r["speedup"], None if ci is None else (ci[0], ci[1]))
    if r["explained_by"]:
        return (f"Slower than {r['compared_with']}, this label's previous run ({shown}), but the conditions differed: "
                f"{r['explained_by']} Measure again under the same conditions before calling it a regression.")
    return f"Regression: {shown} than {r['compared_with']}, this label's previous run, beyond both runs' step-to-step noise."
