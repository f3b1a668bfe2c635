"""What kind of window is this? Split it into segments before the rules judge it.

A window can hold more than a steady loop: a cold start (context creation, lazy module
loading, library handles, first-touch allocations, cuDNN's algorithm search), a graph capture
(a CUDA/HIP graph being recorded and instantiated, a serving engine's capture loop), compilation
(dynamo/inductor/Triton on a thread that drives the GPU), one-off host work before the first
launch (imports, model loading) and an idle tail. None of those is a bottleneck to tune, so the
steady-state rules judge only the steady part (``analysis.analyze``), and ``warmup-in-window``
says how much of the window the rest takes.

Every segment other than ``steady`` needs positive evidence; whatever is not identified is
steady, including a window of one step or with no step markers. Signals, each with its source
in ``analysis.names``: capture/instantiate calls and capture frames/annotations; compile
frames; a runtime or launch call lasting orders of magnitude longer than its peers while the
GPU was idle (a call that waits for queued work keeps the GPU busy); the first call of an
operator on a thread lasting milliseconds more than its later calls, not counting the time it
spent copying or waiting; blocking syncs inside a library's operator (cuDNN's benchmark);
a first step far longer than the others (twice their median, and half again their longest),
unless the CPU samples show the main thread waiting for a core for half its excess or more;
import/model-loading frames before the first launch; an evaluation loop that gpumagic's step
timer saw (a module in eval mode with no optimizer step), which recurs but is not training.

Everything here works on the numpy columns; the only Python loops run over distinct names,
lanes or a handful of candidate events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpumagic._arrays import distinct, median_of
from gpumagic.analysis import allocator, everystep
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import LONG_GAP_NS, Context
from gpumagic.analysis.hostcpu import sampled_ns
from gpumagic.analysis.hostload import BUSY_WAIT
from gpumagic.analysis.phases import phase_intervals

SEGMENT_KINDS = ("steady", "cold_start", "graph_capture", "compile", "one_off_host", "evaluation", "idle_tail")
#: When segments overlap, the more specific kind keeps the time (a capture runs compiled code
#: and launches kernels whose modules load lazily: it is still the capture; an evaluation's first
#: call that loads a kernel is cold start).
PRECEDENCE = ("graph_capture", "compile", "cold_start", "one_off_host", "evaluation", "idle_tail")
#: The kinds that are warm-up: they will not recur once the program runs steadily.
WARMUP_KINDS = ("cold_start", "graph_capture", "compile", "one_off_host")
#: "Orders of magnitude longer than its peers": at least 100× the median call of the same name
#: (two orders of magnitude) ...
OUTLIER_RATIO = 100.0
#: ... and at least 1 ms (a launch costs 2–10 µs: a millisecond is a few hundred launches).
COLD_CALL_MIN_NS = 1_000_000
#: A call counts as one-off work only while the GPU was mostly idle (busy under half of it): a
#: launch that blocks because the launch queue is full, or a call that waits for queued work,
#: overlaps a busy GPU.
COLD_CALL_MAX_BUSY = 0.5
#: Fewer calls than this of a name have no peers to compare with: the median of all runtime
#: calls in the trace is the reference.
MIN_PEERS = 3
#: A first operator call "lasting milliseconds": its own time (less copies and waits inside it)
#: at least 5 ms and 100× the median of its later calls on the same thread.
FIRST_CALL_MIN_NS = 5_000_000
#: A first step this many times the median of the others is warm-up (metrics.steps uses the same)...
FIRST_STEP_RATIO = 2.0
#: ... when it is also this many times the longest of the others. A step of the steady loop that
#: comes close puts the first within the run's own variation, not a one-off: beside a spinning
#: neighbour on this project's 2-core machine, five steps of unchanged code took 134, 132, 44, 59
#: and 12 ms (the first 2.6x the median of the others, 1.02x the longest).
FIRST_STEP_OVER_LONGEST = 1.5
#: ... unless the main thread waited for a core for at least this share of the first step's
#: excess over that median (the CPU samples' run-queue wait): then the machine made it long.
CONTENDED_SHARE = 0.5
#: Pieces of one kind closer than this merge into one segment (1 ms, or 1 % of the window).
MERGE_GAP_NS = 1_000_000
MERGE_GAP_FRAC = 0.01
#: A non-steady segment shorter than this is not reported, and does not cut the steady part:
#: a 20 µs cuInit or a sub-millisecond allocation says nothing about the window.
MIN_SEGMENT_NS = 1_000_000
#: The steady-state rules need a steady stretch at least this long (1 ms and 5 % of the
#: window); below that the window has no steady part to judge.
STEADY_MIN_NS = 1_000_000
STEADY_MIN_FRAC = 0.05
MAX_SEGMENTS = 50
MAX_EVIDENCE = 5


@dataclass
class Segment:
    kind: str
    start_ns: int
    end_ns: int
    evidence: list[str] = field(default_factory=list)

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class Segments:
    """The window's segments in time order (steady ones included), and the steady stretch the
    steady-state rules judge: the longest steady segment, ``None`` when there is none long
    enough (``STEADY_MIN_*``)."""

    items: list[Segment]
    window_ns: int
    steady_span: tuple[int, int] | None

    def share(self, kinds=WARMUP_KINDS) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.items:
            if s.kind in kinds:
                out[s.kind] = out.get(s.kind, 0.0) + s.dur_ns / self.window_ns
        return out

    @property
    def steady_frac(self) -> float:
        return sum(s.dur_ns for s in self.items if s.kind == "steady") / self.window_ns

    @property
    def all_steady(self) -> bool:
        return all(s.kind == "steady" for s in self.items)

    def kind_at(self, start: int, end: int) -> Segment | None:
        """The non-steady segment covering most of ``[start, end)``, if it covers at least half."""
        best, cover = None, 0
        for s in self.items:
            if s.kind == "steady":
                continue
            c = min(end, s.end_ns) - max(start, s.start_ns)
            if c > cover:
                best, cover = s, c
        return best if best is not None and cover >= 0.5 * max(end - start, 1) else None


def segments(ctx: Context) -> Segments:
    """The window's segments (computed once per context)."""
    return ctx.memo("segments", _segments)


