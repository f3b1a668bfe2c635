"""What bounds each step: its critical path (``metrics.critical_path``, docs/metrics.md).

The critical path of a step is the chain of work that, made faster, would make the step
shorter. Found by walking back from the step's end, each link to what the current one waited
for (after HolisticTraceAnalysis's critical-path analysis, which builds the same dependencies
— host op order, launch → kernel, stream order, sync → GPU, event waits — as a graph):

::

    host   ██data██ ▏launch▕ ·· ▏launch▕ ········· ▏sync ████████▕ ██ host ██
    GPU                  ███ kernel ███████ kernel ████▏
                          ▲ waited for its launch     ▲ the sync waited for the kernel

- a GPU event (kernel, copy, memset, on the primary device) waited for whichever came last:
  the previous event on its stream (the GPU was busy: a GPU link), its launch (the host was
  late: the path goes to the host at the launch call, via its correlation id), or, when it
  started more than the launch delay after both, another stream: the device's event that ended
  last before it, when that one is on another stream and the host issued a stream wait
  (``cudaStreamWaitEvent``) since the stream's previous launch or that event ended within the
  launch delay (30 µs) of its start (queued work on a free stream starts at once unless it
  waits on an event); else the delay is ``other``;
- on the host (the main thread and every thread that launches GPU work, taken together), the
  path runs back in time through what the host did, until a blocking sync call that held the
  host while the GPU still had queued work (``metrics.syncs``): there it goes to the GPU event
  that the sync waited for (the last one to end before the sync returned);
- a step starts at its ``ProfilerStep#`` start; the walk stops there.

The path covers the step from its start to its end with no overlap, so its length is the
step's duration and its links' shares add up to 1. Each link is booked as one of
:data:`KINDS`: ``gpu_compute``/``gpu_comm``/``gpu_copy`` (the GPU event itself),
``host_launch`` (runtime/driver calls, and the launch delay, up to
``context.LAUNCH_LATENCY_MAX_NS``, before a kernel that waited for its launch),
``host_compute`` (operators, Python, annotations, and host time with nothing recorded: the
thread runs Python between operators, since a wait for the GPU would be a recorded runtime
call; reported also as ``host_unrecorded_ms``), ``data`` (the DataLoader's spans),
``sync_wait`` (host time in a blocking call while the GPU had queued work, when the trace does
not say which GPU event it waited for; the delay between a GPU event's end and the sync's
return), ``other`` (GPU delays the trace does not explain: queued work on a free stream that
started late with no event to wait on, a delay after a GPU event before the step's end).

Where the trace lacks what a dependency needs, :func:`critical_path` says so in ``notes`` and
books the time as what is known, never a GPU wait as host work: without correlation ids, a GPU
event that started after a gap on its stream is taken to follow the host at its start; without
sync calls, host time inside runtime calls longer than the launch-latency bound while the GPU
had queued work is ``sync_wait``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import LAUNCH_LATENCY_MAX_NS, Context

KINDS = ("gpu_compute", "gpu_comm", "gpu_copy", "host_launch", "host_compute", "data", "sync_wait", "other")
_K = {k: i for i, k in enumerate(KINDS)}
#: The header's phrase for each group of kinds ("bounded by: host Python and launches, 82 %").
GROUPS = (("GPU compute", ("gpu_compute",)), ("GPU communication", ("gpu_comm",)), ("GPU copies", ("gpu_copy",)),
          ("host Python and launches", ("host_compute", "host_launch")), ("data loading", ("data",)),
          ("host waiting on syncs", ("sync_wait",)), ("GPU waits the trace does not explain", ("other",)))
#: Which kinds of critical-path time each finding's fix can shorten (its gain is capped by
#: their share of the path, see :func:`cap`).
SHORTENS = {
    "cpu-bound": ("host_compute", "host_launch"),
    "launch-bound": ("host_compute", "host_launch"),
    "dataloader-bound": ("data",),
    "host-sync": ("host_compute", "host_launch", "sync_wait", "data"),
    "gpu-idle-gaps": ("host_launch", "host_compute", "data", "sync_wait", "other"),
}
TOP_LINKS = 10
_HOST = -1  # a path segment on the host: its kind is read from the host's timeline
MS = 1e6


def _ms(ns: float) -> float:
    return round(float(ns) / MS, 4)


@dataclass
class Path:
    """The critical path of every step as segments (start, end, kind index or ``_HOST``, and
    the event row for GPU and host-call links, -1 otherwise), with the notes on what the trace
    lacked."""

    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    row: np.ndarray
    step: np.ndarray
    notes: list[str]
    links: dict[str, int]


def critical_path(ctx: Context, syncs: Any, queued: iv.Intervals) -> Path:
    """The critical path of each step. ``syncs``: ``metrics.sync_costs(ctx)`` (the blocking
    calls, ``idx``, and how long each blocked the host while the GPU had queued work,
    ``blocked_ns``); ``queued``: ``metrics.queued_work(ctx)``."""
    return _walk_all(ctx, syncs, queued)


class _Gpu:
    """The primary device's events with, per event, what it waited for (vectorised)."""

    def __init__(self, ctx: Context, notes: list[str]) -> None:
        ev, m = ctx.trace.events, ctx.masks
        rows = np.flatnonzero(m["gpu"] & ctx.on_device) if ctx.device >= 0 else np.zeros(0, np.int64)
        self.rows = rows
        self.ts = ev.ts_ns[rows]
        self.end = self.ts + ev.dur_ns[rows]
        kind = np.full(rows.size, _K["gpu_compute"], np.int8)
        kind[m["name_nccl"][rows] & m["kernel"][rows]] = _K["gpu_comm"]
        kind[~m["kernel"][rows]] = _K["gpu_copy"]
        self.kind = kind
        n = rows.size
        # stream order: by (stream, start); prev = the previous event on the same stream
        order = np.lexsort((self.ts, ev.stream[rows]))
        pos = np.empty(n, np.int64)
        pos[order] = np.arange(n)
        same = np.zeros(n, bool)
        if n:
            same[1:] = ev.stream[rows][order][1:] == ev.stream[rows][order][:-1]
        prev = np.full(n, -1, np.int64)
        prev[order[1:][same[1:]]] = order[:-1][same[1:]]
        e_prev = np.where(prev >= 0, self.end[np.maximum(prev, 0)], np.iinfo(np.int64).min)
        assert ctx.launch_ts is not None and ctx.launch_row is not None  # build_context sets them
        launch = ctx.launch_ts[rows] if n else np.zeros(0, np.int64)
        self.launch_row = ctx.launch_row[rows] if n else np.zeros(0, np.int64)
        known = launch >= 0
        if n and not known.any():
            notes.append("No correlation ids link GPU work to its launches: a GPU event that started after a gap "
                         "on its stream is taken to follow the host at its start.")
        # 0 = stream predecessor, 1 = its launch, 2 = another stream's event, 3 = the host at its start
        close = (prev >= 0) & (self.ts - np.where(prev >= 0, e_prev, 0) <= LAUNCH_LATENCY_MAX_NS)
        pred = np.where(known, np.where(e_prev >= launch, 0, 1), np.where(close, 0, 3))
        ready = np.maximum(e_prev, launch)
        late = known & (self.ts - ready > LAUNCH_LATENCY_MAX_NS)
        cross = np.full(n, -1, np.int64)
        if late.any():
            waits = np.sort(ev.ts_ns[m["name_stream_wait"] & m["runtime"]])
            prev_launch = np.where(prev >= 0, launch[np.maximum(prev, 0)], -1)
            w = np.searchsorted(waits, launch, side="right") - 1
            has_wait = (w >= 0) & (waits[np.maximum(w, 0)] >= prev_launch) if waits.size else np.zeros(n, bool)
            # the latest event on another stream that ended before it started
            stream = ev.stream[rows]
            by_end = np.argsort(self.end, kind="stable")
            j = np.searchsorted(self.end[by_end], self.ts, side="right") - 1
            cand = np.where(j >= 0, by_end[np.maximum(j, 0)], -1)
            c = np.maximum(cand, 0)
            ok = late & (cand >= 0) & (stream[c] != stream) & (self.end[c] > ready)
            # a recorded stream wait says so; without one, only a release within the launch delay
            ok &= has_wait | (self.ts - self.end[c] <= LAUNCH_LATENCY_MAX_NS)
            cross = np.where(ok, cand, -1)
            pred = np.where(ok, 2, pred)
        self.pred, self.prev, self.cross, self.launch = pred, prev, cross, launch
        # runs of stream links: from any event, the run's head is the latest event at or before
        # it in stream order whose predecessor is not the stream
        head_flag = pred[order] != 0
        if n:
            head_flag[0] = True
        head_pos = np.maximum.accumulate(np.where(head_flag, np.arange(n), 0)) if n else np.zeros(0, np.int64)
        self.order, self.pos, self.head_pos = order, pos, head_pos
        self.by_end = np.argsort(self.end, kind="stable")
        self.ends_sorted = self.end[self.by_end]

    def last_ending_by(self, t: int) -> int:
        """Index (into ``rows``) of the event that ended last at or before ``t``, -1 if none."""
        j = int(np.searchsorted(self.ends_sorted, t, side="right")) - 1
        return int(self.by_end[j]) if j >= 0 else -1


