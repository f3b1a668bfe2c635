"""Host↔device copies by size: the small ones (``metrics["small_copies"]``, ``small-transfers``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.report.metrics import SmallCopyDirection, SmallCopyMetrics

#: A copy of at most this many bytes is "small". Each copy pays a fixed cost — the runtime call,
#: a DMA descriptor, often a stream sync — of several µs; at 64 KiB a PCIe 3/4 link (12–25 GB/s)
#: moves the data itself in 2.5–5 µs, the same order, so below it the fixed cost dominates and
#: batching pays (CUDA C++ Best Practices Guide, "Data Transfer Between Host and Device":
#: "batching many small transfers into one larger transfer performs significantly better").
#: 64 KB is also the size Nsight Systems' expert rules use, as the issue reports.
SMALL_COPY_BYTES = 64 * 1024
#: Size classes of the distribution, in bytes (upper bounds).
SIZE_CLASSES = (1024, 8 * 1024, SMALL_COPY_BYTES)


def small_copies(ctx: Context, groups: dict[tuple[str, str], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """From ``metrics.copy_groups(ctx)``, per direction (``HtoD``, ``DtoH``): the copies of ≤ 64 KiB — their rows, count, bytes,
    size statistics, GPU time, the host time of the calls that issued them, and ``cost``: the
    union of both, clipped to the window, less the time the GPU was busy with other work (a call
    that waits while the GPU works — a synchronous copy behind queued kernels — costs the step
    nothing more; ``host-sync`` judges such waits)."""
    ev = ctx.trace.events
    out: dict[str, dict[str, Any]] = {}
    for (direction, _mem), g in groups.items():
        if direction not in ("HtoD", "DtoH"):
            continue
        idx = g["idx"][(ev.nbytes[g["idx"]] >= 0) & (ev.nbytes[g["idx"]] <= SMALL_COPY_BYTES)]
        if idx.size:
            out.setdefault(direction, {"idx": []})["idx"].append(idx)
    for row in out.values():
        idx = np.concatenate(row["idx"])
        sizes = ev.nbytes[idx]
        gpu = iv.clip(iv.union(ev.ts_ns[idx], ev.ts_ns[idx] + ev.dur_ns[idx]), ctx.lo, ctx.hi)
        calls = iv.clip(iv.union(*_call_spans(ctx, idx)), ctx.lo, ctx.hi)
        row.update(idx=idx, count=int(idx.size), bytes=int(sizes.sum()), median_bytes=int(median_of(sizes)),
                   max_bytes=int(sizes.max()), sizes=sizes, gpu_ns=iv.total(gpu), host_ns=iv.total(calls),
                   cost=iv.subtract(iv.merge(gpu, calls), iv.subtract(ctx.busy, gpu)))
    return out


def _call_spans(ctx: Context, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The host time of the calls that issued copies ``idx`` (matched by correlation id). A call
    that returns only after its copy finished (a synchronous copy) counts from the copy's start:
    before it, the call was waiting for earlier GPU work, which is ``host-sync``'s business."""
    ev = ctx.trace.events
    calls = np.flatnonzero(ctx.masks["runtime"] & (ev.corr >= 0) & np.isin(ev.corr, ev.corr[idx]))
    if calls.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    copy_of = dict(zip(ev.corr[idx].tolist(), idx.tolist(), strict=False))
    copy = np.array([copy_of[c] for c in ev.corr[calls].tolist()])
    c_s, c_e = ev.ts_ns[calls], ev.ts_ns[calls] + ev.dur_ns[calls]
    g_s, g_e = ev.ts_ns[copy], ev.ts_ns[copy] + ev.dur_ns[copy]
    blocking = c_e >= g_e
    return np.where(blocking, np.clip(g_s, c_s, c_e), c_s), c_e


def metrics(ctx: Context, groups: dict[tuple[str, str], dict[str, Any]]) -> SmallCopyMetrics:
    """``metrics.small_copies``: per direction, the count, size distribution and cost of the
    host↔device copies of ≤ 64 KiB, as shares of the window on the host and on the GPU."""
    steps = max(len(ctx.step_bounds), 1)
    directions: dict[str, SmallCopyDirection] = {}
    for direction, r in sorted(small_copies(ctx, groups).items()):
        classes = np.searchsorted(np.array(SIZE_CLASSES), r["sizes"], side="left")
        directions[direction] = SmallCopyDirection(
            count=r["count"], per_step=round(r["count"] / steps, 2), bytes=r["bytes"],
            median_bytes=r["median_bytes"], max_bytes=r["max_bytes"],
            size_classes={f"<={c // 1024}KiB" if c >= 1024 else f"<={c}B": int(np.count_nonzero(classes == i))
                          for i, c in enumerate(SIZE_CLASSES)},
            gpu_ms=round(r["gpu_ns"] / 1e6, 4), host_ms=round(r["host_ns"] / 1e6, 4),
            gpu_frac=round(ctx.frac(r["gpu_ns"]), 4), host_frac=round(ctx.frac(r["host_ns"]), 4),
            cost_frac=round(ctx.frac(iv.total(r["cost"])), 4),  # host ∪ GPU time, the GPU busy with nothing else
        )
    return SmallCopyMetrics(max_bytes=SMALL_COPY_BYTES, directions=directions)
