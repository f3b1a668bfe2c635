"""Load a Kineto / Chrome-trace JSON file (plain or gzip) into the columnar :class:`Trace`.

Handles the 2021 categories (``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``, ``Memset``) and
today's (``cpu_op``, ``cuda_runtime``, ``cuda_driver``, ``kernel``, ``gpu_memcpy``, ...),
microsecond and nanosecond-resolution float timestamps with or without ``baseTimeNanoseconds``,
several GPUs and streams, ROCm names, CPU-only traces, and gpumagic bundles (a Kineto trace with
an extra top-level ``"gpumagic"`` key holding samples and capture facts).

Kineto occasionally writes JSON that strict parsers reject (trailing commas, stray backslashes in
names) and durations that round negative; both are tolerated and reported in ``Trace.notes``.

Loading runs in stages: msgspec decodes the text into typed structs (:mod:`.schema`; flow
arrows are skipped, and decoded in a second pass only for a trace whose GPU events lack
``correlation`` args); :func:`extract` turns a list of structs into a :class:`Part` of columns;
:func:`_assemble` joins the parts of a file (one, or one per piece when :mod:`.pieces` decodes a
large file side by side) into the :class:`Trace`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

import msgspec
import numpy as np

from gpumagic._arrays import distinct
from gpumagic.errors import TraceError
from gpumagic.trace import schema
from gpumagic.trace.files import read_bytes
from gpumagic.trace.model import (
    GPU_KINDS,
    DeviceInfo,
    EventTable,
    Kind,
    Lane,
    MemoryTable,
    Samples,
    Trace,
)

#: Category names from every schema year, mapped to one :class:`Kind`.
CATEGORY_KINDS: dict[str | None, Kind] = {
    "Operator": Kind.CPU_OP,
    "cpu_op": Kind.CPU_OP,
    "user_annotation": Kind.ANNOTATION,
    "python_function": Kind.PYTHON,
    "Python": Kind.PYTHON,
    "Runtime": Kind.RUNTIME,
    "cuda_runtime": Kind.RUNTIME,
    "cuda_driver": Kind.DRIVER,
    "Kernel": Kind.KERNEL,
    "kernel": Kind.KERNEL,
    "Memcpy": Kind.MEMCPY,
    "gpu_memcpy": Kind.MEMCPY,
    "Memset": Kind.MEMSET,
    "gpu_memset": Kind.MEMSET,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "cuda_sync": Kind.SYNC,
}
#: Duration events that describe the profiler itself, not the program.
SKIPPED_CATEGORIES = frozenset({"Trace", "Spans", "overhead", "cuda_profiler_range"})
FLOW_CATEGORIES = frozenset({"ac2g", "async", "async_cpu_to_gpu"})
CLOCK_ANCHOR = "gpumagic::clock_anchor"

_TRAILING_COMMA = re.compile(rb",(\s*[\]}])")
_BAD_ESCAPE = re.compile(rb'\\(?!["\\/bfnrtu])')
_CONTROL_CHARS = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def decode(raw: bytes, source: str = "<bytes>") -> tuple[schema.TraceFile | schema.FastTraceFile, list[str]]:
    """Decode JSON bytes with the typed schema; repair Kineto's known JSON slips if needed.

    Flow arrows' bodies are skipped (:class:`~schema.FastTraceFile`); :func:`from_bytes` decodes
    them in a second pass only when needed. A file whose values do not fit the schema takes the
    lenient path, which returns a :class:`~schema.TraceFile` with every event, flows included.
    """
    notes: list[str] = []
    try:
        return _decode_typed(raw, _FAST), notes
    except msgspec.ValidationError:
        return _decode_lenient(raw, source, notes), notes
    except msgspec.DecodeError as first_error:
        repaired = _repair(raw)
        if repaired == raw:
            raise TraceError(f"{source}: not valid JSON ({_short(first_error)})") from None
        try:
            tf = _decode_typed(repaired, _FAST)
        except msgspec.ValidationError:
            tf = _decode_lenient(repaired, source, notes)
        except msgspec.DecodeError:
            raise TraceError(f"{source}: not valid JSON, truncated or corrupt ({_short(first_error)})") from None
        notes.append(REPAIRED_NOTE)
        return tf, notes


REPAIRED_NOTE = ("The trace was not strictly valid JSON (a known Kineto slip such as a trailing "
                 "comma or an unescaped backslash); it was repaired before reading.")
_FAST = (schema.FAST_DECODER, schema.FAST_EVENTS_DECODER)
_FLOWS = (schema.FLOW_DECODER, schema.FLOW_EVENTS_DECODER)


def _decode_typed(raw: bytes, decoders: tuple):
    file_decoder, events_decoder = decoders
    if first_char(raw) == b"[":
        return file_decoder.type(traceEvents=events_decoder.decode(raw))
    return file_decoder.decode(raw)


_SPACE = re.compile(rb"\s*")


def first_char(raw: bytes | bytearray) -> bytes:
    """The first non-blank byte (without copying the text, as ``bytearray.lstrip`` would)."""
    at = _SPACE.match(raw).end()
    return bytes(raw[at:at + 1])


def _decode_lenient(raw: bytes, source: str, notes: list[str]) -> schema.TraceFile:
    """Slow path for a file whose values do not fit the schema: convert event by event."""
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise TraceError(f"{source}: not valid JSON ({_short(exc)})") from None
    if isinstance(obj, list):
        obj = {"traceEvents": obj}
    if not isinstance(obj, dict):
        raise TraceError(f"{source}: not a PyTorch profiler trace (the JSON is not an object)")
    raw_events = obj.pop("traceEvents", None)
    try:
        tf = msgspec.convert(obj, schema.TraceFile, strict=False)
    except msgspec.ValidationError:
        tf = schema.TraceFile()
        notes.append("The trace's header fields had unexpected types and were ignored.")
    if raw_events is None:
        return tf
    if not isinstance(raw_events, list):
        raise TraceError(f"{source}: not a PyTorch profiler trace (traceEvents is not a list)")
    events, dropped = [], 0
    for item in raw_events:
        try:
            events.append(msgspec.convert(item, schema.Event, strict=False))
        except msgspec.ValidationError:
            dropped += 1
    tf.traceEvents = events
    if dropped:
        notes.append(f"{dropped} events had fields of unexpected types and were skipped.")
    return tf


def _repair(raw: bytes) -> bytes:
    raw = _TRAILING_COMMA.sub(rb"\1", raw)
    raw = _BAD_ESCAPE.sub(rb"\\\\", raw)
    return _CONTROL_CHARS.sub(b" ", raw)


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:120]


def load(source: str | os.PathLike | dict | schema.TraceFile, *, workers: int = 1) -> Trace:
    """Load a trace from a path (``.json`` or ``.json.gz``), a parsed dict, or decoded structs.

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
            raise TraceError(f"<dict>: not a PyTorch profiler trace ({_short(exc)})") from None
        from gpumagic.trace import ops

        trace = build(tf, [], "<dict>")
        ops.attach_dicts(trace, source.get("traceEvents"))
        return trace
    name = os.fspath(source)
    return from_bytes(read_bytes(name), name, workers=workers)


