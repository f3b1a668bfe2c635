"""The measured facts of one trace, computed once and shared by metrics and rules.

:func:`build_context` does all the interval maths; rules only read the :class:`Context`.
Its docstrings name the definitions used (TensorBoard profiler plugin, HolisticTraceAnalysis).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis import intervals as iv
from gpumagic.analysis import names as nm
from gpumagic.trace.links import CODE_START
from gpumagic.trace.model import GPU_KINDS, LAUNCH_KINDS, DeviceInfo, Kind, Trace

T = TypeVar("T")

#: A GPU gap shorter than this, whose next kernel was already queued, is launch latency
#: ("kernel wait"). HTA's ``consecutive_kernel_delay`` default is 30 in trace units (µs in its
#: µs-based frames; its documentation says nanoseconds); 30 µs comfortably covers the 2–10 µs
#: launch latency of current GPUs without swallowing real stalls.
LAUNCH_LATENCY_MAX_NS = 30_000
#: A GPU idle gap at least this long is "long" (gpumagic default, from the issue's anchor).
LONG_GAP_NS = 1_000_000
#: Kernels shorter than this are "tiny": their launch overhead (≈ 5–10 µs of host time per
#: launch through the PyTorch dispatcher) is comparable to their work.
SHORT_KERNEL_NS = 10_000
#: The breakdown categories in the TensorBoard profiler plugin's priority order: a moment in
#: the window belongs to the first category active then.
BREAKDOWN_ORDER = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")
MAX_REPORTED_GAPS = 50
#: c10's DeviceType codes of GPU allocator records: 1 = CUDA, 6 = HIP (c10/core/DeviceType.h).
GPU_DEVICE_TYPES = (1, 6)

#: Why the GPU was idle. ``host_wait``: the next work had not been launched yet;
#: ``launch_latency``: it was queued and started within the normal launch delay; the others are
#: queued work that did not start (``idle.other_ms``), named where the trace shows the
#: dependency: a stream waiting on an event (``stream_wait``), a collective waiting for other
#: ranks (``collective``), a graph replay (``graph_launch``); ``other`` when nothing says.
GAP_CAUSES = ("host_wait", "launch_latency", "other", "stream_wait", "collective", "graph_launch")
QUEUED_CAUSES = ("other", "stream_wait", "collective", "graph_launch")


@dataclass
class Gaps:
    """GPU idle gaps as arrays: start, end (ns), cause (index into :data:`GAP_CAUSES`, the
    larger part of the gap), ``next_event``, the row of the device's first GPU event at or after
    the gap's end (-1 when there is none), and ``host_ns``, the gap's host-wait part: it runs
    from the gap's start; the rest of the gap is launch latency or queued work."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    cause: np.ndarray
    next_event: np.ndarray
    host_ns: np.ndarray = None  # type: ignore[assignment]  # None: computed in __post_init__

    def __post_init__(self) -> None:
        if self.host_ns is None:
            self.host_ns = np.where(self.cause == 0, self.end_ns - self.start_ns, 0).astype(np.int64)

    def __len__(self) -> int:
        return int(self.start_ns.size)

    @property
    def dur_ns(self) -> np.ndarray:
        return self.end_ns - self.start_ns

    def where(self, mask: np.ndarray) -> Gaps:
        return Gaps(self.start_ns[mask], self.end_ns[mask], self.cause[mask], self.next_event[mask],
                    self.host_ns[mask])

    def of_cause(self, *causes: str) -> Gaps:
        return self.where(np.isin(self.cause, [GAP_CAUSES.index(c) for c in causes]))

    def host_wait(self) -> iv.Intervals:
        """The host-wait parts of the gaps: from each gap's start to the launch that ends it
        (plus the normal launch delay)."""
        keep = self.host_ns > 0
        return self.start_ns[keep], (self.start_ns + self.host_ns)[keep]

    def total_ns(self) -> int:
        return int(self.dur_ns.sum())

    @property
    def intervals(self) -> tuple[np.ndarray, np.ndarray]:
        return self.start_ns, self.end_ns

    @classmethod
    def empty(cls) -> Gaps:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z.astype(np.int8), z)


