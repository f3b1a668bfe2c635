"""Every step of the cell (``steps.all_ms``) and the ones much slower than the rest (``steps.outliers``).

The capture's step timer (:mod:`gpumagic.capture.everystep`) writes the bundle's ``every_step``
block: each optimizer step's duration and start (ms from the timer's start), which steps were
recorded, how many leading steps ran under the profiler, and the events it saw beside them
(garbage collections, ``torch.save``, compilations, evaluation, a DataLoader's workers
starting until their first batch), and each step's wait in the DataLoader's ``next()``
(``wait_ms``, when the cell used one). The block comes from a file, so
it is checked before use; a block that does not fit is left out with a note.

An outlier is a judged step — not the first (warm-up), not one that ran under the profiler (its
cost is the profiler's), not the first after the profiler stopped (compiled code pays the stop in
its next call: ``benchmarks/profiler_aftermath.py`` measured 109 ms, median of 3 rounds, for a
step of 1.9 ms with ``torch.compile(opt.step)``, against 2.2 ms for 1.2 eager) — that is

- beyond the spread of the rest: more than :data:`SPREAD_MADS` scaled median absolute deviations
  above their median (the outlier rule Leys et al. recommend, "Detecting outliers: Do not use
  standard deviation around the mean, use absolute deviation around the median", Journal of
  Experimental Social Psychology 49, 2013; the MAD is scaled by 1.4826 to estimate a normal
  standard deviation), *and*
- at least :data:`MIN_RATIO` × that median, *and* at least :data:`MIN_EXCESS_MS` longer (the
  issue's lines: a step twice as long by a millisecond is no pause worth a finding).

"The rest" is the judged steps that are no candidate (a first pass with every judged step finds
the candidates), so that several slow steps do not widen each other's spread.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.report.metrics import StepCause, StepOutlier, as_record

SPREAD_MADS = 3.0
MAD_SCALE = 1.4826
MIN_RATIO = 2.0
MIN_EXCESS_MS = 20.0
#: Fewer judged steps than this give no outlier check: a median and a spread of fewer mean little.
MIN_JUDGED = 5
#: At most this many outliers are listed (the longest).
MAX_OUTLIERS = 50
KINDS = ("gc", "torch.save", "compile", "eval", "loader")
MS_NS = 1_000_000
#: Events whose time inside a step's DataLoader wait is not the training loop waiting for its batch:
#: the workers stopping and starting (a restart), an evaluation loop (its own loader's waits).
NOT_THE_LOOPS_WAIT = frozenset({"loader", "eval"})


#: A cause explains an outlier when it ran for at least half of the step's excess over the median.
EXPLAINED = 0.5


def explained_by(outlier: StepOutlier, kind: str) -> bool:
    """Whether causes of ``kind`` ran for :data:`EXPLAINED` of ``outlier``'s excess or more."""
    return sum(c.ms for c in outlier.causes if c.kind == kind) >= EXPLAINED * outlier.excess_ms


def fields(ctx: Context) -> dict[str, Any]:
    """``StepMetrics`` fields ``all_ms``, ``all_recorded``, ``all_profiled``, ``outliers``,
    ``torch_save_*`` and ``evaluation_*`` (empty without an ``every_step`` block)."""
    block, notes = _checked(ctx)
    ctx.trace.notes.extend(n for n in notes if n not in ctx.trace.notes)  # once, though a steady part is measured again
    if block is None:
        return {}
    found = outliers(block)
    s, e = saves(block), evaluations(block)
    return {"all_ms": block["step_ms"], "all_wait_ms": block["wait_ms"], "all_recorded": block["recorded"],
            "all_profiled": block["profiled"],
            "outliers": [as_record(o, StepOutlier) for o in found], "torch_save_count": s["count"],
            "torch_save_frac": round(s["ms"] / s["steps_ms"], 4) if s["steps_ms"] > 0 else None,
            "evaluation_count": e["count"],
            "evaluation_frac": round(e["ms"] / e["steps_ms"], 4) if e["steps_ms"] > 0 else None}


def block_of(ctx: Context) -> dict[str, Any] | None:
    """The trace's checked ``every_step`` block (:func:`read`), or None: checked once per context
    for every rule that reads it (a block holds up to 100,000 steps); :func:`fields` notes why
    one does not fit."""
    return _checked(ctx)[0]