#: A sync call blocked the host when it held it this long while the GPU had queued work
#: (``metrics.SYNC_MIN_BLOCKED_NS``: less than one kernel launch).
SYNC_MIN_BLOCKED_NS = 10_000


def _walk_all(ctx: Context, costs: Any, queued: iv.Intervals) -> Path:
    notes: list[str] = []
    g = _Gpu(ctx, notes)
    ev = ctx.trace.events
    sync_s = sync_e = sync_g = np.zeros(0, np.int64)
    if ctx.device >= 0 and costs.idx.size:
        blocking = costs.blocked_ns >= SYNC_MIN_BLOCKED_NS
        rows = costs.idx[blocking]
        sync_s, sync_e = ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows]
        j = np.searchsorted(g.ends_sorted, sync_e, side="right") - 1
        cand = np.where(j >= 0, g.by_end[np.maximum(j, 0)], -1)
        ok = (cand >= 0) & (g.end[np.maximum(cand, 0)] > sync_s)
        order = np.argsort(sync_e[ok], kind="stable")
        sync_s, sync_e, sync_g = sync_s[ok][order], sync_e[ok][order], cand[ok][order]
    elif ctx.device >= 0:
        notes.append("No blocking sync calls in the trace: host time in long runtime calls while the GPU had "
                     "queued work is booked as waiting on the GPU (sync_wait), not as host work.")
    steps = ctx.step_bounds or [(ctx.lo, ctx.hi)]
    host_end = _host_step_ends(ctx, steps)
    segs: list[tuple[np.ndarray, ...]] = []
    links = dict.fromkeys(("gpu_stream", "launch", "cross_stream", "sync", "unlinked"), 0)
    for i, (lo, hi) in enumerate(steps):
        _walk(g, lo, hi, host_end[i], sync_s, sync_e, sync_g, segs, links, i)
    if segs:
        s, e, k, r, st = (np.concatenate([x[j] for x in segs]) for j in range(5))
    else:
        s = e = r = st = np.zeros(0, np.int64)
        k = np.zeros(0, np.int8)
    return Path(s, e, k.astype(np.int8), r, st, notes, links)