class Categories(Mapping[str, iv.Intervals]):
    """A mapping of the breakdown categories (:data:`BREAKDOWN_ORDER`) to intervals, each
    computed by ``make(category)`` when first read, then kept. A context's step-time breakdown
    (:func:`_breakdown`) is a pass of interval maths over every host and GPU event (0.4 s at
    4.3M events) that most readers need one category of: a child that computes the critical path
    (:mod:`gpumagic.analysis.aside`, forked once the rest of the context is built) reads the
    data loader's union alone, while this process computes the whole breakdown for the metrics."""

    def __init__(self, make: Callable[[str], iv.Intervals]) -> None:
        self._make = make
        self._known: dict[str, iv.Intervals] = {}

    def __getitem__(self, category: str) -> iv.Intervals:
        if category not in self._known:
            if category not in BREAKDOWN_ORDER:
                raise KeyError(category)
            self._known[category] = self._make(category)
        return self._known[category]

    def __contains__(self, category: object) -> bool:  # without computing it
        return category in BREAKDOWN_ORDER

    def __iter__(self) -> Iterator[str]:
        return iter(BREAKDOWN_ORDER)

    def __len__(self) -> int:
        return len(BREAKDOWN_ORDER)

    @property
    def computed(self) -> list[str]:
        """The categories computed so far, in :data:`BREAKDOWN_ORDER`."""
        return [c for c in BREAKDOWN_ORDER if c in self._known]

    def __repr__(self) -> str:
        return f"Categories(computed={self.computed})"