def _checked(ctx: Context) -> tuple[dict[str, Any] | None, list[str]]:
    def check(c: Context) -> tuple[dict[str, Any] | None, list[str]]:
        notes: list[str] = []
        return read(c.trace.meta.get("every_step"), notes), notes
    return ctx.memo("every_step", check)


def _floats(values: Any) -> list[float] | None:
    if not isinstance(values, list) or not all(type(v) in (int, float) and math.isfinite(v) and v >= 0 for v in values):
        return None
    return [float(v) for v in values]


def read(block: Any, notes: list[str]) -> dict[str, Any] | None:
    """The checked ``every_step`` block, or None (with a note when it is there but does not fit)."""
    if block is None:
        return None
    bad = "The gpumagic section's every_step block is not valid; the steps after the recorded ones were ignored."
    if not isinstance(block, dict):
        notes.append(bad)
        return None
    steps, starts = _floats(block.get("step_ms")), _floats(block.get("start_ms"))
    recorded, profiled = block.get("recorded", []), block.get("profiled", 0)
    if (steps is None or starts is None or len(steps) != len(starts) or type(profiled) is not int or profiled < 0
            or not isinstance(recorded, list) or not all(type(i) is int and i >= 0 for i in recorded)):
        notes.append(bad)
        return None
    events = []
    for e in block.get("events") or []:
        if (isinstance(e, dict) and e.get("kind") in KINDS and _floats([e.get("start_ms"), e.get("dur_ms")])
                is not None):
            events.append({"kind": e["kind"], "start_ms": float(e["start_ms"]), "dur_ms": float(e["dur_ms"]),
                           "detail": str(e.get("detail", ""))[:200]})
    waits = block.get("wait_ms")
    if waits is not None:
        waits = _floats(waits)
        if waits is None or len(waits) != len(steps):
            notes.append("The every_step block's DataLoader waits (wait_ms) are not valid; they were ignored.")
            waits = None
    dropped = block.get("dropped_steps", 0)
    if type(dropped) is int and dropped > 0:
        notes.append(f"The step timer kept the first {len(steps):,} steps; {dropped:,} more ran.")
    return {"step_ms": steps, "start_ms": starts, "recorded": sorted(set(recorded)), "profiled": profiled,
            "events": events, "wait_ms": waits}


def judged(block: dict[str, Any]) -> list[int]:
    """Indices the outlier check judges: not the first step, none that ran under the profiler, nor
    the first after it stopped (see the module docstring)."""
    skip = set(block["recorded"])
    first = block["profiled"] + 1 if block["profiled"] else 1
    return [i for i in range(first, len(block["step_ms"])) if i not in skip]


def _centre_spread(x: np.ndarray) -> tuple[float, float]:
    med = median_of(x)
    return med, MAD_SCALE * median_of(np.abs(x - med))


def _beyond(d: np.ndarray, med: float, spread: float) -> np.ndarray:
    return (d > med + SPREAD_MADS * spread) & (d >= MIN_RATIO * med) & (d - med >= MIN_EXCESS_MS)


def outliers(block: dict[str, Any]) -> list[dict[str, Any]]:
    """The outliers of the block's judged steps, as ``StepOutlier`` dicts, longest first."""
    idx = judged(block)
    if len(idx) < MIN_JUDGED:
        return []
    d = np.asarray([block["step_ms"][i] for i in idx], dtype=np.float64)
    candidate = _beyond(d, *_centre_spread(d))
    rest = d[~candidate]
    if rest.size < MIN_JUDGED:
        return []
    med, spread = _centre_spread(rest)
    hits = np.flatnonzero(_beyond(d, med, spread))
    hits = hits[np.argsort(-d[hits], kind="stable")][:MAX_OUTLIERS]
    out = []
    events = _loop_events(block)
    steps = [idx[h] for h in hits.tolist()]
    for i, wait in zip(steps, own_waits(block, steps, events).tolist(), strict=True):
        start, dur = block["start_ms"][i], block["step_ms"][i]
        causes = _causes(events, start, start + dur)
        if wait > 0:
            causes = sorted([*causes, StepCause(kind="data", ms=round(wait, 4), detail="")], key=lambda c: -c.ms)
        out.append({"index": i, "ms": round(dur, 4), "over_median": round(dur / med, 3) if med > 0 else 0.0,
                    "excess_ms": round(dur - med, 4), "causes": causes})
    return out


