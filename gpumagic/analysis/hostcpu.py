"""What the host CPU could do and did: usable cores, how busy they were, and whether waiting
for data was CPU work. Feeds ``metrics["host"]``, ``host-cpu-saturated`` and the data-loader
advice.

Usable cores come from the capture (``os.sched_getaffinity`` and a cgroup quota, recorded in
the bundle's ``machine`` block by ``capture.machine.usable_cpus``); a plain Kineto trace does
not say, and the advice then says its worker count is an assumption. Busy cores come from the
host CPU samples (``/proc/stat`` per core, ``capture.cpu``): over the cores of the affinity
mask when it is known, else over all cores; under a cgroup quota smaller than the mask, from
the process's own CPU time (this process plus its data-loader workers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.loaderrestart import worker_starts
from gpumagic.trace.model import meta_block

#: A data-loader wait is CPU work when the loading side (the main process with
#: ``num_workers=0``, else the workers) uses at least half of the CPU it could get during it
#: (gpumagic default: below that, most of the wait is I/O, sleeps or locks).
LOADER_CPU_SHARE = 0.5
#: The samples judge the loading when the loop's waits for data cover at least this many samples'
#: spans in all. While the loop waits, loading that is CPU work keeps its processes busy (they are
#: the bottleneck), so half a span spent waiting already says what the loading does; a window
#: of a few sampling periods (a short cell: two workers that slept on reads while the loop waited
#: 79 % of the one span inside it) had nothing said of it under a whole span's worth.
MIN_WAIT_SAMPLES = 0.5


@dataclass(frozen=True)
class HostCpu:
    usable_cores: float | None  # None: the trace does not say
    usable_source: str  # "affinity", "cgroup quota", "cpu_count" or "unknown"
    sample_count: int  # CPU samples inside the window
    busy_cores: float | None  # mean busy cores (of the usable ones) over the window
    saturation: float | None  # busy_cores / usable_cores
    loader_cpu_bound: bool | None  # the data-loader wait is mostly CPU work (None: unknown)
    loader_cpu_source: str  # "samples", "main-thread ops" or ""
    worker_count: int | None  # data-loader workers seen by the sampler


def host_cpu(ctx: Context) -> HostCpu:
    """The host CPU's figures for the window (computed once per context)."""
    return ctx.memo("host_cpu", _host_cpu)


def _host_cpu(ctx: Context) -> HostCpu:
    machine = meta_block(ctx.trace.meta, "machine")
    usable = machine.get("usable_cores")
    source = machine.get("usable_cores_source") or ("unknown" if usable is None else "cpu_count")
    if usable is None and machine.get("cpu_count"):  # a bundle from before usable cores were recorded
        usable, source = float(machine["cpu_count"]), "cpu_count"
    cpu = cpu_samples(ctx)
    t = np.asarray(cpu.get("t_ns", np.zeros(0)))
    sel = window_samples(ctx, t)
    per_sample = _busy_cores(cpu, machine) if t.size else None
    busy = float(per_sample[sel].mean()) if per_sample is not None and sel.any() else None
    saturation = None if busy is None or not usable else round(min(1.0, busy / float(usable)), 4)
    workers = int(np.max(np.asarray(cpu["worker_count"])[sel])) if sel.any() and "worker_count" in cpu else None
    bound, how = _loader_cpu_bound(ctx, cpu, t, workers, per_sample, usable)
    return HostCpu(usable, source, int(sel.sum()), None if busy is None else round(busy, 3), saturation, bound, how, workers)


def cpu_samples(ctx: Context) -> dict[str, Any]:
    """The trace's CPU sample columns (empty for a plain trace)."""
    return ctx.trace.samples.cpu if ctx.trace.samples is not None else {}


