"""``training-in-eval-mode``: the model trains in eval mode (``model.train()`` not called again after an evaluation)."""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis.context import Context
from gpumagic.analysis.inference import DROPOUT_OPS
from gpumagic.analysis.phases import BACKWARD_RE
from gpumagic.analysis.rules.base import finding, pytorch, rule, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding
from gpumagic.trace.model import EventTable

#: Dropout calls judged: recorded with their arguments (``record_shapes``, torch ≥ 2.1 writes a
#: call's scalar inputs as ``Concrete Inputs``: ``aten::dropout(input, p, train)``), with ``p > 0``
#: and in a forward pass a backward then ran. At least this many, every one with ``train`` False.
MIN_CALLS = 2
#: ``aten::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
#: cudnn_enabled)``: the ``training`` flag's position, reported beside the dropout calls.
BATCH_NORM_TRAINING = 5
DOC = "https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.train"
TRAIN_CODE = """
for epoch in range(2):
    model.train()                # dropout and batch norm in training mode for the training steps
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss_fn(model(inputs), targets).backward()
        optimizer.step()
    model.eval()                 # evaluation mode only for the evaluation
    with torch.no_grad():
        val_loss = loss_fn(model(x), y)
"""


@rule("training-in-eval-mode")
def training_in_eval_mode(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: operators recorded with their arguments (``--shapes``), and ≥ 2 dropout calls with
    ``p > 0`` in forward passes that a backward pass then ran — the call's sequence number (the
    number of the next autograd node built, since eval-mode dropout builds none) is carried by a
    backward node — every one of them with ``train=False``: the model is in eval mode while it
    trains, typically ``model.eval()`` for a validation and no ``model.train()`` after it. Dropout
    then regularises nothing, and batch normalisation normalises with its running statistics and
    stops updating them (the batch-norm calls that ran with ``training=False`` in those passes are
    counted beside). A forward under ``torch.no_grad()`` (an evaluation done right) carries no
    number and is not judged; a model with dropout on in any trained forward call (a submodule put
    in eval mode on purpose) stays silent. Gain: none in speed; a correctness fix. False
    positives: training with dropout switched off through eval mode on purpose (``p=0`` is the
    usual way, and is not judged)."""
    ops = ctx.trace.ops
    if ops is None or not ops.concrete:
        return None
    ev, mk = ctx.trace.events, ctx.masks
    host_ops = mk["cpu_op"] & mk["host"]
    used = ev.seq[host_ops & ctx.host_name_ids(BACKWARD_RE.search)[ev.name] & (ev.seq >= 0)]
    if not used.size:
        return None
    used = distinct(used)
    judged = DROPOUT_OPS | {"aten::batch_norm"}
    numbered = np.flatnonzero(host_ops & ctx.host_name_ids(judged.__contains__)[ev.name] & (ev.seq >= 0))
    trained_off, trained_on, bn_frozen, rows = 0, 0, 0, []
    for i in [i for i, name in enumerate(ops.name) if name in judged]:
        name = ops.name[i]
        if not ctx.lo <= ops.ts_ns[i] < ctx.hi:
            continue
        seq = _seq_of(ev, numbered, int(ops.lane[i]), int(ops.ts_ns[i]))
        if seq is None or not _in(used, seq):
            continue
        values = ops.concrete[i] or []
        if name == "aten::batch_norm":
            bn_frozen += _flag(values, BATCH_NORM_TRAINING) is False
            continue
        p, train = _number(values, 1), _flag(values, 2)
        if p is None or p <= 0 or train is None:
            continue
        if train:
            trained_on += 1
        else:
            trained_off += 1
            rows.append(i)
    if trained_on or trained_off < MIN_CALLS:
        return None
    starts = ops.ts_ns[rows]
    bn = f"; {bn_frozen} batch-norm calls ran with training=False" if bn_frozen else ""
    return finding(
        severity="medium",
        title=f"The model trains in eval mode: dropout is off in all {trained_off} calls of its training passes",
        why="""model.eval() switches dropout off and makes batch normalisation use its running statistics; model.train()
        switches them back. Here every dropout call with a nonzero rate in the forward passes the backward trained
        through ran with train=False: the model was left in eval mode, typically after a validation pass, so
        dropout regularises nothing and batch-norm layers neither normalise by the batch nor update their running
        statistics. Call model.train() before the training steps (each epoch, after each evaluation).""",
        summary=(f"{trained_off} dropout calls with p > 0 in forward passes a backward ran through had train=False, none "
                 f"had train=True{bn}."),
        numbers={"eval_dropout_calls": trained_off, "frozen_batch_norm_calls": bn_frozen,
                 "threshold_calls": MIN_CALLS},
        windows=windows(starts, starts + ops.dur_ns[rows], "cpu", label="dropout in eval mode"),
        est_gain=0.0,
        gain_method="not a speed finding: the model trains in the wrong mode",
        fixes=(pytorch("Put the model back in training mode for the training steps", TRAIN_CODE),),
        doc_url=DOC,
    )


#: The operators table and the event table round a start to the nanosecond apart (1 ns seen):
#: the same call is the one on the same thread starting within this much.
SAME_START_NS = 500


def _seq_of(ev: EventTable, rows: np.ndarray, lane: int, ts: int) -> int | None:
    """The sequence number of the call among ``rows`` (in start order) on ``lane`` starting at ``ts``."""
    k = int(np.searchsorted(ev.ts_ns[rows], ts - SAME_START_NS))
    while k < rows.size and ev.ts_ns[rows[k]] <= ts + SAME_START_NS:
        if ev.lane[rows[k]] == lane:
            return int(ev.seq[rows[k]])
        k += 1
    return None


def _in(sorted_values: np.ndarray, value: int) -> bool:
    k = int(np.searchsorted(sorted_values, value))
    return k < sorted_values.size and int(sorted_values[k]) == value


def _number(values: list[str], i: int) -> float | None:
    try:
        return float(values[i])
    except (IndexError, TypeError, ValueError):
        return None


def _flag(values: list[str], i: int) -> bool | None:
    v = values[i] if i < len(values) else None
    return True if v == "True" else False if v == "False" else None


__all__ = ["training_in_eval_mode"]
