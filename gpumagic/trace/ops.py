"""Operators' recorded input shapes and FLOP counts, read in a second, optional pass.

``torch.profiler(record_shapes=True)`` writes each operator's ``args["Input Dims"]`` (one list
of sizes per input, ``[]`` for non-tensors), ``args["Input type"]`` (``"float"``,
``"c10::BFloat16"``...) and, from torch 2.1 on, ``args["Concrete Inputs"]`` (the values of
scalar and list inputs as strings, e.g. a convolution's ``"[2, 2]"`` stride);
``with_flops=True`` adds ``args["flops"]`` to the operators it knows a formula for (PyTorch's
``torch/csrc/profiler/util.cpp``, ``computeFlops``). They end up in a small :class:`OpTable` on
``Trace.ops``, made one of two ways, with the same result:

- :func:`from_parts` (loading from bytes): the typed decode keeps each event's shapes as raw
  text (:class:`~gpumagic.trace.schema.OpArgs`, no parsing beyond finding its end), and
  :func:`~gpumagic.trace.columns.extract` decodes the operators' only, piece by piece (in the
  decoding workers, for a file decoded in pieces): no second pass over the text;
- :func:`attach`: a second decode of the whole text, only when the file holds them, for the
  decodes that could not read them on the way (the lenient event-by-event path, a repaired
  text); :func:`attach_dicts` for a trace given as a parsed dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from gpumagic.trace import schema
from gpumagic.trace.columns import Part, as_int, json_column, pick, times_ok

#: The byte strings whose presence means the file recorded shapes or FLOPs (a fast search
#: decides whether the second pass is needed at all).
MARKERS = (b'"Input Dims"', b'"flops"')
OP_CATEGORIES = frozenset({"cpu_op", "Operator"})


_ABSENT = msgspec.Raw(b"")


class _OpArgs(msgspec.Struct, frozen=True, gc=False, rename={
    "dims": "Input Dims", "types": "Input type", "concrete": "Concrete Inputs"}):
    """Raw JSON is kept as :class:`msgspec.Raw` (a view into the text): only the rows kept
    are decoded further."""

    dims: msgspec.Raw = _ABSENT
    types: msgspec.Raw = _ABSENT
    concrete: msgspec.Raw = _ABSENT
    flops: float = -1.0


_NO_ARGS = _OpArgs()


class _Op(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    cat: str | None = None
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _OpArgs = _NO_ARGS


_Event = schema.event_union(_Op)  # every other phase: checked and skipped


class _File(msgspec.Struct):
    traceEvents: list[_Event] | None = None  # type: ignore[valid-type]


_FILE = msgspec.json.Decoder(_File)
_LIST = msgspec.json.Decoder(list[_Event])  # type: ignore[valid-type]


@dataclass
class OpTable:
    """Operators with recorded shapes or FLOP counts, sorted by start.

    ``lane`` indexes ``Trace.lanes`` (-1 when the thread is unknown); times are ns on the
    trace's clock (relative to ``Trace.origin_ns``); ``flops`` is the profiler's own count, -1
    when absent. ``dims[i]`` is the list of input sizes (``[]`` for a non-tensor input),
    ``types[i]`` their dtypes, ``concrete[i]`` the values of scalar inputs as strings (``None``
    where not recorded).
    """

    name: list[str]
    lane: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    flops: np.ndarray
    dims: list[list]
    types: list[list]
    concrete: list[list | None]

    def __len__(self) -> int:
        return len(self.name)


def attach(trace, raw: bytes | bytearray) -> None:
    """Set ``trace.ops`` from the file's bytes when it recorded shapes or FLOPs; a file whose
    operator args cannot be read leaves ``trace.ops`` as ``None`` with a note."""
    if not any(m in raw for m in MARKERS):
        return
    try:
        events = _decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        trace.notes.append("The operators' recorded shapes could not be read; FLOPs are not estimated.")
        return
    trace.ops = _table(trace, [e for e in events if isinstance(e, _Op)])


def attach_dicts(trace, events: Any) -> None:
    """The same for a trace given as a parsed dict (its ``traceEvents``)."""
    ops = []
    for e in events if isinstance(events, list) else ():
        a = e.get("args") if isinstance(e, dict) and e.get("ph") == "X" else None
        if not isinstance(a, dict) or ("Input Dims" not in a and "flops" not in a):
            continue
        try:
            args = _OpArgs(a.get("Input Dims"), a.get("Input type"), a.get("Concrete Inputs"),  # type: ignore[arg-type]  # decoded, not Raw
                           float(a.get("flops", -1)))
            ops.append(_Op(e.get("cat"), str(e.get("name", "")), e.get("pid", 0), e.get("tid", 0),
                           float(e.get("ts", 0.0)), float(e.get("dur", 0.0)), args))
        except (TypeError, ValueError):
            continue
    trace.ops = _table(trace, ops, raw_json=False)


def _decode(raw: bytes | bytearray) -> list:
    at = 0
    while at < len(raw) and raw[at:at + 1].isspace():
        at += 1
    if raw[at:at + 1] == b"[":
        return _LIST.decode(raw)
    return _FILE.decode(raw).traceEvents or []


def from_parts(trace, parts: list[Part]) -> None:
    """Set ``trace.ops`` from what :func:`~gpumagic.trace.columns.extract` read of the
    operators in the same pass as the events (``Part.ops`` of each part, in file order): the
    same table as :func:`attach` makes from a second pass over the text."""
    cols = [p.ops for p in parts]
    if not any(c is not None and c.row.size for c in cols):
        return
    names: list[str] = []
    keys: list = []
    dims: list[list] = []
    types: list[list] = []
    concrete: list[list | None] = []
    ts, dur, flops = [], [], []
    for p, c in zip(parts, cols):
        if c is None or not c.row.size:
            continue
        rows = c.row
        names += [p.names[i] for i in p.name[rows].tolist()]
        keys += [p.lane_keys[i] for i in p.lane[rows].tolist()]
        ts.append(p.ts[rows])
        dur.append(p.dur[rows])
        flops.append(c.flops)
        dims += c.dims
        types += c.types
        concrete += c.concrete
    trace.ops = _build(trace, names, keys, np.concatenate(ts), np.concatenate(dur), np.concatenate(flops),
                       dims, types, concrete)


def _table(trace, ops: list[_Op], raw_json: bool = True) -> OpTable | None:
    ops = [o for o in ops if o.cat in OP_CATEGORIES and (_present(o.args.dims) or o.args.flops >= 0)]
    if not ops:
        return None
    ts = np.fromiter((o.ts for o in ops), np.float64, len(ops))
    dur = np.fromiter((o.dur for o in ops), np.float64, len(ops))
    ok = times_ok(ts, dur)  # the same bounds as the events' columns: no inf, no 1e308
    if not ok.all():
        ops, ts, dur = [o for o, keep in zip(ops, ok.tolist()) if keep], ts[ok], dur[ok]
        if not ops:
            return None
    column = json_column if raw_json else _value_column
    return _build(trace, [o.name for o in ops], [(o.pid, o.tid) for o in ops], ts, dur,
                  np.fromiter((o.args.flops for o in ops), np.float64, len(ops)),
                  column([o.args.dims for o in ops], []), column([o.args.types for o in ops], []),
                  column([o.args.concrete for o in ops], None))


def _build(trace, names: list[str], keys: list, ts: np.ndarray, dur: np.ndarray, flops: np.ndarray,
           dims: list, types: list, concrete: list) -> OpTable:
    """The table of operators given in file order (times as written, µs), sorted by start."""
    lanes = {(ln.pid, ln.tid): i for i, ln in enumerate(trace.lanes)}
    base = trace.meta.get("base_time_ns") or 0
    if not isinstance(base, int) or abs(base) >= 1 << 62:  # the loader ignored it too (kineto._base_time_ns)
        base = 0
    t0_ns = trace.origin_ns - base  # the loader's origin, in ns on the file's clock
    order = np.argsort(ts, kind="stable")
    ix = order.tolist()
    return OpTable(
        name=pick(names, order),
        lane=_lanes(pick(keys, order), lanes),
        ts_ns=np.rint(ts[order] * 1000.0 - t0_ns).astype(np.int64),
        dur_ns=np.maximum(np.rint(dur[order] * 1000.0), 0).astype(np.int64),
        flops=flops[order],
        dims=[dims[i] for i in ix],
        types=[types[i] for i in ix],
        concrete=[concrete[i] for i in ix],
    )


def _lanes(keys: list, lanes: dict) -> np.ndarray:
    """Each operator's row in ``Trace.lanes`` (ids spelled as the loader spells them)."""
    index = {k: lanes.get((as_int(k[0]), as_int(k[1])), -1) for k in set(keys)}
    return np.fromiter(map(index.__getitem__, keys), np.int32, len(keys))


def _value_column(values: list, default) -> list:
    return [v if isinstance(v, list) else default for v in values]


def _present(value) -> bool:
    return value is not None and (not isinstance(value, msgspec.Raw) or len(value) > 0)
