"""What a trace records about its collectives' messages, read in an optional pass.

Two generations of PyTorch record it:

- from about torch 2.1, the ``record_param_comms`` operator (torch/csrc/distributed/c10d,
  ``RECORD_PARAM_COMMS``) carries ``args["Collective name"]``, ``"dtype"`` (c10's ScalarType
  name: ``"Float"``, ``"BFloat16"``...), ``"In msg nelems"``, ``"Out msg nelems"`` and
  ``"Group size"``; recent Kineto copies them onto the NCCL/RCCL kernel the operator launched
  (libkineto's ``kCollectiveName``, ``kInMsgNelems``... "Collective function metadata populated
  from CPU op to GPU kernel");
- older traces recorded with ``record_shapes=True`` give the ``nccl:<collective>`` annotation
  (ProcessGroupNCCL's profiling title) the input's ``args["Input Dims"]`` and ``"Input type"``,
  and the ``c10d::<collective>_`` operator around it its output's and input's.

The main loader keeps none of these args. :func:`read` decodes them only when the file holds
them, into a small :class:`CommTable` (one row per such event); which kernel each row describes
is worked out by the job analysis (:mod:`gpumagic.jobs.messages`).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from gpumagic.trace import schema
from gpumagic.trace.columns import as_int, describes_message, times_ok

#: The byte strings whose presence means the file records message sizes.
NEW_MARKER = b'"In msg nelems"'
OLD_MARKERS = (b'"nccl:', b'"Input Dims"')


class _Args(msgspec.Struct, frozen=True, gc=False, rename={
        **{f: schema.COMM_ARGS_KEYS[f] for f in ("coll", "in_n", "out_n", "group", "dims", "types")}, "corr": "correlation"}):
    """Raw JSON views, decoded further only for the events kept: the keys of
    :class:`~gpumagic.trace.schema.CommArgs`, every value raw (this pass is the fallback for a
    file whose values the typed pass refused, ``correlation`` included)."""

    coll: msgspec.Raw = schema.RAW_ABSENT
    dtype: msgspec.Raw = schema.RAW_ABSENT
    in_n: msgspec.Raw = schema.RAW_ABSENT
    out_n: msgspec.Raw = schema.RAW_ABSENT
    group: msgspec.Raw = schema.RAW_ABSENT
    dims: msgspec.Raw = schema.RAW_ABSENT
    types: msgspec.Raw = schema.RAW_ABSENT
    corr: msgspec.Raw = schema.RAW_ABSENT


_NO_ARGS = _Args()


class _Ev(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    cat: str | None = None
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _Args = _NO_ARGS


_Event = schema.event_union(_Ev)  # every other phase: checked and skipped


class _File(msgspec.Struct):
    traceEvents: list[_Event] | None = None  # type: ignore[valid-type]


_FILE = msgspec.json.Decoder(_File)
_LIST = msgspec.json.Decoder(list[_Event])  # type: ignore[valid-type]
_ANY = msgspec.json.Decoder()


@dataclass
class CommTable:
    """Events that describe a collective's message, in file order.

    ``kernel`` is True for a GPU kernel (then ``corr`` is its correlation id), False for a host
    event (then ``lane`` indexes ``Trace.lanes``, -1 when unknown); times are ns on the trace's
    clock. ``collective`` is ``args["Collective name"]`` or, for ``nccl:*`` annotations and
    ``c10d::*`` operators, the name itself; ``in_nelems``, ``out_nelems``, ``group_size`` are -1
    where not recorded; ``dtype`` is the recorded dtype name ("" when absent); ``dims`` and
    ``types`` are ``Input Dims`` and ``Input type`` (empty when absent).
    """

    kernel: np.ndarray
    corr: np.ndarray
    lane: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    name: list[str]
    collective: list[str]
    in_nelems: np.ndarray
    out_nelems: np.ndarray
    group_size: np.ndarray
    dtype: list[str]
    dims: list[list]
    types: list[list]

    def __len__(self) -> int:
        return len(self.name)


def wanted(raw: bytes | bytearray) -> bool:
    """Whether the file may record message sizes (a fast byte search)."""
    return NEW_MARKER in raw or all(m in raw for m in OLD_MARKERS)


def read(trace, raw: bytes | bytearray) -> CommTable | None:
    """The collectives' message facts of the trace loaded from ``raw``; None when the file
    records none (or its args cannot be read: sizes are then unknown, nothing else changes)."""
    if not wanted(raw):
        return None
    kept = _in_pieces(raw)
    if kept is None:
        try:
            kept = _keep(_decode(raw))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
    return _table(trace, kept) if kept else None


def _keep(events: list) -> list[_Ev]:
    return [e for e in events if isinstance(e, _Ev) and _describes_message(e)]


def _describes_message(e: _Ev) -> bool:
    a = e.args
    return describes_message(e.name, len(a.in_n), len(a.coll), len(a.dims))


def _in_pieces(raw: bytes | bytearray) -> list[_Ev] | None:
    """The events kept, from a large file decoded piece by piece (as the loader cuts it,
    :mod:`gpumagic.trace.pieces`), so that only one piece's structs are alive at a time; None when
    the file is small, or any piece does not decode (the caller then decodes it at once)."""
    from gpumagic.trace import pieces

    if len(raw) < pieces.ONE_PROCESS_MIN_BYTES or raw[_start(raw):_start(raw) + 1] != b"{":
        return None
    at = pieces.cuts(raw, max(2, len(raw) // pieces.PIECE_BYTES))
    if not at:
        return None
    kept: list[_Ev] = []
    try:
        for i in range(len(at) + 1):
            kept += _keep(_FILE.decode(pieces.piece(raw, at, i)).traceEvents or [])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return kept


def _start(raw: bytes | bytearray) -> int:
    at = 0
    while at < len(raw) and raw[at:at + 1].isspace():
        at += 1
    return at


def _decode(raw: bytes | bytearray) -> list:
    at = _start(raw)
    if raw[at:at + 1] == b"[":
        return _LIST.decode(raw)
    return _FILE.decode(raw).traceEvents or []


def _value(raw: msgspec.Raw | bytes):
    if not len(raw):
        return None
    try:
        return _ANY.decode(raw)
    except msgspec.DecodeError:
        return None


def _int(raw: msgspec.Raw | bytes) -> int:
    """A count as Kineto writes it (a JSON number, sometimes a string of digits); -1 otherwise."""
    v = _value(raw)
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v.strip())
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62 else -1


def _text(raw: msgspec.Raw | bytes) -> str:
    v = _value(raw)
    return v if isinstance(v, str) else ""


def _list(raw: msgspec.Raw | bytes) -> list:
    v = _value(raw)
    return v if isinstance(v, list) else []


def _table(trace, kept: list[_Ev]) -> CommTable | None:
    """The table of the events a second pass kept (:func:`read`)."""
    ts = np.fromiter((e.ts for e in kept), np.float64, len(kept))
    dur = np.fromiter((e.dur for e in kept), np.float64, len(kept))
    ok = times_ok(ts, dur)
    if not ok.all():
        kept, ts, dur = [e for e, k in zip(kept, ok.tolist()) if k], ts[ok], dur[ok]
        if not kept:
            return None
    args = [e.args for e in kept]
    return _build(trace, kernel=np.array([(e.cat or "").lower() == "kernel" for e in kept], dtype=bool),
                  corr=[_int(a.corr) for a in args], keys=[(e.pid, e.tid) for e in kept], ts=ts, dur=dur,
                  names=[e.name for e in kept], coll=[a.coll for a in args], dtype=[a.dtype for a in args],
                  in_n=[a.in_n for a in args], out_n=[a.out_n for a in args], group=[a.group for a in args],
                  dims=[a.dims for a in args], types=[a.types for a in args])


def from_parts(trace, parts: list) -> CommTable | None:
    """The same table as :func:`read`, from what the loader's own pass kept of each part
    (:attr:`~gpumagic.trace.columns.Part.comms`: the loader was asked for them); no second
    decode of the text."""
    from gpumagic.trace.model import Kind

    cols = [(p, p.comms) for p in parts if p.comms is not None and p.comms.row.size]
    if not cols:
        return None

    def gather(field: str) -> list:
        return [v for _, c in cols for v in getattr(c, field)]

    rows = [(p, c.row) for p, c in cols]
    return _build(trace, kernel=np.concatenate([p.kind[r] == int(Kind.KERNEL) for p, r in rows]),
                  corr=np.concatenate([p.corr[r] for p, r in rows]).tolist(),
                  keys=[p.lane_keys[i] for p, r in rows for i in p.lane[r].tolist()],
                  ts=np.concatenate([p.ts[r] for p, r in rows]), dur=np.concatenate([p.dur[r] for p, r in rows]),
                  names=[p.names[i] for p, r in rows for i in p.name[r].tolist()],
                  coll=gather("coll"), dtype=gather("dtype"), in_n=gather("in_n"), out_n=gather("out_n"),
                  group=gather("group"), dims=gather("dims"), types=gather("types"))


def _build(trace, *, kernel: np.ndarray, corr: list[int], keys: list, ts: np.ndarray, dur: np.ndarray,
           names: list[str], coll: list, dtype: list, in_n: list, out_n: list, group: list, dims: list,
           types: list) -> CommTable:
    """The table, from one row per event: ``keys`` the (pid, tid) as written, ``ts``/``dur`` µs as
    written, ``corr`` the correlation ids (-1 absent), the rest the args' raw JSON texts."""
    base = trace.meta.get("base_time_ns") or 0
    if not isinstance(base, int) or abs(base) >= 1 << 62:  # as the loader (kineto._base_time_ns)
        base = 0
    t0_ns = trace.origin_ns - base
    lanes = {(ln.pid, ln.tid): i for i, ln in enumerate(trace.lanes)}
    is_kernel = kernel.tolist()
    return CommTable(
        kernel=kernel,
        corr=np.array([c if k and 0 <= c < 1 << 62 else -1 for c, k in zip(corr, is_kernel)], dtype=np.int64),
        lane=np.array([-1 if k else lanes.get((as_int(pid), as_int(tid)), -1) for (pid, tid), k in zip(keys, is_kernel)],
                      dtype=np.int64),
        ts_ns=np.rint(ts * 1000.0 - t0_ns).astype(np.int64),
        dur_ns=np.maximum(np.rint(dur * 1000.0), 0).astype(np.int64),
        name=names,
        collective=[_text(c) or n for c, n in zip(coll, names)],
        in_nelems=np.array([_int(v) for v in in_n], dtype=np.int64),
        out_nelems=np.array([_int(v) for v in out_n], dtype=np.int64),
        group_size=np.array([_int(v) for v in group], dtype=np.int64),
        dtype=[_text(v) for v in dtype],
        dims=[_list(v) for v in dims],
        types=[_list(v) for v in types],
    )