@dataclass
class Context:
    """Everything the rules need, in ns relative to the trace origin."""

    trace: Trace
    lo: int
    hi: int
    window_source: str
    step_bounds: list[tuple[int, int]]
    step_names: list[str]
    main_lane: int
    device: int  # primary GPU, -1 when the trace has no GPU activity
    busy: iv.Intervals  # primary device: kernels ∪ copies ∪ memsets, clipped to the window
    per_device: list[dict]
    gaps: Gaps
    idle_ns: dict[str, int]
    cat_union: Mapping[str, iv.Intervals]  # breakdown category -> raw union within window (computed on first use)
    exclusive: Mapping[str, iv.Intervals]  # breakdown category -> exclusive by priority (computed on first use)
    name_flags: dict[str, np.ndarray] = field(default_factory=dict)
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    launch_ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per event: start of the launch that enqueued it (-1)
    launch_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per event: row of the launch that enqueued it (-1)
    gpu_lanes: frozenset = frozenset()  # host lanes that drive the GPU: the main one and launchers
    cache: dict = field(default_factory=dict)  # facts several rules derive (e.g. sync costs)

    def memo(self, key: str, make: Callable[[Context], T]) -> T:
        """``make(self)``, computed once per context under ``key`` in :attr:`cache` (None included):
        a fact several rules and metrics read."""
        if key not in self.cache:
            self.cache[key] = make(self)
        found: T = self.cache[key]
        return found

    @property
    def window_ns(self) -> int:
        return max(self.hi - self.lo, 1)

    def frac(self, ns: float) -> float:
        return float(ns) / self.window_ns

    @property
    def device_info(self) -> DeviceInfo | None:
        """The primary GPU's ``deviceProperties``. Kernels may name a GPU by another index than
        ``deviceProperties`` does (ROCm traces: kernels on device 2, the only GPU listed as 0);
        when the id is not listed and every listed GPU is the same model, that model is it."""
        if self.device < 0:
            return None
        info = self.trace.device_info(self.device)
        devs = self.trace.devices
        if info is None and devs and len({(d.name, d.total_memory_bytes, d.compute_capability) for d in devs}) == 1:
            info = devs[0]
        if info is None and not devs:
            info = self._arch_from_kernels()
        return info

    def _arch_from_kernels(self) -> DeviceInfo | None:
        """Without ``deviceProperties``: an unnamed device whose compute capability is the
        latest architecture its library kernels were built for (``names.kernel_arch``)."""
        return self.memo("arch", _arch_from_kernels)

    def memory_records(self) -> np.ndarray:
        """Mask of the allocator records of the primary GPU (CUDA or HIP device type). When none
        carries its id but the records name exactly one GPU, those are its records (ROCm traces
        number the GPU 0 in allocator records and 2 on kernels)."""
        mem = self.trace.memory
        gpu = np.isin(mem.device_type, GPU_DEVICE_TYPES)
        if self.device < 0:
            return gpu
        mine = gpu & (mem.device == self.device)
        if not mine.any() and gpu.any() and distinct(mem.device[gpu]).size == 1:
            return gpu
        return mine

    @cached_property
    def workload(self) -> str:
        """What ran: ``"training"`` when operators, annotations or kernels show a backward pass
        or an optimizer step; else ``"serving"`` when a serving engine's frames or annotations
        are present (``names.ENGINE_RE``); else ``"inference"``. Python frame names never make
        a trace training: autograd-function wrappers (``save_for_backward``) and AOT-autograd
        frames run in inference too. Inference and serving advice has no optimizer, gradient or
        Trainer fixes."""
        m = self.masks
        what_ran = m["cpu_op"] | m["annotation"] | m["kernel"]
        if bool((m["name_training"] & what_ran).any()):
            return "training"
        return "serving" if bool((m["name_engine"] & (m["annotation"] | m["python"])).any()) else "inference"

    @property
    def cpu_only(self) -> bool:
        return self.device < 0

    @cached_property
    def rocm(self) -> bool:
        """The GPU is AMD's, run through ROCm: its ``deviceProperties`` name says AMD
        (``"AMD Instinct MI300X VF"``), or the host called the HIP runtime (``hipLaunchKernel``,
        ``hipMemcpyAsync``: traces without device names). Advice that only NVIDIA's stack
        accepts (TF32 switches, ``TrainingArguments(tf32=True)``) is left out then."""
        if self.device < 0:
            return False
        info = self.device_info
        if info is not None and nm.says_amd_device(info.name):
            return True
        calls = distinct(self.trace.events.name[self.masks["runtime"]])
        return any(self.trace.names[i].startswith("hip") for i in calls.tolist())

    @cached_property
    def _host_names(self) -> np.ndarray:
        return host_names(self.trace)

    def host_name_ids(self, predicate) -> np.ndarray:
        """``trace.name_ids(predicate)`` on the names host events carry (:func:`host_names`), False on
        the others: for classes that are only ever applied to host events."""
        return nm.classify(self.trace.names, predicate, self._host_names)

    @cached_property
    def _in_window(self) -> np.ndarray:
        """Which events overlap the window (computed once: rules ask for it dozens of times)."""
        ev = self.trace.events
        return (ev.ts_ns < self.hi) & (ev.ts_ns + ev.dur_ns > self.lo)

    @property
    def on_device(self) -> np.ndarray:
        """Which events carry the primary GPU's id (``device``; computed once per device id: two
        dozen metrics and rules select by it, and :func:`build_context` sets ``device`` after the
        context is made). With no GPU (``device`` -1) it is the events without a device id, so
        callers that mean GPU work combine it with a GPU kind's mask, as they all do."""
        known = self.cache.get("on_device")
        if known is None or known[0] != self.device:
            known = self.cache["on_device"] = (self.device, self.trace.events.device == self.device)
        mask: np.ndarray = known[1]
        return mask

    def events_in_window(self, mask: np.ndarray) -> np.ndarray:
        return mask & self._in_window

    def launched_by_main(self) -> np.ndarray:
        """Rows of the primary GPU's events (kernels, copies, memsets) that the main thread
        launched (a known launch on :attr:`main_lane`), in table order."""
        ev = self.trace.events
        rows = np.flatnonzero(self.masks["gpu"] & self.on_device & (self.launch_row >= 0))
        found: np.ndarray = rows[ev.lane[self.launch_row[rows]] == self.main_lane]
        return found

    def intervals(self, mask: np.ndarray) -> iv.Intervals:
        ev = self.trace.events
        start = ev.ts_ns[mask]
        return iv.clip(iv.union(start, start + ev.dur_ns[mask]), self.lo, self.hi)