#: Another steady segment holds the same loop as the judged stretch when its busy share (the
#: GPU's work, or on a CPU-only trace the host's operators) is at least this part of the judged
#: stretch's: the set-up before a cold start (a few operators, no kernel) is not the loop.
LIKE_BUSY = 0.5


def steady_others(ctx: Context) -> iv.Intervals:
    """The steady segments other than the judged stretch (``steady_span``), each of at least
    ``MIN_SEGMENT_NS`` and as busy as the loop (:data:`LIKE_BUSY`): the same loop between
    evaluations, captures or compilations, whose time the steady-state findings' gains count too
    (``analysis._findings``, ``gains.apportion``). Computed once per context."""
    return ctx.memo("steady_others", _steady_others)


def _steady_others(ctx: Context) -> iv.Intervals:
    seg = segments(ctx)
    if seg.steady_span is None:
        return iv.empty()
    rest = [(x.start_ns, x.end_ns) for x in seg.items if x.kind == "steady" and x.dur_ns >= MIN_SEGMENT_NS
            and (x.start_ns, x.end_ns) != seg.steady_span]
    if not rest:
        return iv.empty()
    kinds = ("kernel", "memcpy", "memset", "communication") if ctx.device >= 0 else ("cpu_exec",)
    busy = iv.empty()
    for kind in kinds:
        busy = iv.merge(busy, ctx.cat_union[kind])

    def share(a: int, b: int) -> float:
        return iv.total(iv.clip(busy, a, b)) / max(b - a, 1)

    floor = LIKE_BUSY * share(*seg.steady_span)
    keep = [(a, b) for a, b in rest if (busy_share := share(a, b)) >= floor and busy_share > 0]
    return (np.array([a for a, _ in keep], dtype=np.int64), np.array([b for _, b in keep], dtype=np.int64))


