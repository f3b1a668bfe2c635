"""``gradients-reset-mid-accumulation``: gradient accumulation whose gradients are reset between its
micro-batches, so that each update follows the last micro-batch alone."""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis.context import Context
from gpumagic.analysis.loaderwait import main_waits
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule
from gpumagic.analysis.updates import reset_times, updates
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: Updates after two backward passes or more (gradient accumulation) needed, in the window ...
MIN_UPDATES = 2
#: ... and in at least this share of them, ``Optimizer.zero_grad#`` between their first backward
#: pass and their last: a habit of the loop, not one update.
MIN_SHARE = 0.5
DOC = "https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html"
ACCUMULATE_CODE = """
optimizer.zero_grad()
for i, (inputs, targets) in enumerate(loader):
    # each micro-batch's loss divided by their number: the update follows their mean
    loss = loss_fn(model(inputs.to(device)), targets.to(device)) / accumulation_steps
    loss.backward()                    # adds to the gradients of the micro-batches before it
    if (i + 1) % accumulation_steps == 0:
        optimizer.step()               # the update reads the sum
        optimizer.zero_grad()          # and only then are the gradients reset, for the next update
"""


def _micro_batches(passes: np.ndarray, lost: int, reset: int, update: int, waits: np.ndarray,
                   writes: np.ndarray) -> bool:
    """Whether the passes an update follows (their starts, ``passes``) before and after ``reset``
    are micro-batches whose gradients it drops. With a DataLoader in the window: it handed the
    loop a batch between the last pass before the reset and the first after it, and the passes
    before it wrote parameters' gradients (AccumulateGrad, ``writes``), at least half as many a
    pass as those after it. Without one (batches taken from a list or a tensor): every pass
    wrote the same number of gradients, more than none — the same model on another batch. Not
    ``torch.autograd.grad`` passes (an input's gradient, a gradient penalty, a physics-informed
    loss's derivatives: no ``.grad`` written), nor an adversarial example's backward on the same
    batch (its input's gradient written too), nor a second optimizer resetting its own gradients
    (its passes write other parameters; an update that another optimizer's follows with no
    pass of its own is not judged at all)."""
    edges = np.searchsorted(writes, np.append(passes, update))
    per_pass = np.diff(edges)
    if not waits.size:
        return bool(per_pass[0] > 0 and np.all(per_pass == per_pass[0]))
    fed = np.searchsorted(waits, passes[lost]) > np.searchsorted(waits, passes[lost - 1])
    before = np.searchsorted(writes, reset) - edges[0]
    after = edges[-1] - np.searchsorted(writes, reset)
    return bool(fed) and after > 0 and before / lost >= 0.5 * after / (passes.size - lost)


@rule("gradients-reset-mid-accumulation")
def gradients_reset_mid_accumulation(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: ≥ 2 optimizer updates (``Optimizer.step#``) that each follow two backward passes or
    more (gradient accumulation: ``updates.Updates.passes``, read from the backward nodes'
    sequence numbers), and in ≥ half of them ``optimizer.zero_grad()`` (its ``Optimizer.zero_grad#``
    annotation) runs after the first of those passes and before the last: the gradients that the
    passes before it wrote are dropped, and the update follows only the micro-batches after the
    last reset (the loop resets at the top of every micro-batch instead of after each update),
    where the passes are micro-batches (:func:`_micro_batches`: a DataLoader batch between the
    passes around the reset and parameters' gradients written before it as after it; without a
    DataLoader, the same number of gradients written by every pass). Their forward and backward
    were computed for nothing. Gain: none in speed; a correctness fix
    (the evidence gives the share of the passes whose gradients were dropped). Not judged:
    ``model.zero_grad()`` and ``p.grad = None`` record no annotation (a reset with
    ``set_to_none=True`` leaves only a gradient write that stores instead of adding, which two
    backward passes over different parameters leave too), traces whose backward carries no
    sequence numbers (no passes counted). False positives: a loop that resets on purpose
    between passes on two batches that feed one update, rare."""
    up = updates(ctx)
    accumulating = np.flatnonzero(up.passes >= 2)
    if accumulating.size < MIN_UPDATES:
        return None
    ev = ctx.trace.events
    resets, starts, writes, waits = reset_times(ctx), up.pass_ts, up.write_ts, main_waits(ctx)
    ts = ev.ts_ns[up.rows]
    dropped, passes, with_reset = [], [], 0
    for k in accumulating.tolist():
        if k + 1 < up.passes.size and up.passes[k + 1] == 0:
            continue  # a second optimizer steps after the same passes: a reset may be its own
        since = ts[k - 1] if k else np.iinfo(np.int64).min
        mine = starts[(starts > since) & (starts < ts[k])]
        if mine.size < 2:
            continue
        passes.append(int(mine.size))
        # resets after the first pass began and before the last one: each drops what came before it
        inside = resets[(resets > mine[0]) & (resets < mine[-1])]
        lost = int(np.searchsorted(mine, inside[-1])) if inside.size else 0  # the passes before the last reset
        if lost and _micro_batches(mine, lost, int(inside[-1]), int(ts[k]), waits, writes):
            with_reset += 1
            dropped.append(lost)
        else:
            dropped.append(0)
    judged = len(passes)
    if judged < MIN_UPDATES or with_reset < MIN_SHARE * judged or with_reset < MIN_UPDATES:
        return None
    share = sum(dropped) / sum(passes)
    per_update = median_of(passes)
    return finding(
        severity="high" if with_reset == judged else "medium",
        title=(f"optimizer.zero_grad() runs between accumulated micro-batches: {pct(share)} of their gradients "
               "are dropped before the update"),
        why=f"""{with_reset} of the {judged} updates that accumulate gradients over several backward passes
        ({per_update:.0f} each, median) run optimizer.zero_grad() after the first of those passes and before the last. A
        reset drops every gradient written before it, so each update follows only the micro-batches after the last
        reset: the forward and backward of the others were computed for nothing, and the effective batch is a
        fraction of the one intended. Reset the gradients once per update, after optimizer.step(), and divide each
        micro-batch's loss by their number so that the update follows their mean (PyTorch's recipe on zeroing
        out gradients; Hugging Face Accelerate's gradient accumulation guide).""",
        summary=(f"{with_reset} of {judged} accumulating updates ({per_update:.0f} backward passes each, median) had "
                 f"optimizer.zero_grad() between their passes: {sum(dropped)} of {sum(passes)} passes' gradients "
                 f"({pct(share)}) were dropped."),
        numbers={"accumulating_updates": judged, "updates_with_reset": with_reset,
                 "passes_per_update": round(per_update, 1), "passes": sum(passes), "passes_dropped": sum(dropped),
                 "dropped_frac": round(share, 4), "threshold_updates": MIN_UPDATES, "threshold_share": MIN_SHARE},
        est_gain=0.0,
        gain_method="none: a correctness fix (the dropped passes' share is in the numbers)",
        fixes=(pytorch("Reset the gradients once per update, after optimizer.step(), not before each micro-batch",
                       ACCUMULATE_CODE),),
        doc_url=DOC,
    )


__all__ = ["gradients_reset_mid_accumulation"]
