"""``frequent-checkpoints``: ``torch.save`` runs in most steps and takes a share of every one of them."""

from __future__ import annotations

from gpumagic.analysis import everystep
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for
from gpumagic.analysis.rules.outliers import SAVE_CODE
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: A finding from this share of the steps' time (TensorBoard profiler plugin's 5 % line for a
#: bottleneck worth naming).
MIN_SHARE = 0.05
#: At least this many saves: one save is a checkpoint, not a habit.
MIN_SAVES = 2
#: The interval the fix suggests keeps saving under this share of the training time.
TARGET_SHARE = 0.01
DOC = "https://pytorch.org/tutorials/beginner/saving_loading_models.html"
#: benchmarks/checkpoint_cost.py on this project's 2-core machine, 7 alternated rounds: a loop
#: saving 25 MB of state every step against every 200 steps.
MEASURED = "0.65 saved where the saves took 0.53 of the steps, benchmarks/checkpoint_cost.py"


@rule("frequent-checkpoints")
def frequent_checkpoints(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: gpumagic's step timer saw ``torch.save`` (wrapped while the cell runs) during the
    steps of the cell — every step, not only the recorded ones (:mod:`gpumagic.capture.everystep`)
    — taking ≥ 5 % of their time, in ≥ 2 calls, the first step and ``step-outliers``' outliers
    left out (a save every few hundred steps makes outliers, which that rule reports). Gain, an
    estimate: the share of the recorded steps' time inside ``torch.save`` (the window); the share
    over all the steps is given too. Not an upper bound: a save also slows the steps after it (its
    buffers freed and the training's memory and caches refilled): saving every 200 steps instead
    of every step saved 0.65 of the time where the saves took 0.53 (``benchmarks/checkpoint_cost.py``). Only a gpumagic capture has
    the timer; saves through other writers (safetensors, ``np.save``) are not seen. False
    positives: a run that must save every step (a preemptible machine), where saving on a thread
    still applies."""
    block = everystep.block_of(ctx)
    if block is None:
        return None
    outliers = frozenset(o.index for o in m.steps.outliers or [])
    steady = everystep.saves(block, skip=outliers)
    habit = everystep.recurring(steady, MIN_SAVES, MIN_SHARE)
    if habit is None:
        return None
    share, per_save, train_ms, often = habit.share, habit.each_ms, habit.train_ms, habit.often
    recorded = everystep.saves(block, only=frozenset(block["recorded"]))
    gain = recorded["ms"] / recorded["steps_ms"] if recorded["steps_ms"] > 0 else 0.0
    interval = habit.interval(TARGET_SHARE)
    return finding(
        severity=severity_for(max(gain, share)),
        title=f"torch.save runs {often} and takes {pct(share)} of the training time",
        why=f"""A checkpoint is written {often}: torch.save serialises the whole state (weights, optimizer
        moments) and writes it to disk on the training loop's thread, which waits meanwhile. Each save took
        {per_save:.1f} ms against {train_ms:.1f} ms of training per step. Save every {interval:,} steps
        instead (saving then costs about {pct(per_save / (interval * train_ms))} of the time), or write the
        copy on a thread while training goes on.""",
        summary=(f"{steady['count']} torch.save calls during {steady['steps']} steps ({steady['steps_with']} of "
                 f"them overlap a save): {steady['ms']:.0f} ms of {steady['steps_ms']:.0f} ms, {pct(share)}; in the "
                 f"recorded steps, {pct(gain)}."),
        numbers={"saves": steady["count"], "steps": steady["steps"], "steps_with_save": steady["steps_with"],
                 "save_ms_mean": round(per_save, 4), "train_ms_per_step": round(train_ms, 4),
                 "save_frac_of_steps": round(share, 4), "save_frac_recorded": round(gain, 4),
                 "suggested_every_steps": interval},
        est_gain=gain,
        gain_method=("estimate: the share of the recorded steps' time inside torch.save (over all the steps: "
                     "save_frac_of_steps); a save slows the steps after it too, so the saving can be larger "
                     f"({MEASURED})"),
        fixes=(pytorch(f"Save every {interval:,} steps, not {often}", _every_code(interval)),
               pytorch("Or write the checkpoint on a thread from a CPU copy, as PyTorch's asynchronous "
                       "checkpointing does (torch.distributed.checkpoint.async_save)", SAVE_CODE),
               huggingface(f"Trainer: save every {interval:,} steps",
                           f'TrainingArguments(..., save_strategy="steps", save_steps={interval})')),
        doc_url=DOC,
    )


def _every_code(interval: int) -> str:
    return f"""
import os
save_every = {interval}   # steps between checkpoints
folder = os.path.expanduser("~/checkpoints")
os.makedirs(folder, exist_ok=True)
for step, batch in enumerate(batches, start=1):   # your training loop
    train_step(batch)
    if step % save_every == 0:
        torch.save({{"model": model.state_dict(), "optimizer": optimizer.state_dict()}},
                   os.path.join(folder, "last.pt"))
"""


__all__ = ["frequent_checkpoints"]
