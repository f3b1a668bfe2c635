"""``step-outliers``: some steps after the recorded ones were much slower than the rest."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis.context import Context
from gpumagic.analysis.everystep import EXPLAINED, MIN_EXCESS_MS, MIN_RATIO, SPREAD_MADS, explained_by
from gpumagic.analysis.hostload import busy_machine
from gpumagic.analysis.phases import main_op_starts
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for
from gpumagic.analysis.rules.dataloader import TUNE_CODE
from gpumagic.analysis.rules.evaluation import frequent
from gpumagic.analysis.rules.restarts import persistent_loader_code
from gpumagic.report.metrics import Metrics, StepOutlier
from gpumagic.report.model import Finding, Fix

DOC = "https://docs.python.org/3/library/gc.html#gc.freeze"
#: Python docs, gc.freeze: objects alive at the call move to a permanent generation that later
#: collections skip, so a full collection no longer walks every long-lived object (the model's
#: modules, the dataset's index) each time it runs.
GC_CODE = """
import gc
# After the model, optimizer and data are built, just before the training loop:
gc.collect()  # collect what set-up left behind first
gc.freeze()   # what is alive now is never scanned again: later collections walk only new objects
frozen = gc.get_freeze_count()  # how many objects the collector now leaves alone
"""
#: The idea of PyTorch's asynchronous checkpointing (tutorial "Asynchronous Saving with
#: Distributed Checkpoint (DCP)", torch.distributed.checkpoint.async_save): copy the state off
#: the training path, then write it while training goes on. Here with a plain thread.
SAVE_CODE = """
import os
import threading
# Copy the weights to the CPU (fast), then write them on a thread while training goes on
folder = os.path.expanduser("~/checkpoints")
os.makedirs(folder, exist_ok=True)
state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
saver = threading.Thread(target=torch.save, args=(state, os.path.join(folder, "last.pt")))
saver.start()
# before the next save, and before the program ends: saver.join()
"""
#: torch.compile's documentation ("Dynamic shapes"; troubleshooting: TORCH_LOGS="recompiles")
#: names why a compiled function compiles again: a guard failed, most often a changed shape.
COMPILE_CODE = """
# See why it recompiled: run with the environment variable TORCH_LOGS="recompiles".
# When a dimension changes from batch to batch (the last, smaller batch; variable lengths),
# mark it dynamic before the first call, so that one graph serves every size:
torch._dynamo.mark_dynamic(x, 0)
# or compile for dynamic shapes from the start:
model = torch.compile(model, dynamic=True)
# or give the loader drop_last=True, or pad inputs to a few fixed lengths
"""
EVAL_CODE = """
# An evaluation loop ran inside this step: it is not training time. Evaluate less often,
# or on a fixed subset, e.g. with a step counter in the loop:
eval_every = 500  # steps between evaluations
"""
#: A loader start's ``detail`` (``capture.everystep``): its worker count; a count above
#: ``MAX_WORKERS`` (a damaged file) is not pasted into a fix.
_WORKERS = re.compile(r"^(\d{1,6}) worker\(s\)$")
MAX_WORKERS = 1024
RECORD_CODE = "%%gpuprofile --skip {skip} --steps 1 --shapes"
#: The recorded steps "ran the same operators" when each step's count of main-thread operator calls
#: is within this share of their median (a model whose batches differ only in size calls the same
#: operators every step) ...
SAME_OPS = 0.01
#: ... and "each longer" when the longest recorded step took at least this many times the
#: shortest (the outlier rule's own ratio).
SAME_OPS_SPREAD = MIN_RATIO
#: The page for the cause that explains the most outliers (Python's gc.freeze otherwise).
DOCS = {"torch.save": "https://pytorch.org/tutorials/recipes/distributed_async_checkpoint_recipe.html",
        "compile": "https://docs.pytorch.org/docs/stable/compile/programming_model.recompilation.html",
        "eval": "https://pytorch.org/tutorials/beginner/basics/optimization_tutorial.html",
        "loader": "https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader",
        "data": "https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading"}
#: An outlier nothing explains is "like" a long step the window recorded when its time is within
#: this range of that step's: the loop's own periodic work — a second optimizer's update every
#: N steps (a WGAN's generator after five critic updates), a metric computed every N steps — which
#: the window recorded and the other findings judge; not a pause the window missed.
LIKE = (2 / 3, 3 / 2)
_WORDS = {"gc": "a Python garbage collection", "torch.save": "torch.save", "compile": "a torch.compile compilation",
          "eval": "an evaluation loop (a module in eval mode)",
          "loader": "a DataLoader's workers stopping and starting (a new pass over it: an epoch, an evaluation)",
          "data": "the loop waiting for the DataLoader's next batch"}


@rule("step-outliers")
def step_outliers(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: steps of ``steps.all_ms`` — every step of the cell, from the capture's step timer —
    beyond the spread of the rest (median + 3 scaled MADs), at least 2× their median and 20 ms
    longer; never the first step (warm-up) nor one that ran under the profiler
    (:mod:`gpumagic.analysis.everystep`). Only a gpumagic capture has them. What coincided —
    a garbage collection, ``torch.save``, a compilation, evaluation, a DataLoader starting its
    workers for a new epoch, the step's own wait for the DataLoader's next batch — names the fix; with
    nothing seen, the fix is to record such a step; a DataLoader's workers starting inside an
    outlier bring the persistent-workers fix even when their start explains less than half of it
    (what follows the start is not timed). An outlier nothing explains that took about as long as
    a step the window recorded (2/3 to 3/2 of one that passed the same bars against the recorded
    steps' median, the first recorded step left out) is the loop's own work every few steps — a
    second optimizer's update every N steps — which the window holds: not counted. Gain: none
    inside the recorded window (the outliers fall after it); the excess share of the steps after
    recording is given as a number.
    False positives: a step that waits for something outside the process (a shared file
    system, another job on the machine) is reported with no cause, which is what it is; when
    the recorded steps show the machine busy (the loop's thread waiting for a core ≥ 5 % of the
    window, or other processes on a shared machine), the evidence says so, and where nothing
    explains any of the outliers and other processes used the machine (``host.shared_machine``),
    the finding is low and its title says "on a busy machine":
    the neighbours most likely made them (``host-contended``), not the loop."""
    outliers = m.steps.outliers
    if not outliers:
        return None
    recorded = _recorded_long(m)
    like = [o for o in outliers if sum(c.ms for c in o.causes) < EXPLAINED * o.excess_ms
            and any(LIKE[0] <= o.ms / r <= LIKE[1] for _, r in recorded)]
    outliers = [o for o in outliers if o not in like]
    if frequent(ctx, m) is not None:  # evaluations this frequent are frequent-evaluation's, their outliers too
        outliers = [o for o in outliers if not explained_by(o, "eval")]
    if not outliers:
        return None
    all_ms = m.steps.all_ms or []
    after = sum(all_ms[(m.steps.all_profiled or 0):])
    excess = sum(o.excess_ms for o in outliers)
    share = excess / after if after > 0 else 0.0
    kinds = Counter(c.kind for o in outliers for c in o.causes[:1])
    worst = max(outliers, key=lambda o: o.ms)
    median = worst.ms / worst.over_median if worst.over_median else 0.0
    seen = "; ".join(f"{_WORDS[k]} in {n} of them" for k, n in kinds.most_common()) or "nothing gpumagic watches"
    steps = ", ".join(str(o.index) for o in sorted(outliers, key=lambda o: o.index)[:12])
    told = "; ".join(_told(o) for o in sorted(outliers, key=lambda o: -o.ms)[:3])
    unexplained = [o for o in outliers if sum(c.ms for c in o.causes) < EXPLAINED * o.excess_ms]
    explained = Counter(k for o in outliers for k in _by_kind(o) if explained_by(o, k))
    explains = set(explained)
    fixes: list[Fix] = []
    if "gc" in explains:
        fixes.append(pytorch("Garbage-collection pauses: freeze the long-lived objects once set-up is done, so that "
                             "collections scan only new objects (Python docs, gc.freeze)", GC_CODE))
    if "torch.save" in explains:
        fixes.append(pytorch("Checkpoint saves block the loop: write them on a thread from a CPU copy, as PyTorch's "
                             "asynchronous checkpointing does (torch.distributed.checkpoint.async_save)", SAVE_CODE))
    if "compile" in explains:
        fixes.append(pytorch("torch.compile compiled again during the run: find the guard that failed and mark the "
                             "changing dimension dynamic", COMPILE_CODE))
    # workers started again in an outlier: their start is timed, but not what follows it — the new
    # workers' first batches, made all at once beside the training step (a Trainer's epoch boundary
    # with 2 workers: 174-209 ms against 68-73 with persistent workers, the start itself 33 ms)
    starts = [o for o in outliers if any(c.kind == "loader" and _WORKERS.match(c.detail) for c in o.causes)]
    if "loader" in explains or starts:
        counts = [n for o in outliers for c in o.causes
                  if c.kind == "loader" and (w := _WORKERS.match(c.detail)) and 0 < (n := int(w[1])) <= MAX_WORKERS]
        fixes.append(pytorch("A DataLoader started its worker processes again for a new pass over it (each epoch, "
                             "or each evaluation of a validation loader): keep them between passes "
                             "(persistent_workers=True)"
                             + ("" if "loader" in explains else
                                "; the start is timed, not the new workers' first batches made beside the step, "
                                "so more of these steps may be theirs than the start shows"),
                             persistent_loader_code(max(counts) if counts else None)))
    if "data" in explains:
        fixes.append(pytorch("The loop waited for its next batch in these steps: the loader cannot keep up when the "
                             "batches made ahead run out (the recorded steps may have used those); measure its "
                             "settings on this machine", TUNE_CODE, diagnostic=True))
    if "eval" in explains:
        fixes.append(pytorch("Evaluation ran inside these steps: expected, but evaluate less often if it costs too "
                             "much", EVAL_CODE))
    sizes = ""
    if unexplained or not fixes:
        target = max(unexplained or outliers, key=lambda o: o.ms)
        fixes.append(pytorch("Nothing gpumagic watches explains some of them: record such a step to see what it "
                             "does, with its inputs' shapes (skip the steps before it)",
                             RECORD_CODE.format(skip=target.index), diagnostic=True))
        sizes = _same_operators(ctx) + _busy_machine(m)
    # nothing in the process explains any of them and other processes took cores while recording
    # (not the loop's own threads and workers waiting for each other): most likely the neighbours'
    # doing, which host-contended reports; nothing in the loop to change
    neighbours = not explains and bool(m.host.shared_machine)
    return finding(
        severity="low" if neighbours else severity_for(share),
        title=f"{len(outliers)} step(s) after the recorded ones took up to {worst.over_median:.0f}× the median step"
              + (", on a busy machine" if neighbours else ""),
        why=f"""Every step of the cell was timed, not only the recorded ones: {len(outliers)} of them
        {'was' if len(outliers) == 1 else 'were'} beyond the spread of the rest (more than {SPREAD_MADS:g}
        scaled median absolute deviations above the median), at least {MIN_RATIO:g}× the median and
        {MIN_EXCESS_MS:g} ms longer. A pause that comes every N steps — a full garbage collection, a
        checkpoint save, a recompilation, an evaluation — falls outside a handful of recorded steps,
        yet costs the whole run its share.""",
        summary=(f"{'Step' if len(outliers) == 1 else 'Steps'} {steps} took up to {worst.ms:.1f} ms against a median "
                 f"of {median:.1f} ms; together "
                 f"{excess:.0f} ms more than the median, {pct(share)} of the steps after recording. "
                 f"Coinciding: {seen} ({told}).{sizes}{_like_recorded(like, recorded)}"),
        numbers={"outliers": len(outliers), "worst_ms": round(worst.ms, 4), "median_ms": round(median, 4),
                 "excess_ms": round(excess, 4), "excess_frac_after_recording": round(share, 4),
                 "worst_index": worst.index, **({"like_recorded": len(like)} if like else {}),
                 **({"workers_started": len(starts)} if starts else {}),
                 **{f"with_{k.replace('.', '_')}": n for k, n in kinds.items()},
                 **{f"explained_by_{k.replace('.', '_')}": n for k, n in explained.items()}},
        est_gain=0.0, gain_method="not a gain inside the recorded window (the outliers fall after it); "
                                  "excess_frac_after_recording is their share of the later steps",
        fixes=tuple(fixes),
        doc_url=DOCS.get(explained.most_common(1)[0][0], DOC) if explained else DOCS["loader"] if starts else DOC,
    )