def sample_spans(t: np.ndarray, span: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The samples whose span is known, in time order (``rows``, indices into ``t``), and the span
    each covers, ``[lo, hi)``: from the reading before it to its own. With ``span`` (the capture's
    ``span_ns`` column: each sample's time since the reading before it, the sampler's first reading
    included, which makes no sample itself) every sample has one; without it the first sample's
    reading before it is unknown and it is left out."""
    order = np.argsort(t, kind="stable")
    ts = t[order]
    if span is not None:
        sp = np.asarray(span)
        if sp.shape == t.shape and sp.dtype.kind in "iuf" and (sp > 0).all():
            return order, ts - sp[order].astype(np.int64), ts
    return order[1:], ts[:-1], ts[1:]


def window_samples(ctx: Context, t: Any) -> np.ndarray:
    """Which samples describe the window, by their times ``t`` (ns): those taken inside it, each
    covering the time since the reading before it. When none is (a window shorter than the
    sampling period: five 4 ms steps between two 100 ms samples), the first one after it, which
    covers the whole window: the reading before it came before the window (a reading inside would
    have made a sample there; the sampler's first reading, at the start, makes none)."""
    t = np.asarray(t)
    sel = (t >= ctx.lo) & (t <= ctx.hi) if t.size else np.zeros(0, dtype=bool)
    if t.size and not sel.any():
        after = np.flatnonzero(t > ctx.hi)
        if after.size:
            sel[after[np.argmin(t[after])]] = True
    return sel


def _busy_cores(cpu: dict[str, Any], machine: dict[str, Any]) -> np.ndarray | None:
    """Busy usable cores per sample."""
    affinity = machine.get("cpu_affinity")
    quota = machine.get("cpu_quota_cores")
    per_core = np.asarray(cpu.get("per_core", np.zeros((0, 0))), dtype=np.float64)
    n = np.asarray(cpu["t_ns"]).size
    if quota is not None and affinity and quota < len(affinity) and "main" in cpu:
        return _own_cores(cpu)
    if per_core.ndim == 2 and per_core.shape[0] == n and per_core.shape[1]:
        cols = [c for c in (affinity or range(per_core.shape[1])) if c < per_core.shape[1]]
        busy: np.ndarray = per_core[:, cols].sum(axis=1) / 100
        return busy
    if "total" in cpu and machine.get("cpu_count"):
        total: np.ndarray = np.asarray(cpu["total"], dtype=np.float64) / 100 * machine["cpu_count"]
        return total
    return None


def _own_cores(cpu: dict[str, Any]) -> np.ndarray:
    """Cores this process and its data-loader workers kept busy, per sample (with the children that
    exited during the sample: ``reaped``)."""
    main = np.asarray(cpu["main"], dtype=np.float64)
    workers = np.asarray(cpu.get("workers", np.zeros_like(main)), dtype=np.float64)
    return (main + workers + np.asarray(cpu.get("reaped", np.zeros_like(main)), dtype=np.float64)) / 100


def _loader_cpu_bound(ctx: Context, cpu: dict[str, Any], t: np.ndarray, workers: int | None,
                      busy: np.ndarray | None, usable: float | None) -> tuple[bool | None, str]:
    """Is the data-loader wait CPU work? From the samples: each covers the time since the one
    before it and counts in proportion to how much of that time the loop waited for data (at
    least half a sample's worth in all, :data:`MIN_WAIT_SAMPLES`). The loading processes (the main one with
    ``num_workers=0``, else the workers) are CPU-bound when they used at least half of the CPU
    they could get — a core each, or what other processes left of the usable cores — so a
    loader starved of CPU by other work still counts as CPU-bound, and a sleeping one does not.
    With schedstat's run-queue wait recorded, the share is of the time the threads were not
    waiting for a core (:func:`_compute_share`): a thread that sleeps and then waits for a core
    behind busy neighbours wanted only its run time. Else from how much of the wait main-thread operators (not Python frames) cover; unknown
    when neither says. The waits for workers starting again (``analysis.loaderrestart``: each
    epoch without persistent workers) are left out: they time a process start, which
    ``dataloader-worker-restarts`` reports."""
    waits = ctx.cat_union["dataloader"]
    restarts = worker_starts(ctx).intervals  # new worker processes starting: a process start, not the loading
    if restarts[0].size:
        waits = iv.subtract(waits, restarts)
    if iv.total(waits) == 0:
        return None, ""
    if t.size >= 2 and "main" in cpu:
        rows, lo, hi = sample_spans(t, cpu.get("span_ns"))
        weight = iv.measure_in(waits, lo, hi) / np.maximum(hi - lo, 1).astype(np.float64)
        if weight.sum() >= MIN_WAIT_SAMPLES:
            procs = workers or 1
            demand_key = "workers_demand" if workers else "main_demand"
            if demand_key in cpu and (np.asarray(cpu[demand_key]) >= 0).all():
                wanted = np.asarray(cpu[demand_key], dtype=np.float64)[rows] / 100 / procs
                share = np.minimum(wanted, 1.0)
                wait_key = "workers_wait" if workers else "main_wait"
                if wait_key in cpu and (np.asarray(cpu[wait_key]) >= 0).all():
                    share = _compute_share(wanted, np.asarray(cpu[wait_key], dtype=np.float64)[rows] / 100 / procs)
                return bool(np.average(share, weights=weight) >= LOADER_CPU_SHARE), "samples"
            loading = np.asarray(cpu["workers" if workers else "main"], dtype=np.float64)[rows] / 100
            could = np.full(loading.size, float(procs))
            if busy is not None and usable:
                others = np.maximum(busy[rows] - _own_cores(cpu)[rows], 0.0)
                could = np.clip(float(usable) - others, 0.0, procs)
            if np.average(could, weights=weight) < LOADER_CPU_SHARE * procs:
                return None, ""  # other processes left too little CPU to tell sleeping from starved
            share = np.average(np.minimum(loading / np.maximum(could, 1e-9), 1.0), weights=weight)
            return bool(share >= LOADER_CPU_SHARE), "samples"
    ev, m = ctx.trace.events, ctx.masks
    # operators only: a Python frame (with_stack) also covers a sleep
    ops = ctx.intervals(ctx.events_in_window((ev.lane == ctx.main_lane) & m["cpu_op"] & ~m["name_dataloader"]))
    covered = iv.total(iv.intersect(ops, waits)) / iv.total(waits)
    if covered >= LOADER_CPU_SHARE:
        return True, "main-thread ops"
    return None, ""


def sampled_ns(ctx: Context, key: str, lo: int, hi: int) -> float | None:
    """A CPU-sample column in percent of a core (``main_wait``...) over ``[lo, hi)``, as ns of a
    core: each sample covers the time since the one before it, and counts for its overlap with
    the span. None without the column (or a negative reading: not measured), or where the samples
    cover less than half of the span (the sampler's first reading, taken as the capture starts,
    covers nothing before it: a first step ending before the second reading is not measured)."""
    cpu = cpu_samples(ctx)
    t = np.asarray(cpu.get("t_ns", np.zeros(0)))
    if t.size < 2 or key not in cpu or (np.asarray(cpu[key]) < 0).any():
        return None
    rows, start, end = sample_spans(t, cpu.get("span_ns"))
    overlap = np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0, None).astype(np.float64)
    if overlap.sum() < 0.5 * (hi - lo):
        return None
    return float((np.asarray(cpu[key], dtype=np.float64)[rows] / 100 * overlap).sum())


def main_thread_use(ctx: Context, where: iv.Intervals, computing: iv.Intervals) -> tuple[float | None, int]:
    """How much of a core the main thread wanted during ``where`` (times with no operator of its
    own running), from the CPU samples, and how many samples said so.

    Each sample covers the time since the one before it. The main thread's demand there
    (schedstat's run + run-queue wait, so a thread starved by other processes still counts as
    wanting; its run time, ``main_thread``, where schedstat is missing; never ``main``, the whole
    process), less a whole core during ``computing`` (its operators), is laid on ``where``'s time
    in that sample. Everything else in the sample — Python between the model's operators
    included — is taken as idle, so the figure leans high: a low one means the thread mostly
    slept then (``time.sleep``, a blocking write or network call, a lock). Only samples that lie
    inside the window count (one reaching past it holds the profiler's start or the trace's
    export). None without samples, or where they cover less of ``where`` than one sampling period."""
    cpu = cpu_samples(ctx)
    t = np.asarray(cpu.get("t_ns", np.zeros(0)))
    key = next((k for k in ("main_demand", "main_thread") if k in cpu and (np.asarray(cpu[k]) >= 0).all()), None)
    if t.size < 2 or key is None or not where[0].size:
        return None, 0
    rows, lo, hi = sample_spans(t, cpu.get("span_ns"))
    span = np.maximum(hi - lo, 1).astype(np.float64)
    wanted = np.asarray(cpu[key], dtype=np.float64)[rows] / 100 * span  # ns of CPU the thread wanted
    there = iv.measure_in(where, lo, hi).astype(np.float64)
    # samples inside the window only: one reaching past it holds the profiler's start or export
    used = (there > 0) & (lo >= ctx.lo) & (hi <= ctx.hi)
    if there[used].sum() < float(np.median(span)):
        return None, int(used.sum())
    left = np.maximum(wanted - iv.measure_in(computing, lo, hi), 0.0)
    return float(min(1.0, left[used].sum() / there[used].sum())), int(used.sum())


def _compute_share(wanted: np.ndarray, waited: np.ndarray) -> np.ndarray:
    """Per sample, the share of the time a loading thread was not waiting for a core that it
    spent on a core: ran ÷ (ran + slept), with ran = wanted − waited (schedstat's run and
    run-queue times, per thread) and slept = 1 − wanted. A CPU-bound thread starved by other
    processes never sleeps (share ≈ 1, however little it ran); an I/O-like one that sleeps and,
    woken, waits behind busy neighbours for a core, mostly slept (share ≈ its run time over its
    sleep). Recorded beside four spinning neighbour processes on 2 cores (tests/data/
    loader_samples_busy_neighbours.json): a loader sleeping 10 ms per item ran 1.5 % of a core and
    waited 65 % for one, so run + wait (0.67 of a core) called it CPU-bound; this share is 0.05
    for it and 0.76 for a loader that computes without sleeping."""
    ran = np.clip(wanted - waited, 0.0, 1.0)
    share: np.ndarray = np.minimum(ran / np.maximum(1.0 - np.minimum(waited, 1.0), 1e-9), 1.0)
    return share


def suggested_workers(h: HostCpu, moving: float = 0.0) -> int | None:
    """``num_workers`` the spare usable cores allow: the workers already running plus one per
    idle usable core (busy cores from the samples; without samples the main process is assumed
    to keep one core busy), at least 1 and never more than ``usable − 1`` (the main process
    needs a core too; with one usable core, 1). None when the usable cores are unknown.

    ``moving``: the cores' worth of loading that the main process does itself now
    (``num_workers=0``, CPU-bound loading, :func:`loading_in_main`), which workers would take
    over. That core is then the workers' too: one worker per usable core that is at least half
    free once the loading has left the main process, up to the usable cores (PyTorch's own
    ceiling: DataLoader warns above the CPUs the process may use). On this project's 2-core
    machine, a CPU loop whose main process spent 95 % of each step loading (a 27 ms batch for a
    1.3 ms step) took 15.0 ms a step with ``num_workers=0``, 15.6 ms with 1 and 9.0 ms with 2
    (best of 2 rounds of 40 steps each): one worker, the ``usable − 1`` rule, cannot help there."""
    if not h.usable_cores:
        return None
    usable = int(np.floor(float(h.usable_cores) + 1e-6))
    if moving > 0 and h.busy_cores is not None:
        spare = float(h.usable_cores) - max(0.0, h.busy_cores - moving)
        return max(1, min((h.worker_count or 0) + int(np.floor(spare + 0.5)), usable))
    spare = float(h.usable_cores) - (h.busy_cores if h.busy_cores is not None else 1.0)
    want = (h.worker_count or 0) + int(np.floor(max(spare, 0.0) + 1e-6))
    return max(1, min(want, max(1, usable - 1)))


def loading_in_main(h: HostCpu, own_busy_cores: float | None, wait_frac: float) -> float:
    """The cores' worth of loading the main process does itself, which workers would take over:
    with no workers running, loading that is CPU work and CPU samples, the share of the window it
    waited for data (one thread loading, about a core while it does), at most this process's own
    busy cores; else 0."""
    if h.worker_count != 0 or h.loader_cpu_bound is not True or h.busy_cores is None or own_busy_cores is None:
        return 0.0
    return max(0.0, min(wait_frac, own_busy_cores))
