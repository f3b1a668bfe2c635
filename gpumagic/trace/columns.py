"""From decoded event structs to columns: :func:`extract` turns a list of events (a whole file,
or one piece of it) into a :class:`Part`, one numpy array per field.

Values a column cannot hold are not allowed to stop the load: ids and sizes are stored as
int64 (an id beyond 64 bits, or not a number, reads as absent, -1), ``pid``/``tid`` keep their
exact Python value (a 64-bit pthread id is interned, not squeezed), and an event whose time or
duration is not a finite number within :data:`TS_LIMIT_US` / :data:`DUR_LIMIT_US` is skipped.
Each such repair is counted in :attr:`Part.repairs` and becomes one note on the trace.

This module sits below both :mod:`.kineto` (which assembles parts into a trace) and
:mod:`.pieces` (which extracts parts in forked processes).
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

import msgspec
import numpy as np

from gpumagic._arrays import distinct
from gpumagic.trace import schema
from gpumagic.trace.model import Kind

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

#: Largest |ts| read, in µs: 4e15 µs is the year 2096 as Unix time, and two such times 8e15 µs
#: apart still fit int64 nanoseconds (9.2e18) once made relative to the trace's origin.
TS_LIMIT_US = 4e15
#: Longest duration read, in µs (about 31 years); with TS_LIMIT_US, every end time fits int64 ns.
DUR_LIMIT_US = 1e15

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

#: What :attr:`Part.repairs` counts, and the note each count becomes.
REPAIR_NOTES = {
    "bad_time": "{n} events had a time or duration that is not a finite number within range (for "
                "example 1e308); they were skipped.",
    "wide_int": "{n} ids or sizes in event args were beyond 64 bits or not numbers; they were read as absent.",
}


@dataclass
class OpColumns:
    """What :mod:`.ops` needs of a part's operators that recorded shapes or FLOPs, in file
    order: ``row`` indexes the part's columns; ``dims``/``types``/``concrete`` are decoded
    from the raw JSON (``[]``, ``[]``, ``None`` where absent or not a list)."""

    row: np.ndarray  # int64
    flops: np.ndarray  # float64, -1 when absent
    dims: list[list]
    types: list[list]
    concrete: list[list | None]


@dataclass
class CommRows:
    """The duration events of a part that describe a collective's message (see
    :mod:`gpumagic.trace.comms`), in file order: ``row`` indexes the part's columns; the rest are
    their args' raw JSON texts (``b""`` where absent), copied out of the decoded text."""

    row: np.ndarray  # int64
    coll: list[bytes]
    dtype: list[bytes]
    in_n: list[bytes]
    out_n: list[bytes]
    group: list[bytes]
    dims: list[bytes]
    types: list[bytes]


#: The names of host events that describe a collective's message by their recorded shapes.
COMM_NAME_PREFIXES = ("nccl:", "c10d::")
COMM_OPERATOR = "record_param_comms"


def is_comm_host_name(name: str) -> bool:
    """Whether ``name`` is a collective's host event, whose recorded shapes describe its message."""
    return name.startswith(COMM_NAME_PREFIXES) or name == COMM_OPERATOR


def describes_message(name: str, in_n: int, coll: int, dims: int) -> bool:
    """Whether an event (its name; the lengths of its raw ``In msg nelems``, ``Collective name``
    and ``Input Dims`` args) describes a collective's message: sizes on the event itself, or a
    collective's host event with its recorded shapes."""
    return bool(in_n or coll) or (is_comm_host_name(name) and dims > 0)


@dataclass
class Part:
    """The columns that one run of events (a whole file, or one piece of it) contributes, in
    file order, before the trace-wide origin is known. Pickled between processes, so it holds
    arrays and small lists only."""

    event_count: int
    categories: set  # of the duration events, the skipped ones included
    kind: np.ndarray  # int8
    names: list[str]  # interned, first-seen order
    name: np.ndarray  # int32 index into names
    lane_keys: list[tuple[Any, Any]]  # (pid, tid) as written, first-seen order
    lane: np.ndarray  # int32 index into lane_keys
    ts: np.ndarray  # float64, as written (µs)
    dur: np.ndarray  # float64, µs
    corr: np.ndarray  # int64
    device: np.ndarray  # int64
    stream: np.ndarray  # int64
    nbytes: np.ndarray  # int64
    seq: np.ndarray  # int64: operators' autograd sequence numbers, -1 where not written
    memory: dict[str, np.ndarray]  # the [memory] records' columns; "ts" as written
    lane_names: dict[tuple[int, int], str]
    repairs: dict[str, int] = field(default_factory=dict)  # keys of REPAIR_NOTES -> count
    #: The operators with recorded shapes or FLOPs (:class:`OpColumns`), read in the same pass
    #: (``None`` when the events were not decoded with :class:`~schema.OpArgs`: then
    #: :func:`gpumagic.trace.ops.attach` reads them from the text in a second pass).
    ops: OpColumns | None = None
    #: The events that describe a collective's message (:class:`CommRows`), read in the same
    #: pass when the events were decoded with :class:`~schema.CommArgs`; else ``None``.
    comms: CommRows | None = None

    @property
    def t_min(self) -> float:
        return min(float(self.ts.min()) if self.ts.size else np.inf,
                   float(self.memory["ts"].min()) if self.memory["ts"].size else np.inf)


