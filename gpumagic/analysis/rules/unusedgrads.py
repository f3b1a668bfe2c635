"""``unused-gradients``: the backward computes gradients for parameters no optimizer updates."""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.inference import starts_inside
from gpumagic.analysis.phases import BACKWARD_RE, phase_intervals
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for
from gpumagic.analysis.updates import ACCUMULATE_RE, updates
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding
from gpumagic.trace.model import meta_block

#: Updates judged: each after backward passes of its own whose count the sequence numbers give.
MIN_UPDATES = 3
#: Gradients a pass writes beyond the parameters the optimizers hold, in every judged update: at
#: least this many and this share of the pass's writes (an input or two that requires grad on
#: purpose, adversarial training's, stays below).
MIN_EXTRA = 4
MIN_EXTRA_FRAC = 0.2
DOC = "https://pytorch.org/docs/stable/notes/autograd.html#setting-requires-grad"
FREEZE_CODE = """
trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
for p in model.parameters():
    if id(p) not in trained:
        p.requires_grad_(False)   # no gradient for what no optimizer updates
"""


@rule("unused-gradients")
def unused_gradients(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a gpumagic capture, which records how many distinct parameters the optimizers that
    stepped hold (``capture.optimizer_parameters``, read at each optimizer's first step), and ≥ 3
    updates each after backward passes whose count the sequence numbers give
    (``analysis.updates``): in every one, each pass wrote gradients (AccumulateGrad nodes) for
    ≥ 4 and ≥ 20 % more tensors than the optimizers hold. Those gradients are computed, stored
    and kept for nothing: a model fine-tuned through an optimizer given only its head, with the
    rest left ``requires_grad=True``. Gain: the backward's share of the window times the share of
    the gradients written for nothing, an estimate (a frozen prefix also stops the backward before
    it; frozen layers in the middle still pass gradients through). False positives: gradients
    read on purpose outside any optimizer (parameters updated by hand, gradient norms or saliency
    of other tensors), or an optimizer that did not step while recording. Not judged where a
    gradient is written inside another backward node (a reentrant checkpoint's inner backward,
    which also writes the gradients of the inputs it detached)."""
    held = meta_block(ctx.trace.meta, "capture").get("optimizer_parameters")
    if not isinstance(held, int) or held <= 0:
        return None
    up = updates(ctx)
    judged = up.judged & (up.passes > 0)
    if np.count_nonzero(judged) < MIN_UPDATES:
        return None
    if _inner_writes(ctx):
        return None
    per_pass = up.written[judged] / up.passes[judged]
    extra = per_pass - held
    if extra.min() < MIN_EXTRA or (extra / per_pass).min() < MIN_EXTRA_FRAC:
        return None
    written = median_of(per_pass)
    unused = written - held
    backward = sum(iv.total(parts["backward"]) for parts in phase_intervals(ctx))
    share = ctx.frac(backward)
    gain = share * unused / written
    return finding(
        severity=severity_for(gain),
        title=f"The backward computes gradients for {unused:,.0f} tensors no optimizer updates",
        why="""Every tensor with requires_grad=True that the loss depends on gets a gradient in the backward pass,
        whether or not an optimizer holds it: its gradient is computed, written to .grad and kept until the next
        reset. Here each backward pass wrote more gradients than all the optimizers that stepped hold parameters —
        typically a model fine-tuned by an optimizer given only part of it (the head), with the rest left trainable.
        Turning requires_grad off for what no optimizer updates skips those gradients, and the backward stops at the
        first layer that still needs one when the frozen part comes first.""",
        summary=(f"Each of {int(np.count_nonzero(judged))} updates followed backward passes that wrote {written:,.0f} "
                 f"gradients (median a pass), while the optimizers that stepped hold {held:,} parameters; the backward "
                 f"takes {pct(share)} of the window."),
        numbers={"gradients_per_pass": round(written, 1), "optimizer_parameters": held,
                 "unused_gradients": round(unused, 1), "backward_frac": round(share, 4),
                 "threshold_extra": MIN_EXTRA, "threshold_extra_frac": MIN_EXTRA_FRAC},
        est_gain=gain,
        gain_method=("estimate: the backward's share of the window times the share of its gradients no optimizer "
                     "reads (a frozen prefix saves its whole backward and its forward's graph, frozen middle layers "
                     "only their weights' gradients)"),
        fixes=(pytorch("Turn off gradients for the parameters no optimizer updates", FREEZE_CODE),),
        doc_url=DOC,
    )


def _inner_writes(ctx: Context) -> bool:
    """Whether a gradient is written inside another backward node: a reentrant checkpoint's inner
    backward, which also writes the gradients of the inputs it detached (leaves of its own, not
    parameters): the writes no longer count parameters."""
    ev, mk = ctx.trace.events, ctx.masks
    host_ops = mk["cpu_op"] & mk["host"]
    writes = ctx.host_name_ids(ACCUMULATE_RE.search)[ev.name]
    nodes = np.flatnonzero(ctx.events_in_window(host_ops & writes))
    others = np.flatnonzero(host_ops & ctx.host_name_ids(BACKWARD_RE.search)[ev.name] & ~writes)
    return bool(starts_inside(ev, nodes, others).any())


__all__ = ["unused_gradients"]
