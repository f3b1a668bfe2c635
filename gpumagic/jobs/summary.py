"""One rank's trace, analysed on its own into a small, picklable :class:`RankSummary`.

:func:`summarize` is what every executor runs, once per rank file, in whichever process or Dask
worker gets it: it loads the trace, runs :func:`gpumagic.analysis.analyze` on it, and keeps only
what the job view needs — the per-rank headline numbers, the findings, and the collectives of each
step (durations and the GPU time before each), tens of kilobytes where the trace was tens of megabytes.
No process ever holds two ranks' events.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis import intervals as iv
from gpumagic.errors import GpumagicError, TraceError
from gpumagic.jobs.messages import Message, messages
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding
from gpumagic.trace.comms import CommTable
from gpumagic.trace.model import GPU_KINDS

#: Names of rank files that say which rank wrote them: ``rank3.json.gz``, ``rank-3``, ``rank_3``,
#: torch's ``tensorboard_trace_handler`` names carry the worker name the user chose.
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class StepCollectives:
    """The collective kernels of one step on one rank, in the order they ran on the GPU.

    ``names`` index :attr:`RankSummary.collective_names`; ``dur_ns`` is each kernel's duration
    (the time the rank spent inside the collective, waiting included); ``before_ns`` is the GPU
    time between the end of the previous collective (or the step's start) and this one's start:
    the compute the rank did before arriving at it. All of them are durations on the rank's own
    clock, so ranks are compared without comparing their clocks.
    """

    key: str
    dur_ms: float
    names: tuple[int, ...]
    dur_ns: tuple[int, ...]
    before_ns: tuple[int, ...]
    #: the part of each ``before_ns`` during which the GPU was busy (the rest it waited for the host);
    #: empty when not measured
    busy_before_ns: tuple[int, ...] = ()
    #: each collective's message (:class:`~gpumagic.jobs.messages.Message`: kind, size, group size);
    #: empty when the trace records none
    messages: tuple[Message, ...] = ()


@dataclass(frozen=True)
class RankSummary:
    """What the job view knows about one rank; ``error`` is set (and the numbers are None) when
    its file could not be analysed."""

    path: str
    rank: int | None
    rank_source: str = ""  # "distributedInfo", "file name" or "" when unknown
    world_size: int | None = None
    device: str = ""
    step_median_ms: float | None = None
    step_p90_ms: float | None = None
    gpu_busy_frac: float | None = None
    comm_ms: float | None = None
    comm_exposed_ms: float | None = None
    findings: tuple[Finding, ...] = ()
    steps: tuple[StepCollectives, ...] = ()
    collective_names: tuple[str, ...] = ()
    work: str = ""  # the rank's usual sequence of collectives per step, hashed (see :func:`work_fingerprint`)
    kernels: frozenset[int] = frozenset()  # its GPU's distinct kernel names, hashed (see :func:`kernel_set`)
    notes: tuple[str, ...] = ()
    error: str | None = None

    @property
    def top_finding(self) -> str | None:
        return self.findings[0].id if self.findings else None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        """The row of ``job.ranks[]`` in the JSON view."""
        return {
            "rank": self.rank, "path": self.path, "device": self.device or None,
            "step_median_ms": self.step_median_ms, "step_p90_ms": self.step_p90_ms,
            "gpu_busy_frac": self.gpu_busy_frac, "comm_ms": self.comm_ms,
            "comm_exposed_ms": self.comm_exposed_ms, "top_finding": self.top_finding,
            "findings": [f.id for f in self.findings], "error": self.error,
        }


def rank_from_name(path: str) -> int | None:
    """The rank a file name states (``…rank12…``), or None."""
    found = _RANK_IN_NAME.findall(os.path.basename(path))
    return int(found[-1]) if found else None


def failed(path: str, message: str) -> RankSummary:
    """The summary of a rank whose file could not be analysed."""
    rank = rank_from_name(path)
    return RankSummary(path=path, rank=rank, rank_source="file name" if rank is not None else "", error=message)


def summarize(path: str) -> RankSummary:
    """Analyse one rank's trace file (a local path or an fsspec URL) into its summary; a file that
    cannot be read or analysed gives a summary with ``error`` set instead of raising."""
    from gpumagic.analysis import analyze

    try:
        trace, comms = _load(path)
        report = analyze(trace)
    except GpumagicError as exc:
        return failed(path, str(exc))
    return from_report(path, report, comms)


def _load(path: str):
    """The rank's trace and what it records about its collectives' messages (:mod:`gpumagic.trace.comms`)."""
    from gpumagic._atomic import local_path
    from gpumagic.trace.kineto import from_bytes

    local = local_path(path)  # the same resolution that keeps outputs off inputs (gpumagic._atomic)
    # the collectives' messages in the loader's own pass (no second decode of the file)
    trace = from_bytes(_read(path, local), local if local is not None else path, comms=True)
    return trace, trace.comms


def _read(path: str, local):
    from gpumagic.trace.files import read_bytes

    if local is not None:
        return read_bytes(local)
    try:
        import fsspec
    except ImportError:
        raise TraceError(f"{path}: reading URLs needs fsspec (pip install 'gpumagic[dask]')") from None
    try:
        with fsspec.open(path, "rb", compression="infer") as fh:
            raw = fh.read()
    except (OSError, ValueError) as exc:  # fsspec raises FileNotFoundError/OSError; ValueError for unknown protocols
        raise TraceError(f"{path}: cannot read ({exc})") from None
    return raw


def from_report(path: str, report, comms: CommTable | None = None) -> RankSummary:
    """Reduce an analysed rank (a :class:`~gpumagic.report.model.Report` with its trace) to its summary;
    ``comms``: what the file records about its collectives' messages (:func:`gpumagic.trace.comms.read`)."""
    m = report.metrics
    trace = report.trace
    dist = trace.meta.get("distributed") or {}
    rank, source = _rank(dist, path)
    device = m.gpu.primary_device
    info = trace.device_info(device) if device is not None and device >= 0 else None
    steps, names = collectives(trace, m, device, comms)
    comm = m.communication
    return RankSummary(
        path=path, rank=rank, rank_source=source,
        world_size=dist.get("world_size") if isinstance(dist.get("world_size"), int) else None,
        device=info.name if info is not None else ("CPU only" if device is None or device < 0 else f"GPU {device}"),
        step_median_ms=m.steps.median_ms, step_p90_ms=m.steps.p90_ms,
        gpu_busy_frac=m.gpu.busy_frac,
        comm_ms=comm.ms, comm_exposed_ms=comm.exposed_ms,
        findings=tuple(report.findings), steps=steps, collective_names=names,
        work=work_fingerprint(steps, names), kernels=kernel_set(trace, device), notes=tuple(report.notes),
    )


def _rank(dist: dict, path: str) -> tuple[int | None, str]:
    if isinstance(dist.get("rank"), int):
        return dist["rank"], "distributedInfo"
    rank = rank_from_name(path)
    return (rank, "file name") if rank is not None else (None, "")


def _collective_rows(trace, device: int) -> np.ndarray:
    """Rows of the NCCL/RCCL kernels on ``device``, in start order."""
    from gpumagic.analysis.names import is_nccl
    from gpumagic.trace.model import Kind

    ev = trace.events
    nccl = trace.name_ids(is_nccl)
    mask = (ev.kind == Kind.KERNEL) & (ev.device == device) & nccl[ev.name]
    return np.flatnonzero(mask)


def _launch_ts(trace, rows: np.ndarray) -> np.ndarray:
    """For each kernel row, the start of the host call that launched it (its own start when unknown)."""
    from gpumagic.trace.model import LAUNCH_KINDS

    ev = trace.events
    launches = np.flatnonzero(np.isin(ev.kind, LAUNCH_KINDS) & (ev.corr >= 0))
    order = launches[np.argsort(ev.corr[launches], kind="stable")]
    corr_sorted = ev.corr[order]
    want = ev.corr[rows]
    at = np.clip(np.searchsorted(corr_sorted, want), 0, max(len(order) - 1, 0))
    if not len(order):
        return ev.ts_ns[rows]
    hit = (want >= 0) & (corr_sorted[at] == want)
    return np.where(hit, ev.ts_ns[order[at]], ev.ts_ns[rows])


def collectives(trace, metrics: Metrics, device: int | None,
                comms: CommTable | None = None) -> tuple[tuple[StepCollectives, ...], tuple[str, ...]]:
    """Each step's collective kernels on the primary GPU; a kernel belongs to the step whose host
    span launched it (the GPU may run it after the host has moved on)."""
    steps = metrics.steps
    if device is None or device < 0 or not steps.count or metrics.window.source != "steps":
        return (), ()
    rows = _collective_rows(trace, device)
    ev = trace.events
    bounds = np.asarray(steps.bounds_ns, dtype=np.int64).reshape(-1, 2)
    launched = _launch_ts(trace, rows)
    which = np.searchsorted(bounds[:, 0], launched, side="right") - 1
    inside = (which >= 0) & (launched < bounds[np.clip(which, 0, None), 1])
    rows, which = rows[inside], which[inside]
    msgs = messages(trace, comms, rows) if comms is not None else None
    name_ids, local = np.unique(ev.name[rows], return_inverse=True)
    names = tuple(trace.names[i] for i in name_ids.tolist())
    out = []
    prev_end = None
    gpu = np.isin(ev.kind, np.array(GPU_KINDS, dtype=np.int8)) & (ev.device == device)
    busy = iv.union(ev.ts_ns[gpu], ev.ts_ns[gpu] + ev.dur_ns[gpu])
    for k, (lo, _hi) in enumerate(bounds.tolist()):
        pick = np.flatnonzero(which == k)
        ts, dur = ev.ts_ns[rows[pick]], ev.dur_ns[rows[pick]]
        before, starts = [], []
        for t, d in zip(ts.tolist(), dur.tolist()):
            start = prev_end if before else lo if prev_end is None else max(lo, prev_end)
            before.append(max(0, t - start))
            starts.append(min(start, t))
            prev_end = t + d
        busy_before = iv.measure_in(busy, np.array(starts, dtype=np.int64), ts.astype(np.int64)) if starts else []
        out.append(StepCollectives(key=step_key(steps["names"][k], k), dur_ms=steps["durations_ms"][k],
                                   names=tuple(local[pick].tolist()), dur_ns=tuple(dur.tolist()), before_ns=tuple(before),
                                   busy_before_ns=tuple(int(x) for x in busy_before),
                                   messages=tuple(msgs[i] for i in pick.tolist()) if msgs is not None else ()))
    return tuple(out), names


def step_key(name: str, index: int) -> str:
    """How steps are matched across ranks: the step number of ``ProfilerStep#N`` (every rank counts
    the same steps), else the position in the window."""
    m = re.search(r"#(\d+)$", name or "")
    return f"step {m.group(1)}" if m else f"#{index}"


def work_fingerprint(steps: tuple[StepCollectives, ...], names: tuple[str, ...]) -> str:
    """A short hash of the rank's usual sequence of collectives in a step. Ranks of one
    data-parallel group share it; pipeline stages (send/recv where the others all-reduce, or in
    another order) do not."""
    h = hashlib.sha1(b"collectives")
    usual = Counter(tuple(names[i] for i in s.names) for s in steps).most_common(1)
    for n in usual[0][0] if usual else ():
        h.update(n.encode("utf-8", "replace") + b"\0")
    return h.hexdigest()[:12]


def kernel_set(trace, device: int | None) -> frozenset[int]:
    """The distinct kernel names the rank's GPU ran, each as a 64-bit hash (a few hundred at most):
    enough to tell whether two ranks run the same model on the same kind of GPU."""
    from gpumagic.trace.model import Kind

    if device is None or device < 0:
        return frozenset()
    ev = trace.events
    ids = distinct(ev.name[(ev.kind == Kind.KERNEL) & (ev.device == device)])
    return frozenset(int.from_bytes(hashlib.blake2b(trace.names[i].encode("utf-8", "replace"), digest_size=8).digest(), "little")
                     for i in ids.tolist())