def extract(events: list, with_ops: bool = False, with_comms: bool = False) -> Part:
    """The columns of a list of decoded events (one pass per field, at C speed). ``with_ops``:
    the events were decoded as :data:`schema.FastEvent` (their duration events carry
    :class:`~schema.OpArgs`), so the operators' shapes are read too (:attr:`Part.ops`);
    ``with_comms``: as :data:`schema.CommEvent` (:class:`~schema.CommArgs`), so the events that
    describe collectives' messages are kept too (:attr:`Part.comms`)."""
    repairs: dict[str, int] = {}
    by_type = by_phase(events, _READ_PHASES)
    complete = by_type.get(schema.CommComplete) or by_type.get(schema.FastComplete) or by_type.get(schema.Complete, [])
    code = _KindCodes()
    kind = column(map(code.__getitem__, map(_CAT, complete)), np.int8, len(complete))
    ts = column(map(_TS, complete), np.float64, len(complete))
    dur = column(map(_DUR, complete), np.float64, len(complete))
    keep = (kind >= 0) & times_ok(ts, dur)
    if not keep.all():
        bad = int(np.count_nonzero((kind >= 0) & ~keep))
        if bad:
            repairs["bad_time"] = bad
        kept = np.flatnonzero(keep)
        complete, kind, ts, dur = pick(complete, kept), kind[kept], ts[kept], dur[kept]
    name_index, name_ids = interned(map(_NAME, complete), len(complete))
    lane_index, lane = _lane_keys(complete)
    args = list(map(_ARGS, complete))
    memory = [e for e in by_type.get(schema.Instant, []) if e.name == "[memory]"]
    ops = _op_columns(kind, args) if with_ops else None
    comms = _comm_rows(list(name_index), name_ids, args) if with_comms else None
    return Part(
        event_count=len(events),
        categories=set(code),  # every category seen, the skipped ones included (analysis.selfcheck)
        kind=kind,
        names=list(name_index),
        name=name_ids,
        lane_keys=list(lane_index),
        lane=lane,
        ts=ts,
        dur=dur,
        corr=int_column(args, _CORR, repairs),
        device=int_column(args, _DEVICE, repairs),
        stream=int_column(args, _STREAM, repairs),
        nbytes=int_column(args, _NBYTES, repairs),
        seq=int_column(args, _SEQ, repairs),
        memory=_memory_columns(memory, repairs),
        lane_names=_lane_names(by_type.get(schema.Metadata, [])),
        repairs=repairs,
        ops=ops,
        comms=comms,
    )


def _comm_rows(names: list[str], name_ids: np.ndarray, args: list) -> CommRows:
    """The rows whose events describe a collective's message (:func:`describes_message`, at C
    speed: lengths of raw texts, and the names tested once each)."""
    def present(get) -> np.ndarray:  # which rows hold the raw arg (a non-empty text)
        return column(map(len, map(get, args)), np.int64, len(args)) > 0

    sized = present(_COMM_FIELDS["in_n"]) | present(_COMM_FIELDS["coll"])
    named = np.fromiter(map(is_comm_host_name, names), dtype=bool, count=len(names))
    if named.any():
        sized |= named[name_ids] & present(_DIMS)
    rows = np.flatnonzero(sized)
    picked = pick(args, rows)
    return CommRows(row=rows.astype(np.int64), **{f: [bytes(get(a)) for a in picked] for f, get in _COMM_FIELDS.items()})


def _op_columns(kind: np.ndarray, args: list) -> OpColumns:
    """The operators (``cpu_op``/``Operator``) whose args hold ``Input Dims`` or ``flops``."""
    rows = np.flatnonzero(kind == int(Kind.CPU_OP))
    op_args = pick(args, rows)
    flops = column(map(_FLOPS, op_args), np.float64, len(op_args))
    has = (column(map(len, map(_DIMS, op_args)), np.int64, len(op_args)) > 0) | (flops >= 0)
    if not has.all():
        kept = np.flatnonzero(has)
        rows, flops, op_args = rows[kept], flops[kept], pick(op_args, kept)
    return OpColumns(row=rows.astype(np.int64), flops=flops, dims=json_column(list(map(_DIMS, op_args)), []),
                     types=json_column(list(map(_TYPES, op_args)), []),
                     concrete=json_column(list(map(_CONCRETE, op_args)), None))