def _recorded_long(m: Metrics) -> list[tuple[int, float]]:
    """The recorded steps (their index into ``steps.all_ms`` and time, from the step timer) at
    least :data:`MIN_RATIO` × the recorded steps' median, the first recorded step left out (it
    may hold a warm-up). Not the outlier's :data:`MIN_EXCESS_MS` bar too: an outlier is matched
    to such a step by its time (:data:`LIKE`), and a recorded step 19 ms over the median is as
    much the loop's periodic work as an unrecorded one 21 ms over (a PPO rollout every N
    updates). Empty without every step's times."""
    all_ms, rec = m.steps.all_ms or [], [i for i in (m.steps.all_recorded or []) if 0 <= i < len(m.steps.all_ms or [])]
    if len(rec) < 3:
        return []
    times = [all_ms[i] for i in rec]
    med = median_of(np.asarray(times))
    return [(i, t) for i, t in zip(rec[1:], times[1:], strict=True)
            if t >= MIN_RATIO * med]


def _like_recorded(like: list[StepOutlier], recorded: list[tuple[int, float]]) -> str:
    """A sentence on the outliers left out as like long steps the window recorded; empty without."""
    if not like:
        return ""
    shown = ", ".join(f"step {i}, {t:.0f} ms" for i, t in recorded[:4])
    return (f" {len(like)} more took about as long as steps the window recorded ({shown}): the loop's own work every "
            "few steps, which the window recorded and its other findings judge, so not counted here.")


