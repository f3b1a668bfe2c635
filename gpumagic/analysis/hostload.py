"""Who kept the machine busy during the window: this process tree or other processes, and what
else could change a step time (GPU clocks, other GPU processes, versions, capture options).

Everything here is read from a gpumagic bundle's samples and facts; a plain Kineto trace has
none of them and every value is None. The figures (docs/metrics.md, ``metrics.host`` and
``metrics.conditions``):

- ``own_busy_cores``: cores' worth of CPU this process and its DataLoader workers used (mean over
  the window's samples; with the children that exited during it, the samples' ``reaped``: the
  workers of an epoch without ``persistent_workers``), split into ``own_main_thread_cores`` (the
  main thread), ``own_other_threads_cores`` (intra-op and other threads of the main process) and
  ``own_workers_cores`` (the workers alive at a sample).
- ``other_busy_cores``: busy usable cores that were not this process tree's: other processes
  (``/proc/stat`` busy time of the usable cores less the tree's own ticks). Under a cgroup
  quota smaller than the cores, the cores' busy time includes other cgroups' work and says
  nothing of what this run could get: None.
- ``loader_runqueue_wait_frac``: share of the window each loading thread (the main thread with
  ``num_workers=0``, else each worker) spent runnable but waiting for a core (schedstat);
  ``main_runqueue_wait_frac`` the same for the main thread whatever the loader.
- ``load_average_1m``: the kernel's 1-minute load average, highest reading in the window.
- ``shared_machine``: other processes used at least :data:`SHARED_MIN_CORES` cores and
  :data:`SHARED_MIN_SHARE` of the usable ones.
- ``gpu_other_processes``: most compute processes other than this one seen on the primary GPU.
- ``gpu_throttle_reasons``: NVML slowdown reasons seen on the primary GPU (power cap, thermal...).
- ``gpu_sm_clock_mhz``: median SM clock of the primary GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpumagic.analysis.context import Context
from gpumagic.analysis.hostcpu import host_cpu, window_samples
from gpumagic.trace.model import meta_block

#: Other processes "matter" when they keep at least half a core busy and at least a quarter of
#: the usable cores (our choice: below that a core is free most of the time, and a step time
#: moves by less than the run-to-run noise of a quiet machine).
SHARED_MIN_CORES = 0.5
SHARED_MIN_SHARE = 0.25
#: The main thread runnable without a core for this share of the window or more
#: (``main_runqueue_wait_frac``) makes the machine busy for this run (TensorBoard profiler plugin's
#: 5 % line for a bottleneck worth naming): ``host-contended`` fires from it, ``step-outliers`` and
#: comparisons read step times with care (:func:`busy_machine`).
BUSY_WAIT = 0.05
#: NVML slowdown bits (a copy of ``capture.nvml.THROTTLE_BITS``: the analysis may not import capture).
THROTTLE_BITS = {0x4: "power cap", 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
                 0x40: "hardware thermal slowdown", 0x80: "power brake"}
#: Capture options that change what the profiler costs per operator (and so step times);
#: ``modules`` (time per nn.Module) adds a range per module call.
COST_OPTIONS = ("record_shapes", "with_flops", "with_stack", "profile_memory", "modules")


def busy_machine(host: Any) -> bool:
    """Whether a run's ``metrics.host`` (or None) says its machine was busy: other processes used
    enough of it to call it shared (``shared_machine``), or, where their load is unknown (no
    split of the busy cores, as under a cgroup quota smaller than the cores), the main thread
    waited for a core :data:`BUSY_WAIT` of the window or more. With the other processes' load
    known and under the shared line, a wait for a core is this process's own threads and
    DataLoader workers taking turns: four workers beside the loop on 2 cores kept its thread
    waiting 15 % of the window, and a comparison read a 3× faster loop as "no clear change, the
    machine was busy"."""
    if getattr(host, "shared_machine", None):
        return True
    wait = getattr(host, "main_runqueue_wait_frac", None)
    return wait is not None and wait >= BUSY_WAIT and getattr(host, "other_busy_cores", None) is None


def _in_window(ctx: Context, block: dict) -> np.ndarray:
    return window_samples(ctx, block.get("t_ns", np.zeros(0)))


def _mean_cores(block: dict, key: str, sel: np.ndarray) -> float | None:
    if key not in block or not sel.any():
        return None
    x = np.asarray(block[key], dtype=np.float64)[sel]
    x = x[x >= 0]
    return round(float(x.mean()) / 100, 3) if x.size else None