def from_bytes(raw: bytes, source: str = "<bytes>", *, workers: int = 1) -> Trace:
    """Load a trace from its JSON bytes.

    With ``workers`` > 1 on Linux, a file of at least two pieces of
    :data:`~gpumagic.trace.pieces.MIN_PIECE_BYTES` is cut at event boundaries and the pieces are
    decoded side by side by forked processes, which send back columns; any doubt about a cut
    (it is verified by decoding) falls back to decoding the whole file here. The result is the
    same either way.
    """
    pieces = None
    if workers > 1:
        from gpumagic.trace import pieces as _pieces

        pieces = _pieces.decode_in_pieces(raw, workers)
    if pieces is not None:
        header, parts = pieces
        return _with_ops(_assemble(header, parts, [], source, lambda: _flows_from_bytes(raw)), raw)
    tf, notes = decode(raw, source)
    if tf.traceEvents is None:
        raise TraceError(f"{source}: not a PyTorch profiler trace (no traceEvents)")
    parts = [extract(tf.traceEvents)]
    header = schema.header_of(tf)
    if isinstance(tf, schema.TraceFile):  # the lenient path decoded everything, flows included
        flow_lists = _flow_lists(tf.traceEvents)
        flows = lambda: flow_lists  # noqa: E731
    else:
        flows = lambda: _flows_from_bytes(raw)  # noqa: E731
    del tf  # free the structs before the columns are assembled
    return _with_ops(_assemble(header, parts, notes, source, flows), raw)


