"""Forward→backward links: which backward operator came from which forward operator.

The autograd engine's ``evaluate_function: XBackward0`` and the node ``XBackward0`` carry the
``Sequence number`` of the forward operator that created the node, and Kineto writes the pair as
a flow arrow of category ``fwdbwd`` (``ph: "s"`` on the forward operator, ``ph: "f"`` on the
backward node; torch/csrc/autograd/profiler_kineto.cpp, ``generateForwardBackwardLink``, which
also settles which of the operators sharing a sequence number made the node: the last one to
start). The main loader skips these arrows; :func:`attach` reads them in a second pass, only
when the file holds gpumagic's module ranges (:data:`MODULE_PREFIX`, written with ``--modules``),
which are what the links serve (:mod:`gpumagic.analysis.modules`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic.trace.columns import as_int

#: The name prefix of gpumagic's per-module ranges (``gpumagic::module PATH (Type)``).
MODULE_PREFIX = "gpumagic::module "
#: The flow category of forward→backward arrows in Kineto's JSON.
FWD_BWD = "fwdbwd"
#: A flow's end point and its event may disagree by a rounding of the microsecond timestamps.
MATCH_TOLERANCE_NS = 2


@dataclass
class Links:
    """Rows of ``Trace.events``: ``fwd[i]`` (a forward operator) made ``bwd[i]`` (its backward node)."""

    fwd: np.ndarray  # int64
    bwd: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.fwd.shape[0])


def attach(trace, raw: bytes | bytearray) -> None:
    """Set ``trace.links`` when the file holds module ranges (else leave it ``None``)."""
    if MODULE_PREFIX.encode() not in raw:
        return
    from gpumagic.trace.decode import flows_from_bytes

    starts, ends = flows_from_bytes(raw)
    trace.links = from_flows(trace, starts, ends)


def attach_decoded(trace, events: list | None) -> None:
    """The same for a trace decoded into structs (a parsed dict), whose flow arrows are at hand."""
    if events and any(n.startswith(MODULE_PREFIX) for n in trace.names):
        from gpumagic.trace.decode import flow_lists

        trace.links = from_flows(trace, *flow_lists(events))


def from_flows(trace, starts: list, ends: list) -> Links:
    """Pair the ``fwdbwd`` flow starts and ends by id, then find each end point's event."""
    base = trace.meta.get("base_time_ns") or 0
    if not isinstance(base, int) or abs(base) >= 1 << 62:  # as trace/ops.py: the loader ignored it too
        base = 0
    t0_ns = trace.origin_ns - base
    lanes = {(ln.pid, ln.tid): i for i, ln in enumerate(trace.lanes)}

    def points(group: list) -> dict:
        out = {}
        for e in group:
            if e.cat == FWD_BWD and e.id is not None:
                lane = lanes.get((as_int(e.pid), as_int(e.tid)), -1)
                if lane >= 0:
                    out[e.id] = (lane, round(e.ts * 1000.0 - t0_ns))
        return out

    s, f = points(starts), points(ends)
    pairs = [(s[k], f[k]) for k in s.keys() & f.keys()]
    fwd = _rows(trace, [p[0] for p in pairs])
    bwd = _rows(trace, [p[1] for p in pairs])
    keep = (fwd >= 0) & (bwd >= 0)
    return Links(fwd[keep], bwd[keep])


def _rows(trace, points: list[tuple[int, int]]) -> np.ndarray:
    """The row of the longest host event that starts at each ``(lane, ts_ns)`` (-1: none)."""
    ev = trace.events
    out = np.full(len(points), -1, dtype=np.int64)
    if not points:
        return out
    lane = np.fromiter((p[0] for p in points), np.int64, len(points))
    ts = np.fromiter((p[1] for p in points), np.int64, len(points))
    for ln in np.unique(lane).tolist():
        rows = np.flatnonzero((ev.lane == ln) & (ev.device < 0))
        if rows.size == 0:
            continue
        starts = ev.ts_ns[rows]  # sorted: the table is sorted by start
        which = np.flatnonzero(lane == ln)
        lo = np.searchsorted(starts, ts[which] - MATCH_TOLERANCE_NS, "left")
        hi = np.searchsorted(starts, ts[which] + MATCH_TOLERANCE_NS, "right")
        for j, a, b in zip(which.tolist(), lo.tolist(), hi.tolist(), strict=True):
            if b > a:
                cand = rows[a:b]
                out[j] = int(cand[np.argmax(ev.dur_ns[cand])])
    return out
