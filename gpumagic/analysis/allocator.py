"""The caching allocator's calls to the driver in each step: memory handed back and allocated again.

PyTorch's CUDA caching allocator keeps the memory tensors free and reuses it ("fast memory
deallocation without device synchronizations": PyTorch CUDA semantics notes, "Memory
management"), so once the first steps have warmed it up a step makes no ``cudaMalloc`` or
``cudaFree`` call. A step that makes both — ``torch.cuda.empty_cache()`` in the loop, retries at
the memory limit, caching turned off — does so again next step: the loop's behaviour, read by
``rules.allocchurn``, and not a cold start (``segments``). Growth alone (``cudaMalloc`` without
``cudaFree``) is the cache warming up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context

#: The driver calls that grow the caching allocator (CUDA Runtime/Driver API, HIP; the expandable
#: segments' ``cuMemCreate``). ``cudaMallocAsync`` is left out: the stream-ordered backend
#: (``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``) calls it for every allocation by design,
#: from the driver's own pool.
MALLOC = frozenset({"cudaMalloc", "cuMemAlloc_v2", "cuMemCreate", "hipMalloc", "hipExtMallocWithFlags"})
#: ... and the calls that hand memory back.
FREE = frozenset({"cudaFree", "cuMemFree_v2", "cuMemRelease", "hipFree"})
#: Steps that both free and allocate are the loop's when at least this share of the steps (and
#: two) do: a cache that warms up once, or grows over the first steps, is the cold start's.
MIN_STEP_SHARE = 0.5


@dataclass(frozen=True)
class Churn:
    """The allocator's driver calls in the steps."""

    steps: int  # steps that both freed and allocated device memory
    recurring: bool  # in at least MIN_STEP_SHARE of the steps (and two): the loop's, not its start
    mallocs_per_step: float  # median over those steps
    frees_per_step: float
    rows: np.ndarray  # the calls in those steps (event rows)
    idle: iv.Intervals  # the GPU's idle time during the calls and until its next work


#: No step both freed and allocated.
NONE = Churn(0, False, 0.0, 0.0, np.zeros(0, np.int64), iv.empty())


def churn(ctx: Context) -> Churn:
    """Per step, the caching allocator's calls to the driver, and the GPU idle time they cost
    (computed once per context): during each call and from its end to the GPU's next work."""
    return ctx.memo("allocator_churn", _find)


def _find(ctx: Context) -> Churn:
    ev, m = ctx.trace.events, ctx.masks
    if ctx.device < 0 or not ctx.step_bounds:
        return NONE
    is_malloc = ctx.host_name_ids(MALLOC.__contains__)
    is_free = ctx.host_name_ids(FREE.__contains__)
    rows = np.flatnonzero(ctx.events_in_window(m["runtime"] & (is_malloc | is_free)[ev.name]))
    if not rows.size:
        return NONE
    t = ev.ts_ns[rows]
    mallocs, frees, chosen = [], [], []
    for lo, hi in ctx.step_bounds:
        a, z = np.searchsorted(t, (lo, hi))
        r = rows[a:z]
        n_m = int(np.count_nonzero(is_malloc[ev.name[r]]))
        n_f = int(np.count_nonzero(is_free[ev.name[r]]))
        if n_m and n_f:
            mallocs.append(n_m)
            frees.append(n_f)
            chosen.append(r)
    if not chosen:
        return NONE
    r = np.concatenate(chosen)
    s, e = ev.ts_ns[r], ev.ts_ns[r] + ev.dur_ns[r]
    busy_s = ctx.busy[0]
    k = np.searchsorted(busy_s, e, side="left")  # the GPU's next work after each call
    nxt = np.where(k < busy_s.size, busy_s[np.minimum(k, busy_s.size - 1)], ctx.hi)
    idle = iv.intersect(iv.union(s, np.maximum(e, nxt)), ctx.gaps.intervals)
    recurring = len(chosen) >= max(2, MIN_STEP_SHARE * len(ctx.step_bounds))
    return Churn(len(chosen), recurring, median_of(mallocs), median_of(frees), np.sort(r), idle)


def churn_idle(ctx: Context) -> iv.Intervals:
    """What ``allocator-churn`` claims (``analysis.gains``)."""
    return churn(ctx).idle


__all__ = ["FREE", "MALLOC", "MIN_STEP_SHARE", "Churn", "churn", "churn_idle"]
