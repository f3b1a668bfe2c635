"""``gradients-never-reset``: no step resets the gradients, so each backward adds to all the earlier ones."""

from __future__ import annotations

import re

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis.context import Context
from gpumagic.analysis.inference import holding, starts_inside
from gpumagic.analysis.phases import BACKWARD_RE
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule
from gpumagic.analysis.updates import ZERO_GRAD_RE, gradient_writes
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

# The autograd engine's node that writes a parameter's ``.grad`` (updates.gradient_writes): with no
# gradient there it stores the new one; with one there, it adds in place (``aten::add_`` inside
# the node; torch/csrc/autograd/functions/accumulate_grad.h, ``accumulateGrad``; checked on torch 2.13).
OPTIMIZER_STEP_RE = re.compile(r"^Optimizer\.step#")
#: Updates needed, each followed by a backward pass that adds to the gradients the update used:
#: three in a row.
MIN_UPDATES = 3
#: In each of those backward passes, at least this share of the parameters' gradient writes add to
#: a gradient already there (a model with a few parameters that receive no gradient some steps
#: still passes).
MIN_ADD_FRAC = 0.9
#: Zeroing in place by hand (``model.zero_grad(set_to_none=False)``, ``p.grad.zero_()``) calls
#: ``aten::zero_`` once a parameter: this many per parameter between an update and the next
#: backward's gradient writes, outside the backward, count as a reset.
ZEROED_PER_PARAM = 0.5
DOC = "https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html"
ZERO_GRAD_CODE = """
for inputs, targets in loader:
    optimizer.zero_grad()        # before each backward: the gradients start from nothing
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
"""


@rule("gradients-never-reset")
def gradients_never_reset(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: after ≥ 3 optimizer updates (``Optimizer.step#``) in the window, the next backward
    pass's gradient writes (the autograd engine's ``AccumulateGrad`` nodes) add in place to the
    gradient the update had just used — an ``aten::add_`` inside ≥ 90 % of the nodes — and
    nothing reset it in between: no ``Optimizer.zero_grad#`` anywhere in the trace, and fewer
    than half an ``aten::zero_`` a parameter outside the backward (in-place zeroing by hand). Each
    backward then adds to the sum of every earlier step's gradients, and every update follows
    that sum: training drifts or diverges. Only the first backward pass after each update is
    read (it ends where the main thread runs an operator outside the backward: the next
    micro-batch's forward): gradient accumulation's later passes add on purpose. Gradient
    accumulation resets after its update, and ``model.zero_grad()`` or ``p.grad = None`` leave no
    gradient to add to (the node stores the new one): silent; so is a window inside one long
    accumulation, with no update in it. Gain: none in speed; a correctness fix. False positives: accumulating across updates on
    purpose (an unusual training scheme)."""
    ev, mk = ctx.trace.events, ctx.masks
    host_ops = mk["cpu_op"] & mk["host"]
    marks = mk["host"] & (mk["annotation"] | mk["cpu_op"])
    if (marks & ctx.host_name_ids(ZERO_GRAD_RE.search)[ev.name]).any():
        return None
    updates = np.flatnonzero(ctx.events_in_window(marks & ctx.host_name_ids(OPTIMIZER_STEP_RE.search)[ev.name]))
    # an update the window's start cuts is the step before it's (the step ends in its hook, so the
    # window may start a rounding away before or after that update's end: 4 or 5 for the same steps)
    updates = updates[ev.ts_ns[updates] >= ctx.lo]
    nodes = np.flatnonzero(gradient_writes(ctx))
    if updates.size < MIN_UPDATES or not nodes.size:
        return None
    adding = holding(ev, nodes, np.flatnonzero(host_ops & ctx.host_name_ids(lambda n: n == "aten::add_")[ev.name]))
    backward = np.flatnonzero(host_ops & ctx.host_name_ids(BACKWARD_RE.search)[ev.name])
    zeros = np.flatnonzero(host_ops & ctx.host_name_ids(lambda n: n == "aten::zero_")[ev.name])
    zeros = zeros[~starts_inside(ev, zeros, backward)]  # the backward's own zeroing is not a reset
    node_ts, zero_ts = ev.ts_ns[nodes], ev.ts_ns[zeros]
    # the main thread's operators outside the backward: the next one after a pass's first gradient
    # write is the next micro-batch's forward (gradient accumulation) or the update, and ends the pass
    outside = np.flatnonzero(host_ops & (ev.lane == ctx.main_lane) & ~ctx.host_name_ids(BACKWARD_RE.search)[ev.name])
    outside_ts = np.sort(ev.ts_ns[outside[~starts_inside(ev, outside, backward)]])
    ends = ev.ts_ns[updates] + ev.dur_ns[updates]
    # each update's window: from its end to the next update's start (or the end of the trace)
    nexts = np.append(ev.ts_ns[updates][1:], np.iinfo(np.int64).max)
    params, fracs = [], []
    for lo, hi in zip(ends.tolist(), nexts.tolist(), strict=True):
        a, b = np.searchsorted(node_ts, (lo, hi))
        if b <= a:  # no backward after this update (the last one of the trace)
            continue
        first_write = int(node_ts[a])
        k = int(np.searchsorted(outside_ts, first_write, side="right"))
        if k < outside_ts.size and outside_ts[k] < hi:  # the first pass ends where the main thread goes on
            b = int(np.searchsorted(node_ts, outside_ts[k]))
        zeroed = int(np.count_nonzero((zero_ts >= lo) & (zero_ts < first_write)))
        n = b - a
        if zeroed >= ZEROED_PER_PARAM * n:
            return None
        params.append(n)
        fracs.append(float(np.count_nonzero(adding[a:b])) / n)
    if len(fracs) < MIN_UPDATES or min(fracs) < MIN_ADD_FRAC:
        return None
    count = len(fracs)
    return finding(
        severity="medium",
        title=f"The gradients are never reset: after each of {count} updates the next backward adds to the old ones",
        why="""backward() adds each parameter's new gradient to the one already in .grad; that is what lets gradient
        accumulation sum several micro-batches. A loop that never resets .grad (optimizer.zero_grad() before each
        backward, or after each update) makes every update follow the sum of all the gradients since the start,
        so the steps grow and training drifts or diverges. Here the backward after each update added to the very
        gradients that update had used, and nothing reset them in between.""",
        summary=(f"After each of {count} optimizer updates, {pct(min(fracs))}{' or more' if min(fracs) < 1 else ''} of "
                 f"the next backward's {int(median_of(params)):,} gradient writes (AccumulateGrad) added to the gradient "
                 "already there; no Optimizer.zero_grad and no in-place zeroing ran."),
        numbers={"updates": count, "parameters": int(median_of(params)), "adding_frac": round(min(fracs), 4),
                 "threshold_frac": MIN_ADD_FRAC},
        est_gain=0.0,
        gain_method="not a speed finding: the updates are wrong, not slow",
        fixes=(pytorch("Reset the gradients once per update", ZERO_GRAD_CODE),),
        doc_url=DOC,
    )


__all__ = ["gradients_never_reset"]
