"""``warmup-in-window``: the profiled window includes a cold start."""

from __future__ import annotations

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: Cold-start work (context creation, allocator growth, compilation/autotuning) worth naming
#: once it covers this share of the window (gpumagic default).
COLD_FRAC = 0.05
DOC = "https://pytorch.org/docs/stable/profiler.html#torch.profiler.schedule"


@rule("warmup-in-window")
def warmup_in_window(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: CUDA context creation calls, caching-allocator growth (``cudaMalloc``/``cudaFree``),
    compilation or autotuning (dynamo/inductor/triton compile, ``cudnnFind``) covering ≥ 5 % of the
    window, or a first step ≥ 2× the median of the others. Gain: the cold time (it will not recur,
    so the measured step time overstates the steady state). False positives: a loop that really
    recompiles or re-allocates every step (then the fix is to stop that). Only threads that
    drive the GPU count (the main thread and the threads that launch GPU work): a compile-pool
    worker blocked in a queue for the whole window is not compiling, and ``TorchDynamo Cache
    Lookup`` (an already compiled frame's guard check) is not compilation."""
    parts = cold_parts(ctx)
    cold = {k: ctx.frac(iv.total(v)) for k, v in parts.items()}
    steps = m.steps
    first_extra = 0.0
    if steps.first_step_outlier and steps.median_ms is not None:
        first_extra = ctx.frac((steps.durations_ms[0] - steps.median_ms) * 1e6)
    found = {k: v for k, v in cold.items() if v >= COLD_FRAC}
    if not found and not steps.first_step_outlier:
        return None
    gain = max([first_extra, *found.values()])
    what = [f"{k}: {pct(v)} of the window" for k, v in found.items()]
    if steps.first_step_outlier:
        what.append(f"the first step takes {steps.first_over_median:.1f}× the median of the others")
    return finding(
        severity="low", title="The profiled window includes a cold start",
        why="""The first iterations of a PyTorch program pay one-off costs: creating the CUDA context,
        growing the caching allocator, compiling (torch.compile) and autotuning kernels (cudnn.benchmark).
        They do not recur, so a window that contains them overstates the steady-state step time and
        hides the real bottleneck. Profile after a few warm-up steps.""",
        summary="; ".join(what) + ".",
        numbers={**{k: round(v, 4) for k, v in cold.items()}, "first_over_median": steps.first_over_median or 0.0},
        est_gain=gain, gain_method="cold-start time as a share of the window (it does not recur)",
        fixes=(pytorch("Skip warm-up steps before recording",
                       "%%gpuprofile --skip 3\n# or: torch.profiler.schedule(wait=1, warmup=2, active=5)"),),
        doc_url=DOC,
    )


def cold_parts(ctx: Context) -> dict[str, iv.Intervals]:
    """Cold-start time by kind, on the threads that drive the GPU (``Context.gpu_lanes``)."""
    m_, ev = ctx.masks, ctx.trace.events
    driving = np.isin(ev.lane, np.fromiter(ctx.gpu_lanes, dtype=np.int64, count=len(ctx.gpu_lanes)))
    return {
        "CUDA initialisation": ctx.intervals(ctx.events_in_window(m_["name_init"] & m_["runtime"] & driving)),
        "allocator growth (cudaMalloc/cudaFree)": ctx.intervals(ctx.events_in_window(m_["name_alloc"] & m_["runtime"] & driving)),
        "compilation or autotuning": ctx.intervals(ctx.events_in_window(m_["name_compile"] & m_["host"] & driving)),
    }