def metrics(ctx: Context) -> dict[str, Any]:
    """``window.segments`` and ``window.steady_frac`` (docs/metrics.md)."""
    seg = segments(ctx)
    shown = seg.items
    if len(shown) > MAX_SEGMENTS:  # keep the longest, in time order
        keep = set(np.argsort([-s.dur_ns for s in shown], kind="stable")[:MAX_SEGMENTS].tolist())
        shown = [s for i, s in enumerate(shown) if i in keep]
    span = seg.steady_span
    return {"segments": [{"kind": s.kind, "start_ms": round((s.start_ns - ctx.lo) / 1e6, 4),
                          "dur_ms": round(s.dur_ns / 1e6, 4), "evidence": list(s.evidence)} for s in shown],
            "steady_frac": round(seg.steady_frac, 4),
            "steady_judged_ms": None if span is None else [round((span[0] - ctx.lo) / 1e6, 4),
                                                           round((span[1] - ctx.lo) / 1e6, 4)]}


# --- the detectors: each returns pieces (start_ns, end_ns, evidence) -------------------------

Piece = tuple[int, int, str]


def _driving(ctx: Context) -> np.ndarray:
    """Per event: on a thread that drives the GPU (``Context.gpu_lanes``); computed once."""
    return ctx.memo("driving", lambda c: np.isin(c.trace.events.lane,
                                                 np.fromiter(c.gpu_lanes, dtype=np.int64, count=len(c.gpu_lanes))))


def _in_window(ctx: Context) -> np.ndarray:
    """Per event: overlaps the window; computed once."""
    return ctx.memo("in_window", lambda c: c.events_in_window(np.ones(len(c.trace.events), bool)))


def _name(ctx: Context, row: int) -> str:
    return ctx.trace.names[ctx.trace.events.name[row]]


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms" if ns >= 1e5 else f"{ns / 1e3:.0f} µs"


def graph_capture(ctx: Context) -> list[Piece]:
    """Stream capture (begin → end on the same thread), graph instantiation, and the capture
    frames and annotations of ``names.CAPTURE_FRAME_RE``."""
    ev, m = ctx.trace.events, ctx.masks
    win = _in_window(ctx)
    out: list[Piece] = []
    begins = np.flatnonzero(m["name_begin_capture"] & m["runtime"] & win)
    ends = np.flatnonzero(m["name_end_capture"] & m["runtime"] & win)
    launches = np.sort(ctx.launch_ts[ctx.launch_ts >= 0]) if ctx.launch_ts is not None else np.zeros(0)
    launch_call = m["runtime"] & ctx.host_name_ids(lambda n: "Launch" in n and "Graph" not in n)[ev.name]
    for b in begins.tolist():
        later = ends[(ev.lane[ends] == ev.lane[b]) & (ev.ts_ns[ends] >= ev.ts_ns[b])]
        e = int(ev.ts_ns[later[0]] + ev.dur_ns[later[0]]) if later.size else ctx.hi
        s = int(ev.ts_ns[b])
        n_calls = int(np.count_nonzero(launch_call & (ev.lane == ev.lane[b]) & (ev.ts_ns > s) & (ev.ts_ns < e)))
        ran = int(np.count_nonzero((launches > s) & (launches < e)))
        out.append((s, e, f"{_name(ctx, b)} → {_name(ctx, later[0]) if later.size else 'end of window'} "
                          f"{_ms(e - s)}: {n_calls} launches recorded into the graph, {ran} GPU events ran"))
    inst = np.flatnonzero(m["name_capture_call"] & m["runtime"] & win & ~m["name_begin_capture"] & ~m["name_end_capture"])
    out += [(int(ev.ts_ns[i]), int(ev.ts_ns[i] + ev.dur_ns[i]), f"{_name(ctx, i)} {_ms(ev.dur_ns[i])}")
            for i in inst.tolist()]
    frames = np.flatnonzero(m["name_capture_frame"] & m["host"] & ~m["runtime"] & win)
    out += _named_spans(ctx, frames, "")
    return out


def _named_spans(ctx: Context, rows: np.ndarray, prefix: str) -> list[Piece]:
    """One piece per outermost span of ``rows`` (nested frames collapse), named by its longest
    event."""
    ev = ctx.trace.events
    if rows.size == 0:
        return []
    s, e = iv.union(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows])
    out: list[Piece] = []
    longest = rows[np.argsort(-ev.dur_ns[rows], kind="stable")]
    starts = ev.ts_ns[longest]
    for a, b in zip(s.tolist(), e.tolist(), strict=True):
        inside = longest[(starts >= a) & (starts < b)]
        label = _name(ctx, int(inside[0]))[:80] if inside.size else ""
        out.append((a, b, f"{prefix}{label} {_ms(b - a)}"))
    return out