def _with_ops(trace: Trace, raw: bytes) -> Trace:
    """Operators' shapes and FLOP counts, read in a second pass only when the file has them."""
    from gpumagic.trace import ops

    ops.attach(trace, raw)
    return trace


def build(tf: schema.TraceFile | schema.FastTraceFile, notes: list[str], source: str) -> Trace:
    """Turn decoded structs into the columnar :class:`Trace` (flow arrows are used only if they
    were decoded, i.e. from a :class:`~schema.TraceFile`)."""
    if tf.traceEvents is None:
        raise TraceError(f"{source}: not a PyTorch profiler trace (no traceEvents)")
    return _assemble(tf, [extract(tf.traceEvents)], notes, source, lambda: _flow_lists(tf.traceEvents))


@dataclass
class Part:
    """The columns that one run of events (a whole file, or one piece of it) contributes, in
    file order, before the trace-wide origin is known. Pickled between processes, so it holds
    arrays and small lists only."""

    event_count: int
    categories: set  # of the duration events kept
    kind: np.ndarray  # int8
    names: list[str]  # interned, first-seen order
    name: np.ndarray  # int32 index into names
    lane_keys: list[tuple[Any, Any]]  # (pid, tid) as written, first-seen order
    lane: np.ndarray  # int32 index into lane_keys
    ts: np.ndarray  # float64, as written (µs)
    dur: np.ndarray  # float64, µs
    corr: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    nbytes: np.ndarray
    memory: dict[str, np.ndarray]  # the [memory] records' columns; "ts" as written
    lane_names: dict[tuple[int, int], str]

    @property
    def t_min(self) -> float:
        return min(float(self.ts.min()) if self.ts.size else np.inf,
                   float(self.memory["ts"].min()) if self.memory["ts"].size else np.inf)


def extract(events: list) -> Part:
    """The columns of a list of decoded events (one pass per field, at C speed)."""
    by_type = _by_type(events)
    complete = by_type.get(schema.Complete, [])
    cats = list(map(_CAT, complete))
    # one code per category: its Kind, or -1 for the profiler's own spans ("Trace", ...), which
    # every Kineto trace has a few of and which are dropped here
    code = {c: -1 if c in SKIPPED_CATEGORIES else int(CATEGORY_KINDS.get(c, Kind.OTHER)) for c in set(cats)}
    keep = {c for c, k in code.items() if k >= 0}
    kind = _column(map(code.__getitem__, cats), np.int8, len(cats))
    del cats
    if len(keep) < len(code):
        kept = np.flatnonzero(kind >= 0)
        complete = _pick(complete, kept)
        kind = kind[kept]
    n = len(complete)
    name_index, name_ids = _interned(list(map(_NAME, complete)))
    lane_index, lane = _lane_keys(complete)
    args = list(map(_ARGS, complete))
    memory = [e for e in by_type.get(schema.Instant, []) if e.name == "[memory]"]
    return Part(
        event_count=len(events),
        categories=keep,
        kind=kind,
        names=list(name_index),
        name=name_ids,
        lane_keys=list(lane_index),
        lane=lane,
        ts=_column(map(_TS, complete), np.float64, n),
        dur=_column(map(_DUR, complete), np.float64, n),
        corr=_column(map(_CORR, args), np.int64, n),
        device=_column(map(_DEVICE, args), np.int32, n),
        stream=_column(map(_STREAM, args), np.int32, n),
        nbytes=_column(map(_NBYTES, args), np.int64, n),
        memory=_memory_columns(memory),
        lane_names=_lane_names(by_type.get(schema.Metadata, [])),
    )