def host_names(trace: Trace) -> np.ndarray:
    """Which of ``trace.names`` some event other than a kernel, copy or memset carries: the
    names a host class (a call, an operator, a frame, an annotation) can describe."""
    ev = trace.events
    used = np.zeros(len(trace.names), dtype=bool)
    used[ev.name[~np.isin(ev.kind, np.array(GPU_KINDS, dtype=np.int8))]] = True
    return used


def _flags(trace: Trace) -> dict[str, np.ndarray]:
    """Per distinct name, which classes it belongs to (evaluated once per name). The classes of
    host events are evaluated only on :func:`host_names` (False on names that only kernels,
    copies and memsets carry): every use of them selects host events, and a trace's distinct
    kernel names can be hundreds of thousands."""
    everywhere = {"nccl": nm.is_nccl, "tensor_core": nm.is_tensor_core, "matmul": nm.is_matmul, "training": nm.is_training}
    host = {
        "step": nm.is_step, "dataloader": nm.is_dataloader, "sync_call": nm.is_sync_call,
        "sync_op": nm.SYNC_OPS.__contains__, "alloc": nm.ALLOC_CALLS.__contains__,
        "init": nm.INIT_CALLS.__contains__, "compile": nm.is_compile,
        "graph_launch": nm.is_graph_launch, "stream_wait": nm.is_stream_wait,
        "capture_call": nm.is_capture_call, "begin_capture": nm.BEGIN_CAPTURE_CALLS.__contains__,
        "end_capture": nm.END_CAPTURE_CALLS.__contains__, "capture_frame": nm.is_capture_frame,
        "cold_call": nm.is_cold_call, "library_sync_op": nm.is_library_sync_op, "one_off": nm.is_one_off_frame,
        "engine": nm.is_engine, "comm_host": nm.is_comm_host,
    }
    out = {k: trace.name_ids(f) for k, f in everywhere.items()}
    among = host_names(trace)
    return {**out, **{k: nm.classify(trace.names, f, among) for k, f in host.items()}}


def _trace_facts(trace: Trace) -> tuple[Any, ...]:
    """What a context needs that does not depend on its window: per-name classes, the event
    masks, each GPU event's launch (row and time), every step's bounds and name, the main thread."""
    ev = trace.events
    flags = _flags(trace)
    # a class no name of the trace is in (most of them, in most traces) needs no pass over the
    # events: zeroed memory (calloc) instead of a gather per event (each 4 ms per million events)
    by_name = {k: v[ev.name] if v.any() else np.zeros(len(ev), dtype=bool) for k, v in flags.items()}
    kind = ev.kind
    gpu = np.isin(kind, np.array(GPU_KINDS, dtype=np.int8))
    masks = {
        "gpu": gpu,
        "kernel": kind == Kind.KERNEL,
        "memcpy": kind == Kind.MEMCPY,
        "memset": kind == Kind.MEMSET,
        "runtime": np.isin(kind, np.array(LAUNCH_KINDS, dtype=np.int8)),
        "cpu_op": kind == Kind.CPU_OP,
        "annotation": kind == Kind.ANNOTATION,
        "python": kind == Kind.PYTHON,
        **{f"name_{k}": v for k, v in by_name.items()},
    }
    host = ~gpu & (kind != Kind.GPU_ANNOTATION) & (kind != Kind.SYNC)
    masks["host"] = host
    steps = np.flatnonzero(masks["name_step"] & host)
    launch_row = _launch_rows(trace, masks)
    launch_ts = np.where(launch_row >= 0, ev.ts_ns[np.maximum(launch_row, 0)], -1)
    step_bounds, step_names = _steps(trace, steps, masks, launch_ts)
    return flags, masks, launch_row, launch_ts, step_bounds, step_names, _main_lane(trace, steps, masks)