def _loop_events(block: dict[str, Any]) -> list[dict[str, Any]]:
    """The block's events less the ``eval`` switches that are no evaluation loop (:func:`is_evaluation`)."""
    ends = step_ends(block)
    return [e for e in block["events"] if e["kind"] != "eval" or is_evaluation(e, ends)]


def step_ends(block: dict[str, Any]) -> list[float]:
    """When each step's optimizer hook started (ms from the timer's start), in order."""
    return [s + d for s, d in zip(block["start_ms"], block["step_ms"], strict=True)]


def is_evaluation(event: dict[str, Any], ends: list[float]) -> bool:
    """Whether an ``eval`` event (``Module.train(False)`` … ``train(True)``) is an evaluation loop:
    no optimizer step ended while it lasted. Training that keeps a part in eval mode — a frozen
    backbone's batch norm (``model.train(); model.backbone.eval()``), dropout off in a submodule —
    steps the optimizer inside the span, and is training, not evaluation."""
    s, e = event["start_ms"], event["start_ms"] + event["dur_ms"]
    k = bisect.bisect_right(ends, s)
    return not (k < len(ends) and ends[k] < e)


#: The recorded steps' starts, on the timer's clock and in the trace, agree within this (ms) when
#: the block and the trace come from one capture (the marker edge and the timer's resume are a
#: few microseconds apart; markers.py moves an edge to the end of the optimizer's annotation).
ALIGN_TOLERANCE_MS = 2.0


#: Drawing from a distribution (``Categorical.sample`` calls ``torch.multinomial``, ``Normal.sample``
#: ``torch.normal``) is what a reinforcement-learning rollout does with its policy in eval mode
#: between updates (stable-baselines3's ``set_training_mode(False)`` while it collects rollouts):
#: the updates' data, part of the loop, not an evaluation. An evaluation takes the most likely
#: output. A span in eval mode with at least :data:`MIN_DRAWS` such calls is a rollout.
ACTION_SAMPLING = frozenset({"aten::multinomial", "aten::normal"})
MIN_DRAWS = 2