def _host_step_ends(ctx: Context, steps) -> list[int]:
    """Where each step's host part ends: its ``ProfilerStep#`` annotation's end (the window's
    end without steps)."""
    ev, m = ctx.trace.events, ctx.masks
    if not ctx.step_bounds:
        host = ctx.events_in_window(m["host"])
        return [int((ev.ts_ns[host] + ev.dur_ns[host]).max()) if host.any() else ctx.lo]
    rows = np.flatnonzero(m["name_step"] & m["host"])
    return [min(int(ev.ts_ns[r] + ev.dur_ns[r]), hi) for r, (_, hi) in zip(rows.tolist(), steps)]


def _seg(segs, s, e, k, r, step):
    s = np.atleast_1d(np.asarray(s, np.int64))
    segs.append((s, np.atleast_1d(np.asarray(e, np.int64)), np.broadcast_to(np.asarray(k, np.int8), s.shape).copy(),
                 np.broadcast_to(np.asarray(r, np.int64), s.shape).copy(), np.full(s.size, step, np.int64)))


def _walk(g: _Gpu, lo: int, hi: int, host_end: int, sync_s, sync_e, sync_g, segs, links, step: int) -> None:
    """Walk one step back from its end; segments are clipped to ``[lo, hi)`` afterwards."""
    # where the path ends: the GPU when its last event of the step ends after the host's step
    j = g.last_ending_by(hi)
    active = np.flatnonzero((g.ts < hi) & (g.end > hi))
    if active.size:  # an event still running at the step's end (the next step started)
        j = int(active[np.argmax(g.ts[active])])
    on_gpu = j >= 0 and g.end[j] > max(host_end, lo) and g.end[j] > lo
    t = hi
    if on_gpu and g.end[j] < hi:
        _seg(segs, g.end[j], hi, _K["other"], -1, step)
        t = int(g.end[j])
    stuck = 0
    while t > lo:
        before = t
        if on_gpu:
            t = _gpu_run(g, j, t, lo, segs, step, links)
            if t <= lo:
                break
            head = j if g.head_pos[g.pos[j]] == g.pos[j] else int(g.order[g.head_pos[g.pos[j]]])
            kind = int(g.pred[head])
            if kind == 2:  # another stream's event, through a recorded stream wait
                c = int(g.cross[head])
                _seg(segs, g.end[c], t, _K["other"], -1, step)
                links["cross_stream"] += 1
                j, t = c, int(g.end[c])
                continue
            if kind == 1:  # its launch: the host was late
                launch = min(int(g.launch[head]), int(g.ts[head]))
                lat_end = min(t, launch + LAUNCH_LATENCY_MAX_NS)
                if t > lat_end:
                    _seg(segs, lat_end, t, _K["other"], -1, step)
                _seg(segs, launch, lat_end, _K["host_launch"], int(g.launch_row[head]), step)
                links["launch"] += 1
                t, on_gpu = launch, False
                continue
            if kind == 3:  # no correlation id: the host at its start
                links["unlinked"] += 1
                on_gpu = False
                continue
            # the run's head has no predecessor on its stream (the first event of the stream)
            on_gpu = False
            continue
        # on the host: back to the last blocking sync that returned before t
        k = int(np.searchsorted(sync_e, t, side="right")) - 1
        if k < 0 or sync_e[k] <= lo:
            _seg(segs, lo, t, _HOST, -1, step)
            break
        _seg(segs, sync_e[k], t, _HOST, -1, step)
        j = int(sync_g[k])
        _seg(segs, g.end[j], sync_e[k], _K["sync_wait"], -1, step)
        links["sync"] += 1
        t, on_gpu = int(g.end[j]), True
        stuck = stuck + 1 if t >= before else 0
        if stuck > 2:  # zero-length links that lead nowhere earlier: the rest is unexplained
            _seg(segs, lo, t, _K["other"], -1, step)
            break