def build_context(trace: Trace, window: tuple[int, int] | None = None, like: Context | None = None) -> Context:
    """The context of the whole window, or of ``window`` (ns, a part of it: the steady part the
    steady-state rules judge, ``analysis.segments``): the steps wholly inside it, else the
    span itself. ``like``: the whole window's context of the same trace, whose facts that do not
    depend on the window (name classes, masks, launch links, steps, main thread) are reused."""
    ev = trace.events
    if like is not None and like.trace is trace and "trace_facts" in like.cache:
        flags, masks, launch_row, launch_ts, all_bounds, all_names, main_lane = like.cache["trace_facts"]
    else:
        flags, masks, launch_row, launch_ts, all_bounds, all_names, main_lane = _trace_facts(trace)
    step_bounds, step_names = list(all_bounds), list(all_names)
    if window is not None:
        inside = [i for i, (s, e) in enumerate(step_bounds) if s >= window[0] and e <= window[1]]
        step_bounds, step_names = [step_bounds[i] for i in inside], [step_names[i] for i in inside]
    if window is not None and not step_bounds:
        lo, hi, source = int(window[0]), int(window[1]), "steady"
    elif step_bounds:
        lo, hi, source = step_bounds[0][0], step_bounds[-1][1], "steps"
    else:
        lo = int(ev.ts_ns.min()) if len(ev) else 0
        hi = int((ev.ts_ns + ev.dur_ns).max()) if len(ev) else 1
        source = "trace"
        lo = _code_start(trace, lo, hi)
    hi = max(hi, lo + 1)
    ctx = Context(trace, lo, hi, source, step_bounds, step_names, main_lane, -1, iv.empty(), [], Gaps.empty(),
                  {}, {}, {}, flags, masks, launch_ts, launch_row)
    ctx.cat_union = Categories(lambda cat: _category_union(ctx, cat))
    ctx.exclusive = Categories(lambda cat: _breakdown(ctx)[cat])
    ctx.cache["trace_facts"] = (flags, masks, launch_row, launch_ts, all_bounds, all_names, main_lane)
    ctx.gpu_lanes = frozenset({main_lane, *ev.lane[launch_row[launch_row >= 0]].tolist()}) - {-1}
    _gpu_facts(ctx)
    return ctx


def _code_start(trace: Trace, lo: int, hi: int) -> int:
    """Where the profiled code began in a gpumagic capture (the end of its last
    :data:`~gpumagic.trace.links.CODE_START` range), or ``lo``: what came before was the capture's
    own set-up."""
    if CODE_START not in trace.names:
        return lo
    ev = trace.events
    rows = np.flatnonzero(trace.name_ids(lambda n: n == CODE_START)[ev.name])
    end = int((ev.ts_ns[rows] + ev.dur_ns[rows]).max())
    return end if lo <= end < hi else lo


def _launch_rows(trace: Trace, masks: dict[str, np.ndarray]) -> np.ndarray:
    """For each GPU event, the row of the runtime/driver call with the same correlation id."""
    ev = trace.events
    out = np.full(len(ev), -1, dtype=np.int64)
    launches = np.flatnonzero(masks["runtime"] & (ev.corr >= 0))
    targets = np.flatnonzero(masks["gpu"] & (ev.corr >= 0))
    if launches.size == 0 or targets.size == 0:
        return out
    order = np.argsort(ev.corr[launches], kind="stable")
    keys = ev.corr[launches][order]
    pos = np.searchsorted(keys, ev.corr[targets])
    pos = np.minimum(pos, keys.size - 1)
    hit = keys[pos] == ev.corr[targets]
    out[targets[hit]] = launches[order][pos[hit]]
    return out


