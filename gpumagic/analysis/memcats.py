"""What filled memory: the window's peak of live bytes by category, and the largest allocations then.

The categories come from torch's memory profiler, read by the capture with ``--memory``
(:mod:`gpumagic.capture.memcats`; the trace's ``meta["memory_categories"]``, checked by
:mod:`gpumagic.trace.bundled`). A plain Kineto trace has no categories (its ``[memory]`` records
carry only the allocator's totals): then ``categories_missing`` says why. The allocator cache
(reserved but unallocated) is read from the primary GPU's ``[memory]`` records at the peak.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpumagic.analysis.context import Context
from gpumagic.report.metrics import TopAllocation
from gpumagic.trace.model import meta_block

NOT_CAPTURED = ("not captured: profile with %%gpuprofile --memory (gpumagic.profile(memory=True)) for torch's "
                "memory profile by category")
#: The extra category: bytes the caching allocator reserved but no tensor used at the peak.
ALLOCATOR_CACHE = "allocator_cache"


def categories_in_window(meta: dict[str, Any], lo: int, hi: int) -> dict[str, Any] | None:
    """``{"names", "t_ns", "bytes"}`` of the memory profile's rows inside ``[lo, hi]`` (ns from
    the trace origin; the row in force at ``lo`` first), or None without a memory profile."""
    block = meta.get("memory_categories")
    if not isinstance(block, dict):
        return None
    t, rows = block["t_ns"], block["bytes"]
    inside = (t >= lo) & (t <= hi)
    before = np.flatnonzero(t < lo)
    keep = np.flatnonzero(inside)
    if before.size:
        keep = np.concatenate([before[-1:], keep])
    times = np.maximum(t[keep], lo)
    return {"names": list(block["categories"]), "t_ns": times, "bytes": rows[keep]}


def breakdown(ctx: Context) -> dict[str, Any]:
    """The MemoryMetrics fields ``by_category``, ``at_peak`` … ``categories_missing`` (see
    report.metrics): each category's own peak over the window, and what held the memory at the
    window's peak of live bytes (which adds up to that peak)."""
    block = ctx.trace.meta.get("memory_categories")
    if not isinstance(block, dict):
        return {"categories_missing": _missing(ctx)}
    window = categories_in_window(ctx.trace.meta, ctx.lo, ctx.hi)
    if window is None or not len(window["t_ns"]):
        return {"categories_missing": "the memory profile has no moment inside the window",
                "by_category_device": block["device"] or None}
    names, rows = window["names"], window["bytes"]
    totals = rows.sum(axis=1)
    at = int(np.argmax(totals))
    peak_t = int(window["t_ns"][at])
    sizes = [int(b) for b in rows[at]]
    own = [int(b) for b in rows.max(axis=0)]  # the kept rows: each run's fullest moment
    top = None
    exact = block.get("peak_t_ns")
    if (exact is not None and ctx.lo <= exact <= ctx.hi and block.get("peak_bytes") is not None
            and sum(block["peak_bytes"]) >= int(totals[at])):  # the recording's exact peak is the window's
        peak_t, sizes = int(exact), list(block["peak_bytes"])
        own = [max(a, b) for a, b in zip(own, block.get("category_peaks") or own, strict=True)]
        top = [TopAllocation(bytes=a["bytes"], category=a["category"] or "unknown", frame=a["frame"],
                             module=a["module"], op=a["op"],
                             at_ms=None if a["t_ns"] is None else round((a["t_ns"] - ctx.lo) / 1e6, 3))
               for a in block["top"]]
    at_peak = dict(zip(names, sizes, strict=True))
    by_category = dict(zip(names, [max(a, b) for a, b in zip(own, sizes, strict=True)], strict=True))
    cache = _allocator_cache(ctx, peak_t)
    if cache is not None:
        at_peak[ALLOCATOR_CACHE] = cache
        by_category[ALLOCATOR_CACHE] = max(cache, _allocator_cache_peak(ctx))
    return {"by_category": by_category, "at_peak": at_peak, "by_category_device": block["device"] or None,
            "by_category_peak_ms": round((peak_t - ctx.lo) / 1e6, 3), "top_allocations": top}


def _missing(ctx: Context) -> str:
    if meta_block(ctx.trace.meta, "capture").get("profile_memory"):
        return "torch's memory profiler gave no categories for this capture (see the notes)"
    if len(ctx.trace.memory):
        return ("the trace's allocator records carry totals only: " + NOT_CAPTURED.split(": ", 1)[1])
    return NOT_CAPTURED


def _allocator_cache_peak(ctx: Context) -> int:
    """The most reserved − allocated in the primary GPU's allocator records inside the window."""
    mem = ctx.trace.memory
    sel = ctx.memory_records() & (mem.ts_ns >= ctx.lo) & (mem.ts_ns <= ctx.hi) & (mem.reserved >= 0) & (mem.allocated >= 0)
    return int(np.max(mem.reserved[sel] - mem.allocated[sel])) if sel.any() else 0


def _allocator_cache(ctx: Context, t_ns: int) -> int | None:
    """Reserved − allocated in the primary GPU's last allocator record at or before ``t_ns``;
    None without GPU allocator records with reserved totals."""
    mem = ctx.trace.memory
    sel = np.flatnonzero(ctx.memory_records() & (mem.ts_ns <= t_ns) & (mem.reserved >= 0) & (mem.allocated >= 0))
    if not sel.size:
        return None
    i = sel[np.argmax(mem.ts_ns[sel])]
    return max(0, int(mem.reserved[i]) - int(mem.allocated[i]))