def evaluation_spans(ctx: Context) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The block's evaluation loops on the trace's clock (:func:`evaluation_spans_ns`), split in
    ``(evaluations, rollouts)``: a span that draws actions (:data:`ACTION_SAMPLING`) is a rollout.
    Both empty without a block; computed once per context (segments, phases and
    ``frequent-evaluation`` read it)."""
    def split(c: Context) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        block = block_of(c)
        if block is None:
            return [], []
        spans = evaluation_spans_ns(block, c.step_names, c.step_bounds)
        if not spans:
            return [], []
        ev = c.trace.events
        draws = np.sort(ev.ts_ns[c.masks["cpu_op"] & c.host_name_ids(ACTION_SAMPLING.__contains__)[ev.name]])
        kept: list[tuple[int, int]] = []
        rollouts: list[tuple[int, int]] = []
        for a, b in spans:
            n = int(np.searchsorted(draws, b, side="left") - np.searchsorted(draws, a, side="left"))
            (rollouts if n >= MIN_DRAWS else kept).append((a, b))
        return kept, rollouts
    return ctx.memo("every_step.evaluations", split)


def evaluation_spans_ns(block: dict[str, Any], step_names: list[str], step_bounds: list[tuple[int, int]]
                        ) -> list[tuple[int, int]]:
    """The block's evaluation loops (:func:`is_evaluation`) on the trace's clock (ns): see
    :func:`spans_ns`."""
    ends = step_ends(block)
    return spans_ns(block, step_names, step_bounds, lambda e: e["kind"] == "eval" and is_evaluation(e, ends))


def spans_ns(block: dict[str, Any], step_names: list[str], step_bounds: list[tuple[int, int]],
             keep: Callable[[dict[str, Any]], bool]) -> list[tuple[int, int]]:
    """The block's events that ``keep`` keeps, on the trace's clock (ns), placed by the recorded
    steps: ``ProfilerStep#k`` is the timer's step ``k`` (the capture numbers both from the cell's
    first optimizer step), so their starts give the offset between the clocks. Empty when no
    recorded step is in the trace or most steps' offsets disagree by more than
    :data:`ALIGN_TOLERANCE_MS` (a block and a trace from different captures)."""
    events = [e for e in block["events"] if keep(e)]
    if not events:
        return []
    recorded, starts = set(block["recorded"]), block["start_ms"]
    offsets = []
    for name, (lo, _hi) in zip(step_names, step_bounds, strict=True):
        num = name.removeprefix("ProfilerStep#")
        if num.isdigit() and int(num) in recorded and int(num) < len(starts):
            offsets.append(lo / 1e6 - starts[int(num)])
    offset = median_of(offsets) if offsets else 0.0
    if sum(abs(o - offset) <= ALIGN_TOLERANCE_MS for o in offsets) * 2 < len(offsets) or not offsets:
        return []  # most steps must agree: one preempted hook on a busy machine may not
    return [(int((e["start_ms"] + offset) * 1e6), int((e["start_ms"] + e["dur_ms"] + offset) * 1e6)) for e in events]


def _causes(events: list[dict[str, Any]], start: float, end: float) -> list[StepCause]:
    out = []
    for e in events:
        overlap = min(end, e["start_ms"] + e["dur_ms"]) - max(start, e["start_ms"])
        if overlap > 0 or (e["dur_ms"] == 0 and start <= e["start_ms"] <= end):
            out.append(StepCause(kind=e["kind"], ms=round(max(overlap, 0.0), 4), detail=e["detail"]))
    return sorted(out, key=lambda c: -c.ms)


def later_waits(block: dict[str, Any]) -> tuple[float, float, int] | None:
    """The steps after the recorded ones (the judged steps, :func:`judged`): their time in the
    DataLoader's ``next()`` less the workers stopping and starting inside it (``loader`` events,
    ``dataloader-worker-restarts``' story) and less evaluation loops (whose own loader's waits
    are the evaluation's), their summed duration (ms) and how many; None without the block's
    ``wait_ms`` or such steps."""
    idx = judged(block)
    if not block.get("wait_ms") or not idx:
        return None
    waited = float(own_waits(block, idx, _loop_events(block)).sum())
    return waited, float(sum(block["step_ms"][i] for i in idx)), len(idx)


def own_waits(block: dict[str, Any], steps: list[int], events: list[dict[str, Any]]) -> np.ndarray:
    """Each of ``steps``' wait in the DataLoader's ``next()`` (ms) that is the loop's own: less the
    time inside ``events`` of a :data:`NOT_THE_LOOPS_WAIT` kind (a loader's workers stopping and
    starting run inside ``next()``; an evaluation loop's own loader waits inside it), their
    overlaps counted once, never below 0. Zeros without the block's ``wait_ms``."""
    if not block.get("wait_ms"):
        return np.zeros(len(steps))
    waits = np.asarray([block["wait_ms"][i] for i in steps], dtype=np.float64)
    spans = [(e["start_ms"], e["start_ms"] + e["dur_ms"]) for e in events if e["kind"] in NOT_THE_LOOPS_WAIT]
    if spans:
        starts = np.asarray([block["start_ms"][i] for i in steps], dtype=np.float64)
        ends = starts + np.asarray([block["step_ms"][i] for i in steps], dtype=np.float64)
        lo, hi = (np.asarray(x, dtype=np.float64) for x in zip(*spans, strict=True))
        inside = iv.measure_in(iv.union(_ns(lo), _ns(hi)), _ns(starts), _ns(ends)) / MS_NS
        waits -= inside
    return np.maximum(waits, 0.0)


def _ns(ms: np.ndarray) -> np.ndarray:
    return np.round(ms * MS_NS).astype(np.int64)


def saves(block: dict[str, Any], skip: frozenset[int] = frozenset(), only: frozenset[int] | None = None
          ) -> dict[str, Any]:
    """``torch.save`` during the steps after the first (the warm-up): ``count`` (calls that overlap
    them), ``ms`` (their time inside the steps), ``steps_ms`` (the steps' time), ``steps`` and
    ``steps_with`` (how many steps, and how many overlap a save), ``at`` (the steps the counted
    calls start in, in order). ``skip`` leaves steps out (the outliers, which ``step-outliers``
    reports); ``only`` keeps just these steps (the recorded ones)."""
    return _inside_steps(block, [e for e in block["events"] if e["kind"] == "torch.save"], skip, only)


def evaluations(block: dict[str, Any], skip: frozenset[int] = frozenset(), only: frozenset[int] | None = None
                ) -> dict[str, Any]:
    """The evaluation loops (:func:`is_evaluation`) during the steps after the first, as
    :func:`saves` counts ``torch.save``: ``count``, ``ms``, ``steps_ms``, ``steps``, ``steps_with``,
    ``at``."""
    ends = step_ends(block)
    return _inside_steps(block, [e for e in block["events"] if e["kind"] == "eval" and is_evaluation(e, ends)],
                         skip, only)


#: Intervals a person would write (steps between two saves, two evaluations).
ROUND_STEPS = (10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000)


class Recurring(NamedTuple):
    """Something the loop does again and again between its steps (:func:`saves`,
    :func:`evaluations`), from what those count: its share of the steps' time, each one's mean
    time, how many steps apart, and the training time of a step without it."""

    share: float
    each_ms: float
    every: float
    train_ms: float

    @property
    def often(self) -> str:
        """``'every step'`` or ``'every N steps'``."""
        return "every step" if self.every < 1.5 else f"every {self.every:.0f} steps"

    def interval(self, target: float) -> int:
        """The first of :data:`ROUND_STEPS` (the largest beyond them) at which it would take
        ``target`` of the time or less."""
        steps = self.each_ms / (target * self.train_ms)
        return next((n for n in ROUND_STEPS if n >= steps), ROUND_STEPS[-1])


def recurring(counted: dict[str, Any], min_count: int, min_share: float) -> Recurring | None:
    """:class:`Recurring` from what :func:`saves` or :func:`evaluations` counted, or None when it
    happened fewer than ``min_count`` times or took under ``min_share`` of the steps' time."""
    if counted["count"] < min_count or counted["steps_ms"] <= 0 or counted["ms"] < min_share * counted["steps_ms"]:
        return None
    train_ms = max((counted["steps_ms"] - counted["ms"]) / max(counted["steps"], 1), 1e-3)  # a step without it
    at = counted.get("at") or []
    # how many steps apart: the median gap between the steps they start in, which a window that
    # ends between two of them does not stretch as steps ÷ count does
    every = median_of([b - a for a, b in itertools.pairwise(at)]) if len(at) >= 2 else None
    return Recurring(share=counted["ms"] / counted["steps_ms"], each_ms=counted["ms"] / counted["count"],
                     every=every or counted["steps"] / counted["count"], train_ms=train_ms)


def _inside_steps(block: dict[str, Any], chosen: list[dict[str, Any]], skip: frozenset[int],
                  only: frozenset[int] | None) -> dict[str, Any]:
    events = sorted((e["start_ms"], e["start_ms"] + e["dur_ms"]) for e in chosen)
    # such events run one at a time on the loop's thread: in start order their ends are in order too
    # (made so, should a file say otherwise), and the events a step overlaps are a run found by bisection
    ends = list(itertools.accumulate((e for _, e in events), max))
    out: dict[str, Any] = {"count": 0, "ms": 0.0, "steps_ms": 0.0, "steps": 0, "steps_with": 0}
    seen: dict[int, int] = {}  # each event counted: the first step it overlaps
    for i in range(1, len(block["step_ms"])):
        if i in skip or (only is not None and i not in only):
            continue
        start, dur = block["start_ms"][i], block["step_ms"][i]
        out["steps"] += 1
        out["steps_ms"] += dur
        inside = 0.0
        k = bisect.bisect_right(ends, start)
        while k < len(events) and events[k][0] < start + dur:
            overlap = min(start + dur, events[k][1]) - max(start, events[k][0])
            if overlap > 0:
                inside += overlap
                seen.setdefault(k, i)
            k += 1
        out["ms"] += inside
        out["steps_with"] += inside > 0
    out["count"] = len(seen)
    out["at"] = sorted(set(seen.values()))  # the steps they start in
    return out


def judged_median_ms(block: dict[str, Any], outlier_indices: set[int]) -> float | None:
    """Median of the judged steps that are no outlier (what ``over_median`` divides by)."""
    rest = [block["step_ms"][i] for i in judged(block) if i not in outlier_indices]
    return median_of(rest) if rest else None