def _steps(trace, steps, masks, launch_ts):
    """Step i spans its ``ProfilerStep#`` annotation, extended to the end of the GPU work it
    launched (as the TensorBoard plugin does), but never past the next step's start."""
    if steps.size == 0:
        return [], []
    ev = trace.events
    starts, ends = ev.ts_ns[steps], ev.ts_ns[steps] + ev.dur_ns[steps]
    gpu = np.flatnonzero(launch_ts >= 0)
    order = np.argsort(launch_ts[gpu], kind="stable")
    g_launch, g_end = launch_ts[gpu][order], (ev.ts_ns[gpu] + ev.dur_ns[gpu])[order]
    # the GPU events step i launched are those at [first[i], last[i]) in launch order; the latest
    # end of each such run at once (a sweep per step read every GPU event once per step)
    first = np.searchsorted(g_launch, starts, side="left")
    last = np.searchsorted(g_launch, ends, side="left")
    pairs = np.column_stack([first, last]).ravel()
    latest = np.maximum.reduceat(np.append(g_end, 0), pairs)[::2] if g_end.size else np.zeros(steps.size, np.int64)
    latest = np.where(last > first, latest, 0)
    bounds = []
    for i in range(steps.size):
        end = max(int(ends[i]), int(latest[i]))
        if i + 1 < steps.size:
            end = min(end, int(starts[i + 1])) if starts[i + 1] > starts[i] else end
        bounds.append((int(starts[i]), end))
    return bounds, [trace.names[n] for n in ev.name[steps]]


def _main_lane(trace, steps, masks) -> int:
    ev = trace.events
    if steps.size:
        return int(ev.lane[steps[0]])
    cpu = np.flatnonzero(masks["cpu_op"] | masks["runtime"])
    if cpu.size == 0:
        host = np.flatnonzero(masks["host"])
        return int(ev.lane[host[0]]) if host.size else -1
    return int(np.argmax(np.bincount(ev.lane[cpu], weights=ev.dur_ns[cpu])))


def _gpu_facts(ctx: Context) -> None:
    """Busy time per device (union over streams, never a per-stream sum) and the primary
    device's idle gaps, classified with HolisticTraceAnalysis's definitions."""
    ev, m = ctx.trace.events, ctx.masks
    gpu_in = ctx.events_in_window(m["gpu"])
    devices = distinct(ev.device[gpu_in]) if gpu_in.any() else np.zeros(0, dtype=np.int32)
    best, best_busy = -1, -1
    for d in devices.tolist():
        on_d = gpu_in & (ev.device == d)
        busy = ctx.intervals(on_d)
        row: dict[str, Any] = {"device": int(d), "busy_ns": iv.total(busy),
               "streams": sorted(set(ev.stream[on_d].tolist()))}
        for k in ("kernel", "memcpy", "memset"):
            row[f"{k}_ns"] = iv.total(ctx.intervals(on_d & m[k]))
        ctx.per_device.append(row)
        if row["busy_ns"] > best_busy:
            best, best_busy, ctx.busy = int(d), row["busy_ns"], busy
    ctx.device = best
    ctx.gaps, ctx.idle_ns = _classify_gaps(ctx)


