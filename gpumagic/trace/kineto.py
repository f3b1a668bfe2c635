"""Load a Kineto / Chrome-trace JSON file (plain or gzip) into the columnar :class:`Trace`.

Handles the 2021 categories (``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``, ``Memset``) and
today's (``cpu_op``, ``cuda_runtime``, ``cuda_driver``, ``kernel``, ``gpu_memcpy``, ...),
microsecond and nanosecond-resolution float timestamps with or without ``baseTimeNanoseconds``,
several GPUs and streams, ROCm names, CPU-only traces, and gpumagic bundles (a Kineto trace with
an extra top-level ``"gpumagic"`` key holding samples and capture facts).

Kineto occasionally writes JSON that strict parsers reject (trailing commas, stray backslashes in
names) and durations that round negative; both are tolerated and reported in ``Trace.notes``.

Loading runs in stages: :mod:`.decode` turns the text into typed structs (:mod:`.schema`; flow
arrows are skipped, and decoded in a second pass only for a trace whose GPU events lack
``correlation`` args); :func:`.columns.extract` turns a list of structs into a :class:`Part` of
columns; :func:`_assemble` joins the parts of a file (one, or several when :mod:`.pieces` decodes
a large file in pieces side by side) into the :class:`Trace`; :mod:`.bundled` reads what a
gpumagic bundle adds.
"""

from __future__ import annotations

import os
from contextlib import suppress
from functools import partial
from typing import Any

import msgspec
import numpy as np

from gpumagic import examples
from gpumagic._arrays import distinct, in_threads
from gpumagic.errors import TraceError
from gpumagic.trace import pieces as _pieces
from gpumagic.trace import schema
from gpumagic.trace.columns import REPAIR_NOTES, TS_LIMIT_US, Part, as_int, column, extract, fit64
from gpumagic.trace.decode import REPAIRED_NOTE, decode, flow_lists, flows_from_bytes, short
from gpumagic.trace.files import display_name, read_bytes
from gpumagic.trace.model import GPU_KINDS, DeviceInfo, EventTable, Kind, Lane, MemoryTable, Trace

FLOW_CATEGORIES = frozenset({"ac2g", "async", "async_cpu_to_gpu"})

__all__ = ["Part", "build", "extract", "from_bytes", "load"]


def load(source: str | os.PathLike | dict | schema.TraceFile, *, workers: int = 1) -> Trace:
    """Load a trace from a path (``.json`` or ``.json.gz``), a parsed dict, or decoded structs;
    the string ``"example"`` is the bundled example trace, as on the command line.

    ``workers`` > 1 lets a large file be decoded in pieces by forked processes (see
    :func:`from_bytes`); the default keeps everything in this process, as a notebook kernel needs.
    Raises :class:`~gpumagic.errors.TraceError` with one sentence when the input is not a
    readable profiler trace.
    """
    if isinstance(source, (schema.TraceFile, schema.FastTraceFile)):
        return build(source, [], "<memory>")
    if isinstance(source, dict):
        try:
            tf = msgspec.convert(source, schema.TraceFile, strict=False)
        except msgspec.ValidationError as exc:
            raise TraceError(f"<dict>: not a PyTorch profiler trace ({short(exc)})") from None
        except RecursionError:
            raise TraceError("<dict>: nested too deeply to be a profiler trace") from None
        from gpumagic.trace import links, ops

        trace = build(tf, [], "<dict>")
        ops.attach_dicts(trace, source.get("traceEvents"))
        links.attach_decoded(trace, tf.traceEvents)
        return trace
    name = os.fspath(examples.resolve(source))  # "example": the bundled example, as on the CLI
    return from_bytes(read_bytes(name), name, workers=workers)


