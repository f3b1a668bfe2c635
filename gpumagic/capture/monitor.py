"""Live samples for the monitor (``%gpumonitor``, ``gpumagic.monitor()``), kept for the last minutes.

One daemon thread (``gpumagic-monitor``, a :class:`~gpumagic.capture.sampler.PeriodicSampler`)
reads, every period: each GPU the driver shows through NVML (utilisation, memory used, power, SM
clock; the readings of :mod:`gpumagic.capture.nvml`), the host CPU per core, this process's and its
DataLoader workers' CPU (the ``/proc`` readings of :mod:`gpumagic.capture.cpu`) and this process's
resident memory. Rows go into a ring buffer of :data:`HISTORY_S` seconds; :meth:`MonitorSampler.snapshot`
turns it into plain series for a view, and an ``on_sample`` callback (the shell's widget update)
runs after each sample, on the sampler's thread, so the kernel is never blocked.

While a ``%%gpuprofile`` cell runs, :func:`profiled_window` marks the time on the running monitor.
A source that fails (NVML gone, ``/proc`` missing) is dropped with a note; the others go on.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from gpumagic.capture.cpu import CpuSampler, ProcReader
from gpumagic.capture.nvml import NvmlBackend, NvmlUnavailable, PynvmlBackend
from gpumagic.capture.sampler import PeriodicSampler

#: Seconds of samples kept (and drawn): the last five minutes.
HISTORY_S = 300
#: Default period: NVML's utilisation counters average over 1/6 s to 1 s (NVML API reference,
#: nvmlDeviceGetUtilizationRates), and one sample a second keeps the cost well under 1 % of a core
#: (benchmarks/monitor_overhead.py).
DEFAULT_INTERVAL_MS = 1000
#: Accepted periods: faster would mostly measure the monitor; slower is hardly "live".
MIN_INTERVAL_MS = 50
MAX_INTERVAL_MS = 60_000
#: Profiled windows remembered for drawing.
MAX_MARKS = 64
#: GPU fields the monitor shows (a subset of :data:`gpumagic.capture.nvml.GPU_FIELDS`).
GPU_SHOWN = ("gpu_util", "mem_used_bytes", "mem_total_bytes", "power_w", "sm_clock_mhz")
#: The NVML readers those need: PCIe throughput is left out (it blocks ~20 ms per direction,
#: NVML API reference, nvmlDeviceGetPcieThroughput).
NVML_READS = ("util", "mem", "power_w", "sm_clock_mhz")

_active: MonitorSampler | None = None
_active_lock = threading.Lock()


class MonitorSampler(PeriodicSampler):
    """Rows of ``t_epoch_ns``, ``gpus`` (one dict per device), CPU percentages, ``rss_bytes`` and
    ``profiling`` (the label of the profiled window in progress, or None)."""

    name = "monitor"

    def __init__(self, interval_s: float, *, nvml: NvmlBackend | None = None, proc: ProcReader | None = None,
                 history_s: float = HISTORY_S, on_sample: Callable[[MonitorSampler], None] | None = None) -> None:
        super().__init__(interval_s)
        self.rows: deque[dict[str, Any]] = deque(maxlen=max(2, round(history_s / interval_s)))
        self.notes: list[str] = []
        self.on_sample = on_sample
        self._nvml = nvml
        self._gpus: list[tuple[int, Any]] = []
        self._proc = proc if proc is not None else ProcReader()
        self._cpu: CpuSampler | None = None
        self._page_bytes = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.marks: deque[list[Any]] = deque(maxlen=MAX_MARKS)  # [start_ns, end_ns or None, label]
        self._lock = threading.RLock()  # read() runs under _sample()'s hold

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Open the sources, take the first sample and start the thread; becomes the active monitor."""
        global _active
        self._open_gpus()
        if self._proc.available():
            self._cpu = CpuSampler(self._proc, self.interval_s)
        else:
            self.notes.append("No host CPU samples: /proc is not readable here.")
        super().start()
        with _active_lock:
            _active = self

    def stop(self) -> None:
        """End the thread (waits at most one read), close NVML. Safe to call more than once."""
        global _active
        with _active_lock:
            if _active is self:
                _active = None
        super().stop()
        if self._gpus and self._nvml is not None:
            self._gpus = []
            with contextlib.suppress(Exception):  # the driver may already be gone at exit; nothing to tell
                self._nvml.shutdown()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def _open_gpus(self) -> None:
        if self._nvml is None:
            self._nvml = PynvmlBackend()
        try:
            self._nvml.init()
        except NvmlUnavailable as exc:
            self.notes.append(f"No GPU samples: {exc}.")
            self._nvml = None
            return
        try:
            self._gpus = self._nvml.all_handles()
        except Exception as exc:  # an NVML error type we cannot name without pynvml
            self.notes.append(f"No GPU samples: NVML lists no devices ({exc}).")
        if not self._gpus:
            self._nvml.shutdown()
            self._nvml = None

    # -- sampling ------------------------------------------------------------------------------

    def read(self, t_epoch_ns: int) -> list[dict[str, Any]]:
        row: dict[str, Any] = {"t_epoch_ns": t_epoch_ns, "gpus": self._read_gpus(), "rss_bytes": self._rss_bytes()}
        if self._cpu is not None:
            try:
                cpu = self._cpu.read(t_epoch_ns)
            except OSError as exc:
                self.notes.append(f"Host CPU sampling stopped: {exc}.")
                self._cpu = None
                cpu = []
            if cpu:
                row.update({k: v for k, v in cpu[0].items() if k != "t_epoch_ns"})
        with self._lock:
            open_marks = [m for m in self.marks if m[1] is None]
        row["profiling"] = open_marks[-1][2] if open_marks else None
        return [row]

    def _read_gpus(self) -> list[dict[str, Any]]:
        out = []
        for index, handle in self._gpus:
            try:
                values = self._nvml.read(handle, NVML_READS)
            except Exception as exc:  # the reading failed (driver reset, device lost): stop asking
                self.notes.append(f"GPU sampling stopped: {type(exc).__name__}: {exc}.")
                self._gpus = []
                return []
            out.append({"device": index, **{k: values[k] for k in GPU_SHOWN if k in values}})
        return out

    def _rss_bytes(self) -> int | None:
        try:
            fields = (self._proc.root / str(self._proc.pid) / "statm").read_text().split()
        except OSError:
            return None
        return int(fields[1]) * self._page_bytes  # resident pages (proc(5), /proc/pid/statm)

    def _sample(self) -> None:
        with self._lock:
            super()._sample()
        callback = self.on_sample
        if callback is not None:
            try:
                callback(self)
            except Exception as exc:  # a view that fails must not end sampling: say so once, drop it
                self.notes.append(f"The monitor's view stopped updating: {type(exc).__name__}: {exc}.")
                self.on_sample = None

    # -- marks and snapshots -------------------------------------------------------------------

    def mark_start(self, label: str) -> None:
        with self._lock:
            self.marks.append([time.time_ns(), None, label])

    def mark_end(self) -> None:
        with self._lock:
            for m in self.marks:
                if m[1] is None:
                    m[1] = time.time_ns()

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return dict(self.rows[-1]) if self.rows else None

    def snapshot(self) -> dict[str, Any]:
        """Plain data for a view: times (s, relative to the last sample), one series per quantity,
        the profiled windows, the notes. See :func:`series` for the series."""
        with self._lock:
            rows = list(self.rows)
            marks = [list(m) for m in self.marks]
            notes = list(self.notes)
        now_ns = rows[-1]["t_epoch_ns"] if rows else time.time_ns()
        return {
            "interval_s": self.interval_s,
            "span_s": self.rows.maxlen * self.interval_s,
            "t_s": [(r["t_epoch_ns"] - now_ns) / 1e9 for r in rows],
            "series": series(rows),
            "per_core": rows[-1].get("per_core", []) if rows else [],
            "marks": [((s - now_ns) / 1e9, None if e is None else (e - now_ns) / 1e9, label) for s, e, label in marks],
            "notes": notes,
            "running": self.running,
        }