def _classify_gaps(ctx: Context) -> tuple[Gaps, dict[str, int]]:
    """Split the primary device's idle time inside the window (after HTA's "Idle Time
    Breakdown", split at the launch):

    ::

        GPU   ███████                      ████
        host              launch ▲
              ├ host wait ───────┼30µs┤ queued ┤   next work launched after the gap began
        GPU   ███████          ████
        host    launch ▲                           launched before: < 30 µs launch latency,
                                                   else queued work that did not start

    - host wait: from the gap's start to the launch of the work that ends it, plus the normal
      launch delay (up to :data:`LAUNCH_LATENCY_MAX_NS`); in a leading gap whose launch is not in
      the trace (launched before the window), the time the host threads that drive the GPU were
      recorded busy in it, the rest ``other`` (a trace cut before its first launches, a graph
      replayed from before the window: what the GPU waited for is not recorded);
    - whatever remains after that is queued work that did not start: a dependency (an event
      wait on another stream, a collective waiting for other ranks, a graph replay, work outside
      the recorded window), counted as ``other`` and named where the trace shows it;
    - work launched before the gap began: launch latency when the gap is short, else queued;
    - a trailing gap (no GPU work after it in the window) is ``other``.
    """
    ev, m = ctx.trace.events, ctx.masks
    idle = dict.fromkeys(("host_wait", "launch_latency", "other"), 0)
    if ctx.device < 0:
        return Gaps.empty(), idle
    g_s, g_e = iv.gaps(ctx.busy, ctx.lo, ctx.hi)
    on_d = np.flatnonzero(m["gpu"] & ctx.on_device)
    starts = ev.ts_ns[on_d]  # sorted: the table is sorted by start
    k = np.searchsorted(starts, g_e, side="left")
    nxt = np.where(k < on_d.size, on_d[np.minimum(k, on_d.size - 1)], -1)
    has_next = (nxt >= 0) & (g_e < ctx.hi)
    launch = np.where(has_next, ctx.launch_ts[np.maximum(nxt, 0)], -1)
    length = g_e - g_s
    after = has_next & (launch >= g_s)
    unknown_lead = has_next & (launch < 0) & (g_s == ctx.lo)
    # the host is busy until the launch call returns: a call that lasts (lazy module loading, a
    # cold start, staging a pageable copy) keeps the gap host time until then, whether it began
    # before the gap (it spans it) or inside it
    by = np.where(has_next, ctx.launch_row[np.maximum(nxt, 0)], -1)
    launch_end = np.where(by >= 0, ev.ts_ns[np.maximum(by, 0)] + ev.dur_ns[np.maximum(by, 0)], -1)
    host_end = np.maximum(launch + LAUNCH_LATENCY_MAX_NS, launch_end)
    host_ns = np.where(after, np.minimum(host_end, g_e) - g_s, 0)
    spans = has_next & (launch >= 0) & (launch < g_s) & (launch_end > g_s)
    host_ns = np.where(spans, np.minimum(launch_end, g_e) - g_s, host_ns)
    lead_host = np.zeros(g_s.size, dtype=np.int64)
    if unknown_lead.any():
        lead_host[unknown_lead] = _host_recorded(ctx, g_s[unknown_lead], g_e[unknown_lead])
    host_ns = np.where(unknown_lead, lead_host, np.maximum(host_ns, 0))
    latency = has_next & (launch >= 0) & (launch < g_s) & (length < LAUNCH_LATENCY_MAX_NS) & ~spans
    host_ns = np.where(latency, 0, host_ns)
    queued_ns = np.maximum(length - host_ns - np.where(latency, length, 0), 0)
    dependency = _dependencies(ctx, nxt, launch)
    cause = np.where(latency, 1, np.where(host_ns >= queued_ns, 0, np.where(has_next, dependency, 2)))
    idle["host_wait"] = int(host_ns.sum())
    idle["launch_latency"] = int(length[latency].sum())
    idle["other"] = int(queued_ns.sum())
    return Gaps(g_s, g_e, cause.astype(np.int8), nxt.astype(np.int64), host_ns.astype(np.int64)), idle