def _gpu_run(g: _Gpu, j: int, t: int, lo: int, segs, step: int, links) -> int:
    """Book the run of stream links that ends with event ``j`` (at ``t``): its events and the
    gaps between them; returns the time the run's head started (or ``lo``)."""
    p_end, p_head = int(g.pos[j]), int(g.head_pos[g.pos[j]])
    idx = g.order[p_head:p_end + 1]
    starts = g.ts[idx]
    # stop at the step's start: the run's events from the last one that started at or before lo
    first = max(int(np.searchsorted(starts, lo, side="right")) - 1, 0)
    idx, starts = idx[first:], starts[first:]
    ends = np.minimum(g.end[idx], t)
    _seg(segs, starts, ends, g.kind[idx], g.rows[idx], step)
    if idx.size > 1:
        _seg(segs, ends[:-1], starts[1:], _K["other"], -1, step)
    links["gpu_stream"] += int(idx.size - 1)
    return int(starts[0]) if first == 0 else lo


def _host_kinds(ctx: Context, costs: Any, queued: iv.Intervals) -> list[tuple[int, iv.Intervals]]:
    """The host's timeline (main thread and launching threads together) as exclusive interval
    sets per kind, by priority: data, sync_wait, host_launch, host_compute."""
    ev, m = ctx.trace.events, ctx.masks
    lanes = np.isin(ev.lane, np.array(sorted(ctx.gpu_lanes | {ctx.main_lane}), dtype=np.int64))
    host = m["host"] & lanes

    def union(mask):
        return iv.union(ev.ts_ns[mask], ev.ts_ns[mask] + ev.dur_ns[mask])

    data = ctx.cat_union["dataloader"]
    runtime = host & m["runtime"]
    blocking = np.zeros(len(ev), bool)
    if ctx.device >= 0:
        blocking[costs.idx] = True
        blocking |= runtime & (ev.dur_ns > LAUNCH_LATENCY_MAX_NS)
        wait = iv.intersect(union(blocking), queued)
    else:
        wait = iv.empty()
    sources = [(_K["data"], data), (_K["sync_wait"], wait), (_K["host_launch"], union(runtime)),
               (_K["host_compute"], union(host & (m["cpu_op"] | m["python"] | m["annotation"]) & ~m["name_step"]))]
    out, covered = [], iv.empty()
    for k, raw in sources:
        out.append((k, iv.subtract(raw, covered)))
        covered = iv.merge(covered, raw)
    return out