def from_bytes(raw: bytes | bytearray, source: str = "<bytes>", *, workers: int = 1, comms: bool = False,
               consume: bool = False, early: _pieces.Early | None = None) -> Trace:
    """Load a trace from its JSON bytes.

    A file of at least two pieces of :data:`~gpumagic.trace.pieces.MIN_PIECE_BYTES` is cut at
    boundaries between the events of ``traceEvents`` and decoded piece by piece, so that only
    one piece's structs are alive at a time; with ``workers`` > 1 on Linux, runs of pieces are
    decoded side by side by forked processes, which send back columns, and a large trace's
    columns are put in time order on ``workers`` threads. Any doubt about a cut (each is verified
    by decoding) falls back to decoding the whole file at once. The result is the same either way.

    ``comms``: also read what the file records about its collectives' messages into
    ``Trace.comms`` (a :class:`~gpumagic.trace.comms.CommTable`, or None when it records none),
    in the same pass (what a job's rank needs; :mod:`gpumagic.jobs.summary`).

    ``consume``: ``raw`` is the caller's to give away: a ``bytearray`` is emptied (its memory
    freed) as soon as nothing needs the text any more, before the columns are assembled. Without
    it the text lives until the caller lets it go, which is only after this call returns
    (a caller's frame holds the arguments of a call it is making): at 860 MB the assembly's
    arrays then need fresh memory besides the text, where with it they reuse the text's pages.

    ``early``: a child that :func:`gpumagic.trace.pieces.start_early` started on the first pieces
    of ``raw`` while it was being inflated; it is waited for (or stopped when not of use).
    """
    source = display_name(source)
    decoders = schema.COMMS if comms else schema.FAST
    pieces = None
    if workers > 1 or len(raw) >= _pieces.ONE_PROCESS_MIN_BYTES or early is not None:
        pieces = _pieces.decode_in_pieces(raw, workers, decoders, early=early)
    if pieces is not None:
        from gpumagic.trace import links

        header, parts = pieces
        if (all(p.ops is not None for p in parts) and not any(_lacks_correlation(p) for p in parts)
                and not any(links.has_module_ranges(p.names) for p in parts)):
            # nothing reads the text again (no second pass for flows or shapes): let it go before
            # the columns are assembled; at 1 GB the text is most of the memory
            if consume and isinstance(raw, bytearray):
                with suppress(BufferError):  # a view of it still alive somewhere: it stays
                    raw.clear()
            del raw
            return _with_ops(_assemble(header, parts, [], source, _no_flows, workers), b"", parts, comms)
        return _with_ops(_assemble(header, parts, [], source, lambda: flows_from_bytes(raw), workers), raw, parts, comms)
    tf, notes = decode(raw, source, decoders)
    if tf.traceEvents is None:
        raise TraceError(f"{source}: not a PyTorch profiler trace (no traceEvents)")
    # the typed decode read the operators' shapes too; a lenient or repaired decode leaves them
    # to the second pass over the original text (as before: the same answer either way)
    typed = isinstance(tf, schema.FastTraceFile) and REPAIRED_NOTE not in notes
    parts = [extract(tf.traceEvents, with_ops=typed, with_comms=typed and comms)]
    header = schema.header_of(tf)
    if isinstance(tf, schema.TraceFile):  # the lenient path decoded everything, flows included
        decoded_flows = flow_lists(tf.traceEvents)
        flows = lambda: decoded_flows  # noqa: E731
    else:
        flows = lambda: flows_from_bytes(raw)  # noqa: E731
    del tf  # free the structs before the columns are assembled
    return _with_ops(_assemble(header, parts, notes, source, flows, workers), raw, parts, comms)


def _lacks_correlation(part: Part) -> bool:
    """Whether some GPU event of ``part`` has no correlation id (then :func:`_assemble` links it by
    the flow arrows, read from the text in a second pass)."""
    return bool(np.any(np.isin(part.kind, np.array(GPU_KINDS, dtype=np.int8)) & (part.corr < 0)))


def _no_flows() -> tuple[list, list]:
    raise AssertionError("flows are read only when a GPU event lacks a correlation id")  # see from_bytes


