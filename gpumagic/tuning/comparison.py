"""Before/after: what one change bought, measured on two runs (``gpumagic.compare``).

(The module is not called ``compare``: a submodule of that name would replace the function
``gpumagic.compare`` on the package as soon as it is imported.)

::

    cmp = gpumagic.compare("before.json.gz", "after.json.gz")   # or Reports, runs, or labels
    cmp.to_dict()["step_time_ratio"]    # after / before, median step time
    cmp                                 # in a notebook: the HTML table; in a terminal: text

``a`` is the run *before* the change, ``b`` the run *after* it. Each may be a
:class:`~gpumagic.report.model.Report`, anything with a ``.report`` (a run from
``gpumagic.profile()``), a trace path (Kineto JSON, ``.json.gz`` or a gpumagic bundle) or a run of
the history (:mod:`gpumagic.tuning.runs`), also from an earlier kernel: ``LABEL`` (its latest run),
``LABEL@N`` (its N-th most recent) or ``r<id>``.

Step time is the median of the recorded steps (``ProfilerStep#`` markers), so runs with a
different number of steps still compare. The breakdown is per step for the same reason.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpumagic.errors import GpumagicError
from gpumagic.report.metrics import Metrics
from gpumagic.report.views import Viewable

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Report

#: A change of the median step under 3 % is called "about the same" (more when the runs' own
#: steps vary more: see :func:`same_tolerance`). Our choice: the step-to-step jitter of a training
#: loop on a quiet machine is a few percent (MAD/median of the steps in four of the five
#: fixture traces with steps: 0.3-2 %).
SAME_STEP_TOLERANCE = 0.03
#: Standard error of a sample median relative to σ/√n for normal data: √(π/2) ≈ 1.2533.
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
#: Fewer recorded steps than this make the median step a weak estimate (torch.profiler's
#: examples record 3-5 active steps).
FEW_STEPS = 3
#: The headline metrics compared beside step time: (key, name, the metric, kind, better).
#: kind: "ms_per_step"/"count_per_step" divide a window total by the step count (when both runs
#: have steps); "frac" is a share of the window; "bytes". better: "lower", "higher" or "".
HEADLINE: tuple[tuple[str, str, Callable[[Metrics], float | None], str, str], ...] = (
    ("gpu_idle_ms", "GPU idle", lambda m: m.idle.total_ms, "ms_per_step", "lower"),
    ("dataloader_frac", "data-loader wait", lambda m: m.host.dataloader_frac, "frac", "lower"),
    ("kernel_count", "kernels", lambda m: m.kernels.count, "count_per_step", ""),
    ("memcpy_ms", "memory copies", lambda m: m.copies.total_ms, "ms_per_step", "lower"),
    ("sync_blocked_ms", "host blocked in syncs", lambda m: m.syncs.blocked_ms, "ms_per_step", "lower"),
    ("peak_allocated_bytes", "peak GPU memory", lambda m: m.memory.peak_allocated_bytes, "bytes", ""),
)
TRACE_SUFFIXES = (".gz", ".json", ".pt.trace", ".trace")


def compare(a: Any, b: Any) -> Comparison:
    """Compare run ``a`` (before) with run ``b`` (after); see the module docstring for inputs.

    Raises :class:`~gpumagic.errors.TraceError` for a missing or unreadable trace file,
    :class:`~gpumagic.tuning.runs.UnknownRunError` for a string that is neither a file nor a remembered
    label while some labels are remembered, :class:`GpumagicError` for a run without a report,
    and :class:`TypeError` for anything else.
    """
    report_a, label_a = _as_report(a)
    report_b, label_b = _as_report(b)
    label_a, label_b = _distinct_labels(label_a or "before", label_b or "after")
    return Comparison(report_a, report_b, label_a, label_b)


def _as_report(x: Any) -> tuple[Report, str]:
    """The Report behind ``x`` and a label for it (the report's, else the file name)."""
    from gpumagic.report.model import Report

    if isinstance(x, Report):
        return x, x.label
    if isinstance(x, (str, os.PathLike)):
        return _report_from_path_or_label(x)
    if hasattr(x, "report"):
        report = x.report
        if report is None:
            raise GpumagicError(f"{x!r} has no report: nothing was recorded, so it cannot be compared")
        return _as_report(report)
    raise TypeError(f"compare() takes Reports, runs (with .report), trace paths or run labels, not {type(x).__name__}")


def _report_from_path_or_label(x: str | os.PathLike) -> tuple[Report, str]:
    from gpumagic.analysis import analyze
    from gpumagic.tuning import runs

    text = os.fspath(x)
    if isinstance(x, str) and not os.path.exists(text):  # a run of the history: LABEL, LABEL@N or r<id>
        try:
            row = runs.find(text)
        except runs.UnknownRunError:
            known = runs.labels()
            if known:
                listed = ", ".join(repr(k) for k in known[-20:])
                raise runs.UnknownRunError(f"{text!r} is neither a trace file nor a remembered run; known labels: {listed}") from None
        else:
            report = runs.get(text)
            return report, (report.label or text) if text == row.label else text
    report = analyze(text)
    return report, report.label or trace_stem(text)


def trace_stem(path: str) -> str:
    """``'runs/resnet50_workers0.json.gz'`` → ``'resnet50_workers0'``."""
    name = Path(path).name
    stripped = True
    while stripped:
        stripped = False
        for suffix in TRACE_SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, stripped = name[: -len(suffix)], True
    return name


def _distinct_labels(a: str, b: str) -> tuple[str, str]:
    return (f"{a} (before)", f"{b} (after)") if a == b else (a, b)


@dataclass
class Comparison(Viewable):
    """Two reports side by side. :meth:`to_dict` holds every number; the renderers read it."""

    before: Report
    after: Report
    label_before: str = "before"
    label_after: str = "after"
    data: dict[str, Any] = field(init=False, repr=False)

    _view_kind: ClassVar[str] = "comparison"

    def __post_init__(self) -> None:
        self.data = summarise(self.before, self.after, self.label_before, self.label_after)

    @property
    def step_time_ratio(self) -> float | None:
        return self.data["step_time_ratio"]

    @property
    def speedup(self) -> float | None:
        return self.data["speedup"]

    @property
    def resolved(self) -> list[str]:
        return list(self.data["resolved"])

    @property
    def new(self) -> list[str]:
        return list(self.data["new"])

    @property
    def persisting(self) -> list[str]:
        return list(self.data["persisting"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``step_time_ratio``, ``speedup``, ``gpu_busy``, ``breakdown``, ``metrics``,
        ``resolved``/``new``/``persisting`` (finding ids), ``findings`` (details), ``notes``."""
        import copy

        return copy.deepcopy(self.data)

    def to_json(self, indent: int | None = 2) -> str:
        import json

        return json.dumps(self.data, indent=indent, allow_nan=False)

    def _view_subject(self) -> dict[str, Any]:
        return self.data  # the views read the numbers only

    def _protected_paths(self) -> list[str]:
        return [getattr(r.trace, "source", "") or "" for r in (self.before, self.after)]  # the traces compared

    def __repr__(self) -> str:
        return f"<gpumagic Comparison {self.label_before!r} → {self.label_after!r}: {self.data['verdict']}>"


# -- the numbers ----------------------------------------------------------------------------------


def summarise(a: Report, b: Report, label_a: str, label_b: str) -> dict[str, Any]:
    """Every number of the comparison, as plain JSON-ready data."""
    ma, mb = a.metrics, b.metrics
    steps_a, steps_b = _step_count(ma), _step_count(mb)
    ratio = _significant(_step_ratio(None if mb is None else mb.steps.median_ms, None if ma is None else ma.steps.median_ms))
    busy_a, busy_b = (None if ma is None else ma.gpu.busy_frac), (None if mb is None else mb.gpu.busy_frac)
    data: dict[str, Any] = {
        "before": _run_facts(a, label_a),
        "after": _run_facts(b, label_b),
        "step_time_ratio": ratio,
        # from the stored ratio, to 4 significant digits; the verdict and the renders print this same
        # number (rounding the raw ratio and its inverse separately once showed 2.59× beside 2.58×)
        "speedup": _significant(1 / ratio) if ratio else None,
        "step_time_change_frac": _round(None if ratio is None else ratio - 1),
        "gpu_busy": {"before": busy_a, "after": busy_b, "delta": _round(difference(busy_b, busy_a))},
        "breakdown": _breakdown(ma, mb, steps_a, steps_b),
        "metrics": [_headline_row(row, ma, mb, steps_a, steps_b) for row in HEADLINE],
    }
    data.update(_findingsdifference(a, b))
    data["same_tolerance_frac"] = _round(same_tolerance(a, b))
    data["verdict"] = verdict(data, data["same_tolerance_frac"])
    data["notes"] = comparability_notes(a, b, data)
    return data


def _step_count(m: Metrics | None) -> int:
    """Recorded steps, or 0 when the window is not bounded by step markers."""
    if m is None or m.window.source != "steps":
        return 0
    return m.steps.count


def _step_ratio(after_ms: float | None, before_ms: float | None) -> float | None:
    """``after_ms / before_ms``; None unless both median steps last some time (a trace whose
    step markers have zero length has no step time to compare)."""
    if after_ms is None or before_ms is None or not after_ms > 0 or not before_ms > 0:
        return None
    ratio = after_ms / before_ms
    return ratio if math.isfinite(ratio) and ratio > 0 else None


def difference(x: float | None, y: float | None) -> float | None:
    """``x - y``, or None when either is missing."""
    return None if x is None or y is None else x - y


def _significant(x: float | None, digits: int = 4) -> float | None:
    """``x`` to ``digits`` significant digits (a ratio of 1e-9 stays above zero)."""
    return None if x is None else float(f"{x:.{digits}g}")


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def _run_facts(r: Report, label: str) -> dict[str, Any]:
    m = r.metrics
    devices = [] if m is None else m.trace.devices
    primary = None if m is None else m.gpu.primary_device
    names = [d.name for d in devices if d.id == primary] or [d.name for d in devices[:1]]
    return {
        "label": label,
        "source": None if m is None else m.trace.source,
        "device": names[0] if names else None,
        "steps": _step_count(m),
        "step_median_ms": None if m is None else m.steps.median_ms,
        "step_p90_ms": None if m is None else m.steps.p90_ms,
        "step_mean_ms": _mean_step_ms(m),
        "window_ms": None if m is None else m.window.dur_ms,
        "findings": r.finding_ids,
    }


def _mean_step_ms(m: Metrics | None) -> float | None:
    durations = [] if m is None else m.steps.durations_ms
    return round(statistics.fmean(durations), 4) if durations and _step_count(m) else None


def _per_step(value: float | None, steps: int) -> float | None:
    return None if value is None else (value / steps if steps else value)


def _breakdown(ma: Metrics | None, mb: Metrics | None, steps_a: int, steps_b: int) -> dict[str, Any]:
    """Each category's time per step (per window when either run has no step markers)."""
    per_step = bool(steps_a and steps_b)
    sa, sb = (steps_a, steps_b) if per_step else (0, 0)
    ba, bb = (None if ma is None else ma.breakdown), (None if mb is None else mb.breakdown)
    order = list((ba.order if ba is not None else None) or (bb.order if bb is not None else None) or [])
    rows = []
    for cat in order:
        x = _per_step(None if ba is None else ba.total_ms.get(cat), sa)
        y = _per_step(None if bb is None else bb.total_ms.get(cat), sb)
        rows.append({"category": cat, "before_ms": _round(x, 3), "after_ms": _round(y, 3), "delta_ms": _round(difference(y, x), 3),
                     "before_frac": None if ba is None else ba.frac.get(cat),
                     "after_frac": None if bb is None else bb.frac.get(cat)})
    return {"unit": "ms per step" if per_step else "ms in the window", "categories": rows}


def _headline_row(row: tuple[str, str, Callable[[Metrics], float | None], str, str], ma: Metrics | None,
                  mb: Metrics | None, steps_a: int, steps_b: int) -> dict[str, Any]:
    key, name, read, kind, better = row
    x, y = (None if ma is None else read(ma)), (None if mb is None else read(mb))
    per_step = kind.endswith("_per_step") and steps_a and steps_b
    if per_step:
        x, y = _per_step(x, steps_a), _per_step(y, steps_b)
    unit = {"ms_per_step": "ms", "count_per_step": "count", "frac": "frac", "bytes": "bytes"}[kind]
    return {"key": key, "name": name + (" per step" if per_step else ""), "unit": unit, "better": better,
            "before": _round(x, 4), "after": _round(y, 4)}


def _findingsdifference(a: Report, b: Report) -> dict[str, Any]:
    """Finding ids resolved (before only), new (after only) and persisting (both), each in its
    report's order (largest estimated gain first)."""
    ids_a, ids_b = a.finding_ids, b.finding_ids
    details = {}
    for fid in dict.fromkeys(ids_a + ids_b):
        fa, fb = a.finding(fid), b.finding(fid)
        details[fid] = {"title": (fb or fa).title,
                        "before": None if fa is None else {"severity": fa.severity, "est_gain": fa.est_gain},
                        "after": None if fb is None else {"severity": fb.severity, "est_gain": fb.est_gain}}
    return {
        "resolved": [f for f in ids_a if f not in ids_b],
        "new": [f for f in ids_b if f not in ids_a],
        "persisting": [f for f in ids_b if f in ids_a],
        "findings": details,
    }


def same_tolerance(before: Report, after: Report) -> float:
    """The relative step-time change below which the runs count as equally fast.

    Each run's median step has a standard error of about 1.25 × σ / √n, with σ estimated robustly
    as 1.4826 × MAD (the median absolute deviation ignores one slow step). The tolerance is two
    combined standard errors of the two medians, relative to each median (about 95 % confidence
    for normal noise), and at least :data:`SAME_STEP_TOLERANCE`. A noisy run thus widens the band
    only as much as its step count leaves the median uncertain."""
    variances = []
    for r in (before, after):
        durations = [] if r.metrics is None else r.metrics.steps.durations_ms
        median = None if r.metrics is None else r.metrics.steps.median_ms
        if len(durations) >= 2 and median:
            mad = statistics.median(abs(d - median) for d in durations)
            se_rel = MEDIAN_SE_FACTOR * 1.4826 * mad / median / math.sqrt(len(durations))
            variances.append(se_rel**2)
    return max(SAME_STEP_TOLERANCE, 2 * math.sqrt(sum(variances)))


def verdict(data: dict[str, Any], tolerance: float = SAME_STEP_TOLERANCE) -> str:
    """One sentence: faster, slower or about the same (a change within ``tolerance``), per median step."""
    ratio = data["step_time_ratio"]
    if ratio is None:
        if data["before"]["steps"] and data["after"]["steps"]:
            return "Step times cannot be compared: a run's median step lasts no time."
        return "Step times cannot be compared: a run has no ProfilerStep# markers."
    change = ratio - 1
    if abs(change) <= tolerance:
        return f"About the same: the median step changed by {change * 100:+.1f} %, within the step-to-step variation."
    if change < 0:
        speedup = data.get("speedup") or _significant(1 / ratio)  # the number Comparison.speedup holds
        return f"{speedup:.2f}× faster: the median step is {-change * 100:.0f} % shorter."
    return f"{ratio:.2f}× slower: the median step is {change * 100:.0f} % longer."


def comparability_notes(a: Report, b: Report, data: dict[str, Any]) -> list[str]:
    """Reasons to read the comparison with care (different GPUs, few steps, no steps)."""
    notes = []
    da, db = data["before"]["device"], data["after"]["device"]
    if da != db:
        notes.append(f"The runs used different devices ({da or 'no GPU'} vs {db or 'no GPU'}): "
                     "step times compare the hardware as well as the change.")
    for side in ("before", "after"):
        facts = data[side]
        if not facts["steps"]:
            notes.append(f"{facts['label']}: no ProfilerStep# markers, so its numbers cover the whole trace.")
        elif facts["steps"] < FEW_STEPS:
            notes.append(f"{facts['label']}: only {facts['steps']} recorded step(s): the median step is a weak estimate.")
    if data["breakdown"]["unit"] != "ms per step":
        notes.append("The breakdown compares totals over each trace, not time per step.")
    src_a, src_b = data["before"]["source"], data["after"]["source"]
    if src_a and src_a == src_b and a.metrics == b.metrics:
        notes.append("Both sides are the same trace.")
    return notes