def metrics(ctx: Context, syncs: Any, queued: iv.Intervals) -> dict[str, Any]:
    """``metrics["critical_path"]`` (docs/metrics.md); arguments as :func:`critical_path`."""
    p = critical_path(ctx, syncs, queued)
    steps = ctx.step_bounds or [(ctx.lo, ctx.hi)]
    lo = np.array([s for s, _ in steps], np.int64)[p.step] if p.step.size else p.start
    hi = np.array([e for _, e in steps], np.int64)[p.step] if p.step.size else p.end
    s, e = np.maximum(p.start, lo), np.minimum(p.end, hi)
    keep = e > s
    s, e, kind, row, step = s[keep], e[keep], p.kind[keep], p.row[keep], p.step[keep]
    n_steps = len(steps)
    per = np.zeros((n_steps, len(KINDS)), np.float64)
    gpu = kind >= 0
    np.add.at(per, (step[gpu], kind[gpu]), (e - s)[gpu])
    host_s, host_e, host_step = s[~gpu], e[~gpu], step[~gpu]
    host_sets = _host_kinds(ctx, syncs, queued) if host_s.size else []
    covered = np.zeros(host_s.size, np.float64)
    for k, a in host_sets:
        ns = _overlap_each(a, host_s, host_e)
        np.add.at(per[:, k], host_step, ns)
        covered += ns
    # host time with nothing recorded: Python between operators (a wait for the GPU would be
    # a recorded runtime call), booked as host work and also reported on its own
    unrecorded = (host_e - host_s) - covered
    np.add.at(per[:, _K["host_compute"]], host_step, unrecorded)
    totals = per.sum(axis=0)
    length = float(totals.sum())
    frac = {k: (round(float(totals[i]) / length, 4) if length else 0.0) for i, k in enumerate(KINDS)}
    bound = _bound(frac, gpu=ctx.device >= 0)
    out: dict[str, Any] = {
        "kinds": list(KINDS),
        "frac": frac,
        "ms": {k: _ms(totals[i]) for i, k in enumerate(KINDS)},
        "per_step_ms": [_ms(x) for x in per.sum(axis=1)] if ctx.step_bounds else [],
        "per_step_bound": [KINDS[int(np.argmax(r))] for r in per] if ctx.step_bounds else [],
        "bound": bound,
        "top": _top(ctx, s, e, kind, row, host_s, host_e),
        "host_unrecorded_ms": _ms(unrecorded.sum()),
        "links": dict(p.links),
        "notes": list(p.notes),
    }
    return out


