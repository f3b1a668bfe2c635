"""Each collective kernel's message: which collective it is, its size and its group's size, and
the bandwidths that follow (``job.collectives``' ``size_bytes`` and ``bus_gbps``).

The facts come from :mod:`gpumagic.trace.comms`: on the kernel itself (recent Kineto) or on the
host events around the call that launched it — the ``record_param_comms`` operator, the
``nccl:<collective>`` annotation, the ``c10d::<collective>_`` operator — the innermost one that
says it first. The size is what NVIDIA's nccl-tests call *S* (doc/PERFORMANCE.md): the buffer of
an all-reduce, broadcast, reduce or send/receive, and the *total* array of an all-gather
(``sendcount × n``), a reduce-scatter (``recvcount × n``) and an all-to-all. From it:

- algorithm bandwidth ``algbw = S / t``, with ``t`` the rank's kernel duration (waiting included:
  the rank that arrives last shows the transfer's own speed);
- bus bandwidth ``busbw = algbw × factor``, nccl-tests' correction that makes it comparable with
  the links' peak whatever the number of ranks ``n``: all-reduce ``2(n−1)/n``; all-gather,
  reduce-scatter and all-to-all ``(n−1)/n``; broadcast, reduce and send/receive 1
  (nccl-tests src/sendrecv.cu). GB/s are 10⁹ bytes per second, as nccl-tests print them.

A size or group size the trace does not record stays ``None`` (older traces name the group's size
only where the ``c10d`` operator's output and input shapes give it: an all-gather's output is
``n`` times its input), and so do the bandwidths that need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.trace.comms import CommTable
from gpumagic.trace.model import LAUNCH_KINDS

#: Element sizes of the dtype names recorded: c10's ScalarType names ("Float", "BFloat16"...,
#: ``c10::toString``) on ``record_param_comms``, and the ``Input type`` strings of record_shapes.
ELEMENT_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "ComplexHalf": 4, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "long": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}
#: nccl-tests' bus-bandwidth factor per collective (doc/PERFORMANCE.md "Summary"; src/sendrecv.cu).
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
#: How far back on a thread to look for the events around a launch (they are the latest to start).
_NEAREST = 32
#: Host times come from the file's µs as float64; a launch is inside an event within this much.
_TOLERANCE_NS = 1_000


@dataclass(frozen=True)
class Message:
    """One collective kernel's message; None where the trace does not say."""

    collective: str | None = None  # one of BUS_FACTOR's keys, or the recorded name when it is another
    size_bytes: int | None = None  # nccl-tests' S
    group_size: int | None = None

    def alg_gbps(self, dur_ns: int) -> float | None:
        return None if self.size_bytes is None or dur_ns <= 0 else self.size_bytes / dur_ns

    def bus_gbps(self, dur_ns: int) -> float | None:
        alg = self.alg_gbps(dur_ns)
        factor = BUS_FACTOR.get(self.collective or "")
        if alg is None or factor is None:
            return None
        if self.collective in ("broadcast", "reduce", "send_recv"):
            return alg
        return alg * factor(self.group_size) if self.group_size and self.group_size > 1 else None


UNKNOWN = Message()


def kind_of(name: str) -> str | None:
    """``"nccl:_all_gather_base"``, ``"allgather_into_tensor_coalesced"``, ``"c10d::allreduce_"`` → the
    collective (a :data:`BUS_FACTOR` key); None for anything else (barrier, gather, scatter...)."""
    n = name.lower().removeprefix("nccl:").removeprefix("rccl:").removeprefix("c10d::").replace("_", "")
    for key, parts in (("all_reduce", ("allreduce",)), ("reduce_scatter", ("reducescatter",)),
                       ("all_gather", ("allgather",)), ("all_to_all", ("alltoall",)), ("broadcast", ("broadcast",))):
        if any(p in n for p in parts):
            return key
    if n.startswith("reduce"):
        return "reduce"
    if n.startswith(("send", "recv")) or n in ("sendrecv", "p2p"):
        return "send_recv"
    return None