def host_state(ctx: Context) -> dict[str, Any]:
    """The new ``metrics.host`` keys (see the module docstring)."""
    samples = ctx.trace.samples
    cpu = samples.cpu if samples is not None else {}
    gpu = samples.gpu if samples is not None else {}
    sel = _in_window(ctx, cpu)
    h = host_cpu(ctx)
    machine = meta_block(ctx.trace.meta, "machine")
    main, workers = _mean_cores(cpu, "main", sel), _mean_cores(cpu, "workers", sel)
    reaped = _mean_cores(cpu, "reaped", sel)  # children that exited in the window: workers of an epoch
    own = None if main is None else round(main + (workers or 0.0) + (reaped or 0.0), 3)
    thread = _mean_cores(cpu, "main_thread", sel)
    quota, affinity = machine.get("cpu_quota_cores"), machine.get("cpu_affinity")
    under_quota = quota is not None and affinity and quota < len(affinity)
    other = None
    if h.busy_cores is not None and own is not None and not under_quota:
        other = round(max(0.0, h.busy_cores - own), 3)
    usable = h.usable_cores
    shared = None if other is None or not usable else bool(
        other >= SHARED_MIN_CORES and other >= SHARED_MIN_SHARE * float(usable))
    out: dict[str, Any] = {
        "own_busy_cores": own,
        "own_main_thread_cores": thread,
        "own_other_threads_cores": None if thread is None or main is None else round(max(0.0, main - thread), 3),
        "own_workers_cores": workers,
        "other_busy_cores": other,
        "shared_machine": shared,
        "loader_runqueue_wait_frac": _runqueue_wait(cpu, sel, h.worker_count),
        "main_runqueue_wait_frac": _runqueue_wait(cpu, sel, None),
        "load_average_1m": _max(cpu, "loadavg_1m", sel),
    }
    out.update(_gpu_state(ctx, gpu))
    return out


def _runqueue_wait(cpu: dict, sel: np.ndarray, workers: int | None) -> float | None:
    key = "workers_wait" if workers else "main_wait"
    if key not in cpu or not sel.any():
        return None
    x = np.asarray(cpu[key], dtype=np.float64)[sel]
    x = x[x >= 0]
    return round(float(x.mean()) / 100 / (workers or 1), 4) if x.size else None


def _max(block: dict, key: str, sel: np.ndarray) -> float | None:
    if key not in block or not sel.any():
        return None
    x = np.asarray(block[key], dtype=np.float64)[sel]
    x = x[x >= 0]
    return round(float(x.max()), 2) if x.size else None


def _gpu_state(ctx: Context, gpu: dict) -> dict[str, Any]:
    out: dict[str, Any] = {"gpu_other_processes": None, "gpu_throttle_reasons": None, "gpu_sm_clock_mhz": None}
    sel = _in_window(ctx, gpu)
    if not sel.any():
        return out
    if "device" in gpu and ctx.device >= 0:
        sel &= np.asarray(gpu["device"]) == ctx.device
    if "other_processes" in gpu:
        x = np.asarray(gpu["other_processes"])[sel]
        x = x[x >= 0]
        out["gpu_other_processes"] = int(x.max()) if x.size else None
    if "throttle_reasons" in gpu:
        x = np.asarray(gpu["throttle_reasons"])[sel]
        masks = [int(v) for v in x if v >= 0]
        if masks:
            seen = 0
            for m in masks:
                seen |= m
            out["gpu_throttle_reasons"] = [name for bit, name in THROTTLE_BITS.items() if seen & bit]
    if "sm_clock_mhz" in gpu:
        x = np.sort(np.asarray(gpu["sm_clock_mhz"], dtype=np.float64)[sel])
        x = x[x >= 0]
        out["gpu_sm_clock_mhz"] = float(x[x.size // 2]) if x.size else None
    return out


def run_conditions(ctx: Context) -> dict[str, Any]:
    """``metrics.conditions``: library versions and the capture options that change what the
    profiler costs (from the bundle; None each in a plain trace)."""
    versions, capture, machine = (meta_block(ctx.trace.meta, k) for k in ("versions", "capture", "machine"))
    return {
        "torch": _text(versions.get("torch")),
        "cuda": _text(machine.get("cuda")),
        "gpumagic": _text(versions.get("gpumagic")),
        "capture_options": sorted(k for k in COST_OPTIONS if capture.get(k) is True) if capture else None,
    }


def _text(x: Any) -> str | None:
    return x[:80] if isinstance(x, str) and x else None