def _assemble(header, parts: list[Part], notes: list[str], source: str, flows) -> Trace:
    """One :class:`Trace` from the parts of a file (in file order) and its header fields.
    ``flows()`` returns the flow arrows (starts, ends); it is called only when some GPU event
    lacks a correlation id."""
    if not any(p.kind.size or p.memory["ts"].size for p in parts):
        raise TraceError(f"{source}: the trace holds no profiler events")
    t0 = min(p.t_min for p in parts)
    names, name_ids = _merge_interned([(p.names, p.name) for p in parts])
    lane_keys, raw_lane = _merge_interned([(p.lane_keys, p.lane) for p in parts])
    lane_names: dict = {}
    for p in parts:
        lane_names.update(p.lane_names)

    def cat(field: str) -> np.ndarray:
        arrays = [getattr(p, field) for p in parts]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    kinds = cat("kind")
    table, lanes, neg = _event_table(kinds, name_ids, {k: i for i, k in enumerate(lane_keys)}, raw_lane, lane_names,
                                     cat("ts"), cat("dur"), cat("corr"), cat("device"), cat("stream"), cat("nbytes"), t0)
    if neg:
        notes.append(f"{neg} events had negative durations (a Kineto rounding slip); they were set to 0.")
    gpu = np.isin(table.kind, np.array(GPU_KINDS, dtype=np.int8))
    if np.any(gpu & (table.corr < 0)):
        _link_by_flows(table, lanes, *flows(), t0)
    memory = {k: np.concatenate([p.memory[k] for p in parts]) for k in parts[0].memory}
    categories = set().union(*(p.categories for p in parts))
    base_ns = header.baseTimeNanoseconds or 0
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
    if header.gpumagic:
        _attach_bundle(trace, header.gpumagic)
    return trace


def _merge_interned(parts: list[tuple[list, np.ndarray]]) -> tuple[list, np.ndarray]:
    """Re-intern per-part keys into one first-seen numbering; the per-row ids follow."""
    if len(parts) == 1:
        return parts[0]
    index: dict = {}
    ids = []
    for keys, local in parts:
        remap = _column((index.setdefault(k, len(index)) for k in keys), np.int32, len(keys))
        ids.append(remap[local] if local.size else local.astype(np.int32))
    return list(index), np.concatenate(ids)


def _flow_lists(events: list) -> tuple[list, list]:
    by_type = _by_type(events)
    return by_type.get(schema.FlowStart, []), by_type.get(schema.FlowEnd, [])


def _flows_from_bytes(raw: bytes) -> tuple[list, list]:
    """The second pass for a trace whose GPU events lack correlation ids: its flow arrows."""
    for data in (raw, _repair(raw)):
        try:
            return _flow_lists(_decode_typed(data, _FLOWS).traceEvents or [])
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return [], []


def _by_type(events: list) -> dict[type, list]:
    """The events grouped by their struct type (the phase they were decoded as), in order."""
    types = list(map(type, events))
    codes = {t: i for i, t in enumerate(dict.fromkeys(types))}
    code = _column(map(codes.__getitem__, types), np.int16, len(types))
    return {t: _pick(events, np.flatnonzero(code == i)) for t, i in codes.items()}


def _lane_names(meta_events: Iterable[schema.Metadata]) -> dict[tuple[Any, Any], str]:
    out: dict[tuple[Any, Any], str] = {}
    for e in meta_events:
        if e.name == "thread_name" and e.args.name:
            out[(_as_int(e.pid), _as_int(e.tid))] = e.args.name.strip()
    return out


def _column(values: Iterable, dtype, n: int) -> np.ndarray:
    return np.fromiter(values, dtype=dtype, count=n)


def _interned(keys: list) -> tuple[dict, np.ndarray]:
    """(key -> index in first-seen order, index per row), all at C speed."""
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return index, _column(map(index.__getitem__, keys), np.int32, len(keys))


def _pick(items: list, index: np.ndarray) -> list:
    """``[items[i] for i in index]`` at C speed."""
    if index.size == 0:
        return []
    if index.size == 1:
        return [items[int(index[0])]]
    return list(itemgetter(*index.tolist())(items))