def _same_operators(ctx: Context) -> str:
    """A sentence when the recorded steps called the same operators (counts within
    :data:`SAME_OPS` of their median) yet the longest took ≥ :data:`SAME_OPS_SPREAD` × the
    shortest: the same work on larger inputs — batches of varying length — or a slower machine;
    the outliers after them may be the same. Empty otherwise (fewer than 3 recorded steps)."""
    bounds = ctx.step_bounds
    if len(bounds) < 3:
        return ""
    starts = main_op_starts(ctx)
    counts = np.array([np.searchsorted(starts, hi) - np.searchsorted(starts, lo) for lo, hi in bounds])
    durs = np.array([hi - lo for lo, hi in bounds], dtype=np.float64)
    med = median_of(counts)
    if med <= 0 or np.abs(counts - med).max() > SAME_OPS * med or durs.max() < SAME_OPS_SPREAD * durs.min():
        return ""
    return (f" The recorded steps called the same {int(med):,} operators each, yet took from {durs.min() / 1e6:.1f} to "
            f"{durs.max() / 1e6:.1f} ms: the same work on larger inputs (batches of varying length or size) takes "
            "longer, and so does a busier machine; these later steps may be that.")


def _busy_machine(m: Metrics) -> str:
    """A sentence when the machine was busy while recording (``analysis.hostload.busy_machine``:
    the loop's thread waited for a core 5 % of the window or more, or other processes used enough
    to call the machine shared): steps that nothing gpumagic watches explains may have waited for
    the neighbours. Empty otherwise, or when the capture took no CPU samples."""
    host = m.host
    if not busy_machine(host):
        return ""
    wait, other = host.main_runqueue_wait_frac, host.other_busy_cores
    parts = []
    if other is not None:
        parts.append(f"other processes used {other:.1f} of {host.usable_cores or 0:g} cores")
    if wait is not None:
        parts.append(f"the loop's thread waited for a core {pct(wait)} of the time")
    return (f" While the steps were recorded the machine was busy ({' and '.join(parts)}): a slow step that nothing "
            "here explains may have waited for the neighbours; compare on a quiet machine.")


def _by_kind(o: StepOutlier) -> dict[str, float]:
    """The outlier's causes' time by kind, longest first: a loader's workers stopping at the end of
    an epoch and starting for the next are one cause, and so are two collections."""
    kinds: dict[str, float] = {}
    for c in o.causes:
        kinds[c.kind] = kinds.get(c.kind, 0.0) + c.ms
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def _told(o: StepOutlier) -> str:
    what = ", ".join(f"{_WORDS[k]} {ms:.0f} ms of it" for k, ms in list(_by_kind(o).items())[:2]) or "nothing seen"
    return f"step {o.index}: {o.ms:.0f} ms, {what}"


__all__ = ["step_outliers"]