def _with_ops(trace: Trace, raw: bytes | bytearray, parts: list[Part], comms: bool = False) -> Trace:
    """Operators' shapes and FLOP counts: from the parts when the typed decode read them, else
    in a second pass over the text, only when the file has them; forward→backward links, from
    the text, when it holds module ranges; with ``comms``, the collectives' messages, likewise
    from the parts or else from a second pass."""
    from gpumagic.trace import links, ops

    if all(p.ops is not None for p in parts):
        ops.from_parts(trace, parts)
    else:
        ops.attach(trace, raw)
    links.attach(trace, raw)
    if comms:
        from gpumagic.trace import comms as _comms

        trace.comms = _comms.from_parts(trace, parts) if all(p.comms is not None for p in parts) else _comms.read(trace, raw)
    return trace


def build(tf: schema.TraceFile | schema.FastTraceFile, notes: list[str], source: str) -> Trace:
    """Turn decoded structs into the columnar :class:`Trace` (flow arrows are used only if they
    were decoded, i.e. from a :class:`~schema.TraceFile`)."""
    if tf.traceEvents is None:
        raise TraceError(f"{source}: not a PyTorch profiler trace (no traceEvents)")
    return _assemble(tf, [extract(tf.traceEvents)], notes, source, lambda: flow_lists(tf.traceEvents))


def _assemble(header, parts: list[Part], notes: list[str], source: str, flows, threads: int = 1) -> Trace:
    """One :class:`Trace` from the parts of a file (in file order) and its header fields.
    ``flows()`` returns the flow arrows (starts, ends); it is called only when some GPU event
    lacks a correlation id. ``threads``: how many threads may put a large trace's columns in
    time order (:func:`_event_table`)."""
    if not any(p.kind.size or p.memory["ts"].size for p in parts):
        raise TraceError(f"{source}: the trace holds no profiler events")
    t0 = min(p.t_min for p in parts)
    names, name_ids = _merge_interned([(p.names, p.name) for p in parts])
    lane_keys, raw_lane = _merge_interned([(p.lane_keys, p.lane) for p in parts])
    lane_names: dict = {}
    for p in parts:
        lane_names.update(p.lane_names)

    table, lanes, neg = _event_table(parts, name_ids, raw_lane, {k: i for i, k in enumerate(lane_keys)}, lane_names,
                                     t0, threads)
    if neg:
        notes.append(f"{neg} events had negative durations (a Kineto rounding slip); they were set to 0.")
    for key, note in REPAIR_NOTES.items():
        count = sum(p.repairs.get(key, 0) for p in parts)
        if count:
            notes.append(note.format(n=count))
    gpu = np.isin(table.kind, np.array(GPU_KINDS, dtype=np.int8))
    if np.any(gpu & (table.corr < 0)):
        flow_starts, flow_ends = flows()
        _link_by_flows(table, lanes, flow_starts, flow_ends, t0)
    memory = {k: np.concatenate([p.memory[k] for p in parts]) for k in parts[0].memory}
    categories = set().union(*(p.categories for p in parts))
    base_ns = _base_time_ns(header, notes)
    trace = Trace(
        events=table,
        names=names,
        lanes=lanes,
        memory=_memory_table(memory, t0),
        devices=[_device(d) for d in header.deviceProperties],
        origin_ns=int(base_ns + round(t0 * 1000.0)),
        notes=notes,
        meta=_meta(header, sum(p.event_count for p in parts), categories),
        source=source,
    )
    if header.gpumagic is not None:  # a gpumagic bundle (``--save``): its samples and capture notes
        from gpumagic.trace.bundled import attach_bundle

        attach_bundle(trace, header.gpumagic)
    return trace


def _merge_interned(parts: list[tuple[list, np.ndarray]]) -> tuple[list, np.ndarray]:
    """Re-intern per-part keys into one first-seen numbering; the per-row ids follow."""
    if len(parts) == 1:
        return parts[0]
    index: dict = {}
    ids = []
    for keys, local in parts:
        remap = column((index.setdefault(k, len(index)) for k in keys), np.int32, len(keys))
        ids.append(remap[local] if local.size else local.astype(np.int32))
    return list(index), np.concatenate(ids)