_ANY = msgspec.json.Decoder()


def json_column(raws: list, default) -> list:
    """Decode many raw JSON values at once; a value that is absent or not a list becomes
    ``default``. Each distinct text is decoded once (one decoder call over ``[v1,v2,...]``), and
    rows holding the same text share its value: operators repeated step after step record the
    same few shapes, and nothing changes the lists once read."""
    if not raws:
        return []
    texts = list(map(bytes, raws))
    unique = list(dict.fromkeys(texts))
    try:
        with gc_paused():
            values = _ANY.decode(b"[" + b",".join([t or b"null" for t in unique]) + b"]")
    except msgspec.DecodeError:
        values = [_safe_list(t, default) for t in unique]
    value = {t: v if isinstance(v, list) else default for t, v in zip(unique, values)}
    return list(map(value.__getitem__, texts))


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a block that only makes new, acyclic containers
    (the decoded shapes: tens of thousands of small lists, which would set off collections that
    walk every tracked object again and again; 3.2 s against 0.9 s for the ResNet-50 fixture's
    23.6k operators, measured side by side on a busy machine); restored as it was afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _safe_list(value, default):
    if not len(value):
        return default
    try:
        out = _ANY.decode(value)
    except (msgspec.DecodeError, TypeError):
        return default
    return out if isinstance(out, list) else default


def times_ok(ts: np.ndarray, dur: np.ndarray | None = None) -> np.ndarray:
    """Which events have a finite time within TS_LIMIT_US (and a duration up to DUR_LIMIT_US;
    negative durations are kept here and clamped to 0, with a note, when the trace is built)."""
    with np.errstate(invalid="ignore"):
        ok = np.abs(ts) <= TS_LIMIT_US  # False for NaN and ±inf
        if dur is not None:
            ok &= np.abs(dur) <= DUR_LIMIT_US
    return ok


def int_column(items: list, get, repairs: dict[str, int]) -> np.ndarray:
    """``get(item)`` for each item as int64. Fast path at C speed; a value beyond int64 (or not an
    int at all, from a lenient decode) makes a second, per-value pass that reads it as -1 and
    counts it under ``repairs["wide_int"]``."""
    try:
        return column(map(get, items), np.int64, len(items))
    except (OverflowError, TypeError, ValueError):
        values = [fit64(get(x)) for x in items]
        bad = values.count(None)
        repairs["wide_int"] = repairs.get("wide_int", 0) + bad
        return np.array([-1 if v is None else v for v in values], dtype=np.int64)