def messages(trace, table: CommTable | None, rows: np.ndarray) -> list[Message]:
    """The message of each collective kernel in ``rows`` (rows of ``trace.events``)."""
    if table is None or not len(table) or rows.size == 0:
        return [UNKNOWN] * int(rows.size)
    ev = trace.events
    on_kernel = {int(c): i for i, c in enumerate(table.corr.tolist()) if table.kernel[i] and c >= 0}
    launch_at = _launches(trace, rows)
    host = np.flatnonzero(~table.kernel & (table.lane >= 0))
    by_lane: dict[int, np.ndarray] = {}
    for lane in distinct(table.lane[host]).tolist():
        mine = host[table.lane[host] == lane]
        by_lane[lane] = mine[np.argsort(table.ts_ns[mine], kind="stable")]
    out = []
    for row, launch in zip(rows.tolist(), launch_at.tolist()):
        found = []
        k = on_kernel.get(int(ev.corr[row]), -1) if ev.corr[row] >= 0 else -1
        if k >= 0:
            found.append(k)
        if launch >= 0:
            found += _around(table, by_lane.get(int(ev.lane[launch])), int(ev.ts_ns[launch]))
        out.append(_combine(table, found))
    return out


def _launches(trace, rows: np.ndarray) -> np.ndarray:
    """The row of the host call that launched each kernel (-1 when unknown)."""
    ev = trace.events
    launches = np.flatnonzero(np.isin(ev.kind, LAUNCH_KINDS) & (ev.corr >= 0))
    if launches.size == 0:
        return np.full(rows.size, -1, np.int64)
    order = launches[np.argsort(ev.corr[launches], kind="stable")]
    at = np.clip(np.searchsorted(ev.corr[order], ev.corr[rows]), 0, order.size - 1)
    hit = (ev.corr[rows] >= 0) & (ev.corr[order[at]] == ev.corr[rows])
    return np.where(hit, order[at], -1)


def _around(table: CommTable, lane_rows: np.ndarray | None, t: int) -> list[int]:
    """The table's host events on the launch's thread that contain its start, innermost first."""
    if lane_rows is None:
        return []
    ts = table.ts_ns[lane_rows]
    last = int(np.searchsorted(ts, t + _TOLERANCE_NS, side="right"))
    out = []
    for i in lane_rows[max(0, last - _NEAREST):last][::-1].tolist():
        if table.ts_ns[i] + table.dur_ns[i] + _TOLERANCE_NS >= t:
            out.append(i)
    return out


def _combine(table: CommTable, found: list[int]) -> Message:
    """One message from the events that describe it, the kernel's own facts and the innermost first."""
    kind = next((k for i in found if (k := kind_of(table.collective[i]))), None)
    recorded = next((table.collective[i] for i in found if table.collective[i]), None)
    new = next((i for i in found if table.in_nelems[i] >= 0 or table.out_nelems[i] >= 0), None)
    group = next((int(g) for i in found if (g := table.group_size[i]) > 0), None)
    size = None
    if new is not None:
        es = ELEMENT_BYTES.get(table.dtype[new])
        n_in, n_out = int(table.in_nelems[new]), int(table.out_nelems[new])
        total = n_out if kind == "all_gather" else n_in
        size = total * es if es and total >= 0 else None
    else:  # older traces: the nccl: annotation's input, the c10d operator's output/input shapes
        ann = next((i for i in found if table.name[i].startswith(("nccl:", "rccl:")) and table.dims[i]), None)
        if group is None and kind in ("all_gather", "reduce_scatter"):
            group = next((g for i in found if table.name[i].startswith("c10d::") and (g := _ratio(table.dims[i]))), None)
        if ann is not None:
            numel, es = _numel(table.dims[ann]), _element_bytes(table.types[ann])
            if numel is not None and es:  # an all-gather's annotation holds one rank's input: S is n of them
                size = numel * es if kind != "all_gather" else numel * es * group if group else None
    return Message(collective=kind or recorded, size_bytes=size, group_size=group)


def _numel(dims: list) -> int | None:
    """Elements of the tensors among the inputs (each ``[d0, d1, ...]``); None when none is a tensor."""
    shapes = [d for d in dims if isinstance(d, list) and d and all(isinstance(x, int) and x >= 0 for x in d)]
    return sum(prod(s) for s in shapes) if shapes else None


def _element_bytes(types: list) -> int | None:
    sizes = {ELEMENT_BYTES.get(t) for t in types if isinstance(t, str) and t in ELEMENT_BYTES}
    return sizes.pop() if len(sizes) == 1 else None


def _ratio(dims: list) -> int | None:
    """The group size a ``c10d::_allgather_base_(output, input)`` or ``_reduce_scatter_base_(output,
    input)`` implies: the larger tensor over the smaller, when it divides evenly."""
    shapes = [d for d in dims[:2] if isinstance(d, list) and d and all(isinstance(x, int) and x > 0 for x in d)]
    if len(shapes) != 2:
        return None
    a, b = prod(shapes[0]), prod(shapes[1])
    big, small = max(a, b), min(a, b)
    return big // small if big % small == 0 and big > small else None
