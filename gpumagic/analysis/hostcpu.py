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

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context

#: A data-loader wait is CPU work when the loading side (the main process with
#: ``num_workers=0``, else the workers) keeps at least half a core busy per loading process
#: during it (gpumagic default: below that, most of the wait is I/O, sleeps or locks).
LOADER_CPU_SHARE = 0.5


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
    if "host_cpu" not in ctx.cache:
        ctx.cache["host_cpu"] = _host_cpu(ctx)
    return ctx.cache["host_cpu"]


def _host_cpu(ctx: Context) -> HostCpu:
    machine = ctx.trace.meta.get("machine") or {}
    usable = machine.get("usable_cores")
    source = machine.get("usable_cores_source") or ("unknown" if usable is None else "cpu_count")
    if usable is None and machine.get("cpu_count"):  # a bundle from before usable cores were recorded
        usable, source = float(machine["cpu_count"]), "cpu_count"
    cpu = ctx.trace.samples.cpu if ctx.trace.samples is not None else {}
    t = np.asarray(cpu.get("t_ns", np.zeros(0)))
    sel = (t >= ctx.lo) & (t <= ctx.hi) if t.size else np.zeros(0, dtype=bool)
    busy = _busy_cores(cpu, sel, machine) if sel.any() else None
    saturation = None if busy is None or not usable else round(min(1.0, busy / float(usable)), 4)
    workers = int(np.max(np.asarray(cpu["worker_count"])[sel])) if sel.any() and "worker_count" in cpu else None
    bound, how = _loader_cpu_bound(ctx, cpu, t, workers)
    return HostCpu(usable, source, int(sel.sum()), None if busy is None else round(busy, 3), saturation, bound, how, workers)


def _busy_cores(cpu: dict, sel: np.ndarray, machine: dict) -> float | None:
    affinity = machine.get("cpu_affinity")
    quota = machine.get("cpu_quota_cores")
    per_core = np.asarray(cpu.get("per_core", np.zeros((0, 0))), dtype=np.float64)
    if quota is not None and affinity and quota < len(affinity) and "main" in cpu:
        own = np.asarray(cpu["main"], dtype=np.float64)[sel] + np.asarray(cpu.get("workers", 0 * cpu["main"]),
                                                                          dtype=np.float64)[sel]
        return float(own.mean()) / 100
    if per_core.ndim == 2 and per_core.shape[0] == sel.size and per_core.shape[1]:
        cols = [c for c in (affinity or range(per_core.shape[1])) if c < per_core.shape[1]]
        return float(per_core[sel][:, cols].sum(axis=1).mean()) / 100
    if "total" in cpu and machine.get("cpu_count"):
        return float(np.asarray(cpu["total"], dtype=np.float64)[sel].mean()) / 100 * machine["cpu_count"]
    return None


def _loader_cpu_bound(ctx: Context, cpu: dict, t: np.ndarray, workers: int | None) -> tuple[bool | None, str]:
    """Is the data-loader wait CPU work? From the samples taken during the waits (the loading
    processes' CPU per process), else from how much of the wait main-thread operators cover."""
    waits = ctx.cat_union["dataloader"]
    if iv.total(waits) == 0:
        return None, ""
    if t.size and "main" in cpu:
        k = np.searchsorted(waits[0], t, side="right") - 1
        during = (k >= 0) & (t < waits[1][np.maximum(k, 0)])
        if during.any():
            if workers:
                per_worker = np.asarray(cpu.get("workers"), dtype=np.float64)[during].mean() / 100 / workers
                return bool(per_worker >= LOADER_CPU_SHARE), "samples"
            main = np.asarray(cpu["main"], dtype=np.float64)[during].mean() / 100
            return bool(main >= LOADER_CPU_SHARE), "samples"
    ev, m = ctx.trace.events, ctx.masks
    ops = ctx.intervals(ctx.events_in_window((ev.lane == ctx.main_lane) & (m["cpu_op"] | m["python"])
                                             & ~m["name_dataloader"]))
    covered = iv.total(iv.intersect(ops, waits)) / iv.total(waits)
    if covered >= LOADER_CPU_SHARE:
        return True, "main-thread ops"
    return None, ""


def suggested_workers(h: HostCpu) -> int | None:
    """``num_workers`` the spare usable cores allow: the workers already running plus one per
    idle usable core (busy cores from the samples; without samples the main process is assumed
    to keep one core busy), at least 1 and never more than ``usable − 1`` (the main process
    needs a core too; with one usable core, 1). None when the usable cores are unknown."""
    if not h.usable_cores:
        return None
    usable = int(np.floor(float(h.usable_cores) + 1e-6))
    spare = float(h.usable_cores) - (h.busy_cores if h.busy_cores is not None else 1.0)
    want = (h.worker_count or 0) + int(np.floor(max(spare, 0.0) + 1e-6))
    return max(1, min(want, max(1, usable - 1)))