def _lane_keys(evs: list[schema.Complete]) -> tuple[dict, np.ndarray]:
    """Intern (pid, tid) pairs, numbered in first-seen order. Fast path: all ids are ints
    (current traces), paired as one int64 code; else each half is interned first (2021 traces
    spell some tids as strings)."""
    n = len(evs)
    try:
        pid = _column(map(_PID, evs), np.int64, n)
        tid = _column(map(_TID, evs), np.int64, n)
        pids, tids = pid, tid
    except (TypeError, ValueError):  # a string id somewhere
        pid_index, pid = _interned(list(map(_PID, evs)))
        tid_index, tid = _interned(list(map(_TID, evs)))
        pids, tids = list(pid_index), list(tid_index)
    pid = pid.astype(np.int64)
    tid = tid.astype(np.int64)
    span = int(tid.max() - tid.min() + 1) if n else 1
    codes = (pid - (pid.min() if n else 0)) * span + (tid - (tid.min() if n else 0))
    _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    order = np.argsort(first)  # lanes numbered in first-seen order
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    lane_index = {(_item(pids, pid[first[i]]), _item(tids, tid[first[i]])): int(rank[i]) for i in order}
    return lane_index, rank[inverse.ravel()].astype(np.int32)


def _item(values, code):
    """The original id: ``values`` is the array of ints itself, or the list of interned ids."""
    return int(code) if isinstance(values, np.ndarray) else values[int(code)]


def _event_table(kinds, name_ids, lane_index, raw_lane, lane_names, ts, dur, corr, dev, stream, nbytes, t0: float):
    ts_ns = np.rint((ts - t0) * 1000.0).astype(np.int64)
    dur_ns = np.rint(dur * 1000.0).astype(np.int64)
    negative = int(np.count_nonzero(dur_ns < 0))
    np.maximum(dur_ns, 0, out=dur_ns)

    lanes, remap, lane_pid, lane_tid = _normalise_lanes(lane_index, lane_names, kinds, raw_lane)
    lane = remap[raw_lane]
    gpu = np.isin(kinds, np.array((*GPU_KINDS, Kind.GPU_ANNOTATION, Kind.SYNC), dtype=np.int8))
    dev = np.where(gpu & (dev < 0), lane_pid[lane], dev).astype(np.int32)
    stream = np.where(gpu & (stream < 0), lane_tid[lane], stream).astype(np.int32)
    dev[~gpu] = -1
    stream[~gpu] = -1

    order = np.argsort(ts_ns, kind="stable")
    table = EventTable(kinds, name_ids, lane, ts_ns, dur_ns, corr, dev, stream, nbytes).take(order)
    return table, lanes, negative


_CAT, _NAME, _PID, _TID, _TS, _DUR, _ARGS = (attrgetter(a) for a in ("cat", "name", "pid", "tid", "ts", "dur", "args"))
_CORR, _DEVICE, _STREAM, _NBYTES = (attrgetter(a) for a in ("correlation", "device", "stream", "nbytes"))


def _normalise_lanes(lane_index, lane_names, kinds, raw_lane):
    """Merge (pid, tid) keys that differ only in spelling ("25738" vs 25738, "stream 7" vs 7)."""
    gpu_kind = np.isin(kinds, np.array(GPU_KINDS, dtype=np.int8))
    gpu_lanes = set(distinct(raw_lane[gpu_kind]).tolist())
    merged: dict[tuple[int, int], int] = {}
    lanes: list[Lane] = []
    remap = np.zeros(len(lane_index), dtype=np.int32)
    for (pid, tid), i in lane_index.items():
        key = (_as_int(pid), _as_int(tid))
        if key not in merged:
            merged[key] = len(lanes)
            name = lane_names.get(key) or (str(tid) if isinstance(tid, str) else "")
            lanes.append(Lane(pid=key[0], tid=key[1], name=name, gpu=i in gpu_lanes))
        elif i in gpu_lanes and not lanes[merged[key]].gpu:
            old = lanes[merged[key]]
            lanes[merged[key]] = Lane(old.pid, old.tid, old.name, True)
        remap[i] = merged[key]
    lane_pid = np.array([ln.pid for ln in lanes], dtype=np.int32)
    lane_tid = np.array([ln.tid for ln in lanes], dtype=np.int32)
    return lanes, remap, lane_pid, lane_tid


