"""Host CPU samples from Linux ``/proc``: every core, this process, its data-loader workers.

No dependency (psutil is not needed): ``/proc/stat`` gives per-core busy jiffies, and
``/proc/<pid>/stat`` a process's user + system ticks. PyTorch names its DataLoader worker
processes ``pt_data_worker`` (torch/utils/data/_utils/worker.py sets the thread name, which
Linux reports as the process's ``comm``); they are found among this process's children.
Percentages: ``total`` and ``per_core`` are 0-100 of all cores / each core; ``main`` (this process, all its
threads) and ``workers`` (summed over all workers) are percent of one core and can exceed 100.
``main_demand`` and ``workers_demand`` are the CPU the loading threads *wanted*: time running
plus time runnable but waiting for a core, from ``/proc/<pid>/schedstat`` (the main thread of
this process, and of each worker; proc(5), sched-stats.rst), in percent of one core. A thread
that sleeps or waits on I/O wants nothing; one starved by other processes wants a full core
even when it got little of it. Absent where the kernel has no schedstat.
``main_wait`` and ``workers_wait`` are the run-queue part alone (percent of one core: time the
loading threads were runnable but had no core), ``main_thread`` the main thread's own CPU
(``/proc/<pid>/task/<pid>/stat``; the rest of ``main`` is intra-op and other threads), and
``loadavg_1m`` the kernel's one-minute load average (``/proc/loadavg``, proc(5)), and ``reaped``
the CPU of this process's children that exited in the interval and were waited for (the
parent's ``cutime`` + ``cstime``, less what earlier samples counted of the workers among them;
percent of one core): the workers of a DataLoader without ``persistent_workers`` end each epoch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumagic.capture.sampler import PeriodicSampler

#: ``comm`` of a PyTorch DataLoader worker process.
WORKER_COMM = "pt_data_worker"
#: Columns of ``/proc/stat`` cpu lines counted as idle: idle and iowait (proc(5)).
_IDLE_COLUMNS = (3, 4)


@dataclass
class CpuTimes:
    """One reading: per-core (busy, total) jiffies and per-process busy ticks."""

    cores: list[tuple[int, int]]
    main_ticks: int
    worker_ticks: dict[int, int] = field(default_factory=dict)
    main_demand_ns: int | None = None  # main thread: ns on a CPU + ns waiting on a run queue
    worker_demand_ns: dict[int, int] = field(default_factory=dict)
    main_wait_ns: int | None = None  # main thread: ns runnable but waiting for a core
    worker_wait_ns: dict[int, int] = field(default_factory=dict)
    main_thread_ticks: int | None = None  # the main thread alone (the process's other threads excluded)
    loadavg_1m: float | None = None
    #: this process's children that exited and were waited for, all their lifetime (``cutime`` +
    #: ``cstime``): DataLoader workers of an epoch that ended, compile workers, subprocesses
    children_ticks: int | None = None


class ProcReader:
    """Reads ``/proc`` (or a directory laid out like it, for tests) for process ``pid``."""

    def __init__(self, root: str | os.PathLike = "/proc", pid: int | None = None) -> None:
        self.root = Path(root)
        self.pid = os.getpid() if pid is None else pid

    def available(self) -> bool:
        return (self.root / "stat").is_file() and (self.root / str(self.pid) / "stat").is_file()

    def ticks_per_second(self) -> int:
        return os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def read(self) -> CpuTimes:
        workers, demand, wait = {}, {}, {}
        for child in self.children():
            ticks = self._process_ticks(child)
            if ticks is not None and self._comm(child) == WORKER_COMM:
                workers[child] = ticks
                sched = self._schedstat(child)
                if sched is not None:
                    demand[child], wait[child] = sum(sched), sched[1]
        main = self._process_ticks(self.pid)
        sched = self._schedstat(self.pid)
        return CpuTimes(self._cores(), 0 if main is None else main, workers,
                        None if sched is None else sum(sched), demand,
                        main_wait_ns=None if sched is None else sched[1], worker_wait_ns=wait,
                        main_thread_ticks=self._process_ticks(self.pid, f"task/{self.pid}/stat"),
                        loadavg_1m=self._loadavg(), children_ticks=self._process_ticks(self.pid, children=True))

    def _schedstat(self, pid: int) -> tuple[int, int] | None:
        """(ns the process's main thread ran, ns it waited runnable): ``schedstat``'s first two
        fields, or None where the file is missing."""
        try:
            on_cpu, waiting = (self.root / str(pid) / "schedstat").read_text().split()[:2]
            return int(on_cpu), int(waiting)
        except (OSError, ValueError):  # no schedstat (kernel option), or the process exited
            return None

    def _loadavg(self) -> float | None:
        try:
            return float((self.root / "loadavg").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # not there (a fake /proc), or malformed
            return None

    def children(self) -> list[int]:
        pids: list[int] = []
        for path in (self.root / str(self.pid) / "task").glob("*/children"):
            try:
                pids.extend(int(p) for p in path.read_text().split())
            except (OSError, ValueError):  # the thread ended while we read
                continue
        return pids

    def _cores(self) -> list[tuple[int, int]]:
        cores = []
        for line in (self.root / "stat").read_text().splitlines():
            if line.startswith("cpu") and line[3:4].isdigit():
                values = [int(v) for v in line.split()[1:]]
                idle = sum(values[i] for i in _IDLE_COLUMNS if i < len(values))
                # guest time is already counted in user time (proc(5)); leave it out of the total
                total = sum(values[:8])
                cores.append((total - idle, total))
        return cores

    def _process_ticks(self, pid: int, name: str = "stat", children: bool = False) -> int | None:
        """utime + stime (fields 14 and 15 of proc(5)), or with ``children`` cutime + cstime (16
        and 17: the exited children the process waited for)."""
        try:
            text = (self.root / str(pid) / name).read_text()
        except OSError:  # the process (or thread) has exited
            return None
        fields = text.rsplit(")", 1)[1].split()  # the name in parentheses may contain spaces
        if children:
            return int(fields[13]) + int(fields[14]) if len(fields) > 14 else None
        return int(fields[11]) + int(fields[12])

    def _comm(self, pid: int) -> str:
        try:
            return (self.root / str(pid) / "comm").read_text().strip()
        except OSError:
            return ""


class CpuSampler(PeriodicSampler):
    """Rows of ``t_epoch_ns, total, per_core, main, workers, worker_count`` (percentages)."""

    name = "cpu"

    def __init__(self, reader: ProcReader, interval_s: float) -> None:
        super().__init__(interval_s)
        self.reader = reader
        self._hz = reader.ticks_per_second()
        self._last: tuple[int, CpuTimes] | None = None

    def read(self, t_epoch_ns: int) -> list[dict[str, Any]]:
        now = self.reader.read()
        last, self._last = self._last, (t_epoch_ns, now)
        if last is None:
            return []
        row = cpu_row(last[1], now, (t_epoch_ns - last[0]) / 1e9, self._hz, t_epoch_ns)
        row["span_ns"] = t_epoch_ns - last[0]  # the time since the reading before, the first one's too
        return [row]


def cpu_row(before: CpuTimes, after: CpuTimes, dt_s: float, hz: int, t_epoch_ns: int) -> dict[str, Any]:
    """Percentages over the interval between two readings."""
    per_core = [_percent(b1 - b0, t1 - t0) for (b0, t0), (b1, t1) in zip(before.cores, after.cores)]
    busy = sum(b1 - b0 for (b0, _), (b1, _) in zip(before.cores, after.cores))
    total = sum(t1 - t0 for (_, t0), (_, t1) in zip(before.cores, after.cores))
    one_core = hz * dt_s if dt_s > 0 else 0.0
    # a worker first seen now started in the interval (each reading lists the children): its time
    # is the interval's, up to one core's worth (a DataLoader worker runs one intra-op thread; more
    # would be time from before the interval, for a worker a reading missed). One gone since the
    # last reading exited, and its parent waited for it: its whole lifetime moved into the
    # parent's children time, of which the earlier readings counted what they saw (a DataLoader's
    # workers end with each epoch without persistent_workers: uncounted, their CPU read as other
    # processes').
    worker_ticks = sum(t - before.worker_ticks[p] if p in before.worker_ticks else min(t, one_core)
                       for p, t in after.worker_ticks.items())
    reaped = None
    if before.children_ticks is not None and after.children_ticks is not None:
        seen = sum(t for p, t in before.worker_ticks.items() if p not in after.worker_ticks)
        reaped = max(0, after.children_ticks - before.children_ticks - seen)
    row = {
        "t_epoch_ns": t_epoch_ns,
        "total": _percent(busy, total),
        "per_core": per_core,
        "main": _percent(after.main_ticks - before.main_ticks, one_core, cap=None),
        "workers": _percent(worker_ticks, one_core, cap=None),
        "worker_count": len(after.worker_ticks),
    }
    if reaped is not None:
        row["reaped"] = _percent(reaped, one_core, cap=None)
    wall_ns = dt_s * 1e9
    if before.main_demand_ns is not None and after.main_demand_ns is not None:
        row["main_demand"] = _percent(after.main_demand_ns - before.main_demand_ns, wall_ns, cap=None)
        wanted = sum(d - before.worker_demand_ns[p] for p, d in after.worker_demand_ns.items()
                     if p in before.worker_demand_ns)
        row["workers_demand"] = _percent(wanted, wall_ns, cap=None)
    row.update(_state_columns(before, after, one_core, wall_ns))
    return row


def _state_columns(before: CpuTimes, after: CpuTimes, one_core: float, wall_ns: float) -> dict[str, Any]:
    """The main thread's own CPU, the loading threads' run-queue wait, the load average (each
    only where it was read)."""
    out: dict[str, Any] = {}
    if before.main_thread_ticks is not None and after.main_thread_ticks is not None:
        out["main_thread"] = _percent(after.main_thread_ticks - before.main_thread_ticks, one_core, cap=None)
    if before.main_wait_ns is not None and after.main_wait_ns is not None:
        out["main_wait"] = _percent(after.main_wait_ns - before.main_wait_ns, wall_ns, cap=None)
        waited = sum(w - before.worker_wait_ns[p] for p, w in after.worker_wait_ns.items() if p in before.worker_wait_ns)
        out["workers_wait"] = _percent(waited, wall_ns, cap=None)
    if after.loadavg_1m is not None:
        out["loadavg_1m"] = after.loadavg_1m
    return out


def _percent(part: float, whole: float, cap: float | None = 100.0) -> float:
    if whole <= 0:
        return 0.0
    value = max(0.0, 100.0 * part / whole)
    return round(value if cap is None else min(cap, value), 2)