#: From this many events on, :func:`_event_table` puts the columns in time order on several
#: threads (numpy releases the GIL while it gathers): at 4.3M events about 0.5 s on one thread
#: on this project's 2-core machine, most of it the page faults of fresh memory, which threads
#: take side by side. Below it a thread pool costs about what it saves (whole commands, 8
#: alternated runs each with the threshold at 50,000: the V100 trace ×2, 432k events, no
#: different; the V100 trace, 123k events, about 2 % slower).
THREADED_MIN_EVENTS = 500_000


def _event_table(parts: list[Part], name_ids: np.ndarray, raw_lane: np.ndarray, lane_index: dict, lane_names: dict,
                 t0: float, threads: int = 1) -> tuple[EventTable, list[Lane], int]:
    """The events of ``parts`` (in file order) as one table sorted by start time (stable: equal
    starts keep file order), times in ns from ``t0`` (µs); its lanes; how many durations were
    negative (set to 0). ``name_ids`` and ``raw_lane`` are the parts' ids, merged and in file
    order. Each column is written once, in time order, straight from the parts (no file-order
    concatenation first); with ``threads`` > 1 and :data:`THREADED_MIN_EVENTS` events or more,
    the columns are written side by side."""
    n = sum(p.kind.size for p in parts)
    ts = parts[0].ts if len(parts) == 1 else np.concatenate([p.ts for p in parts])
    ts_ns = _us_to_ns(np.subtract(ts, t0))
    del ts
    order = np.argsort(ts_ns, kind="stable")
    where = None
    if len(parts) > 1:  # each file-order row's place in time order
        where = np.empty(n, dtype=np.int64)
        where[order] = np.arange(n, dtype=np.int64)

    columns: list[np.ndarray | str] = [ts_ns, name_ids, raw_lane, "kind", "dur", "corr", "device", "stream", "nbytes",
                                          "seq"]
    put = partial(_in_time_order, parts=parts, order=order, where=where)
    ts_ns, name_ids, raw_lane, kinds, dur, corr, dev, stream, nbytes, seq = in_threads(
        put, columns, threads if n >= THREADED_MIN_EVENTS else 1)
    del put, order, where, columns  # the file-order arrays go (those the caller holds aside)
    dur_ns = _us_to_ns(dur)  # dur is this function's own copy: scaled in place
    del dur
    negative = int(np.count_nonzero(dur_ns < 0))
    np.maximum(dur_ns, 0, out=dur_ns)

    lanes, remap, lane_pid, lane_tid = _normalise_lanes(lane_index, lane_names, kinds, raw_lane)
    lane = remap[raw_lane]
    # a GPU event without a device or stream id takes its lane's (pid, tid); host events have none
    gpu = np.isin(kinds, np.array((*GPU_KINDS, Kind.GPU_ANNOTATION, Kind.SYNC), dtype=np.int8))
    for ids, lane_ids in ((dev, lane_pid), (stream, lane_tid)):
        missing = gpu & (ids < 0)
        ids[missing] = lane_ids[lane[missing]]
        ids[~gpu] = -1
    return EventTable(kinds, name_ids, lane, ts_ns, dur_ns, corr, dev, stream, nbytes, seq), lanes, negative


def _in_time_order(column: np.ndarray | str, parts: list[Part], order: np.ndarray, where: np.ndarray | None) -> np.ndarray:
    """``column`` (an array in file order, or the name of the parts' column) in time order:
    gathered by ``order`` from one array, or scattered part by part to ``where`` (each
    file-order row's place in time order), with no file-order concatenation first."""
    if isinstance(column, np.ndarray):
        return column[order]
    arrays = [getattr(p, column) for p in parts]
    if where is None:
        return arrays[0][order]
    out = np.empty(order.size, dtype=np.result_type(*arrays))
    start = 0
    for a in arrays:
        out[where[start:start + a.size]] = a
        start += a.size
    return out


def _us_to_ns(us: np.ndarray) -> np.ndarray:
    """``np.rint(us * 1000.0).astype(np.int64)``, the same numbers, scaling ``us`` in place
    (the caller's own array) instead of making a second float array."""
    us *= 1000.0
    return np.rint(us, out=np.empty(us.shape, dtype=np.int64), casting="unsafe")


