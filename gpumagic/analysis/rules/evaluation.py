"""``frequent-evaluation``: an evaluation loop runs so often that it takes a large share of the
training time."""

from __future__ import annotations

from typing import Any

from gpumagic.analysis import everystep
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: A finding from this share of the steps' time: the TensorBoard profiler plugin's 5 % line for a
#: bottleneck worth naming, doubled, since some evaluation is part of every run worth watching.
MIN_SHARE = 0.10
#: At least this many evaluations: one is a check, not a habit.
MIN_EVALS = 2
#: The interval the fix suggests keeps evaluation under this share of the time (a learning curve
#: still drawn, at a twentieth of the cost).
TARGET_SHARE = 0.05
DOC = "https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments"


@rule("frequent-evaluation")
def frequent_evaluation(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: gpumagic's step timer saw evaluation loops (a module switched to eval mode and back
    with no optimizer step between, ``everystep.evaluations``) during the steps of the cell — every
    step, not only the recorded ones — taking ≥ 10 % of their time, in ≥ 2 loops, the first step
    and the ``step-outliers`` that no evaluation explains left out (:func:`frequent`; the
    outliers the evaluations make are their time, and ``step-outliers`` leaves them to this
    rule). Suggests an interval, rounded up to one a person would write, that keeps evaluation
    under 5 % of the time. Gain, an estimate: the evaluations' share of all the
    steps' time, less what evaluating at the suggested interval still costs. Only a gpumagic
    capture has the timer. Silent where the window's spans in eval mode draw actions
    (``everystep.evaluation_spans``: ``torch.multinomial``, ``torch.normal``, a reinforcement-
    learning rollout with the policy in eval mode, which the updates need). False positives: a
    run that must evaluate this often (early stopping on a tiny budget, a tutorial's per-epoch
    curve on a handful of steps), a rollout whose draws all fall outside the recorded window."""
    found = frequent(ctx, m)
    if found is None:
        return None
    block, seen, habit = found
    share, per_eval, train_ms, often = habit.share, habit.each_ms, habit.train_ms, habit.often
    interval = habit.interval(TARGET_SHARE)
    after = per_eval / (interval * train_ms + per_eval)  # evaluation's share at the suggested interval
    gain = max(0.0, share - after)
    ran = len(block["step_ms"])  # the optimizer steps the cell ran
    return finding(
        severity=severity_for(gain),
        title=f"An evaluation loop runs {often} and takes {pct(share)} of the training time",
        why=f"""The model is switched to eval mode and evaluated {often}: each evaluation took {per_eval:.1f} ms,
        against {train_ms:.1f} ms of training per step, and no optimizer step runs meanwhile. Evaluating every
        {interval:,} steps still draws the learning curve and costs about {pct(after)} of the time; a fixed
        subset of the validation data costs less again."""
        + (f""" This cell ran {ran:,} optimizer steps: at that interval a run as long would evaluate only at the
        end, so for a curve within it evaluate a subset more often instead.""" if interval > ran else ""),
        summary=(f"{seen['count']} evaluation loops during {seen['steps']} steps: {seen['ms']:.0f} ms of "
                 f"{seen['steps_ms']:.0f} ms, {pct(share)}; {per_eval:.1f} ms each, {train_ms:.1f} ms of training "
                 f"a step."),
        numbers={"evaluation_frac": round(share, 4), "evaluations": seen["count"], "steps": seen["steps"],
                 "per_evaluation_ms": round(per_eval, 4), "training_per_step_ms": round(train_ms, 4),
                 "suggested_every_steps": interval, "threshold_frac": MIN_SHARE},
        est_gain=gain,
        gain_method=(f"estimate: the evaluations' share of the steps' time ({pct(share)}) less their share when "
                     f"run every {interval:,} steps ({pct(after)})"),
        fixes=(pytorch(f"Evaluate every {interval:,} steps, not {often}", _every_code(interval)),
               huggingface(f"Trainer: evaluate every {interval:,} steps",
                           f'TrainingArguments(..., eval_strategy="steps", eval_steps={interval})')),
        doc_url=DOC,
    )


def frequent(ctx: Context, m: Metrics) -> tuple[dict[str, Any], dict[str, Any], everystep.Recurring] | None:
    """The step timer's block, what :func:`everystep.evaluations` counted in it during the cell's
    steps and the habit it makes
    (:func:`everystep.recurring`: ≥ :data:`MIN_EVALS` loops taking ≥ :data:`MIN_SHARE` of the
    steps' time), or None: no step timer, rollouts drawing actions in eval mode, too few or too
    short. ``step-outliers``' outliers are left out unless an evaluation explains them (runs for
    at least half of the excess): an evaluation long against a step makes its step an outlier,
    and it is that time this counts; an outlier something else made (a busy machine) is not."""
    block = everystep.block_of(ctx)
    if block is None or everystep.evaluation_spans(ctx)[1]:  # rollouts drawing actions in eval mode
        return None
    others = frozenset(o.index for o in m.steps.outliers or [] if not everystep.explained_by(o, "eval"))
    seen = everystep.evaluations(block, skip=others)
    habit = everystep.recurring(seen, MIN_EVALS, MIN_SHARE)
    return None if habit is None else (block, seen, habit)


def _every_code(interval: int) -> str:
    return f"""
eval_every = {interval}   # optimizer steps between evaluations
for step, batch in enumerate(loader, start=1):   # your training loop
    train_step(*batch)
    if step % eval_every == 0:                     # your evaluation as it is, under this test
        model.eval()
        with torch.inference_mode():
            val_loss = sum(loss_fn(model(x.to(device)), y.to(device)).item() for x, y in val_loader) / len(val_loader)
        model.train()
        print(f"step {{step}}: validation loss {{val_loss:.4f}}")
"""


__all__ = ["frequent_evaluation"]