def compile_pieces(ctx: Context) -> list[Piece]:
    """Compilation and autotuning frames (``names.COMPILE_RE``) on the threads that drive the GPU."""
    m = ctx.masks
    rows = np.flatnonzero(ctx.events_in_window(m["name_compile"] & m["host"]) & _driving(ctx))
    return _named_spans(ctx, rows, "compiling: ")


def cold_start(ctx: Context) -> list[Piece]:
    """Context creation, lazy loading, handle creation, first-touch allocations and cuDNN's
    algorithm search, from behaviour: outlier calls, slow first operator calls, library syncs,
    allocator calls, an outlying first step."""
    return [*_outlier_calls(ctx), *_first_calls(ctx), *_library_sync_pieces(ctx), *_init_calls(ctx),
            *_first_step(ctx)]


def _outlier_calls(ctx: Context) -> list[Piece]:
    ev, m = ctx.trace.events, ctx.masks
    rt = np.flatnonzero(m["runtime"] & m["host"])
    if rt.size == 0:
        return []
    cand_rows = rt[m["name_cold_call"][rt] & (ev.dur_ns[rt] >= COLD_CALL_MIN_NS)]
    cand_rows = cand_rows[_in_window(ctx)[cand_rows] & _driving(ctx)[cand_rows]]
    if cand_rows.size == 0:
        return []
    overall = median_of(ev.dur_ns[rt])
    first_of_kernel = _launches_first_kernel(ctx)
    out: list[Piece] = []
    for n in distinct(ev.name[cand_rows]).tolist():
        peers = ev.dur_ns[rt[ev.name[rt] == n]]
        ref = median_of(peers) if peers.size >= MIN_PEERS else overall
        ref = max(ref, 1000.0)  # a 0-µs median (coarse clocks) compares with 1 µs
        rows = cand_rows[ev.name[cand_rows] == n]
        rows = rows[ev.dur_ns[rows] >= OUTLIER_RATIO * ref]
        if rows.size == 0:
            continue
        if "Launch" in ctx.trace.names[n]:
            rows = rows[first_of_kernel[rows]]
        elif len(ctx.step_bounds) >= MIN_PEERS:
            rows = _not_periodic(ctx, rows)
        s, e = ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows]
        busy = iv.measure_in(ctx.busy, s, e) / np.maximum(e - s, 1)
        for i in np.flatnonzero(busy < COLD_CALL_MAX_BUSY).tolist():
            what = _why_slow(ctx.trace.names[n])
            out.append((int(s[i]), int(e[i]), f"{ctx.trace.names[n]} {_ms(e[i] - s[i])} (median {_ms(ref)}){what}"))
    return out


def _launches_first_kernel(ctx: Context) -> np.ndarray:
    """Per event: a launch call whose GPU work is the first of its name in the trace, or whose
    work is not in the trace. Lazy loading loads a kernel's module at its first launch only; a
    slow launch of a kernel that ran before is something else (a busy host, a full queue)."""
    ev, m = ctx.trace.events, ctx.masks
    out = m["runtime"].copy()
    gpu = np.flatnonzero(m["gpu"] & (ctx.launch_row >= 0))
    if gpu.size == 0:
        return out
    _, first = np.unique(ev.name[gpu], return_index=True)
    is_first = np.zeros(gpu.size, dtype=bool)
    is_first[first] = True
    out[ctx.launch_row[gpu[~is_first]]] = False
    out[ctx.launch_row[gpu[is_first]]] = True
    return out


def _not_periodic(ctx: Context, rows: np.ndarray) -> np.ndarray:
    """Drop outlier calls of a name that recur in at least half of the steps: what happens
    every step is the loop, not its start."""
    b = np.array(ctx.step_bounds, dtype=np.int64)
    k = np.searchsorted(b[:, 0], ctx.trace.events.ts_ns[rows], side="right") - 1
    if distinct(k[k >= 0]).size >= max(2, len(b) / 2):
        return rows[:0]
    return rows


def _why_slow(name: str) -> str:
    if "Launch" in name:
        return ": a first launch loading its module (lazy loading)"
    if "StreamCreate" in name or "EventCreate" in name:
        return ": stream/event creation in a first library call (context or handle creation)"
    if "StreamPriority" in name or name.endswith("Free") or "Init" in name or "Ctx" in name:
        return ": context creation or device memory release"
    if "Malloc" in name:
        return ": a first-touch allocation"
    return ""


