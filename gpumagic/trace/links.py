"""Forward→backward links: which backward operator came from which forward operator.

The autograd engine's ``evaluate_function: XBackward0`` and the node ``XBackward0`` carry the
``Sequence number`` of the forward operator that created the node, and Kineto writes the pair as
a flow arrow of category ``fwdbwd`` (``ph: "s"`` on the forward operator, ``ph: "f"`` on the
backward node; torch/csrc/autograd/profiler_kineto.cpp, ``generateForwardBackwardLink``, which
also settles which of the operators sharing a sequence number made the node: the last one to
start). The main loader skips these arrows; :func:`attach` reads them in a second pass, only
when the file holds gpumagic's module ranges (:data:`MODULE_PREFIX`, written with ``--modules``),
which are what the links serve (:mod:`gpumagic.analysis.modules`). A file without the arrows but
with the operators' ``Sequence number`` and ``Fwd thread id`` args is linked from those, by the same
rule (:func:`from_sequence_numbers`).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from gpumagic._arrays import distinct
from gpumagic.trace import schema
from gpumagic.trace.columns import as_int

#: The name prefix of gpumagic's per-module ranges (``gpumagic::module PATH (Type)``).
MODULE_PREFIX = "gpumagic::module "
#: The name prefix of the range a gpumagic capture records around the start of a DataLoader's
#: worker processes (``gpumagic::DataLoader workers start (N workers)``: ``capture.stages``;
#: read by ``analysis.loaderrestart``).
WORKER_START_PREFIX = "gpumagic::DataLoader workers start"
#: A zero-length range a gpumagic capture records when its own start is done and the profiled
#: code begins: a window with no step starts there (``analysis.context``), not at the capture's
#: own set-up (the clock anchor, the step hooks: about 0.5 ms on this project's machine).
CODE_START = "gpumagic::code_start"
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


def has_module_ranges(names) -> bool:
    """Whether any of the event ``names`` is one of gpumagic's module ranges: the links serve
    nothing else. (Read from the decoded names, a few thousand distinct ones, not by a search of
    the text, which at 860 MB took 0.23 s.)"""
    return any(n.startswith(MODULE_PREFIX) for n in names)


def attach(trace, raw: bytes | bytearray) -> None:
    """Set ``trace.links`` when the trace holds module ranges (else leave it ``None``)."""
    if not has_module_ranges(trace.names):
        return
    from gpumagic.trace.decode import flows_from_bytes

    starts, ends = flows_from_bytes(raw)
    trace.links = from_flows(trace, starts, ends)
    if not len(trace.links) and SEQ_MARKER in raw:
        try:
            trace.links = from_sequence_numbers(trace, _decode_seq(raw))
        except (msgspec.DecodeError, msgspec.ValidationError):
            trace.notes.append("The operators' sequence numbers could not be read; backward time per module is not attributed.")


def attach_decoded(trace, events: list | None) -> None:
    """The same for a trace decoded into structs (a parsed dict), whose flow arrows are at hand."""
    if events and has_module_ranges(trace.names):
        from gpumagic.trace.decode import flow_lists

        trace.links = from_flows(trace, *flow_lists(events))


#: The arg that carries an operator's autograd sequence number (torch/csrc/profiler/kineto_shim.cpp).
SEQ_MARKER = b'"Sequence number"'
#: The autograd engine's span around a node: it carries the node's sequence number too.
EVALUATE_PREFIX = "autograd::engine::evaluate_function: "


class _SeqArgs(msgspec.Struct, frozen=True, gc=False, rename={"seq": "Sequence number", "fwd": "Fwd thread id"}):
    seq: int = -1
    fwd: int = -1


_NO_SEQ = _SeqArgs()


class _SeqOp(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    cat: str | None = None
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    args: _SeqArgs = _NO_SEQ


_SeqEvent = schema.event_union(_SeqOp)  # every other phase: checked and skipped


class _SeqFile(msgspec.Struct):
    traceEvents: list[_SeqEvent] | None = None  # type: ignore[valid-type]


_SEQ_FILE = msgspec.json.Decoder(_SeqFile)
_SEQ_LIST = msgspec.json.Decoder(list[_SeqEvent])  # type: ignore[valid-type]


def _decode_seq(raw: bytes | bytearray) -> list:
    body = bytes(raw[:64]).lstrip()
    events: list = _SEQ_LIST.decode(raw) if body.startswith(b"[") else (_SEQ_FILE.decode(raw).traceEvents or [])
    return [e for e in events if isinstance(e, _SeqOp) and e.args.seq >= 0]


def from_sequence_numbers(trace, ops: list) -> Links:
    """Links from sequence numbers when the file has no ``fwdbwd`` arrows: a backward node
    (``Fwd thread id`` > 0) belongs to the forward operator of its process with the same sequence
    number, the last of them to start (the rule of ``generateForwardBackwardLink``). The JSON does
    not say which thread a node's ``Fwd thread id`` names, so forward operators are taken from the
    thread of the process that ran the module ranges; a process with module ranges on several
    threads is left unlinked rather than guessed."""
    base = trace.meta.get("base_time_ns") or 0
    if not isinstance(base, int) or abs(base) >= 1 << 62:
        base = 0
    t0_ns = trace.origin_ns - base
    lanes = {(ln.pid, ln.tid): i for i, ln in enumerate(trace.lanes)}
    ev = trace.events
    module_ids = np.fromiter((i for i, n in enumerate(trace.names) if n.startswith(MODULE_PREFIX)), np.int64)
    threads: dict[int, set[int]] = {}
    for ln in distinct(ev.lane[np.isin(ev.name, module_ids)]).tolist():
        threads.setdefault(trace.lanes[ln].pid, set()).add(trace.lanes[ln].tid)
    forward: dict[tuple[int, int], tuple[float, int, int]] = {}  # (pid, seq) -> latest (ts, pid, tid)
    nodes: dict[tuple[int, int, int], tuple[float, int, int]] = {}
    for e in ops:
        pid, tid = as_int(e.pid), as_int(e.tid)
        if e.args.fwd > 0:  # a backward node, or the engine's span around one
            if e.name.startswith(EVALUATE_PREFIX):
                continue
            nodes[(pid, e.args.fwd, e.args.seq)] = (e.ts, pid, tid)
        elif threads.get(pid) == {tid}:
            key = (pid, e.args.seq)
            if key not in forward or e.ts >= forward[key][0]:
                forward[key] = (e.ts, pid, tid)
    pairs = []
    for (pid, _fwd_thread, seq), (bts, bpid, btid) in nodes.items():
        f = forward.get((pid, seq))
        if f is None:
            continue
        fl, bl = lanes.get((f[1], f[2]), -1), lanes.get((bpid, btid), -1)
        if fl >= 0 and bl >= 0:
            pairs.append(((fl, round(f[0] * 1000.0 - t0_ns)), (bl, round(bts * 1000.0 - t0_ns))))
    fwd = _rows(trace, [p[0] for p in pairs])
    bwd = _rows(trace, [p[1] for p in pairs])
    keep = (fwd >= 0) & (bwd >= 0)
    return Links(fwd[keep], bwd[keep])


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
    for ln in distinct(lane).tolist():
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
