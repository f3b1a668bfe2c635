"""The primary GPU's energy over the window, per step, and the share of it spent idle, from NVML samples.

Two sources, the better first:

- the total-energy counter, ``nvmlDeviceGetTotalEnergyConsumption`` (NVML API reference: "total
  energy consumption for this GPU in millijoules (mJ) since the driver was last reloaded", Volta
  and newer): the energy of a sampling interval is the counter's difference;
- else the power samples, ``nvmlDeviceGetPowerUsage`` (W), integrated with the trapezoid rule.
  NVML's power reading is itself averaged over a short period (on recent drivers about a second,
  NVML reference, ``nvmlDeviceGetPowerUsage``), so this is the coarser estimate.

Each sampling interval's energy is counted in the proportion of it inside the window (power taken
as constant within the interval), and split into busy and idle in the proportion of that part
during which the GPU ran a kernel, copy or memset (``ctx.busy``): an estimate, since a GPU draws
more while busy than while idle within one interval, which makes ``idle_energy_frac`` an upper
bound on the idle share when both are in one interval and exact when the intervals are all busy
or all idle.

Energy per training sample is the energy per step ÷ the samples of one optimizer step on the
primary GPU: the batch size the capture was told (``capture.batch_size``: ``--batch-size``,
``batch_size=``, the Trainer's per-device batch) × the batches it accumulates
(``capture.accumulation_steps``, default 1; the Trainer's ``gradient_accumulation_steps``). The
trace alone holds neither.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.oom import batch_size
from gpumagic.trace.model import meta_block


def fields(ctx: Context) -> dict[str, Any]:
    """``GpuMetrics`` fields ``energy_j``, ``energy_j_per_step``, ``energy_j_per_sample``,
    ``idle_energy_frac``, ``energy_source`` (empty without NVML samples that give energy)."""
    s = ctx.trace.samples
    block = {} if s is None else s.gpu
    if "t_ns" not in block or "device" not in block:
        return {}
    devices = distinct(np.asarray(block["device"]))
    device = ctx.device if ctx.device >= 0 else (int(devices[0]) if devices.size == 1 else None)
    if device is None:
        return {}
    sel = np.asarray(block["device"]) == device
    t = np.asarray(block["t_ns"], dtype=np.int64)[sel]
    order = np.argsort(t, kind="stable")
    t = t[order]
    per_interval, source, times = None, None, t
    if "energy_mj" in block:
        e = np.asarray(block["energy_mj"], dtype=np.float64)[sel][order]
        ok = e >= 0  # the sampler writes -1 where a read failed
        # a counter only grows (a driver reload would reset it)
        if ok.sum() >= 2 and np.all(np.diff(e[ok]) >= 0):
            per_interval, source, times = np.diff(e[ok]) / 1000.0, "counter", t[ok]
    if per_interval is None and "power_w" in block:
        p = np.asarray(block["power_w"], dtype=np.float64)[sel][order]
        ok = p >= 0
        if ok.sum() >= 2:
            p, times = p[ok], t[ok]
            per_interval, source = (p[1:] + p[:-1]) / 2 * np.diff(times) / 1e9, "power"
    if per_interval is None:
        return {}
    t = times
    lo, hi = t[:-1], t[1:]
    length = (hi - lo).astype(np.float64)
    a, b = np.maximum(lo, ctx.lo), np.minimum(hi, ctx.hi)
    inside = np.clip(b - a, 0, None).astype(np.float64)
    keep = length > 0
    share = np.zeros_like(length)
    share[keep] = inside[keep] / length[keep]
    energy = per_interval * share
    total = float(energy.sum())
    if not total > 0:
        return {"energy_j": 0.0 if source else None, "energy_source": source}
    busy = iv.measure_in(ctx.busy, a, np.maximum(a, b)).astype(np.float64)
    idle = np.zeros_like(inside)
    held = inside > 0
    idle[held] = 1.0 - np.minimum(busy[held] / inside[held], 1.0)
    steps = len(ctx.step_bounds)
    batch = batch_size(ctx.trace.meta)
    if batch is not None:  # one optimizer step accumulates the gradients of this many batches
        k = meta_block(ctx.trace.meta, "capture").get("accumulation_steps", 1)
        batch = batch * k if type(k) is int and k >= 1 else None
    return {"energy_j": round(total, 4), "energy_j_per_step": round(total / steps, 4) if steps else None,
            "energy_j_per_sample": round(total / steps / batch, 6) if steps and batch else None,
            "idle_energy_frac": round(float((energy * idle).sum()) / total, 4), "energy_source": source}
