"""How much of some GPU kernels' time can a fix that makes them faster save at most?

A fix that shortens GPU work (a faster dtype, TF32, fusion, a fused attention kernel) saves time
only where that work held something up. The GPU works in *runs* (busy stretches between idle
gaps). A run that ends in a gap the host caused (the next work was launched after the run ended:
``Gaps.host_ns`` > 0), while no host call was blocked on the GPU at that moment (a sync, a
device-to-pageable copy, any runtime call longer than the launch-latency bound that spans the
run's end), held nothing up: made shorter, it only lengthens the GPU's wait for the host, and
the host launches its next work when it would have anyway. Every other run — one followed by
queued work, by a launch already made, by a host blocked on it, or by the window's end — may
bound the step, and all its time counts. So the saving of a fix on kernels ``rows`` is at most
their time in those runs (:func:`bounding_ns`) × the share the fix removes: an upper bound, as
small as the evidence allows on a launch- or CPU-bound step, unchanged on a GPU-bound one.
"""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import LAUNCH_LATENCY_MAX_NS, Context
from gpumagic.analysis.metrics import sync_costs

#: The gain of a fix that shortens kernels is said to be capped (its ``gain_method`` says so) when
#: their bounding time is under 90 % of their time: above it the step is GPU-bound and the cap
#: changes little.
CAP_SHARE = 0.9


def slack_runs(ctx: Context) -> iv.Intervals:
    """The primary GPU's runs that held nothing up (see the module docstring); computed once per context."""
    return ctx.memo("slack_runs", _slack_runs)


def _slack_runs(ctx: Context) -> iv.Intervals:
    out = iv.empty()
    g = ctx.gaps
    if ctx.device >= 0 and len(g):
        ev, m = ctx.trace.events, ctx.masks
        # host calls that were waiting on the GPU: the blocking syncs and long runtime calls
        costs = sync_costs(ctx)
        long_calls = np.flatnonzero(ctx.events_in_window(m["host"] & m["runtime"] & (ev.dur_ns > LAUNCH_LATENCY_MAX_NS)))
        calls = distinct(np.concatenate((costs.idx, long_calls), axis=None))  # np.union1d, without numpy.ma
        cs, ce = ev.ts_ns[calls], ev.ts_ns[calls] + ev.dur_ns[calls]
        run_s, run_e = ctx.busy
        late = g.host_ns > 0
        keep = np.zeros(run_e.size, bool)
        ends = g.start_ns[late]  # a host-caused gap starts where a run ends
        j = np.searchsorted(run_e, ends)
        ok = (j < run_e.size) & (run_e[np.minimum(j, run_e.size - 1)] == ends)
        keep[j[ok]] = True
        # a host call spanning the run's end (start < end <= call end + launch delay) was blocked on
        # it: that run bounds the host
        bs, be = iv.union(cs, ce + LAUNCH_LATENCY_MAX_NS)
        k = np.searchsorted(bs, run_e, side="left") - 1
        blocked = (k >= 0) & (be[np.maximum(k, 0)] >= run_e) if bs.size else np.zeros(run_e.size, bool)
        keep &= ~blocked
        out = (run_s[keep], run_e[keep])
    return out


def bounding_ns(ctx: Context, rows: np.ndarray) -> int:
    """Time (ns, within the window) of the GPU events ``rows`` outside :func:`slack_runs`."""
    if rows.size == 0:
        return 0
    ev = ctx.trace.events
    own = iv.clip(iv.union(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows]), ctx.lo, ctx.hi)
    return int(iv.total(iv.subtract(own, slack_runs(ctx))))


def gpu_time_gain(ctx: Context, rows: np.ndarray, saved_share: float, method: str) -> tuple[float, str]:
    """(gain, gain_method) of a fix that makes the GPU events ``rows`` ``saved_share`` shorter:
    their time × ``saved_share``, at most their :func:`bounding_ns` × ``saved_share``; the
    method names the cap when it binds."""
    ev = ctx.trace.events
    own = iv.clip(iv.union(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows]), ctx.lo, ctx.hi)
    total = iv.total(own)
    bound = bounding_ns(ctx, rows)
    gain = ctx.frac(min(total, bound)) * saved_share
    if bound < CAP_SHARE * total:
        method += (f"; capped at the {bound / 1e6:.2f} ms of them that can bound the steps: after the rest the "
                   "GPU waited for the host's next launch, so shorter kernels there save nothing")
    return gain, method
