"""``low-gpu-utilization`` and ``gpu-idle-gaps``: symptoms, with their causes named."""

from __future__ import annotations

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis import names as nm
from gpumagic.analysis import segments as sg
from gpumagic.analysis.context import GAP_CAUSES, LONG_GAP_NS, QUEUED_CAUSES, Context, Gaps
from gpumagic.analysis.metrics import cap_by_critical_path
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for, windows
from gpumagic.analysis.rules.warmup import warmup_intervals
from gpumagic.report.metrics import IdleMetrics, Metrics
from gpumagic.report.model import Finding, Fix

#: The issue's anchor: the GPU busy less than half of the profiled window.
BUSY_FRAC = 0.5
#: Long gaps (≥ 1 ms) must add up to this share of the window to be worth a finding.
LONG_GAPS_FRAC = 0.05
DOC = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"


@rule("low-gpu-utilization")
def low_gpu_utilization(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the primary GPU's busy fraction (union of kernels, copies and memsets over all
    streams). Threshold: < 50 % (gpumagic's anchor). Gain: the idle share; ``analysis.gains``
    then keeps only the idle time no more specific finding claims, since those name the cause
    and the fix. False positives: a window that is mostly start-up or evaluation."""
    busy = m.gpu.busy_frac
    if busy is None or busy >= BUSY_FRAC:
        return None
    residual = 1.0 - busy
    i = m.idle
    idle_by_kind = _idle_by_segment(ctx)
    idle_ns = max(ctx.gaps.total_ns(), 1)
    warm_ns = sum(idle_by_kind.values())
    mostly = _dominant_idle(i)
    if warm_ns >= 0.5 * idle_ns:
        kind = max(idle_by_kind, key=lambda k: idle_by_kind[k])
        mostly = f"during {kind.replace('_', ' ')} (warm-up, it does not recur)"
    seg_text = "".join(f"; {v / 1e6:.1f} ms of the idle time in the {k.replace('_', ' ')} segment"
                       for k, v in sorted(idle_by_kind.items(), key=lambda kv: -kv[1]))
    return finding(
        severity=severity_for(residual - ctx.frac(warm_ns)),
        title=f"GPU busy only {pct(busy)}, idle mostly {mostly}",
        why="""A GPU is fast only while it has queued work. Whatever the host does between launches —
        loading data, Python code, synchronising, logging — shows up as idle GPU time. The idle time below
        is split by cause; the other findings name the fixes.""",
        summary=f"GPU busy {pct(busy)} of {m.window.dur_ms:.1f} ms; idle {i.total_ms:.1f} ms: "
                f"host wait {i.host_wait_ms:.1f} ms, launch latency {i.launch_latency_ms:.1f} ms, "
                f"other {i.other_ms:.1f} ms{seg_text}.",
        numbers={"busy_frac": busy, "idle_ms": i.total_ms, "host_wait_ms": i.host_wait_ms,
                 "launch_latency_ms": i.launch_latency_ms, "other_ms": i.other_ms, "threshold_frac": BUSY_FRAC},
        windows=windows(*ctx.gaps.intervals, "gpu", ctx.device, "GPU idle"),
        est_gain=residual - ctx.frac(warm_ns),
        gain_method="idle share of the window" + (" outside warm-up segments" if warm_ns else ""),
        fixes=(pytorch("Find where the time goes: look at the other findings and the timeline; a bigger batch "
                       "is the generic remedy", "loader = DataLoader(dataset, batch_size=2 * batch_size)  # keep your other arguments"),),
        doc_url=DOC,
    )


_CAUSE_WORDS = {"host_wait": "waiting for the host", "launch_latency": "launch latency",
                "other": "queued work not started", "stream_wait": "queued work waiting on another stream's event",
                "collective": "a collective waiting for other ranks", "graph_launch": "queued graph replay not started"}
#: A host frame names what the main thread was doing during a gap only if it covers at least
#: half of the gap (gpumagic default: a frame that overlaps a sliver of a gap did not cause it).
FRAME_MIN_COVER = 0.5


def _dominant_idle(i: IdleMetrics) -> str:
    """The largest part of the idle time, in words."""
    parts = {"waiting for the host": i.host_wait_ms, "in launch latency": i.launch_latency_ms,
             "on queued work": i.other_ms}
    return max(parts, key=lambda k: parts[k])


def _describe_gap(ctx: Context, gaps: Gaps, i: int) -> str:
    start, end, cause = int(gaps.start_ns[i]), int(gaps.end_ns[i]), GAP_CAUSES[gaps.cause[i]]
    host = int(gaps.host_ns[i])
    queued = _queued_detail(ctx, start, end, int(gaps.next_event[i])) if cause in QUEUED_CAUSES else ""
    split = ""
    if 0 < host < end - start:
        split = f"; {host / 1e6:.1f} ms host wait, {(end - start - host) / 1e6:.1f} ms queued"
    words = _CAUSE_WORDS[cause]
    call = _spanning_launch(ctx, start, end, int(gaps.next_event[i]))
    if call:
        words = f"host time inside {call}"
    seg = sg.segments(ctx).kind_at(start, end)
    where = f", in the {seg.kind.replace('_', ' ')} segment" if seg is not None else ""
    return f"{(end - start) / 1e6:.1f} ms ({words}{queued}{split}{where}, {host_frame(ctx, start, end)})"


def _spanning_launch(ctx: Context, start: int, end: int, nxt: int) -> str:
    """The launch call that began before the gap and returned inside it, e.g. ``cudaLaunchKernel
    2125.3 ms``: the gap is host time in that call, not queued work."""
    if nxt < 0 or ctx.launch_row[nxt] < 0:
        return ""
    ev, by = ctx.trace.events, int(ctx.launch_row[nxt])
    s, e = int(ev.ts_ns[by]), int(ev.ts_ns[by] + ev.dur_ns[by])
    if s < start < e <= end:
        return f"{ctx.trace.names[ev.name[by]]} {(e - s) / 1e6:.1f} ms"
    return ""


def host_frame(ctx: Context, start: int, end: int) -> str:
    """What the main thread was doing during ``[start, end)``: the innermost informative host
    frame (an operator, the DataLoader, a Python function — not ``<module>`` or the IPython
    machinery) that covers at least :data:`FRAME_MIN_COVER` of the interval."""
    ev, msk = ctx.trace.events, ctx.masks
    cand = np.flatnonzero((ev.lane == ctx.main_lane) & msk["host"] & ~msk["name_step"]
                          & (ev.ts_ns < end) & (ev.ts_ns + ev.dur_ns > start))
    if cand.size:
        cover = np.minimum(ev.ts_ns[cand] + ev.dur_ns[cand], end) - np.maximum(ev.ts_ns[cand], start)
        # one test per distinct name, not per event (a capture window has 100k+ frames)
        names, per_row = np.unique(ev.name[cand], return_inverse=True)
        info = np.array([nm.is_informative_frame(ctx.trace.names[n]) for n in names.tolist()], dtype=bool)[per_row.ravel()]
        ok = info & (cover >= FRAME_MIN_COVER * max(end - start, 1))
        if ok.any():
            best = cand[ok][int(np.argmin(ev.dur_ns[cand[ok]]))]
            return f"main thread in {ctx.trace.names[ev.name[best]][:80]}"
    return "the main thread shows no profiled activity for most of it"


def _queued_detail(ctx: Context, start: int, end: int, nxt: int) -> str:
    """For a gap whose next GPU work (row ``nxt``) had been queued before it ran: how long
    before, and by which call (e.g. ``cudaGraphLaunch``). Empty when that is not known."""
    if nxt < 0:
        return ""
    ev, launched = ctx.trace.events, int(ctx.launch_ts[nxt])
    if launched < 0 or launched >= end:
        return ""
    by = int(ctx.launch_row[nxt])
    call = f" by {ctx.trace.names[ev.name[by]]}" if by >= 0 else ""
    return f", launched {(end - launched) / 1e6:.1f} ms before it ran{call}"


@rule("gpu-idle-gaps")
def gpu_idle_gaps(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: GPU idle gaps ≥ 1 ms inside the window (merged across streams), each split at
    the launch of the work that ends it into host wait and queued work (docs/metrics.md).
    Threshold: they add up to ≥ 5 % of the window (gpumagic default). Gain: their length (the
    idle-time accounting in ``analysis.gains`` then counts time a more specific finding
    claims only once). Each gap is reported with its cause and the innermost host frame that
    covers it. False positives: gaps during deliberate host work (evaluation, checkpointing);
    queued gaps whose dependency lies outside the trace (then the fix is elsewhere)."""
    i = m.idle
    long = ctx.gaps.where(ctx.gaps.dur_ns >= LONG_GAP_NS)
    frac = ctx.frac(long.total_ns())
    if frac < LONG_GAPS_FRAC:
        return None
    warm = warmup_intervals(ctx)
    in_warmup = iv.total(iv.intersect(long.intervals, warm))
    top = np.argsort(-long.dur_ns, kind="stable")[:5].tolist()
    causes = "; ".join(_describe_gap(ctx, long, j) for j in top)
    host = int(np.minimum(long.host_ns, long.dur_ns).sum())
    queued = long.total_ns() - host
    what = "host wait" if host >= queued else "queued work"
    where = host_frame(ctx, int(long.start_ns[top[0]]), int(long.end_ns[top[0]]))
    return finding(
        severity=severity_for(frac - ctx.frac(in_warmup)),
        title=f"{i.long_gap_count} GPU idle gap{'s' if i.long_gap_count != 1 else ''} ≥ 1 ms, mostly {what}",
        why="""A gap of a millisecond or more is 100–200 kernel launches' worth of idle GPU (at 5–10 µs per launch). Most long
        gaps have one host-side cause — a batch being loaded, a synchronisation, a logging or checkpoint
        call — visible on the main thread at the same moment. When the work after a gap had been launched
        before it ran ("queued work not started"), the host was not the holdup: the GPU waited on a
        dependency — an event recorded on another stream, a collective waiting for a slower rank, a host
        callback in a CUDA graph — or on work the profiler did not record.""",
        summary=f"{i.long_gap_count} gaps ≥ 1 ms total {i.long_gap_ms:.1f} ms ({pct(frac)} of the window): "
                f"{host / 1e6:.1f} ms host wait, {queued / 1e6:.1f} ms queued work"
                + (f"; {in_warmup / 1e6:.1f} ms of it in warm-up segments (it does not recur)" if in_warmup else "")
                + f"; the longest: {causes}.",
        numbers={"long_gaps": i.long_gap_count, "long_gap_ms": i.long_gap_ms, "long_gap_frac": round(frac, 4),
                 **({"warmup_ms": round(in_warmup / 1e6, 4)} if in_warmup else {}),
                 "host_wait_ms": round(host / 1e6, 4), "queued_ms": round(queued / 1e6, 4),
                 "min_gap_ms": LONG_GAP_NS / 1e6},
        windows=windows(*long.intervals, "gpu", ctx.device, "idle gap ≥ 1 ms"),
        est_gain=cap_by_critical_path(ctx, "gpu-idle-gaps", frac - ctx.frac(in_warmup)),
        gain_method="length of the gaps ≥ 1 ms" + (" outside warm-up segments" if in_warmup else ""),
        fixes=_gap_fixes(ctx, host >= queued, where, in_warmup >= 0.5 * long.total_ns()),
        doc_url=DOC,
    )


#: A step timed across its collectives lasts the slowest rank's time on every rank (a collective
#: completes only when the last rank joins: NCCL docs, "Collective Operations"), so it cannot show
#: which rank is slow. Two ways that can: gpumagic's job analysis (``gpumagic analyze DIR``,
#: ``straggler-rank``: the rank whose collectives are shortest arrived last), and timing each
#: rank's own work with no collective in it. DDP's ``no_sync()`` keeps the backward pass local; the
#: first probe batch is left out (a warm-up, in which DDP may still broadcast its buffers:
#: ``DistributedDataParallel._pre_forward``). tests/test_snippets.py runs the probe on a two-rank
#: gloo job with a straggler slow in compute and one slow in its loader.
JOB_TRACES_CODE = """
import os
import torch.distributed as dist
import gpumagic
os.makedirs("traces", exist_ok=True)
with gpumagic.profile(steps=5, save=f"traces/rank{dist.get_rank()}.json.gz"):   # on every rank
    run_steps()   # a few steps of your loop
# then, on one machine:  gpumagic analyze traces/   (straggler-rank names the rank the others wait for)"""
STRAGGLER_PROBE_CODE = """
import time
import torch.distributed as dist
# DDP: a few batches, each rank timing its own work with no collective in it
it = iter(loader)
data_s = compute_s = 0.0
for i in range(6):
    t0 = time.perf_counter()
    x, y = next(it)                          # this rank's data wait
    t1 = time.perf_counter()
    with model.no_sync():                    # no all-reduce in this backward pass
        loss_fn(model(x.to("cuda")), y.to("cuda")).backward()
    torch.cuda.synchronize()                 # this rank's kernels only
    if i > 0:                                # batch 0 is a warm-up
        data_s, compute_s = data_s + t1 - t0, compute_s + time.perf_counter() - t1
model.zero_grad(set_to_none=True)            # a probe: no optimizer step
per_rank = [None] * dist.get_world_size()
dist.all_gather_object(per_rank, (round(data_s, 4), round(compute_s, 4)))
if dist.get_rank() == 0:
    print("(data wait s, forward+backward s) per rank:", per_rank)   # the straggler: the largest"""


def _gap_fixes(ctx: Context, host_side: bool, where: str, warmup: bool = False) -> tuple[Fix, ...]:
    if warmup:
        return (pytorch("Most of this idle time is start-up (see warm-up in window): nothing to fix in the loop; "
                        "record after a few steps to see the steady gaps", "%%gpuprofile --skip 3"),)
    if host_side:
        return (pytorch(f"Overlap the host work with GPU work, or move it out of the loop ({where})",
                        "# see the gap causes above; e.g. log every N steps instead of every step\n"
                        "if step % 100 == 0:\n    log(metrics)"),)
    if not _multi_process(ctx):  # one process: no rank to compare
        return (pytorch("The GPU had work queued: find what it waited for (an event on another stream, work "
                        "launched before the window). Record more steps, so that what the queue waited on is in "
                        "the window", "%%gpuprofile --skip 1\n# or: torch.profiler.schedule(wait=1, warmup=1, active=5)",
                        diagnostic=True),)
    job = pytorch("The GPU had work queued: find what it waited for. On a multi-GPU job a slower rank stalls "
                  "every collective: record every rank and let gpumagic's job analysis name it (straggler-rank: "
                  "the others wait inside their collectives, the straggler's are the shortest); on one GPU, "
                  "record more steps, so that the work the queue waited on is in the window",
                  JOB_TRACES_CODE, diagnostic=True)
    if ctx.workload != "training":
        return (job,)
    return (job,
            pytorch("Or time each rank's own work, with no collective in it (a step timed across its collectives "
                    "lasts the straggler's time on every rank, and a rank slow in its loader even looks fastest); "
                    "work only one rank does between steps shows in the job analysis, not here",
                    STRAGGLER_PROBE_CODE, diagnostic=True))


def _idle_by_segment(ctx: Context) -> dict[str, int]:
    """GPU idle time (ns) inside each kind of warm-up segment."""
    out: dict[str, int] = {}
    for seg in sg.segments(ctx).items:
        if seg.kind in sg.WARMUP_KINDS:
            ns = iv.total(iv.clip(ctx.gaps.intervals, seg.start_ns, seg.end_ns))
            if ns:
                out[seg.kind] = out.get(seg.kind, 0) + ns
    return out


def idle_outside_warmup(ctx: Context) -> iv.Intervals:
    """The time ``low-gpu-utilization`` recovers: GPU idle time outside warm-up segments."""
    return iv.subtract(ctx.gaps.intervals, warmup_intervals(ctx))


def _multi_process(ctx: Context) -> bool:
    """A job of several ranks: the trace's distributedInfo says world size > 1, or collectives ran."""
    dist = ctx.trace.meta.get("distributed") or {}
    return (dist.get("world_size") or 0) > 1 or bool((ctx.masks["kernel"] & ctx.masks["name_nccl"]).any())


def long_gap_intervals(ctx: Context) -> iv.Intervals:
    """The time ``gpu-idle-gaps`` recovers: its gaps ≥ 1 ms, outside warm-up segments (which do
    not recur)."""
    return iv.subtract(ctx.gaps.where(ctx.gaps.dur_ns >= LONG_GAP_NS).intervals, warmup_intervals(ctx))
