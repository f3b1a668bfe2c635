"""``l2-penalty-in-loss``: a training loop that adds a sum of squared parameters to its loss by
hand, tensor by tensor, where the optimizer's ``weight_decay`` gives the same update for free."""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import distinct, median
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.inference import nested
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for
from gpumagic.analysis.updates import backward_nodes, gradient_writes, updates
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: One term of a hand-written penalty, as the host records it: a square of a tensor reduced to a
#: scalar (``p.pow(2).sum()``, ``(p ** 2).sum()``, ``torch.square(p).sum()``: the square's operator,
#: then ``aten::sum`` as the next operator on that thread), or a norm squared (``p.norm() ** 2``:
#: a norm, then ``aten::pow``).
SQUARE_OPS = frozenset({"aten::pow", "aten::square"})
NORM_OPS = frozenset({"aten::norm", "aten::linalg_vector_norm", "aten::frobenius_norm"})
#: The engine's node for ``pow(tensor, scalar)``'s backward: a squared tensor that requires grad
#: (``PowBackward1``/``2`` are a tensor exponent's); a full sum's; an addition's.
POW_BACKWARD = "PowBackward0"
SUM_BACKWARD = "SumBackward0"
ADD_BACKWARD = "AddBackward0"
#: A finding when, per optimizer update, at least this many penalty terms (a 3-layer MLP's six
#: tensors: benchmarks/weight_decay.py measured 0.23 of its step saved) ...
MIN_TERMS = 4
#: ... cover at least half of the parameter tensors the backward wrote (a penalty over the weights
#: and not the biases covers about half of an MLP's): a normalisation's squares of activations
#: (RMSNorm: one ``pow`` per norm layer, under a quarter of a transformer's parameter tensors;
#: GPT-2's tanh GELU: one ``pow(x, 3)`` per block of 12) stay under it ...
MIN_COVER = 0.5
#: ... and the penalty's own operators take at least this share of the window (the TensorBoard
#: profiler plugin's line for a bottleneck worth naming).
MIN_FRAC = 0.05
#: Optimizers whose ``weight_decay`` adds ``weight_decay * p`` to each gradient before the update
#: (torch.optim's docs for each: "weight decay (L2 penalty)"; NAdam and RAdam unless
#: ``decoupled_weight_decay=True``): for them ``weight_decay = 2 * lam`` is the penalty
#: ``lam * sum(p ** 2)`` exactly (tests/test_l2_penalty.py runs both).
COUPLED = frozenset({"SGD", "Adam", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam", "ASGD", "Adadelta"})
#: Optimizers whose ``weight_decay`` shrinks the weights outside the gradient (decoupled: AdamW,
#: Loshchilov & Hutter 2019), and those without a ``weight_decay`` (Rprop, LBFGS, SparseAdam).
DECOUPLED = frozenset({"AdamW"})
NO_DECAY = frozenset({"Rprop", "LBFGS", "SparseAdam"})
DOC = "https://pytorch.org/docs/stable/optim.html#per-parameter-options"
#: benchmarks/weight_decay.py on this project's 2-core machine, unprofiled, alternated rounds.
MEASURED = ("benchmarks/weight_decay.py, three CPU MLPs: weight_decay = 2 * lam saved 0.36, 0.33 and 0.11 of the "
            "step where this estimate read 0.31, 0.24 and 0.15")


def _coupled_code(cls: str) -> str:
    return f"""
# the penalty lam * sum(p.pow(2).sum() for p in params) has the gradient 2 * lam * p, and {cls}'s
# weight_decay adds weight_decay * p to each gradient inside its step: the same update, without the
# penalty's operators and their backward
optimizer = torch.optim.{cls}(model.parameters(), lr=lr, weight_decay=2 * lam)   # keep your other arguments
loss = loss_fn(model(x), y)   # the loss without the penalty
# a penalty over some tensors only (weights, not biases): give them a group of their own
# optimizer = torch.optim.{cls}([{{"params": decayed, "weight_decay": 2 * lam}},
#{" " * (len(cls) + 27)}{{"params": others, "weight_decay": 0.0}}], lr=lr)"""


ADAM_TWIN_CODE = """
# Adam's weight_decay adds weight_decay * p to each gradient before its moments, as the penalty's
# gradient 2 * lam * p does: the same update as AdamW(weight_decay=0) with the penalty
optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=2 * lam)   # keep your other arguments
loss = loss_fn(model(x), y)   # the loss without the penalty"""
ADAMW_DECAY_CODE = """
# AdamW's weight_decay shrinks each weight by lr * weight_decay * p at every step, outside Adam's
# moments (decoupled; Loshchilov & Hutter 2019): a different regulariser from the penalty, whose
# gradient goes through them. Its value is tuned anew (the default is 0.01)
optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
loss = loss_fn(model(x), y)   # the loss without the penalty"""


def _next_ops(ctx: Context, rows: np.ndarray, ops: np.ndarray) -> np.ndarray:
    """For each event of ``rows``, the row of the first operator of ``ops`` (time-sorted rows) on
    its thread that starts at or after its end (its own nested operators start before): -1 where
    none does."""
    ev = ctx.trace.events
    out = np.full(rows.size, -1, dtype=np.int64)
    for lane in distinct(ev.lane[rows]).tolist():
        mine = rows[ev.lane[rows] == lane]
        theirs = ops[ev.lane[ops] == lane]
        at = np.searchsorted(ev.ts_ns[theirs], ev.ts_ns[mine] + ev.dur_ns[mine], side="left")
        found = at < theirs.size
        out[np.flatnonzero(ev.lane[rows] == lane)[found]] = theirs[at[found]]
    return out


def _terms(ctx: Context) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The penalty's terms in the window: rows of their first operator (a square or a norm), of the
    operator that follows it (the sum, or the square of the norm), and of the additions after those
    (Python's ``sum()`` of the terms; fewer where a term is not added at once)."""
    ev, names = ctx.trace.events, ctx.trace.names
    host_ops = ctx.masks["host"] & ctx.masks["cpu_op"]
    ops = np.flatnonzero(ctx.events_in_window(host_ops))
    ops = ops[np.lexsort((-ev.dur_ns[ops], ev.ts_ns[ops]))]  # by start, an enclosing operator first
    square = ctx.host_name_ids(SQUARE_OPS.__contains__)[ev.name[ops]]
    norm = ctx.host_name_ids(NORM_OPS.__contains__)[ev.name[ops]]
    first = ops[square | norm]
    first = first[~nested(ev, first)]  # torch.square runs aten::pow inside: one term
    if not first.size:
        return first, first, first
    nxt = _next_ops(ctx, first, ops)
    want = np.where(ctx.host_name_ids(SQUARE_OPS.__contains__)[ev.name[first]], "aten::sum", "aten::pow")
    got = np.array([names[ev.name[j]] if j >= 0 else "" for j in nxt.tolist()], dtype=object)
    keep = got == want
    first, second = first[keep], nxt[keep]
    after = _next_ops(ctx, second, ops)
    adds = after[after >= 0]
    return first, second, adds[ctx.host_name_ids(lambda n: n == "aten::add")[ev.name[adds]]]


@rule("l2-penalty-in-loss")
def l2_penalty_in_loss(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a training window whose host, per optimizer update, squares and sums ≥ 4 tensors
    one by one (a square, ``aten::pow``/``aten::square``, followed on its thread by ``aten::sum``;
    or a norm followed by ``aten::pow``), as many as ≥ 50 % of the parameter tensors the backward
    wrote (``AccumulateGrad`` nodes), with ``PowBackward0`` nodes in the backward for at least
    half of them (the window may end between a step's forward and its backward):
    ``loss + lam * sum(p.pow(2).sum() for p in model.parameters())``. The penalty's gradient is
    ``2 * lam * p``, which torch.optim's SGD, Adam, RMSprop, Adagrad and kin add themselves with
    ``weight_decay = 2 * lam`` (coupled L2), inside the update, for the cost of one multiply-add
    per element (none apart with ``foreach``/``fused``). Threshold: the penalty's operators take
    ≥ 5 % of the host's operator time between two updates, the median over those steps (time a
    busy machine takes from the process between operators counts in neither part, and a step it
    slowed does not decide it; the whole window is judged, as the terms are the loop's code).
    Gain, an estimate, that median share: each term's square, sum and addition, and its backward
    nodes (``PowBackward0``, and as many ``SumBackward0`` and ``AddBackward0`` as terms);
    weight_decay's own multiply-add is left out, and so is the Python between the penalty's
    operators (:data:`MEASURED`). Silent
    for an optimizer without weight_decay (Rprop, LBFGS, SparseAdam) and for one with several
    optimizers of different kinds. For AdamW, whose weight_decay is decoupled (Loshchilov & Hutter
    2019), the fix names both the exact twin (Adam's coupled weight_decay) and AdamW's own decay,
    retuned. False positives: squares of activations (a physics-informed loss) as many as half
    the parameter tensors, each summed to a scalar."""
    if ctx.workload != "training":
        return None
    ups = updates(ctx)
    n_updates = int(ups.rows.size)
    classes = sorted(set(ups.classes))
    if n_updates == 0 or len(classes) > 1 or set(classes) & NO_DECAY:
        return None
    first, second, adds = _terms(ctx)
    terms = int(first.size)
    ev = ctx.trace.events
    written = int(np.count_nonzero(ctx.events_in_window(gradient_writes(ctx))))
    if terms < MIN_TERMS * n_updates or terms < MIN_COVER * written:
        return None
    pow_backward = np.flatnonzero(ctx.events_in_window(backward_nodes(ctx, POW_BACKWARD)))
    # the squared tensors require grad (parameters): a backward node for (most of) the terms; the
    # window may end between a step's forward and its backward
    if pow_backward.size < MIN_COVER * terms:
        return None
    # the penalty's operator time before each update (and after the last): in the forward each term's
    # square, sum and addition; in the backward a PowBackward0 a term, and of the sums' and additions'
    # nodes as many as there are terms
    parts = [(first, 1.0), (second, 1.0), (adds, 1.0), (pow_backward, 1.0)]
    for node in (SUM_BACKWARD, ADD_BACKWARD):
        rows = np.flatnonzero(ctx.events_in_window(backward_nodes(ctx, node)))
        if rows.size:
            parts.append((rows, min(1.0, terms / rows.size)))
    update_ts = np.sort(ev.ts_ns[ups.rows])
    per_group = np.zeros(n_updates + 1)
    for rows, weight in parts:
        np.add.at(per_group, np.searchsorted(update_ts, ev.ts_ns[rows]), ev.dur_ns[rows] * weight)
    penalty_ms = float(per_group.sum()) / 1e6
    # the share: of the host's operator time between two updates, the median over those steps (time
    # a busy machine took from the process between operators counts in neither; a step it slowed
    # does not decide it); with fewer than two whole steps, of the window
    host_ops = ctx.masks["host"] & ctx.masks["cpu_op"]
    between = iv.measure_in(ctx.intervals(ctx.events_in_window(host_ops)), update_ts[:-1], update_ts[1:])
    gain = (median(per_group[1:n_updates] / between) if n_updates >= 3 and (between > 0).all()
            else ctx.frac(penalty_ms * 1e6))
    if gain < MIN_FRAC:
        return None
    cls = classes[0] if classes else "SGD"
    per_update = terms / n_updates
    who = cls if cls in COUPLED else "torch.optim's SGD, Adam, RMSprop and Adagrad"
    one_pass = ", in one pass over all the tensors with foreach or fused" if cls in COUPLED else ""
    adamw = (" AdamW is the exception: its weight_decay shrinks the weights outside Adam's moments (decoupled), "
             "a different regulariser; Adam's coupled weight_decay is the penalty's exact twin."
             if cls in DECOUPLED else "")
    fixes: tuple[Fix, ...]
    if cls in DECOUPLED:
        fixes = (pytorch("If your AdamW's weight_decay is 0: Adam with weight_decay = 2 * lam is the same update, "
                         "without the penalty's operators", ADAM_TWIN_CODE),
                 pytorch("Or regularise with AdamW's own decoupled weight_decay instead of the penalty (a different "
                         "regulariser: tune its value)", ADAMW_DECAY_CODE))
    else:
        known = cls in COUPLED
        fixes = (pytorch(f"Drop the penalty from the loss and give {'the optimizer' if not known else cls} "
                         "weight_decay = 2 * lam: the same update"
                         + ("" if known else f" (if {cls}'s weight_decay adds weight_decay * p to each gradient, "
                            "as torch.optim's SGD and Adam do)"),
                         _coupled_code(cls if known else "SGD")),)
    return finding(
        severity=severity_for(gain),
        title="An L2 penalty is added to the loss tensor by tensor: the optimizer's weight_decay does it in its step",
        why=f"""The loss adds a sum of squared parameters, one tensor at a time: each term is a square, a sum and
        an addition in the forward pass, and a backward node that computes 2 * lam * p, so every update pays
        for a few small operators per parameter tensor. The optimizer can apply the same gradient itself:
        {who} with weight_decay adds weight_decay * p to each gradient before its update (PyTorch's optim docs:
        "weight decay (L2 penalty)"), so weight_decay = 2 * lam gives the update the penalty gives{one_pass}.{adamw}
        The loss you log then leaves the penalty out.""",
        summary=(f"{terms} squared tensors summed into the loss over {n_updates} update(s) ({per_update:.0f} per "
                 f"update, of {written / n_updates:.0f} parameter tensors with gradients); the penalty's operators "
                 f"and backward nodes take {penalty_ms:.1f} ms, {pct(gain)} of the window."),
        numbers={"penalty_terms_per_update": round(per_update, 1), "parameter_tensors_per_update": round(written / n_updates, 1),
                 "penalty_ms": round(penalty_ms, 3), "penalty_frac": round(gain, 4), "optimizer": cls,
                 "threshold_terms": MIN_TERMS, "threshold_frac": MIN_FRAC},
        est_gain=gain,
        gain_method=("estimate: the penalty's operators (each term's square, sum and addition, its PowBackward0 nodes, "
                     "and as many SumBackward0 and AddBackward0 nodes as terms) as a share of the host's operator time "
                     "between two updates, the median step; weight_decay's multiply-add inside the update is left out "
                     f"({MEASURED})"),
        fixes=fixes,
        doc_url=DOC,
    )
