"""The columnar trace model: one numpy array per field, names interned.

A :class:`Trace` holds every duration event of a profiler trace in an :class:`EventTable`
(no Python object per event), the allocator's memory records in a :class:`MemoryTable`,
the GPUs described by the trace, and optional samples (NVML, host CPU) recorded beside it.

Times are integer nanoseconds relative to ``Trace.origin_ns`` (the earliest event), so that
interval maths is exact and comparisons are cheap. ``origin_ns`` itself is the absolute time of
that origin on the profiler's clock (``baseTimeNanoseconds`` + ``ts`` where the trace gives a
base), kept only for aligning samples recorded on the same clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np


class Kind(IntEnum):
    """What an event is, independent of the schema year that named it."""

    CPU_OP = 0  # "Operator" (2021) / "cpu_op"
    ANNOTATION = 1  # "user_annotation": ProfilerStep#N, enumerate(DataLoader)..., nccl:*
    PYTHON = 2  # "python_function"
    RUNTIME = 3  # "Runtime" / "cuda_runtime" (cudaLaunchKernel, hipMemcpyAsync, ...)
    DRIVER = 4  # "cuda_driver" (cuLaunchKernel, ...)
    KERNEL = 5  # "Kernel" / "kernel"
    MEMCPY = 6  # "Memcpy" / "gpu_memcpy"
    MEMSET = 7  # "Memset" / "gpu_memset"
    GPU_ANNOTATION = 8  # "gpu_user_annotation"
    SYNC = 9  # "cuda_sync": synchronisation activity recorded by CUPTI
    OTHER = 10  # any other duration event


#: The kinds that occupy a GPU stream.
GPU_KINDS = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
#: The kinds issued by the host that can launch GPU work.
LAUNCH_KINDS = (Kind.RUNTIME, Kind.DRIVER)


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU as the trace's ``deviceProperties`` describes it."""

    id: int
    name: str = ""
    total_memory_bytes: int = 0
    compute_major: int = 0
    compute_minor: int = 0
    num_sms: int = 0

    @property
    def compute_capability(self) -> float:
        return self.compute_major + self.compute_minor / 10.0


@dataclass(frozen=True)
class Lane:
    """A (process, thread) of the host, or a (device, stream) of a GPU."""

    pid: int
    tid: int
    name: str = ""
    gpu: bool = False


@dataclass
class EventTable:
    """Duration events as parallel arrays, sorted by start time.

    ``corr`` is the CUDA correlation id that links a runtime/driver launch to the kernel,
    copy or memset it enqueued (-1 when absent); ``lane`` indexes ``Trace.lanes``;
    ``device``/``stream`` are -1 for host events; ``nbytes`` is -1 where not given; ``seq`` is an
    operator's autograd sequence number, written only while grad mode was on (-1 elsewhere).
    """

    kind: np.ndarray  # int8
    name: np.ndarray  # int32 index into Trace.names
    lane: np.ndarray  # int32 index into Trace.lanes
    ts_ns: np.ndarray  # int64
    dur_ns: np.ndarray  # int64, never negative
    corr: np.ndarray  # int64
    device: np.ndarray  # int64 (wide enough for any id a trace writes)
    stream: np.ndarray  # int64 (streams of 4294967295 occur)
    nbytes: np.ndarray  # int64
    seq: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @property
    def end_ns(self) -> np.ndarray:
        return self.ts_ns + self.dur_ns

    def take(self, mask_or_index: np.ndarray) -> EventTable:
        """A new table holding the selected rows (boolean mask or index array)."""
        return EventTable(**{f: getattr(self, f)[mask_or_index] for f in _EVENT_FIELDS})

    @classmethod
    def empty(cls) -> EventTable:
        return cls(**{f: np.zeros(0, dtype=dt) for f, dt in _EVENT_DTYPES.items()})


_EVENT_DTYPES = {
    "kind": np.int8,
    "name": np.int32,
    "lane": np.int32,
    "ts_ns": np.int64,
    "dur_ns": np.int64,
    "corr": np.int64,
    "device": np.int64,
    "stream": np.int64,
    "nbytes": np.int64,
    "seq": np.int64,
}
_EVENT_FIELDS = tuple(_EVENT_DTYPES)


@dataclass
class MemoryTable:
    """The allocator's ``[memory]`` records (present when memory profiling was on).

    ``device_type`` follows c10's DeviceType: 0 = CPU, 1 = CUDA. ``allocated``/``reserved``
    are the allocator totals after the event (-1 in old traces that did not record them).
    Every column is int64.
    """

    ts_ns: np.ndarray
    device_type: np.ndarray
    device: np.ndarray
    nbytes: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray

    def __len__(self) -> int:
        return int(self.ts_ns.shape[0])

    @classmethod
    def empty(cls) -> MemoryTable:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z, z, z, z)


@dataclass
class Samples:
    """Time series recorded beside the trace (NVML, host CPU), on the trace's clock.

    ``gpu`` and ``cpu`` map a field name to a numpy array; both hold ``t_ns`` (relative to
    ``Trace.origin_ns``). GPU fields: ``device``, ``gpu_util``, ``mem_util``,
    ``mem_used_bytes``, ``mem_total_bytes``, ``power_w``, ``sm_clock_mhz``, ``pcie_tx_kbps``,
    ``pcie_rx_kbps``. CPU fields: ``total`` (percent of all cores), ``per_core`` (2-D),
    ``main`` (this process, all its threads, in percent of one core), ``workers`` (percent of one
    core summed over data-loader worker processes), ``worker_count``.
    """

    gpu: dict[str, np.ndarray] = field(default_factory=dict)
    cpu: dict[str, np.ndarray] = field(default_factory=dict)


def meta_block(meta: dict, key: str) -> dict:
    """A block of a trace's bundle metadata (``capture``, ``machine``, ``versions``…), or ``{}``
    when it is missing or not an object (a bundle edited by hand or corrupted: what it cannot say
    is unknown, never a crash)."""
    value = meta.get(key)
    return value if isinstance(value, dict) else {}


@dataclass
class Trace:
    """A profiler trace, ready for analysis. Build one with :func:`gpumagic.trace.load`."""

    events: EventTable
    names: list[str]
    lanes: list[Lane]
    memory: MemoryTable
    devices: list[DeviceInfo]
    origin_ns: int = 0
    samples: Samples | None = None
    notes: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    source: str = ""
    ops: Any = None  # gpumagic.trace.ops.OpTable when the file recorded shapes or FLOPs
    links: Any = None  # gpumagic.trace.links.Links when the file holds module ranges (--modules)
    comms: Any = None  # gpumagic.trace.comms.CommTable: loaded with comms=True, when the file records messages

    def name_ids(self, predicate) -> np.ndarray:
        """Boolean array over ``names``: which interned names satisfy ``predicate``. A predicate
        with a ``batch`` attribute (the classifiers of :mod:`gpumagic.analysis.names`) is given
        all the names at once, in time linear in their total length."""
        batch = getattr(predicate, "batch", None)
        if batch is not None:
            return batch(self.names)
        return np.fromiter((bool(predicate(n)) for n in self.names), dtype=bool, count=len(self.names))

    def device_info(self, device_id: int) -> DeviceInfo | None:
        for d in self.devices:
            if d.id == device_id:
                return d
        return None
