"""``optimizer-state-reset``: every update creates the optimizer's state again (a new optimizer each step)."""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, pytorch, rule, windows
from gpumagic.analysis.updates import updates
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: torch.optim creates a parameter's state at its first update, in the step itself (each
#: optimizer's ``_init_group``: Adam, AdamW, Adamax, NAdam, RAdam ``torch.zeros_like`` for the two
#: moments, RMSprop and Adadelta ``torch.zeros_like`` and ``torch.zeros`` for the step, Rprop
#: ``full_like``, Adafactor ``new_zeros``/``zeros_like``; checked on torch 2.13 with foreach on and
#: off and fused, where none of these operators runs in a later update).
STATE_CREATORS = frozenset({"aten::zeros_like", "aten::zeros", "aten::full_like", "aten::new_zeros"})
#: Optimizers whose state is a copy of the first gradient: SGD with momentum,
#: ``torch.clone(grad).detach()`` (torch/optim/sgd.py). Others clone in every update (Rprop,
#: Adafactor), so a clone counts for these classes only.
CLONED_STATE = frozenset({"SGD"})
#: Updates judged (each after a backward pass of its own), all of which created state.
MIN_UPDATES = 3
#: State created in each judged update: at least this many operators above for each parameter the
#: backward before it wrote (one AccumulateGrad node a parameter). Adam creates two a parameter,
#: SGD one; an optimizer that makes a buffer or two in every update (a norm, a flag) stays far below.
MIN_PER_PARAM = 0.5
DOC = "https://pytorch.org/docs/stable/optim.html"
TORCH_OPTIMIZERS = frozenset({"Adadelta", "Adafactor", "Adagrad", "Adam", "Adamax", "AdamW", "ASGD", "NAdam", "RAdam",
                              "RMSprop", "Rprop", "SGD", "SparseAdam"})


def _fix_code(cls: str) -> str:
    if cls == "SGD":  # its state is the momentum buffer: only SGD with momentum loses anything
        build = "optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)  # your lr and momentum"
    elif cls in TORCH_OPTIMIZERS:
        build = f"optimizer = torch.optim.{cls}(model.parameters(), lr=lr)  # with your settings"
    else:
        build = "# optimizer = YourOptimizer(model.parameters(), ...)  # with your settings"
    return f"""
# build the optimizer (and any learning-rate scheduler on it) once, before the loop:
{build}

for inputs, targets in loader:
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()             # the same optimizer every step: its state carries over
"""


@rule("optimizer-state-reset")
def optimizer_state_reset(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: ≥ 3 optimizer updates (``Optimizer.step#<Class>.step``), each after a backward pass
    of its own (AccumulateGrad nodes since the update before), and every one of them creates the
    optimizer's per-parameter state — ``aten::zeros_like``, ``aten::zeros``, ``aten::full_like``
    or ``aten::new_zeros`` inside the update (``aten::clone`` for SGD's momentum), at least half a
    call per parameter written (one backward pass's writes, where the sequence numbers count the
    passes: gradient accumulation writes each gradient once a micro-batch). torch.optim creates that state at a parameter's first update only,
    so a loop that keeps its optimizer creates it once: here the optimizer (or the model it
    updates) is built anew every step, or its state cleared. Adam's first update from empty
    state is about ``lr * sign(grad)`` whatever the gradient's size, SGD's momentum never builds
    up, and a scheduler on the first optimizer no longer sets the learning rate. Nested updates
    (a wrapper's step around its inner optimizer's) count once; updates that run a backward
    themselves (LBFGS's closure) are not judged. Gain: none in speed; a correctness fix. False
    positives: an optimizer that allocates zeroed buffers for every parameter in every update by
    design (none of torch.optim's)."""
    ev, mk = ctx.trace.events, ctx.masks
    up = updates(ctx)
    judged = up.judged  # a second optimizer after the same backward, or no backward in the window: not judged
    if np.count_nonzero(judged) < MIN_UPDATES:
        return None
    host_ops = mk["cpu_op"] & mk["host"]
    creators = np.flatnonzero(host_ops & ctx.host_name_ids(STATE_CREATORS.__contains__)[ev.name])
    clones = np.flatnonzero(host_ops & ctx.host_name_ids(lambda n: n == "aten::clone")[ev.name])
    starts, ends, lanes = ev.ts_ns[up.rows], ev.ts_ns[up.rows] + ev.dur_ns[up.rows], ev.lane[up.rows]

    def inside(rows: np.ndarray) -> np.ndarray:
        return iv.weight_in_ranges(ev.ts_ns[rows], ev.lane[rows], None, starts, ends, lanes)

    created = inside(creators) + np.where([c in CLONED_STATE for c in up.classes], inside(clones), 0)
    # the parameters written: one backward pass's writes (gradient accumulation writes each one per micro-batch)
    written = up.written[judged] / np.maximum(up.passes[judged], 1)
    per_param = created[judged] / written
    if per_param.min() < MIN_PER_PARAM:
        return None
    count = int(np.count_nonzero(judged))
    params = int(median_of(written))
    kinds = sorted({c for c, j in zip(up.classes, judged.tolist(), strict=True) if j})
    shown = kinds[0] if len(kinds) == 1 else " and ".join(kinds)
    rows = up.rows[judged]
    return finding(
        severity="medium",
        title=f"Every {shown} update starts from empty optimizer state: a new optimizer each step",
        why="""An optimizer keeps state for each parameter from one update to the next (Adam's running averages of
        the gradient and of its square, SGD's momentum) and creates it at a parameter's first update. Here every
        update created it again, so the optimizer, or the model it updates, is built anew inside the loop (or its
        state is cleared). From empty state Adam moves every weight by about the learning rate in the direction of
        its gradient's sign, however large or small the gradient (its bias-corrected averages are then exactly the
        gradient and its square), momentum never builds up, and a learning-rate scheduler made with the first
        optimizer no longer changes the rate. Build the optimizer once, before the loop; a function that trains one
        batch should take the optimizer as an argument.""",
        summary=(f"Each of {count} {shown} updates, every one after its own backward pass, created "
                 f"{float(per_param.min()):.1f}{' or more' if per_param.min() < per_param.max() else ''} state tensors "
                 f"a parameter (zeros_like, zeros, full_like or new_zeros{', clone' if CLONED_STATE & set(kinds) else ''}) "
                 f"for the {params:,} parameters its backward wrote; a kept optimizer creates them at its first update only."),
        numbers={"updates": count, "parameters": params, "created_per_param": round(float(per_param.min()), 3),
                 "threshold_per_param": MIN_PER_PARAM, "optimizer": shown},
        windows=windows(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows], "cpu", label="update creating state"),
        est_gain=0.0,
        gain_method="not a speed finding: the updates are wrong, not slow",
        fixes=(pytorch("Build the optimizer once, before the loop", _fix_code(kinds[0] if len(kinds) == 1 else "")),),
        doc_url=DOC,
    )


__all__ = ["optimizer_state_reset"]