def series(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each quantity as ``{"group", "name", "unit", "values" (None where not read), "max"}``."""
    out: list[dict[str, Any]] = []
    devices = sorted({g["device"] for r in rows for g in r.get("gpus", [])})
    by_device = [{g["device"]: g for g in r.get("gpus", [])} for r in rows]
    for d in devices:
        per = [gpus.get(d, {}) for gpus in by_device]
        total = max((g.get("mem_total_bytes") or 0 for g in per), default=0) or None
        group = f"GPU {d}"
        out += [
            {"group": group, "name": "utilisation", "unit": "%", "values": [g.get("gpu_util") for g in per], "max": 100},
            {"group": group, "name": "memory used", "unit": "bytes", "values": [g.get("mem_used_bytes") for g in per],
             "max": total},
            {"group": group, "name": "power", "unit": "W", "values": [g.get("power_w") for g in per], "max": None},
            {"group": group, "name": "SM clock", "unit": "MHz", "values": [g.get("sm_clock_mhz") for g in per], "max": None},
        ]
    if any("total" in r for r in rows):
        out += [
            {"group": "host", "name": "CPU (all cores)", "unit": "%", "values": [r.get("total") for r in rows], "max": 100},
            {"group": "process", "name": "CPU (this process)", "unit": "% of a core", "values": [r.get("main") for r in rows],
             "max": None},
            {"group": "process", "name": "CPU (DataLoader workers)", "unit": "% of a core",
             "values": [r.get("workers") for r in rows], "max": None},
        ]
    out.append({"group": "process", "name": "memory (resident)", "unit": "bytes", "values": [r.get("rss_bytes") for r in rows],
                "max": None})
    return out


def active() -> MonitorSampler | None:
    """The running monitor, if any."""
    return _active


@contextlib.contextmanager
def profiled_window(label: str) -> Iterator[None]:
    """Mark the time of the block on the running monitor (nothing when none runs)."""
    monitor = _active
    if monitor is None:
        yield
        return
    monitor.mark_start(label)
    try:
        yield
    finally:
        monitor.mark_end()