_DIGITS = re.compile(r"-?\d+")


def _as_int(value: int | str) -> int:
    """25738 → 25738; "25738" → 25738; "stream 7" → 7; "Spans" → -1."""
    if isinstance(value, int):
        return value
    m = _DIGITS.search(value)
    return int(m.group()) if m else -1


def _link_by_flows(table: EventTable, lanes: list[Lane], flow_starts: list, flow_ends: list, t0: float) -> None:
    """Fill missing correlation ids from ``ac2g`` flow arrows (start on the launch, end on the
    GPU event, matched by lane and timestamp). Most traces carry ``correlation`` in both args."""
    starts, ends = {}, {}
    for flows, group in ((starts, flow_starts), (ends, flow_ends)):
        for e in group:
            if e.cat in FLOW_CATEGORIES and e.id is not None:
                flows[(_as_int(e.pid), _as_int(e.tid), round((e.ts - t0) * 1000.0))] = _as_int(e.id)
    for flows in (starts, ends):
        for i in np.flatnonzero(table.corr < 0):
            ln = lanes[table.lane[i]]
            fid = flows.get((ln.pid, ln.tid, int(table.ts_ns[i])))
            if fid is not None:
                table.corr[i] = fid


def _memory_columns(evs: list[schema.Instant]) -> dict[str, np.ndarray]:
    n = len(evs)
    args = list(map(_ARGS, evs))

    def col(attr: str, dtype=np.int64) -> np.ndarray:
        return _column(map(attrgetter(attr), args), dtype, n)

    return {
        "ts": _column(map(_TS, evs), np.float64, n),
        "device_type": col("device_type", np.int8),
        "device": col("device_id", np.int32),
        "nbytes": col("mem_bytes"),
        "allocated": col("total_allocated"),
        "reserved": col("total_reserved"),
    }


def _memory_table(cols: dict[str, np.ndarray], t0: float) -> MemoryTable:
    if not cols["ts"].size:
        return MemoryTable.empty()
    ts_ns = np.rint((cols["ts"] - t0) * 1000.0).astype(np.int64)
    return MemoryTable(ts_ns=ts_ns, **{k: v for k, v in cols.items() if k != "ts"})


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
    }


def _attach_bundle(trace: Trace, bundle: dict[str, Any]) -> None:
    """Read what a gpumagic bundle adds: label, notes, capture facts and aligned samples."""
    trace.notes.extend(str(n) for n in bundle.get("notes", []) if n)
    for key in ("label", "capture", "machine", "versions"):
        if key in bundle:
            trace.meta[key] = bundle[key]
    samples = bundle.get("samples") or {}
    if not samples:
        return
    offset = _sample_offset(trace, bundle.get("clock") or {})
    trace.samples = Samples(gpu=_columns(samples.get("gpu"), offset), cpu=_columns(samples.get("cpu"), offset))


def _sample_offset(trace: Trace, clock: dict[str, Any]) -> int:
    """ns to add to an epoch time to get trace-relative time."""
    anchor_epoch = clock.get("anchor_epoch_ns")
    if anchor_epoch is not None:
        ids = [i for i, n in enumerate(trace.names) if n == CLOCK_ANCHOR]
        hit = np.isin(trace.events.name, ids) if ids else np.zeros(0, dtype=bool)
        if hit.any():
            return int(trace.events.ts_ns[np.flatnonzero(hit)[0]]) - int(anchor_epoch)
    trace.notes.append("Samples were aligned assuming the profiler clock is the system clock (no clock anchor).")
    return -trace.origin_ns


def _columns(block: dict[str, Any] | None, offset: int) -> dict[str, np.ndarray]:
    if not block or "t_epoch_ns" not in block:
        return {}
    out = {k: np.asarray(v) for k, v in block.items() if k != "t_epoch_ns"}
    out["t_ns"] = np.asarray(block["t_epoch_ns"], dtype=np.int64) + offset
    return out
