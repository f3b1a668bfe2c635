"""``updates-without-gradients``: backward passes write gradients, yet no optimizer update runs anything."""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, pytorch, rule, windows
from gpumagic.analysis.updates import gradient_writes, reset_times, updates
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: Updates judged (each after a backward pass of its own); every update of the window, judged or
#: not, must have run nothing.
MIN_UPDATES = 3
# torch.optim's ``step`` skips every parameter whose ``.grad`` is None: with none left it runs no
# operator at all (checked on torch 2.13 for Adam, AdamW, SGD with and without momentum,
# for-loop, foreach and fused), while an update with gradients runs at least one (SGD without
# momentum: one ``aten::add_`` a parameter; a fused GPU update: its kernel's launch).
DOC = "https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html"
ORDER_CODE = """
for inputs, targets in loader:
    optimizer.zero_grad()        # first: the gradients start from nothing
    loss = loss_fn(model(inputs), targets)
    loss.backward()              # writes the gradients
    optimizer.step()             # reads them: nothing may reset them in between
"""
CHECK_CODE = """
loss.backward()
held = {id(p) for group in optimizer.param_groups for p in group["params"]}
with_grad = [p for p in model.parameters() if p.grad is not None]
print(f"{sum(id(p) in held for p in with_grad)} of the {len(with_grad)} parameters with a gradient "
      f"are among the optimizer's {len(held)}")
"""


@rule("updates-without-gradients")
def updates_without_gradients(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: ≥ 3 optimizer updates (``Optimizer.step#``) after backward passes of their own
    (AccumulateGrad nodes since the update before), and no update in the window ran anything — no
    operator, annotation or launch inside. torch.optim's step skips each parameter whose
    ``.grad`` is None, so an update that runs nothing found none of its parameters with a
    gradient, although the backward wrote some: the model does not train. Names the cause the
    trace shows: ``Optimizer.zero_grad#`` between the backward's last gradient write and the
    update (``optimizer.zero_grad()`` placed between ``backward()`` and ``step()``); otherwise
    the optimizer holds other parameters than the ones the backward wrote (built before the
    model was rebuilt or copied, or from another model), or the gradients were set to None by
    hand in between. Compiled updates record no annotation and are not judged; an update that
    ran anything at all keeps it silent (a second optimizer over frozen parameters beside one
    that works). Severity high when the misplaced ``zero_grad`` is seen before every update, else
    medium. Gain: none in speed; a correctness fix. False positives: an optimizer wrapper that
    records an update of its own but steps its inner optimizer only every few calls, profiled in
    a window shorter than that."""
    up = updates(ctx)
    judged = up.judged
    if np.count_nonzero(judged) < MIN_UPDATES or up.inside.any():
        return None
    ev = ctx.trace.events
    rows = up.rows[judged]
    resets = reset_times(ctx)
    nodes = np.sort(ev.ts_ns[gradient_writes(ctx)])
    starts = ev.ts_ns[rows]
    last_write = nodes[np.searchsorted(nodes, starts) - 1]  # each judged update has a write before it
    between = np.searchsorted(resets, starts) - np.searchsorted(resets, last_write)
    misplaced = int(np.count_nonzero(between > 0))
    count = int(rows.size)
    params = int(median_of(up.written[judged]))
    kinds = sorted({c for c, j in zip(up.classes, judged.tolist(), strict=True) if j})
    fixes: tuple[Fix, ...]
    if misplaced == count:
        cause = "optimizer.zero_grad() ran between backward() and step() before every one of them"
        fixes = (pytorch("Reset the gradients before the backward, not between it and the step", ORDER_CODE),)
    else:
        cause = ("no zero_grad ran in between: the optimizer holds other parameters than the ones the backward "
                 "writes, or their gradients were set to None by hand")
        fixes = (pytorch("Check that the parameters with a gradient are the optimizer's", CHECK_CODE, diagnostic=True),
                 pytorch("Build the optimizer from the model you train, after it is built, copied or loaded",
                         "# an optimizer holds the parameters it was built from: build it from the model you train,\n"
                         "# once that model is built, copied or loaded\n"
                         "optimizer = torch.optim.SGD(model.parameters(), lr=lr)"))
    return finding(
        severity="high" if misplaced == count else "medium",
        title=f"No optimizer update changed anything: each of {count} found no gradient",
        why="""An optimizer's step skips every parameter whose .grad is None, and torch.optim's runs no operator at
        all when none has one. Here each backward pass wrote gradients, yet every update that followed ran nothing:
        the parameters the optimizer holds had no gradient when it stepped, so the model does not train. Either the
        gradients were reset between backward() and step() (optimizer.zero_grad() in the wrong place, or .grad set to
        None by hand), or the optimizer was built from other parameters than the ones the backward writes: a model
        rebuilt, reloaded or copied after the optimizer was made, or the optimizer given another model.""",
        summary=(f"{count} {' and '.join(kinds)} updates, each after a backward pass that wrote {params:,} gradients "
                 f"(median), ran no operator; {cause}."),
        numbers={"updates": count, "gradients_written": params, "zero_grad_between": misplaced,
                 "optimizer": " and ".join(kinds)},
        windows=windows(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows], "cpu", label="update that ran nothing"),
        est_gain=0.0,
        gain_method="not a speed finding: the updates change nothing",
        fixes=fixes,
        doc_url=DOC,
    )


__all__ = ["updates_without_gradients"]
