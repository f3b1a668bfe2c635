"""Turn a :class:`~gpumagic.analysis.context.Context` into ``Report.metrics`` (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpumagic._arrays import distinct, median, percentile
from gpumagic.analysis import (
    aside,
    copysizes,
    critical_path,
    energy,
    everystep,
    flops,
    memcats,
    modules,
    operators,
    phases,
    segments,
)
from gpumagic.analysis import intervals as iv
from gpumagic.analysis import names as nm
from gpumagic.analysis.compile import metrics as compile_metrics
from gpumagic.analysis.context import (
    BREAKDOWN_ORDER,
    GAP_CAUSES,
    LAUNCH_LATENCY_MAX_NS,
    LONG_GAP_NS,
    MAX_REPORTED_GAPS,
    SHORT_KERNEL_NS,
    Context,
)
from gpumagic.analysis.cpuprecision import host_threads, low_precision, machine_support
from gpumagic.analysis.hostcpu import host_cpu, window_samples
from gpumagic.analysis.hostload import host_state, run_conditions
from gpumagic.analysis.loaderstages import loader_stages
from gpumagic.analysis.loaderwait import loader_wait
from gpumagic.analysis.memgrowth import growth
from gpumagic.analysis.optimizerimpl import optimizer_steps
from gpumagic.report.metrics import (
    BreakdownMetrics,
    CommunicationMetrics,
    ConditionsMetrics,
    CopiesMetrics,
    CopyGroupMetrics,
    CriticalPathMetrics,
    DeviceMetrics,
    Distributed,
    GapMetrics,
    GpuDeviceMetrics,
    GpuMetrics,
    HostMetrics,
    IdleMetrics,
    KernelMetrics,
    KernelsMetrics,
    MainThread,
    MemoryMetrics,
    Metrics,
    OperatorsMetrics,
    PhasesMetrics,
    SampleMetrics,
    SegmentMetrics,
    StepMetrics,
    SyncCallMetrics,
    SyncMetrics,
    TraceMetrics,
    WindowMetrics,
    as_record,
)
from gpumagic.trace.model import Samples

TOP_KERNELS = 15
#: A first step this many times the median of the others is an outlier (warm-up in the window).
FIRST_STEP_OUTLIER_RATIO = 2.0
MS = 1e6


def _ms(ns: float) -> float:
    return round(float(ns) / MS, 4)


def compute(ctx: Context) -> Metrics:
    """Every metric of ``ctx``. Those in :data:`ASIDE` are computed last: when a child computes
    them (:mod:`gpumagic.analysis.aside`), this process does everything else meanwhile."""
    fields: dict[str, Any] = dict(
        trace=_trace(ctx),
        window=WindowMetrics(start_ns=ctx.lo, end_ns=ctx.hi, dur_ms=_ms(ctx.hi - ctx.lo), source=ctx.window_source,
                             **_segment_fields(ctx)),
        steps=_steps(ctx),
        gpu=_gpu(ctx),
        breakdown=_breakdown(ctx),
        idle=_idle(ctx),
        kernels=_kernels(ctx),
        copies=_copies(ctx),
        syncs=syncs(ctx),
        memory=_memory(ctx),
        communication=communication(ctx),
        host=_host(ctx),
        compute=flops.metrics(ctx),
        small_copies=copysizes.metrics(ctx, copy_groups(ctx)),
        conditions=as_record(run_conditions(ctx), ConditionsMetrics),
        phases=None if (p := phases.metrics(ctx)) is None else as_record(p, PhasesMetrics),
        samples=None if ctx.trace.samples is None else _samples(ctx, ctx.trace.samples),
        modules=modules.module_rows(ctx),
        compile=compile_metrics(ctx),
    )
    last: dict[str, Callable[[], Any]] = {
        "critical_path": lambda: as_record(critical_path_metrics(ctx), CriticalPathMetrics),
        "operators": lambda: as_record(operator_metrics(ctx), OperatorsMetrics)}
    for key in sorted(last, key=lambda k: k in ASIDE):  # what a child may be computing comes last
        fields[key] = last[key]()
    return Metrics(**fields)


def critical_path_metrics(ctx: Context) -> dict[str, Any]:
    """``metrics["critical_path"]``, computed once per context (see analysis/critical_path.py)."""
    out: dict[str, Any] = aside.take(ctx, "critical_path", _critical_path)
    return out


def _critical_path(ctx: Context) -> dict[str, Any]:
    queued = queued_work(ctx) if ctx.device >= 0 else iv.empty()
    return critical_path.metrics(ctx, sync_costs(ctx), queued)


def operator_metrics(ctx: Context) -> dict[str, Any]:
    """``metrics["operators"]`` (see analysis/operators.py), its length ``ctx.cache["top_ops"]``."""
    out: dict[str, Any] = aside.take(ctx, "operators", _operators)
    return out


def _operators(ctx: Context) -> dict[str, Any]:
    return operators.metrics(ctx, ctx.cache.get("top_ops", operators.TOP_OPERATORS))


#: The metrics a child may compute while this process computes the others
#: (:func:`gpumagic.analysis.aside.start`, forked once the context is built but for its
#: step-time breakdown, which is computed on first use). At 860 MB of JSON (4.3M events) the
#: critical path (with the sync costs and queued work it reads) takes about 0.65 s and the
#: operators table 0.25 s, against about 0.4 s for the breakdown and 0.55 s for everything else
#: that :func:`compute` does here: the two processes end at about the same time.
ASIDE = {"critical_path": _critical_path, "operators": _operators}


def before_aside(ctx: Context) -> None:
    """What both processes read, computed once before the child is forked, so that it inherits
    it instead of computing it again: the sync costs (this process's ``syncs`` metric and the
    child's critical path both read them) and the queued work under them. At 4.3M events the
    child spent about 0.1 s on these, and this process then waited about as long for it."""
    sync_costs(ctx)


def cap_by_critical_path(ctx: Context, finding_id: str, gain: float) -> float:
    """``gain``, at most the share of the critical path that the finding's fix shortens
    (``critical_path.SHORTENS``); rules call it on their gain."""
    return critical_path.cap(critical_path_metrics(ctx)["ms"], ctx.window_ns / MS, finding_id, gain)


def _segment_fields(ctx: Context) -> dict[str, Any]:
    """``window.segments``, ``steady_frac`` and ``steady_judged_ms`` (analysis/segments.py)."""
    d = segments.metrics(ctx)
    return {"segments": [as_record(x, SegmentMetrics) for x in d["segments"]], "steady_frac": d["steady_frac"],
            "steady_judged_ms": d["steady_judged_ms"]}


def _trace(ctx: Context) -> TraceMetrics:
    t = ctx.trace
    dist = t.meta.get("distributed")
    return TraceMetrics(
        source=t.source,
        events=t.meta.get("event_count", len(t.events)),
        schema=t.meta.get("schema"),
        devices=[DeviceMetrics(id=d.id, name=d.name, compute_capability=d.compute_capability,
                               total_memory_bytes=d.total_memory_bytes) for d in t.devices],
        cpu_only=ctx.device < 0,
        distributed=None if dist is None else Distributed(backend=dist.get("backend"), rank=dist.get("rank"),
                                                          world_size=dist.get("world_size")),
        workload=ctx.workload,
    )


def _steps(ctx: Context) -> StepMetrics:
    d = np.array([e - s for s, e in ctx.step_bounds], dtype=np.float64) / MS
    median_ms = p90_ms = first_over = None
    outlier = False
    if d.size:
        median_ms = round(float(median(d)), 4)
        p90_ms = round(float(percentile(d, 90)), 4)
    if d.size >= 3:
        rest = float(median(d[1:]))
        ratio = float(d[0]) / rest if rest > 0 else None
        first_over = None if ratio is None else round(ratio, 3)
        outlier = bool(ratio is not None and ratio >= FIRST_STEP_OUTLIER_RATIO)
    return StepMetrics(count=len(ctx.step_bounds), names=list(ctx.step_names),
                       bounds_ns=[(s, e) for s, e in ctx.step_bounds], durations_ms=[round(x, 4) for x in d.tolist()],
                       median_ms=median_ms, p90_ms=p90_ms, first_step_outlier=outlier, first_over_median=first_over,
                       **everystep.fields(ctx))


def _gpu(ctx: Context) -> GpuMetrics:
    per = [GpuDeviceMetrics(device=r["device"], busy_frac=round(ctx.frac(r["busy_ns"]), 4), busy_ms=_ms(r["busy_ns"]),
                            kernel_ms=_ms(r["kernel_ns"]), memcpy_ms=_ms(r["memcpy_ns"]), memset_ms=_ms(r["memset_ns"]),
                            streams=r["streams"]) for r in ctx.per_device]
    busy = iv.total(ctx.busy)
    info = ctx.device_info
    return GpuMetrics(primary_device=ctx.device if ctx.device >= 0 else None,
                      primary_name=info.name if info is not None and info.name else None,
                      busy_frac=round(ctx.frac(busy), 4) if ctx.device >= 0 else None,
                      busy_ms=_ms(busy), per_device=per, **energy.fields(ctx))


def _breakdown(ctx: Context) -> BreakdownMetrics:
    totals = {c: iv.total(ctx.exclusive[c]) for c in BREAKDOWN_ORDER}
    per_step = []
    if ctx.step_bounds:
        lo = np.array([s for s, _ in ctx.step_bounds])
        hi = np.array([e for _, e in ctx.step_bounds])
        cols = {c: iv.measure_in(ctx.exclusive[c], lo, hi) for c in BREAKDOWN_ORDER}
        per_step = [{c: _ms(cols[c][i]) for c in BREAKDOWN_ORDER} for i in range(lo.size)]
    return BreakdownMetrics(order=list(BREAKDOWN_ORDER), total_ms={c: _ms(v) for c, v in totals.items()},
                            frac={c: round(ctx.frac(v), 4) for c, v in totals.items()}, per_step_ms=per_step)


def _idle(ctx: Context) -> IdleMetrics:
    gaps = ctx.gaps
    long = gaps.where(gaps.dur_ns >= LONG_GAP_NS)
    top = np.sort(np.argsort(-gaps.dur_ns, kind="stable")[:MAX_REPORTED_GAPS])
    return IdleMetrics(
        total_ms=_ms(sum(ctx.idle_ns.values())),
        host_wait_ms=_ms(ctx.idle_ns.get("host_wait", 0)),
        launch_latency_ms=_ms(ctx.idle_ns.get("launch_latency", 0)),
        other_ms=_ms(ctx.idle_ns.get("other", 0)),
        launch_latency_max_us=LAUNCH_LATENCY_MAX_NS / 1000,
        long_gap_count=len(long),
        long_gap_ms=_ms(long.total_ns()),
        gaps=[GapMetrics(start_ns=int(gaps.start_ns[i]), end_ns=int(gaps.end_ns[i]), cause=GAP_CAUSES[gaps.cause[i]],
                         host_wait_ms=_ms(gaps.host_ns[i])) for i in top.tolist()],
    )


def kernel_mask(ctx: Context) -> np.ndarray:
    mask: np.ndarray = ctx.events_in_window(ctx.masks["kernel"]) & ctx.on_device
    return mask


def _kernels(ctx: Context) -> KernelsMetrics:
    ev, m = ctx.trace.events, ctx.masks
    k = kernel_mask(ctx)
    dur = ev.dur_ns[k]
    mm = m["name_matmul"][k]
    median_us = short_frac = None
    top: list[KernelMetrics] = []
    if dur.size:
        median_us = round(float(median(dur)) / 1000, 3)
        short_frac = round(float(np.mean(dur < SHORT_KERNEL_NS)), 4)
        ids = ev.name[k]
        tot = np.bincount(ids, weights=dur, minlength=len(ctx.trace.names))
        cnt = np.bincount(ids, minlength=len(ctx.trace.names))
        for n in np.argsort(-tot)[:TOP_KERNELS]:
            if cnt[n] == 0:
                break
            top.append(KernelMetrics(name=ctx.trace.names[n], count=int(cnt[n]), total_ms=_ms(tot[n]),
                                     mean_us=round(tot[n] / cnt[n] / 1000, 3),
                                     tensor_core=bool(ctx.name_flags["tensor_core"][n]),
                                     matmul=bool(ctx.name_flags["matmul"][n])))
    return KernelsMetrics(count=int(k.sum()), total_ms=_ms(dur.sum()), median_us=median_us, short_frac=short_frac,
                          tensor_core_ms=_ms(dur[m["name_tensor_core"][k]].sum()),
                          matmul_ms=_ms(dur[m["name_matmul"][k]].sum()),
                          matmul_tensor_core_ms=_ms(dur[(m["name_matmul"] & m["name_tensor_core"])[k]].sum()),
                          matmul_fp64_ms=_ms(matmul_ns_saying(nm.says_fp64, ctx.trace.names, ev.name[k], dur, mm)),
                          matmul_bf16_ms=_ms(matmul_ns_saying(nm.says_bf16, ctx.trace.names, ev.name[k], dur, mm)),
                          matmul_fp16_ms=_ms(matmul_ns_saying(nm.says_fp16, ctx.trace.names, ev.name[k], dur, mm)),
                          matmul_fp32_matrix_ms=_ms(matmul_ns_saying(nm.says_fp32_matrix, ctx.trace.names, ev.name[k],
                                                                     dur, mm)),
                          short_kernel_us=SHORT_KERNEL_NS / 1000, graph_frac=graph_frac(ctx), top=top)


def matmul_ns_saying(says: Callable[[str], bool], names: list[str], ids: np.ndarray, dur: np.ndarray,
                     matmul: np.ndarray) -> int:
    """Of the kernels named ``ids`` (lasting ``dur``, ``matmul`` where they are matmuls: the
    window's kernels on the primary GPU), the time of the matmuls whose names ``says`` reads a dtype
    in (``names.says_fp64``, ``says_bf16``, ``says_fp16``, ``says_fp32_matrix``), checked once per distinct matmul name."""
    mm = distinct(ids[matmul])
    flag = np.zeros(len(names), dtype=bool)
    flag[mm] = [says(names[i]) for i in mm.tolist()]
    return int(dur[flag[ids]].sum())


def graph_frac(ctx: Context) -> float | None:
    """Share of the primary GPU's kernels in the window that a graph launch replayed
    (``cudaGraphLaunch``/``hipGraphLaunch``), from the correlation ids."""
    k = np.flatnonzero(kernel_mask(ctx))
    if k.size == 0:
        return None
    by = ctx.launch_row[k]
    return round(float(np.mean((by >= 0) & ctx.masks["name_graph_launch"][np.maximum(by, 0)])), 4)


def copy_groups(ctx: Context) -> dict[tuple[str, str], dict[str, Any]]:
    """Copies on the primary device grouped by (direction, host memory kind)."""
    ev = ctx.trace.events
    idx = np.flatnonzero(ctx.events_in_window(ctx.masks["memcpy"]) & ctx.on_device)
    kinds = {n: nm.copy_kind(ctx.trace.names[n]) for n in distinct(ev.name[idx]).tolist()}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for n, key in kinds.items():
        sel = idx[ev.name[idx] == n]
        g = groups.setdefault(key, {"count": 0, "bytes": 0, "ns": 0, "idx": []})
        g["count"] += int(sel.size)
        g["bytes"] += int(np.maximum(ev.nbytes[sel], 0).sum())
        g["ns"] += int(ev.dur_ns[sel].sum())
        g["idx"].append(sel)
    for g in groups.values():
        g["idx"] = np.concatenate(g["idx"]) if g["idx"] else np.zeros(0, dtype=np.int64)
    return groups


def _copies(ctx: Context) -> CopiesMetrics:
    groups = copy_groups(ctx)
    rows = [CopyGroupMetrics(direction=d, memory=mem, count=g["count"], bytes=g["bytes"], ms=_ms(g["ns"]),
                             gbps=round(g["bytes"] / g["ns"], 3) if g["ns"] > 0 else None)
            for (d, mem), g in sorted(groups.items(), key=lambda kv: -kv[1]["ns"])]
    return CopiesMetrics(count=sum(r.count for r in rows), total_ms=_ms(sum(g["ns"] for g in groups.values())),
                         total_bytes=sum(r.bytes for r in rows), groups=rows)


def sync_events(ctx: Context) -> np.ndarray:
    """Host calls inside the window that block until the GPU has finished (rows of the event
    table): the sync calls of ``names.SYNC_CALLS``, and asynchronous-copy calls whose copy
    goes from the device to *pageable* host memory — "for transfers from device memory to
    pageable host memory, the function will return only once the copy has completed" (CUDA
    Runtime API, "API synchronization behavior"); that is how ``.item()``, ``.cpu()`` and
    ``.tolist()`` on CUDA tensors usually synchronise."""
    m, ev = ctx.masks, ctx.trace.events
    # a library's own syncs (cuDNN's algorithm search, the allocator, cudagraph-trees before it
    # records) are not the user's: segments.library_sync_rows
    calls = m["name_sync_call"] & m["runtime"] & m["host"] & ~segments.library_sync_rows(ctx)
    copies = np.flatnonzero(m["memcpy"] & (ctx.launch_row >= 0))
    if copies.size:
        kinds = {n: nm.copy_kind(ctx.trace.names[n]) for n in distinct(ev.name[copies]).tolist()}
        to_pageable = np.array([kinds[n] == ("DtoH", "pageable") for n in ev.name[copies].tolist()], dtype=bool)
        calls = calls.copy()
        calls[ctx.launch_row[copies[to_pageable]]] = True
    return np.flatnonzero(ctx.events_in_window(calls))


#: A sync that held the host for less than this while the GPU still had queued work cost less
#: than one kernel launch (2–10 µs on current GPUs, see context.LAUNCH_LATENCY_MAX_NS): it is
#: not counted as harmful.
SYNC_MIN_BLOCKED_NS = 10_000


@dataclass
class SyncCost:
    """Per sync call in the window (``idx``): the time it blocked the host while the GPU still
    had queued work (``blocked_ns``), whether it is harmful, and the GPU idle time the harmful
    ones cost (``starved``)."""

    idx: np.ndarray
    blocked_ns: np.ndarray
    harmful: np.ndarray  # bool per call
    starved: iv.Intervals


def queued_work(ctx: Context) -> iv.Intervals:
    """When the primary GPU had work queued or running: from each GPU event's launch to its end
    (computed once per context: the sync costs and the critical path both read it)."""
    return ctx.memo("queued_work", _queued_work)


def _queued_work(ctx: Context) -> iv.Intervals:
    ev, m = ctx.trace.events, ctx.masks
    on = m["gpu"] & ctx.on_device
    start = np.where(on & (ctx.launch_ts >= 0), ctx.launch_ts, ev.ts_ns)[on]
    return iv.union(np.minimum(start, ev.ts_ns[on]), ev.ts_ns[on] + ev.dur_ns[on])


def sync_costs(ctx: Context) -> SyncCost:
    """What each blocking call cost (computed once per context)."""
    return ctx.memo("sync_costs", _sync_costs)


def _sync_costs(ctx: Context) -> SyncCost:
    """A sync is harmful only for the time it actually blocked the host while the GPU still had
    queued work (``blocked_ns``: the call's overlap with :func:`queued_work`), when GPU work
    follows it in the window. A call that returns in microseconds because the GPU was already
    idle blocked nothing, however long the gap around it (that gap belongs to whatever the host
    did); a final sync that only waits for the queue to drain costs nothing.

    What harmful syncs cost the GPU: without the blocks, the host would have run ahead by the
    time it spent blocked, launching later work (and preparing batches) while the GPU still had
    work. So host-wait idle time (in gaps longer than the launch-latency bound) after a harmful sync is the syncs' doing, up to the total time
    they had blocked the host by then, less what earlier idle time already used of it. Launch
    latency (work already queued) and queued work waiting on a dependency are not."""
    idx = sync_events(ctx)
    ev = ctx.trace.events
    starts, ends = ev.ts_ns[idx], ev.ts_ns[idx] + ev.dur_ns[idx]
    if idx.size == 0 or ctx.device < 0:
        return SyncCost(idx, np.zeros(idx.size, np.int64), np.zeros(idx.size, bool), iv.empty())
    blocked = iv.measure_in(queued_work(ctx), starts, ends).astype(np.int64)
    harmful = (ends < _last_gpu_start(ctx)) & (blocked >= SYNC_MIN_BLOCKED_NS)
    real = ctx.gaps.where(ctx.gaps.dur_ns >= LAUNCH_LATENCY_MAX_NS)  # shorter: launch noise
    return SyncCost(idx, blocked, harmful, _run_ahead(real.host_wait(), ends[harmful], blocked[harmful]))


def _run_ahead(waits: iv.Intervals, returns: np.ndarray, blocked: np.ndarray) -> iv.Intervals:
    """The host-wait time that a host, ahead by the cumulative ``blocked`` time of the syncs
    returned so far, would have hidden (in time order, each wait using what is left)."""
    if returns.size == 0:
        return iv.empty()
    order = np.argsort(returns)
    returns, cum = returns[order], np.cumsum(blocked[order])
    s, e = iv.clip(waits, int(returns[0]), int(np.iinfo(np.int64).max))
    budget = cum[np.searchsorted(returns, s, side="right") - 1]
    used, out_e = 0, e.copy()
    for j in range(s.size):
        take = min(int(e[j] - s[j]), max(0, int(budget[j]) - used))
        used += take
        out_e[j] = s[j] + take
    return iv.union(s, out_e)


def _last_gpu_start(ctx: Context) -> int:
    """Start of the last GPU work on the primary device inside the window."""
    ev = ctx.trace.events
    on = ctx.events_in_window(ctx.masks["gpu"] & ctx.on_device)
    return int(ev.ts_ns[on].max()) if on.any() else ctx.lo


def harmful_syncs(ctx: Context) -> tuple[np.ndarray, iv.Intervals]:
    """The harmful sync calls (event rows) and the idle time they caused (see :func:`sync_costs`)."""
    c = sync_costs(ctx)
    return c.idx[c.harmful], c.starved


def syncs(ctx: Context) -> SyncMetrics:
    ev, names = ctx.trace.events, ctx.trace.names
    c = sync_costs(ctx)
    idx = c.idx
    by_name: dict[str, SyncCallMetrics] = {}
    for n in distinct(ev.name[idx]).tolist():
        sel = ev.name[idx] == n
        by_name[names[n]] = SyncCallMetrics(count=int(sel.sum()), ms=_ms(ev.dur_ns[idx[sel]].sum()),
                                            blocked_ms=_ms(c.blocked_ns[sel].sum()))
    ops = np.flatnonzero(ctx.events_in_window(ctx.masks["name_sync_op"] & ctx.masks["host"]))
    op_counts = {names[n]: int(np.count_nonzero(ev.name[ops] == n)) for n in distinct(ev.name[ops]).tolist()}
    lib = segments.library_sync_rows(ctx)
    return SyncMetrics(count=int(idx.size), library_count=int(np.count_nonzero(ctx.events_in_window(lib))),
                       call_ms=_ms(ev.dur_ns[idx].sum()), blocked_ms=_ms(c.blocked_ns.sum()),
                       harmful_count=int(c.harmful.sum()), harmful_blocked_ms=_ms(c.blocked_ns[c.harmful].sum()),
                       starved_ms=_ms(iv.total(c.starved)),
                       min_blocked_us=SYNC_MIN_BLOCKED_NS / 1000, by_name=by_name, sync_ops=op_counts)


def _memory(ctx: Context) -> MemoryMetrics:
    mem = ctx.trace.memory
    info = ctx.device_info
    cap = info.total_memory_bytes if info and info.total_memory_bytes > 0 else None
    allocated = reserved = nvml = frac = None
    source: str | None = None
    sel = ctx.memory_records()
    if sel.any() and (mem.allocated[sel] >= 0).any():
        allocated = int(mem.allocated[sel].max())
        reserved = int(mem.reserved[sel].max()) if (mem.reserved[sel] >= 0).any() else None
        source = "allocator"
    samples = ctx.trace.samples
    if samples is not None and "mem_used_bytes" in samples.gpu and len(samples.gpu["mem_used_bytes"]):
        used = samples.gpu["mem_used_bytes"]
        total = samples.gpu.get("mem_total_bytes")
        nvml = int(np.max(used))
        if cap is None and total is not None and len(total):
            cap = int(np.max(total))
        if source is None:
            source = "nvml"
    # The pressure signal is peak *allocated* memory: reserved memory near capacity is the caching
    # allocator working as designed, and NVML's "used" adds the CUDA context and other processes
    # (PyTorch CUDA semantics notes, "Memory management"). Reserved and NVML stay as numbers.
    if allocated and cap:
        frac = round(allocated / cap, 4)
    pool = _pool(ctx, sel, cap)
    return MemoryMetrics(peak_allocated_bytes=allocated, peak_reserved_bytes=reserved, capacity_bytes=cap,
                         peak_frac=frac, source=source, nvml_peak_used_bytes=nvml,
                         allocated_range_bytes=pool["allocated_range_bytes"], pool=pool["pool"],
                         floor_growth_per_step_bytes=round(grew.per_step) if (grew := growth(ctx)).floors else None,
                         **memcats.breakdown(ctx))


#: A deliberate pool: allocated memory moves by at most 5 % of the device across the window's
#: allocator records, and no allocation call reaches the driver in the window. vLLM reserves its
#: KV cache up front (``gpu_memory_utilization``, default 0.9), SGLang its static memory
#: (``mem_fraction_static``): one large reservation before serving, then no growth or retries.
POOL_RANGE_FRAC = 0.05


def _pool(ctx: Context, sel: np.ndarray, cap: int | None) -> dict[str, Any]:
    """``allocated_range_bytes`` (max − min allocated over the window's records) and ``pool``:
    whether the memory was held up front (see :data:`POOL_RANGE_FRAC`); null when unknown."""
    mem = ctx.trace.memory
    rec = sel & (mem.ts_ns >= ctx.lo) & (mem.ts_ns <= ctx.hi) & (mem.allocated >= 0)
    if np.count_nonzero(rec) < 2 or not cap:
        return {"allocated_range_bytes": None, "pool": None}
    rng = int(mem.allocated[rec].max() - mem.allocated[rec].min())
    m = ctx.masks
    mallocs = ctx.events_in_window(m["runtime"] & ctx.host_name_ids(
        lambda n: n in ("cudaMalloc", "cudaMallocAsync", "cuMemAlloc_v2", "cuMemCreate", "hipMalloc",
                        "hipMallocAsync", "hipExtMallocWithFlags"))[ctx.trace.events.name])
    return {"allocated_range_bytes": rng, "pool": bool(rng <= POOL_RANGE_FRAC * cap and not mallocs.any())}


def communication(ctx: Context) -> CommunicationMetrics:
    """NCCL kernel time, how much of it overlaps compute kernels, and what stays exposed."""
    comm = ctx.cat_union["communication"]
    compute = ctx.cat_union["kernel"]
    comm_ns = iv.total(comm)
    exposed = iv.total(iv.subtract(comm, compute))
    m = ctx.masks
    count = int(np.count_nonzero(ctx.events_in_window(m["kernel"] & m["name_nccl"]) & ctx.on_device))
    host_calls = int(np.count_nonzero(ctx.events_in_window(m["name_comm_host"] & m["host"])))
    dist = ctx.trace.meta.get("distributed") or {}
    # the program communicates (collective operators on the host, or several ranks) but no kernel
    # is recognised as a collective: communication may be undercounted
    # (a world of one rank moves nothing: its collectives launch no kernel)
    world = dist.get("world_size")
    maybe_under = count == 0 and ctx.device >= 0 and world != 1 and (host_calls > 0 or (world or 0) > 1)
    return CommunicationMetrics(count=count, host_calls=host_calls, maybe_undercounted=bool(maybe_under),
                                ms=_ms(comm_ns), frac=round(ctx.frac(comm_ns), 4),
                                overlap_frac=round(1 - exposed / comm_ns, 4) if comm_ns else None,
                                exposed_ms=_ms(exposed), exposed_frac=round(ctx.frac(exposed), 4))


def _host(ctx: Context) -> HostMetrics:
    dl = iv.total(ctx.cat_union["dataloader"])
    lane = ctx.trace.lanes[ctx.main_lane] if ctx.main_lane >= 0 else None
    h = host_cpu(ctx)
    w = loader_wait(ctx)
    return HostMetrics(dataloader_ms=_ms(dl), dataloader_frac=round(ctx.frac(dl), 4),
                       runtime_ms=_ms(iv.total(ctx.cat_union["runtime"])), cpu_op_ms=_ms(iv.total(ctx.cat_union["cpu_exec"])),
                       main_thread=None if lane is None else MainThread(pid=lane.pid, tid=lane.tid),
                       usable_cores=h.usable_cores, usable_cores_source=h.usable_source,
                       cpu_busy_cores=h.busy_cores, cpu_saturation=h.saturation,
                       loader_cpu_bound=h.loader_cpu_bound, dataloader_batches=w.batches, dataloader_batch_ms=w.median_ms,
                       loader_in_workers=w.in_workers, loader_stages=loader_stages(ctx), **host_state(ctx),
                       **_cpu_precision(ctx))


def _cpu_precision(ctx: Context) -> dict[str, Any]:
    """The intra-op thread count recorded, the CPU's 16-bit support and, without a GPU, the matrix
    calls seen in 16 bits; the optimizer steps' share of the window and their implementation."""
    support = machine_support(ctx)
    steps = optimizer_steps(ctx)
    return {"intra_op_threads": host_threads(ctx), "cpu_bf16": support["bf16"], "cpu_fp16": support["fp16"],
            "cpu_low_precision_calls": low_precision(ctx).calls if ctx.device < 0 else None,
            "optimizer_step_frac": round(ctx.frac(steps.ns), 4) if steps.calls else None,
            "optimizer_impl": steps.impl}


def _samples(ctx: Context, s: Samples) -> SampleMetrics:
    def in_window(block: dict[str, Any], key: str) -> np.ndarray:
        if key not in block or "t_ns" not in block:
            return np.zeros(0)
        sel = window_samples(ctx, block["t_ns"])
        values: np.ndarray = np.asarray(block[key], dtype=np.float64)[sel]
        return values

    gu = in_window(s.gpu, "gpu_util")
    cu = in_window(s.cpu, "total")
    wu = in_window(s.cpu, "workers")
    mu = in_window(s.gpu, "mem_used_bytes")
    return SampleMetrics(count=int(max(gu.size, cu.size)),
                         gpu_util_mean=round(float(gu.mean()), 2) if gu.size else None,
                         gpu_mem_used_max_bytes=int(mu.max()) if mu.size else None,
                         cpu_util_mean=round(float(cu.mean()), 2) if cu.size else None,
                         workers_util_mean=round(float(wu.mean()), 2) if wu.size else None)