def _first_calls(ctx: Context) -> list[Piece]:
    """First call of an operator on a thread that lasts milliseconds longer than its later ones,
    not counting the copies and waits inside it (a first batch copied from pageable memory is
    not start-up)."""
    ev, m = ctx.trace.events, ctx.masks
    ops = np.flatnonzero(m["cpu_op"] & _driving(ctx))
    if ops.size == 0:
        return []
    key = ev.lane[ops].astype(np.int64) * (len(ctx.trace.names) + 1) + ev.name[ops]
    _, first = np.unique(key, return_index=True)
    cand = ops[first]
    cand = cand[(ev.dur_ns[cand] >= FIRST_CALL_MIN_NS) & _in_window(ctx)[cand]]
    if cand.size == 0:
        return []
    waits = np.flatnonzero(m["runtime"] & (m["name_sync_call"] | m["name_capture_call"]
                                           | _copy_call_mask(ctx)))
    out: list[Piece] = []
    for i in cand.tolist():
        lane_waits = waits[ev.lane[waits] == ev.lane[i]]
        s, e = int(ev.ts_ns[i]), int(ev.ts_ns[i] + ev.dur_ns[i])
        waited = int(iv.measure_in(iv.union(ev.ts_ns[lane_waits], ev.ts_ns[lane_waits] + ev.dur_ns[lane_waits]),
                                   np.array([s]), np.array([e]))[0]) if lane_waits.size else 0
        own = (e - s) - waited
        same = ops[(ev.lane[ops] == ev.lane[i]) & (ev.name[ops] == ev.name[i])]
        later = ev.dur_ns[same[1:]]
        if later.size < MIN_PEERS - 1 or own < FIRST_CALL_MIN_NS:
            continue
        ref = max(median_of(later), 1000.0)
        if own >= OUTLIER_RATIO * ref:
            out.append((s, e, f"first {_name(ctx, i)[:60]} on its thread {_ms(e - s)} (later calls: median {_ms(ref)})"))
    return out


def _copy_call_mask(ctx: Context) -> np.ndarray:
    flags = ctx.memo("copy_call", lambda c: c.host_name_ids(lambda n: "Memcpy" in n or "Memset" in n))
    return flags[ctx.trace.events.name]


def library_sync_rows(ctx: Context) -> np.ndarray:
    """Boolean mask over events: blocking sync calls made inside a library's operator
    (``names.LIBRARY_SYNC_OP_RE``: cuDNN/MIOpen algorithm search, the allocator freeing cached
    blocks) or inside a graph capture's own frames (cudagraph-trees synchronises before it
    records). They are the library's syncs, not the user's: not ``host-sync``."""
    return ctx.memo("library_syncs", _library_sync_rows)


def _library_sync_rows(ctx: Context) -> np.ndarray:
    ev, m = ctx.trace.events, ctx.masks
    out = np.zeros(len(ev), dtype=bool)
    syncs = np.flatnonzero(m["name_sync_call"] & m["runtime"])
    owners = m["host"] & ~m["runtime"] & (m["name_library_sync_op"] | m["name_capture_frame"])
    for lane in distinct(ev.lane[syncs]).tolist() if syncs.size else []:
        rows = np.flatnonzero(owners & (ev.lane == lane))
        if rows.size == 0:
            continue
        s, e = iv.union(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows])
        mine = syncs[ev.lane[syncs] == lane]
        k = np.searchsorted(s, ev.ts_ns[mine], side="right") - 1
        inside = (k >= 0) & (ev.ts_ns[mine] + ev.dur_ns[mine] <= e[np.maximum(k, 0)])
        out[mine[inside]] = True
    return out