def _host_recorded(ctx: Context, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per span ``[starts, ends)``, the time in it that the host threads driving the GPU
    (``ctx.gpu_lanes``) were recorded busy (any host event)."""
    ev = ctx.trace.events
    host = ctx.intervals(ctx.masks["host"] & np.isin(ev.lane, np.array(sorted(ctx.gpu_lanes), dtype=np.int64)))
    return iv.measure_in(host, starts, ends)


def _dependencies(ctx: Context, nxt: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Per gap, the cause index naming what the queued work after it waited on: a collective
    kernel (``collective``), work replayed by a graph launch (``graph_launch``), a stream wait
    issued between the previous launch and this one (``stream_wait``), else ``other``."""
    ev, m = ctx.trace.events, ctx.masks
    out = np.full(nxt.size, GAP_CAUSES.index("other"), dtype=np.int64)
    if nxt.size == 0:
        return out
    row = np.maximum(nxt, 0)
    waits = np.sort(ev.ts_ns[m["name_stream_wait"] & m["runtime"]])
    launches = np.sort(ctx.launch_ts[(ctx.launch_ts >= 0) & m["gpu"] & ctx.on_device])
    prev = launches[np.maximum(np.searchsorted(launches, launch, side="left") - 1, 0)] if launches.size else launch
    w = np.searchsorted(waits, launch, side="right") - 1
    has_wait = (w >= 0) & (waits[np.maximum(w, 0)] >= prev) if waits.size else np.zeros(nxt.size, bool)
    out[has_wait & (launch >= 0)] = GAP_CAUSES.index("stream_wait")
    by = ctx.launch_row[row]
    graph = (by >= 0) & m["name_graph_launch"][np.maximum(by, 0)]
    out[graph] = GAP_CAUSES.index("graph_launch")
    out[m["kernel"][row] & m["name_nccl"][row]] = GAP_CAUSES.index("collective")
    out[nxt < 0] = GAP_CAUSES.index("other")
    return out


def _sources(ctx: Context, category: str) -> np.ndarray:
    """The events of a breakdown category (every one but ``other``): "kernel" is every kernel
    of the primary device but NCCL's, which are "communication"."""
    m = ctx.masks
    if category in ("kernel", "memcpy", "memset", "communication"):
        on_device = ctx.on_device if ctx.device >= 0 else np.zeros(len(ctx.trace.events), bool)
        if category == "kernel":
            return m["kernel"] & on_device & ~m["name_nccl"]
        if category == "communication":
            return m["kernel"] & on_device & m["name_nccl"]
        return m[category] & on_device
    if category == "runtime":
        return m["runtime"] & m["host"]
    if category == "dataloader":
        return m["name_dataloader"] & m["host"]
    if category == "cpu_exec":
        return m["host"] & (m["cpu_op"] | m["annotation"] | m["python"]) & ~m["name_step"] & ~m["name_dataloader"]
    raise KeyError(category)


def _category_union(ctx: Context, category: str) -> iv.Intervals:
    """``ctx.cat_union[category]``: the union of the category's events within the window (for
    ``other``, the time no category covers)."""
    if category == "other":
        return ctx.exclusive["other"]
    return ctx.intervals(ctx.events_in_window(_sources(ctx, category)))


def _breakdown(ctx: Context) -> dict[str, iv.Intervals]:
    """Step time by category, TensorBoard-plugin style: each moment goes to the highest-priority
    category active then (kernel > memcpy > memset > communication > runtime > dataloader >
    CPU exec > other); computed once per context, on the first read of ``ctx.exclusive``."""
    return ctx.memo("breakdown", _exclusive_parts)


def _arch_from_kernels(ctx: Context) -> DeviceInfo | None:
    ev = ctx.trace.events
    ids = distinct(ev.name[ctx.masks["kernel"] & ctx.on_device])
    arch = [a for a in (nm.kernel_arch(ctx.trace.names[n]) for n in ids.tolist()) if a is not None]
    return DeviceInfo(ctx.device, "", 0, *max(arch)) if arch else None


def _exclusive_parts(ctx: Context) -> dict[str, iv.Intervals]:
    exclusive: dict[str, iv.Intervals] = {}
    covered = iv.empty()
    for cat in BREAKDOWN_ORDER[:-1]:
        raw = ctx.cat_union[cat]
        exclusive[cat] = iv.subtract(raw, covered)
        covered = iv.merge(covered, raw)
    exclusive["other"] = iv.gaps(covered, ctx.lo, ctx.hi)
    return exclusive