def fit64(value: Any) -> int | None:
    """``value`` if it is an int that int64 holds, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value <= INT64_MAX:
        return value
    return None


def by_phase(events: list, only: frozenset | None = None) -> dict[type, list]:
    """The events grouped by their struct type (the phase they were decoded as), in order;
    ``only``: just the groups of these types (the others, such as the skipped flow arrows,
    are not gathered)."""
    codes = FirstSeen()
    code = column(map(codes.__getitem__, map(type, events)), np.int16, len(events))
    return {t: pick(events, np.flatnonzero(code == i)) for t, i in codes.items() if only is None or t in only}


#: The groups :func:`extract` reads: duration events (of each schema flavour), instants, metadata.
_READ_PHASES = frozenset({schema.Complete, schema.FastComplete, schema.CommComplete, schema.Instant, schema.Metadata})


class FirstSeen(dict):
    """A key's number in first-seen order, given on its first lookup (``d[key]`` numbers a new
    key): interning in one pass at C speed, the Python ``__missing__`` called once per distinct key."""

    __slots__ = ()

    def __missing__(self, key: Any) -> int:
        number = self[key] = len(self)
        return number


class _KindCodes(dict):
    """Category -> its :class:`Kind` code, or -1 for the profiler's own spans ("Trace", ...),
    which every Kineto trace has a few of and which are dropped; filled on first lookup, so its
    keys are the categories seen."""

    __slots__ = ()

    def __missing__(self, category: str | None) -> int:
        code = self[category] = -1 if category in SKIPPED_CATEGORIES else int(CATEGORY_KINDS.get(category, Kind.OTHER))
        return code


def _lane_names(meta_events: Iterable[schema.Metadata]) -> dict[tuple[Any, Any], str]:
    out: dict[tuple[Any, Any], str] = {}
    for e in meta_events:
        if e.name == "thread_name" and e.args.name:
            out[(as_int(e.pid), as_int(e.tid))] = e.args.name.strip()
    return out


def column(values: Iterable, dtype, n: int) -> np.ndarray:
    return np.fromiter(values, dtype=dtype, count=n)


def interned(keys: Iterable, n: int) -> tuple[dict, np.ndarray]:
    """(key -> index in first-seen order, index per row) of ``n`` keys, in one pass at C speed."""
    index = FirstSeen()
    return index, column(map(index.__getitem__, keys), np.int32, n)


def pick(items: list, index: np.ndarray) -> list:
    """``[items[i] for i in index]`` at C speed."""
    if index.size == 0:
        return []
    if index.size == 1:
        return [items[int(index[0])]]
    return list(itemgetter(*index.tolist())(items))


def _lane_keys(evs: list[schema.Complete]) -> tuple[dict, np.ndarray]:
    """Intern (pid, tid) pairs, numbered in first-seen order. Fast path: all ids are int64
    (current traces), paired as one int64 code; else each half is interned first (2021 traces
    spell some tids as strings; a 64-bit pthread id may exceed int64)."""
    n = len(evs)
    pids: Any
    tids: Any
    try:
        pid = column(map(_PID, evs), np.int64, n)
        tid = column(map(_TID, evs), np.int64, n)
        if n and _pair_span(pid, tid) >= 1 << 62:  # the pair code below would overflow int64
            raise OverflowError
        pids, tids = pid, tid
    except (TypeError, ValueError, OverflowError):  # a string id, or ids too wide to pair
        pid_index, pid = interned(map(_PID, evs), n)
        tid_index, tid = interned(map(_TID, evs), n)
        pids, tids = list(pid_index), list(tid_index)
    pid = pid.astype(np.int64)
    tid = tid.astype(np.int64)
    span = int(tid.max() - tid.min() + 1) if n else 1
    codes = (pid - (pid.min() if n else 0)) * span + (tid - (tid.min() if n else 0))
    # np.unique(codes, return_index=True, return_inverse=True), the same arrays, without its
    # stable argsort of every row: a trace has a few dozen lanes
    distinct_codes = distinct(codes)
    inverse = np.searchsorted(distinct_codes, codes)
    first = np.full(distinct_codes.size, n, dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(n, dtype=np.int64))
    order = np.argsort(first)  # lanes numbered in first-seen order
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    lane_index = {(_item(pids, pid[first[i]]), _item(tids, tid[first[i]])): int(rank[i]) for i in order}
    return lane_index, rank[inverse.ravel()].astype(np.int32)


def _pair_span(pid: np.ndarray, tid: np.ndarray) -> int:
    """How large the (pid, tid) pair code can get, in Python ints (which do not overflow)."""
    return (int(pid.max()) - int(pid.min()) + 1) * (int(tid.max()) - int(tid.min()) + 1)


def _item(values, code):
    """The original id: ``values`` is the array of ints itself, or the list of interned ids."""
    return int(code) if isinstance(values, np.ndarray) else values[int(code)]


_CAT, _NAME, _PID, _TID, _TS, _DUR, _ARGS = (attrgetter(a) for a in ("cat", "name", "pid", "tid", "ts", "dur", "args"))
_CORR, _DEVICE, _STREAM, _NBYTES, _SEQ = (attrgetter(a) for a in ("correlation", "device", "stream", "nbytes", "seq"))
_FLOPS, _DIMS, _TYPES, _CONCRETE = (attrgetter(a) for a in ("flops", "dims", "types", "concrete"))
_COMM_FIELDS = {f: attrgetter(f) for f in ("coll", "dtype", "in_n", "out_n", "group", "dims", "types")}

_DIGITS = re.compile(r"-?\d+")


def as_int(value: int | str) -> int:
    """25738 → 25738; "25738" → 25738; "stream 7" → 7; "Spans" → -1."""
    if isinstance(value, int):
        return value
    m = _DIGITS.search(value)
    return int(m.group()) if m else -1


def _memory_columns(evs: list[schema.Instant], repairs: dict[str, int]) -> dict[str, np.ndarray]:
    ts = column(map(_TS, evs), np.float64, len(evs))
    ok = times_ok(ts)
    if not ok.all():
        repairs["bad_time"] = repairs.get("bad_time", 0) + int(np.count_nonzero(~ok))
        kept = np.flatnonzero(ok)
        evs, ts = pick(evs, kept), ts[kept]
    args = list(map(_ARGS, evs))
    return {
        "ts": ts,
        "device_type": int_column(args, attrgetter("device_type"), repairs),
        "device": int_column(args, attrgetter("device_id"), repairs),
        "nbytes": int_column(args, attrgetter("mem_bytes"), repairs),
        "allocated": int_column(args, attrgetter("total_allocated"), repairs),
        "reserved": int_column(args, attrgetter("total_reserved"), repairs),
    }