def _library_sync_pieces(ctx: Context) -> list[Piece]:
    """The library operators whose syncs are the library's (cuDNN's benchmark): cold start.
    The allocator's syncs stay where they are (they can happen in any step)."""
    ev, m = ctx.trace.events, ctx.masks
    lib = np.flatnonzero(library_sync_rows(ctx) & _in_window(ctx))
    if lib.size == 0:
        return []
    search = m["host"] & ~m["runtime"] & m["name_library_sync_op"] & ~ctx.host_name_ids(
        lambda n: "empty" in n)[ev.name]
    out: list[Piece] = []
    for lane in distinct(ev.lane[lib]).tolist():
        rows = np.flatnonzero(search & (ev.lane == lane))
        if rows.size == 0:
            continue
        s, e = iv.union(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows])
        mine = lib[ev.lane[lib] == lane]
        k = np.searchsorted(s, ev.ts_ns[mine], side="right") - 1
        k = k[k >= 0]
        for j in distinct(k).tolist():
            n = int(np.count_nonzero(k == j))
            out.append((int(s[j]), int(e[j]), f"algorithm search: {n} blocking sync{'s' if n > 1 else ''} inside "
                                              f"a cuDNN/MIOpen operator (cudnn.benchmark)"))
    return out


def _init_calls(ctx: Context) -> list[Piece]:
    """Context creation calls and caching-allocator growth on the threads that drive the GPU; not
    the calls of steps that hand memory back and allocate it again, when most steps do
    (``allocator.churn``: ``torch.cuda.empty_cache()`` in the loop)."""
    ev, m = ctx.trace.events, ctx.masks
    rows = np.flatnonzero(ctx.events_in_window((m["name_init"] | m["name_alloc"]) & m["runtime"]) & _driving(ctx))
    c = allocator.churn(ctx)
    if c.recurring:  # memory handed back and allocated again in most steps: the loop's, not its start
        rows = np.setdiff1d(rows, c.rows, assume_unique=True)
    return [(int(ev.ts_ns[i]), int(ev.ts_ns[i] + ev.dur_ns[i]),
             f"{_name(ctx, i)} {_ms(ev.dur_ns[i])} ({'context creation' if m['name_init'][i] else 'allocator growth'})")
            for i in rows.tolist()]


def _first_step(ctx: Context) -> list[Piece]:
    b = ctx.step_bounds
    if len(b) < 3:
        return []
    d = np.array([e - s for s, e in b], dtype=np.float64)
    rest = median_of(d[1:])
    if rest <= 0 or d[0] < FIRST_STEP_RATIO * rest or d[0] < FIRST_STEP_OVER_LONGEST * float(d[1:].max()):
        return []
    # the main thread waiting for a core (CPU samples, schedstat) for half its excess or more: a
    # busy machine's doing, not a one-off start (beside three spinning processes on this project's
    # 2-core machine, a first step of 77 ms against 2-22 ms for the others, with no warm-up on a quiet one)
    waited = sampled_ns(ctx, "main_wait", *b[0])
    if waited is not None and waited >= CONTENDED_SHARE * (d[0] - rest):
        return []
    if waited is None:  # the samples do not reach the first step: where the loop's thread waited for a
        # core over the window as a whole, a neighbour's burst cannot be told from a warm-up (the same
        # warm loop profiled beside a test run: a first step of 101 ms against 23, no reading inside it)
        whole = sampled_ns(ctx, "main_wait", ctx.lo, ctx.hi)
        if whole is not None and whole >= BUSY_WAIT * (ctx.hi - ctx.lo):
            return []
    # a first step of FIRST_STEP_RATIO times the others' backward passes or more ran more work, not a
    # warm-up (LBFGS converging: 12 closure evaluations in its first recorded step, 1 in each later one)
    passes = [p["backward"][0].size for p in phase_intervals(ctx)]
    if passes[0] and passes[0] >= FIRST_STEP_RATIO * max(1.0, median_of(passes[1:])):
        return []
    return [(b[0][0], b[0][1], f"the first step takes {d[0] / rest:.1f}× the median of the others")]


def one_off_host(ctx: Context) -> list[Piece]:
    """Import and model-loading frames before the first launch (positive evidence only: host
    work inside a step stays part of the step)."""
    ev, m = ctx.trace.events, ctx.masks
    if ctx.device < 0:
        return []
    launched = ctx.launch_ts[ctx.launch_ts >= 0]
    first = int(launched.min()) if launched.size else ctx.hi
    rows = np.flatnonzero(ctx.events_in_window(m["name_one_off"] & m["host"]) & (ev.ts_ns < first))
    if rows.size == 0:
        return []
    return [(a, min(b, first), t) for a, b, t in _named_spans(ctx, rows, "before the first launch: ")]