def _normalise_lanes(lane_index, lane_names, kinds, raw_lane):
    """Merge (pid, tid) keys that differ only in spelling ("25738" vs 25738, "stream 7" vs 7)."""
    gpu_kind = np.isin(kinds, np.array(GPU_KINDS, dtype=np.int8))
    gpu_lanes = set(distinct(raw_lane[gpu_kind]).tolist())
    merged: dict[tuple[int, int], int] = {}
    lanes: list[Lane] = []
    remap = np.zeros(len(lane_index), dtype=np.int32)
    for (pid, tid), i in lane_index.items():
        key = (as_int(pid), as_int(tid))
        if key not in merged:
            merged[key] = len(lanes)
            name = lane_names.get(key) or (str(tid) if isinstance(tid, str) else "")
            lanes.append(Lane(pid=key[0], tid=key[1], name=name, gpu=i in gpu_lanes))
        elif i in gpu_lanes and not lanes[merged[key]].gpu:
            old = lanes[merged[key]]
            lanes[merged[key]] = Lane(old.pid, old.tid, old.name, True)
        remap[i] = merged[key]
    # a GPU lane's (pid, tid) stand in for its (device, stream) when args lack them
    lane_pid = np.array([_id64(ln.pid) for ln in lanes], dtype=np.int64)
    lane_tid = np.array([_id64(ln.tid) for ln in lanes], dtype=np.int64)
    return lanes, remap, lane_pid, lane_tid


def _id64(value: int) -> int:
    v = fit64(value)
    return -1 if v is None else v


def _base_time_ns(header: schema.Header, notes: list[str]) -> int:
    """``baseTimeNanoseconds``, or 0 (with a note) when it is not a time int64 nanoseconds hold."""
    base = header.baseTimeNanoseconds
    if base is None:
        return 0
    if fit64(base) is None or abs(base) >= 1 << 62:
        notes.append("The trace's baseTimeNanoseconds is out of range; it was ignored.")
        return 0
    return base


def _link_by_flows(table: EventTable, lanes: list[Lane], flow_starts: list, flow_ends: list, t0: float) -> None:
    """Fill missing correlation ids from ``ac2g`` flow arrows (start on the launch, end on the
    GPU event, matched by lane and timestamp). Most traces carry ``correlation`` in both args."""
    starts: dict[Any, Any] = {}
    ends: dict[Any, Any] = {}
    for flows, group in ((starts, flow_starts), (ends, flow_ends)):
        for e in group:
            if e.cat in FLOW_CATEGORIES and e.id is not None and abs(e.ts) <= TS_LIMIT_US:
                fid = fit64(as_int(e.id))
                if fid is not None:
                    flows[(as_int(e.pid), as_int(e.tid), round((e.ts - t0) * 1000.0))] = fid
    for flows in (starts, ends):
        for i in np.flatnonzero(table.corr < 0):
            ln = lanes[table.lane[i]]
            fid = flows.get((ln.pid, ln.tid, int(table.ts_ns[i])))
            if fid is not None:
                table.corr[i] = fid


def _memory_table(cols: dict[str, np.ndarray], t0: float) -> MemoryTable:
    if not cols["ts"].size:
        return MemoryTable.empty()
    return MemoryTable(ts_ns=_us_to_ns(cols["ts"] - t0), **{k: v for k, v in cols.items() if k != "ts"})


def _device(d: schema.DeviceProperties) -> DeviceInfo:
    return DeviceInfo(d.id, d.name, d.totalGlobalMem, d.computeMajor, d.computeMinor, d.numSms)


def _meta(tf: schema.Header, event_count: int, cats: set) -> dict[str, Any]:
    dist = tf.distributedInfo
    return {
        "schema": "2021" if {"Operator", "Runtime", "Kernel"} & cats else "current",
        "event_count": event_count,
        "display_time_unit": tf.displayTimeUnit,
        "base_time_ns": tf.baseTimeNanoseconds,
        "distributed": None if dist is None else {"backend": dist.backend, "rank": dist.rank, "world_size": dist.world_size},
        "categories": sorted(c for c in cats if isinstance(c, str)),
    }
