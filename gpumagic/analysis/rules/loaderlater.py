"""``dataloader-bound-later``: the loop waits for the data loader after the recorded steps."""

from __future__ import annotations

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for
from gpumagic.analysis.rules.dataloader import DATALOADER_FRAC, DOC, TUNE_CODE, later_share
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: Fewer steps after the recorded ones than this say too little for a finding of their own.
MIN_LATER_STEPS = 10


@rule("dataloader-bound-later")
def dataloader_bound_later(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the recorded window waits for data ≤ 5 % (``dataloader-bound``'s line, so the two
    never both fire), but the steps after the recorded ones — every step timed by a gpumagic
    capture, with its time in the DataLoader's ``next()`` (``steps.all_wait_ms``), less the
    workers' restarts inside it — spend more than 5 % there, over at least
    :data:`MIN_LATER_STEPS` steps: workers had batches made ahead while the first steps ran (a
    compiled model's first step, a slow warm-up), and the loader sets the pace once they run out.
    Gain: that share of the later steps, an upper bound (what more or faster loading could hide;
    the cores may not absorb it all), outside the recorded window. Fixes (diagnostic): measure
    the loader's settings (``gpumagic.tune_dataloader``), and record later steps (``--skip``).
    False positives: later steps that wait for a reason the loader cannot change (a dataset
    streamed from a slower source after a cached start)."""
    frac = ctx.frac(iv.total(ctx.cat_union["dataloader"]))
    if frac > DATALOADER_FRAC:
        return None  # dataloader-bound's: the recorded window waits
    later = later_share(ctx)
    if later is None or later[0] <= DATALOADER_FRAC or later[1] < MIN_LATER_STEPS:
        return None
    share, count = later
    skip = (ctx.trace.meta.get("every_step") or {}).get("profiled", 0) + 1
    return finding(
        severity=severity_for(share), title="The loop waits for the data loader after the recorded steps",
        why=f"""Every step of the cell was timed, not only the recorded ones, with its time in the DataLoader's
        next(). The recorded steps waited little for their batches ({pct(frac)} of the window), but the
        {count:,} steps after them spent {pct(share)} of their time waiting: while the first steps ran (a slow
        first step, a compilation, a warm-up), the workers made batches ahead, and once those ran out the loader set
        the pace. More workers, or a cheaper batch, hide that wait where the cores allow.""",
        summary=(f"{pct(share)} of the time of the {count:,} steps after the recorded ones was spent in the "
                 f"DataLoader's next() (every step timed; its workers' restarts left out), against {pct(frac)} of "
                 "the recorded window."),
        numbers={"later_wait_frac": round(share, 4), "later_steps": count, "dataloader_frac": round(frac, 4),
                 "threshold_frac": DATALOADER_FRAC},
        est_gain=share,
        gain_method=("upper bound: the later steps' share of their time in the DataLoader's next(), which faster "
                     "loading hides at most; the cores may not absorb all of it"),
        fixes=(pytorch("Measure the loader's settings on this machine and keep the fastest", TUNE_CODE,
                       diagnostic=True),
               pytorch("Record steps after the batches made ahead have run out, to see the wait and its stages",
                       f"%%gpuprofile --skip {max(skip, 20)}", diagnostic=True)),
        doc_url=DOC,
    )


__all__ = ["dataloader_bound_later"]
