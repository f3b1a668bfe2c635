"""``low-gpu-utilization`` and ``gpu-idle-gaps``: symptoms, with their causes named."""

from __future__ import annotations

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import GAP_CAUSES, LONG_GAP_NS, Context, Gaps
from gpumagic.analysis.metrics import harmful_syncs
from gpumagic.analysis.rules.base import finding, pct, pytorch, severity_for, windows

#: The issue's anchor: the GPU busy less than half of the profiled window.
BUSY_FRAC = 0.5
#: Long gaps (≥ 1 ms) must add up to this share of the window to be worth a finding.
LONG_GAPS_FRAC = 0.05
DOC = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
_CAUSE_WORDS = {"host_wait": "waiting for the host", "launch_latency": "launch latency", "other": "queued work not started"}


def low_gpu_utilization(ctx: Context, m: dict, explained: float = 0.0):
    """Signal: the primary GPU's busy fraction (union of kernels, copies and memsets over all
    streams). Threshold: < 50 %. Gain: the idle share not already claimed by a more specific
    finding (``explained``), since those name the cause and the fix. False positives: a window
    that is mostly start-up or evaluation, not training."""
    busy = m["gpu"]["busy_frac"]
    if busy is None or busy >= BUSY_FRAC:
        return None
    idle = 1.0 - busy
    residual = max(0.0, idle - explained)
    i = m["idle"]
    return finding(
        "low-gpu-utilization", severity=severity_for(residual),
        title=f"The GPU is busy only {pct(busy)} of the time",
        why="""A GPU is fast only while it has queued work. Whatever the host does between launches —
        loading data, Python code, synchronising, logging — shows up as idle GPU time. The idle time below
        is split by cause; the other findings name the fixes.""",
        summary=f"GPU busy {pct(busy)} of {m['window']['dur_ms']:.1f} ms; idle {i['total_ms']:.1f} ms: "
                f"host wait {i['host_wait_ms']:.1f} ms, launch latency {i['launch_latency_ms']:.1f} ms, "
                f"other {i['other_ms']:.1f} ms.",
        numbers={"busy_frac": busy, "idle_ms": i["total_ms"], "host_wait_ms": i["host_wait_ms"],
                 "launch_latency_ms": i["launch_latency_ms"], "other_ms": i["other_ms"], "threshold_frac": BUSY_FRAC},
        windows=windows(*ctx.gaps.intervals, "gpu", ctx.device, "GPU idle"),
        est_gain=residual,
        gain_method="idle share of the window not already claimed by a more specific finding",
        fixes=(pytorch("Find where the time goes: look at the other findings and the timeline; a bigger batch "
                       "is the generic remedy", "loader = DataLoader(dataset, batch_size=2 * batch_size, ...)"),),
        doc_url=DOC,
    )


def _describe_gap(ctx: Context, gaps: Gaps, i: int) -> str:
    start, end, cause = int(gaps.start_ns[i]), int(gaps.end_ns[i]), GAP_CAUSES[gaps.cause[i]]
    queued = _queued_detail(ctx, start, end, int(gaps.next_event[i])) if cause == "other" else ""
    return f"{(end - start) / 1e6:.1f} ms ({_CAUSE_WORDS[cause]}{queued}, {_gap_cause(ctx, start, end)})"


def _gap_cause(ctx: Context, start: int, end: int) -> str:
    """What the main thread was doing during a gap: the longest host op overlapping it."""
    ev, msk = ctx.trace.events, ctx.masks
    cand = np.flatnonzero((ev.lane == ctx.main_lane) & msk["host"] & ~msk["name_step"]
                          & (ev.ts_ns < end) & (ev.ts_ns + ev.dur_ns > start))
    if cand.size == 0:
        return "the main thread shows no profiled activity"
    overlap = np.minimum(ev.ts_ns[cand] + ev.dur_ns[cand], end) - np.maximum(ev.ts_ns[cand], start)
    best = cand[int(np.argmax(overlap))]
    return f"main thread in {ctx.trace.names[ev.name[best]][:80]}"


def _queued_detail(ctx: Context, start: int, end: int, nxt: int) -> str:
    """For a gap whose next GPU work (row ``nxt``) had been launched before the gap began: how
    long before, and by which call (e.g. ``cudaGraphLaunch``). Empty when that is not the case."""
    if nxt < 0:
        return ""
    ev, launched = ctx.trace.events, int(ctx.launch_ts[nxt])
    if launched < 0 or launched >= start:
        return ""
    by = np.flatnonzero(ctx.masks["runtime"] & (ev.corr == ev.corr[nxt]))
    call = f" by {ctx.trace.names[ev.name[by[0]]]}" if by.size else ""
    return f", launched {(end - launched) / 1e6:.1f} ms before it ran{call}"


def explained_idle(ctx: Context) -> iv.Intervals:
    """Idle time that a cause finding already accounts for: data-loader waits and the GPU
    starvation that follows harmful syncs."""
    _, after_sync = harmful_syncs(ctx)
    return iv.merge(ctx.cat_union["dataloader"], after_sync.intervals)


def gpu_idle_gaps(ctx: Context, m: dict):
    """Signal: GPU idle gaps ≥ 1 ms inside the window (merged across streams). Threshold: they
    add up to ≥ 5 % of the window. Gain: their total. Each gap is reported with its HTA cause
    and what the main thread was doing. False positives: gaps during deliberate host work
    (evaluation, checkpointing) inside the window."""
    long = ctx.gaps.where(ctx.gaps.dur_ns >= LONG_GAP_NS)
    total = long.total_ns()
    frac = ctx.frac(total)
    if frac < LONG_GAPS_FRAC:
        return None
    unexplained = ctx.frac(iv.total(iv.subtract(long.intervals, explained_idle(ctx))))
    top = np.argsort(-long.dur_ns, kind="stable")[:5].tolist()
    causes = "; ".join(_describe_gap(ctx, long, i) for i in top)
    return finding(
        "gpu-idle-gaps", severity=severity_for(unexplained), title=f"{len(long)} long GPU idle gaps (≥ 1 ms)",
        why="""A gap of a millisecond or more is thousands of kernel launches' worth of idle GPU. Most long
        gaps have one host-side cause — a batch being loaded, a synchronisation, a logging or checkpoint
        call — visible on the main thread at the same moment. When the work after a gap had been launched
        long before it ("queued work not started"), the host was not the holdup: the GPU waited on a
        dependency — an event recorded on another stream, a collective waiting for a slower rank, a host
        callback in a CUDA graph — or on work the profiler did not record.""",
        summary=f"{len(long)} gaps ≥ 1 ms total {total / 1e6:.1f} ms ({pct(frac)} of the window). Longest: {causes}.",
        numbers={"long_gaps": len(long), "long_gap_ms": round(total / 1e6, 3), "long_gap_frac": round(frac, 4),
                 "unexplained_frac": round(unexplained, 4),
                 "min_gap_ms": LONG_GAP_NS / 1e6},
        windows=windows(*long.intervals, "gpu", ctx.device, "idle gap ≥ 1 ms"),
        est_gain=unexplained,
        gain_method="length of the gaps ≥ 1 ms not already explained by a data-loader wait or a sync",
        fixes=(pytorch("Overlap the host work with GPU work, or move it out of the loop",
                       "# see the gap causes above; e.g. log every N steps instead of every step\n"
                       "if step % 100 == 0:\n    log(metrics)"),),
        doc_url=DOC,
    )