def evaluation(ctx: Context) -> list[Piece]:
    """Evaluation loops inside a training window: gpumagic's step timer saw a module switched to
    eval mode and back with no optimizer step in between (``everystep.is_evaluation``). It
    recurs, but it is not the training loop: its batches, syncs and loader waits are the
    evaluation's, and the steady-state rules' fixes are written for the training step. A span that
    draws actions (a reinforcement-learning rollout, ``everystep.evaluation_spans``) is the loop's
    own data collection: steady."""
    return [(a, b, f"an evaluation loop {_ms(b - a)}: a module in eval mode and no optimizer step (gpumagic's "
                   "step timer)") for a, b in everystep.evaluation_spans(ctx)[0]]


def idle_tail(ctx: Context) -> list[Piece]:
    """The end of the window after the last GPU work and the last runtime call (≥ 1 ms)."""
    ev, m = ctx.trace.events, ctx.masks
    if ctx.device < 0 or ctx.step_bounds:  # inside a step, host work after the GPU's is the step's
        return []
    gpu = ctx.events_in_window(m["gpu"] & ctx.on_device)
    rt = ctx.events_in_window(m["runtime"])
    if not gpu.any():
        return []
    last = max(int((ev.ts_ns[gpu] + ev.dur_ns[gpu]).max()), int((ev.ts_ns[rt] + ev.dur_ns[rt]).max()) if rt.any() else 0)
    if ctx.hi - last < LONG_GAP_NS:
        return []
    return [(last, ctx.hi, f"no GPU work and no runtime call for the last {_ms(ctx.hi - last)}")]


DETECTORS = {"graph_capture": graph_capture, "compile": compile_pieces, "cold_start": cold_start,
             "one_off_host": one_off_host, "evaluation": evaluation, "idle_tail": idle_tail}


def _segments(ctx: Context) -> Segments:
    lo, hi = ctx.lo, ctx.hi
    merge_gap = max(MERGE_GAP_NS, int(MERGE_GAP_FRAC * ctx.window_ns))
    taken = iv.empty()
    found: list[Segment] = []
    for kind in PRECEDENCE:
        pieces = [(max(a, lo), min(b, hi), t) for a, b, t in DETECTORS[kind](ctx) if min(b, hi) > max(a, lo)]
        if not pieces:
            continue
        s = np.array([p[0] for p in pieces], dtype=np.int64)
        e = np.array([p[1] for p in pieces], dtype=np.int64)
        ms, me = iv.union(s, e)
        if ms.size > 1:  # close pieces merge
            keep = np.concatenate([[True], ms[1:] - me[:-1] >= merge_gap])
            ms, me = ms[keep], np.maximum.reduceat(me, np.flatnonzero(keep))
        own_s, own_e = iv.subtract((ms, me), taken)
        for a, b in zip(own_s.tolist(), own_e.tolist(), strict=True):
            if b - a < MIN_SEGMENT_NS:
                continue
            inside = [p for p in pieces if p[0] < b and p[1] > a]
            inside.sort(key=lambda p: p[0] - p[1])
            ev_text = list(dict.fromkeys(p[2] for p in inside))
            more = len(ev_text) - MAX_EVIDENCE
            found.append(Segment(kind, a, b, ev_text[:MAX_EVIDENCE] + ([f"and {more} more"] if more > 0 else [])))
        taken = iv.merge(taken, (own_s, own_e))
    taken = iv.union(np.array([x.start_ns for x in found], dtype=np.int64),
                     np.array([x.end_ns for x in found], dtype=np.int64))
    gs, ge = iv.gaps(taken, lo, hi)
    items = found + [Segment("steady", a, b, []) for a, b in zip(gs.tolist(), ge.tolist(), strict=True) if b > a]
    items.sort(key=lambda x: x.start_ns)
    steady = [x for x in items if x.kind == "steady"]
    span = None
    if steady:
        best = max(steady, key=lambda x: x.dur_ns)
        if best.dur_ns >= STEADY_MIN_NS and best.dur_ns >= STEADY_MIN_FRAC * ctx.window_ns:
            span = (best.start_ns, best.end_ns)
    return Segments(items, ctx.window_ns, span)