def _overlap_each(a: iv.Intervals, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    return iv.measure_in(a, s, e).astype(np.float64)


#: The host group's phrase when no GPU was recorded: the host's time is then its own operators'
#: compute (a matmul on the CPU), not Python feeding a GPU launches.
HOST_ONLY = "host operators and Python"


def _bound(frac: dict[str, float], gpu: bool = True) -> dict[str, Any]:
    """The group of kinds with the largest share: ``{"what", "frac", "kinds"}``; ``gpu``: whether
    the trace recorded a GPU (else the host group reads :data:`HOST_ONLY`)."""
    best = max(GROUPS, key=lambda g: sum(frac[k] for k in g[1]))
    share = round(sum(frac[k] for k in best[1]), 4)
    what = best[0] if gpu or "host_compute" not in best[1] else HOST_ONLY
    return {"what": what, "frac": share, "kinds": list(best[1])}


def _top(ctx: Context, s, e, kind, row, host_s, host_e) -> list[dict[str, Any]]:
    """The names that take the most critical-path time: GPU events and launch links by their
    kernel's name, host calls and operators by theirs (the innermost informative frame)."""
    ev, names = ctx.trace.events, ctx.trace.names
    acc: dict[tuple[str, str], float] = {}
    named = (row >= 0) & (kind >= 0)
    if named.any():
        keys = ev.name[row[named]].astype(np.int64) * len(KINDS) + kind[named]
        tot = np.bincount(keys, weights=(e - s)[named])
        for key in np.flatnonzero(tot):
            acc[(names[key // len(KINDS)], KINDS[key % len(KINDS)])] = float(tot[key])
    if host_s.size:
        path = iv.union(host_s, host_e)
        m = ctx.masks
        lanes = np.isin(ev.lane, np.array(sorted(ctx.gpu_lanes | {ctx.main_lane}), dtype=np.int64))
        for k, mask in (("data", m["name_dataloader"] & m["host"]),
                        ("host_launch", m["runtime"] & m["host"] & lanes),
                        ("host_compute", m["cpu_op"] & m["host"] & lanes & ~m["name_dataloader"] & ~m["name_step"])):
            rows = np.flatnonzero(ctx.events_in_window(mask))
            if rows.size == 0:
                continue
            cover = iv.measure_in(path, ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows])
            tot = np.bincount(ev.name[rows], weights=cover, minlength=len(names))
            if k == "host_compute":  # nested operators: keep the innermost that covers most
                tot = _innermost(tot, np.bincount(ev.name[rows], weights=ev.dur_ns[rows], minlength=len(names)),
                                 np.bincount(ev.name[rows], minlength=len(names)))
            # equal times in name order, not in the order the file first named them
            for n in sorted(np.flatnonzero(tot > 0).tolist(), key=lambda n: (-tot[n], names[n]))[:TOP_LINKS]:
                acc[(names[n], k)] = acc.get((names[n], k), 0.0) + float(tot[n])
    top = sorted(acc.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_LINKS]
    return [{"name": n, "kind": k, "ms": _ms(ns)} for (n, k), ns in top]


def _innermost(cover: np.ndarray, dur: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Of nested operators (an ``aten::linear`` around its ``aten::addmm``), the one with the
    shortest events among those covering at least half as much as the best: the others are
    zeroed (their time is their callees')."""
    if not cover.any():
        return cover
    best = cover.max()
    pool = np.flatnonzero(cover >= 0.5 * best)
    inner = pool[int(np.argmin(dur[pool] / np.maximum(cnt[pool], 1)))]
    out = np.where(cover < 0.5 * best, cover, 0.0)
    out[inner] = cover[inner]
    return out


def cap(path_ms: dict[str, float], window_ms: float, finding_id: str, gain: float) -> float:
    """A finding's gain (a share of the window), at most the critical-path time (``path_ms``, per
    kind) that its fix shortens (:data:`SHORTENS`) over the window: the steps cannot get shorter
    by more than the time the fix removes from the chain that bounds them. Unchanged for a
    finding the table does not name."""
    kinds = SHORTENS.get(finding_id)
    if kinds is None or window_ms <= 0:
        return gain
    return min(gain, sum(path_ms[k] for k in kinds) / window_ms)
