"""``inference-grad-enabled`` and ``inference-train-mode``: forward computations run as if for training."""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis.context import Context
from gpumagic.analysis.inference import batch_norm, dropout, grad_mode, holding, no_grad_dropout, outermost_ops
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: Fewer unused autograd nodes than this is a stray computation on a parameter (a norm logged
#: each call), not a model's forward pass: a single ``nn.Linear`` builds two (``aten::t``, ``aten::addmm``).
MIN_NODES = 16
#: ... or at least this many calls of a model compiled with torch.compile (one ``CompiledFunction``
#: node each, holding everything the compiled forward saved for its backward) ...
MIN_COMPILED = 2
#: ... and the operators that built them must cover this share of the window's operator time
#: (the TensorBoard profiler plugin's 5 % line): a training loop's ``torch.sigmoid(logits)`` for
#: a metric (eight small operators a step in the bundled A100 trace) is not worth a finding ...
MIN_UNUSED_FRAC = 0.05
#: ... or at least this many of them were built by a layer's operator (a matmul, a convolution, an
#: embedding: ``phases.LAYER_OPS``), a model's forward pass with grad mode on whatever its share of
#: the time. A time share moves with the machine's load (a validation forward read 6–10 % of the
#: operator time on a quiet machine, under 5 % beside busy neighbours); whether a layer built the
#: node does not.
MIN_LAYER_NODES = 1
#: From this share of the operator time the unused graph is most of what runs: medium, else low.
MEDIUM_FRAC = 0.25
#: At least this many dropout calls drew a mask: a model has one per block, and a single call
#: can be deliberate.
MIN_ACTIVE_DROPOUT = 2
#: Batch norm in training mode: at least this share of the window's batch-norm calls come right
#: after an ``aten::add_``. A training-mode module adds to its counter before every call; an
#: eval-mode model whose residual join is in place (``out += shortcut``, then the next block's
#: batch norm: a pre-activation ResNet) puts an add_ before some of them only, about half.
MIN_TRAIN_BATCH_NORM_SHARE = 0.9
GRAD_DOC = "https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation"
EVAL_DOC = "https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval"
INFERENCE_MODE_CODE = """
model.eval()                     # dropout off, batch norm uses its running statistics
with torch.inference_mode():     # no autograd graph; torch.no_grad() if the outputs later enter autograd
    for inputs, _ in loader:
        outputs = model(inputs)
"""
DECORATOR_CODE = """
@torch.inference_mode()          # every call runs without building a graph
def predict(model, inputs):
    return model(inputs)
"""
EVAL_CODE = """
model.eval()                     # before inference: dropout passes activations through
with torch.inference_mode():
    outputs = model(x)
model.train()                    # back to training mode before the next training step
"""
VALIDATION_CODE = """
model.eval()                     # dropout off, batch norm uses (and keeps) its running statistics
with torch.inference_mode():
    val_loss = sum(loss_fn(model(x), y).item() for x, y in val_loader) / len(val_loader)
model.train()                    # back to training mode before the next training step
"""
DETACHED_CODE = """
with torch.no_grad():            # the output is detached anyway (a GAN's fakes, a teacher's targets)
    fake = generator(noise)      # the same values as generator(noise).detach(); no graph is built
"""
#: An action (or a label) chosen from the model's output: ``q_net(obs).argmax().item()`` records the
#: model's operators, then ``aten::argmax`` (``aten::max`` for ``.max(...)``, ``aten::topk``) as the
#: next outermost operator; the choice is an integer, so no backward ever reads that graph.
PICKS = frozenset({"aten::argmax", "aten::max", "aten::topk"})
ACTING_CODE = """
with torch.no_grad():            # choosing an action needs no graph (labels for a batch: the same block)
    action = policy(observation).argmax(dim=-1).item()
# the training step's forward, whose loss you backpropagate, stays outside the no_grad block
"""
FROZEN_PART_CODE = """
model.train()                    # switches every submodule to training mode, the frozen one too
backbone.eval()                  # so put the frozen part back in eval mode after each model.train()
with torch.no_grad():
    features = backbone(inputs)
# a distillation's teacher: teacher.eval() once, before the loop (unless something calls teacher.train())
"""


@rule("inference-grad-enabled")
def inference_grad_enabled(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the window's operators built autograd nodes (grad mode on: their ``Sequence number``
    advances) that no backward pass in the trace used (no ``evaluate_function`` span carries their
    number; :mod:`gpumagic.analysis.inference`): inference run with grad mode on, or, in a training
    loop, an evaluation or a metric computed without ``torch.no_grad()``. Threshold: ≥ 16 such nodes
    (or ≥ 2 calls of a torch.compile'd model: under grad mode AOTAutograd runs its training graph,
    one ``CompiledFunction`` node a call), built by operators covering ≥ 5 % of the window's
    operator time or including a layer's operator (a matmul, a convolution, an embedding: a model's
    forward, whatever the load does to its time share; a metric's ``sigmoid`` builds none); medium
    from 25 % of the operator time. Each node keeps the tensors its backward would need (a layer's
    input, an activation) alive for as long as the output is, so the forward pass holds what a
    training step's forward holds; and each operator spends host time recording the graph. In a
    training trace, dropout calls that drew a mask inside that computation (an operator of theirs
    built an unused node) are counted too: the model was in training mode for it. Gain: not
    estimated from the trace (the bookkeeping runs inside each operator's own time);
    ``benchmarks/inference_mode.py`` times a loop under grad mode, ``no_grad`` and
    ``inference_mode``. False positives: a cell that runs a forward pass whose backward runs in
    another cell (the finding says so); a trace whose backward spans carry no numbers (Kineto before
    about 2022) is not judged when it trains."""
    g = grad_mode(ctx)
    if (g.nodes < MIN_NODES and g.compiled < MIN_COMPILED) or (g.unused_frac < MIN_UNUSED_FRAC
                                                                and g.layers < MIN_LAYER_NODES):
        return None
    ev = ctx.trace.events
    rows = g.rows
    masked = detached = 0
    if g.training:
        title = f"{g.nodes:,} autograd nodes that no backward pass used: a forward computation ran with grad mode on"
        why = """Besides the training steps, a forward computation here ran with grad mode on: an evaluation, a
        metric, an agent choosing its actions, a model whose output is detached before use (a GAN's generator
        making fakes for the discriminator's step, a teacher or target network), or a part of the model whose
        output the loss does not use. Its operators recorded autograd nodes that no backward pass ever used. Each node keeps alive the
        tensors its backward would read (a layer's input, an activation) for as long as the output is kept, so
        that computation holds the memory of a training forward pass, and every operator spends host time
        recording the graph. Run it under torch.no_grad() (torch.inference_mode() where its outputs never enter
        autograd again: an inference tensor cannot be saved for a backward pass). Switch the model to eval
        mode for an evaluation, not for a model that goes on training in the same loop: eval mode changes what
        its batch norm and dropout compute."""
        what = "no backward pass used them (the backward passes ran every other node the window built)"
        masked = int(np.count_nonzero(holding(ev, dropout(ctx).active, rows)))
        detached = _followed_by(ctx, rows, DETACH)
        picked = _followed_by(ctx, rows, PICKS)
        if detached:  # the graph was built only to be thrown away
            what += (f"; {detached:,} times the next operator was aten::detach: the output was detached right after "
                     "its graph was built")
        if picked:  # the output only chose an action or a label
            what += (f"; {picked:,} times the next operator picked from the output (argmax, max, topk): an action "
                     "or a label chosen, which no backward reads")
        if masked:  # the same forward computation left in training mode too
            what += (f"; {masked:,} dropout calls among those operators drew a random mask: the model was in "
                     "training mode for it")
    else:
        title = (f"Inference runs torch.compile's training graph: {g.compiled:,} compiled calls with grad mode on"
                 if g.compiled >= MIN_COMPILED and g.nodes < MIN_NODES else
                 f"Inference builds an autograd graph: {g.nodes:,} nodes with grad mode on")
        why = """Nothing in this window computes gradients (no backward pass, no optimizer step), yet its operators
        ran with grad mode on: each one that takes a parameter records an autograd node, and each node keeps
        alive the tensors its backward would read (a layer's input, an activation) for as long as the output
        is kept. The forward pass then holds the memory of a training step's forward, and every operator
        spends host time recording the graph. torch.inference_mode() (or torch.no_grad()) builds none; if
        this cell is the first half of a training step whose backward runs elsewhere, this does not apply."""
        what = "no backward pass or optimizer step ran"
    if g.compiled:
        what += (f"; {g.compiled:,} of those nodes are calls of a torch.compile'd model (CompiledFunction): under grad "
                 "mode it runs its training graph, whose forward keeps what a backward would need (under "
                 "torch.no_grad() it compiles once more, an inference graph)")
    return finding(
        severity="medium" if g.unused_frac >= MEDIUM_FRAC else "low",
        title=title,
        why=why,
        summary=(f"{g.recorded:,} operators recorded an autograd sequence number (grad mode on); {g.nodes:,} autograd "
                 f"nodes were built by operators covering {pct(g.unused_frac)} of the window's operator time"
                 + (f" ({g.layers:,} of them by a layer's operator: a matmul, a convolution, an embedding)"
                    if g.layers else "") + f", and {what}."),
        numbers={"unused_nodes": g.nodes, "grad_mode_ops": g.recorded, "unused_frac": round(g.unused_frac, 4),
                 "context": "training" if g.training else "inference", "layer_nodes": g.layers,
                 # what applies only in some traces: dropout in a training trace, compiled calls where there are any
                 **({"train_mode_dropout_calls": masked, "detached_outputs": detached, "picked_outputs": picked}
                    if g.training else {}),
                 **({"compiled_calls": g.compiled} if g.compiled else {}),
                 "threshold_nodes": MIN_NODES, "threshold_frac": MIN_UNUSED_FRAC,
                 "threshold_layer_nodes": MIN_LAYER_NODES},
        windows=windows(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows], "cpu", -1, "builds an unused autograd node"),
        est_gain=0.0,
        gain_method="not estimated from the trace: recording the graph runs inside each operator's own time, and "
                    "the memory it holds depends on how long the outputs are kept",
        fixes=(_training_fixes(detached, picked) if g.training else
               (pytorch("Run inference without a graph", INFERENCE_MODE_CODE),
                pytorch("Or decorate the function that runs the model", DECORATOR_CODE))),
        doc_url=GRAD_DOC,
    )


def _training_fixes(detached: int, picked: int = 0) -> tuple[Fix, ...]:
    """A training trace's fixes: the one fitting what the trace shows after the unused forward —
    an action or a label picked from it (an agent acting), its output detached — first."""
    evaluation = pytorch("An evaluation: in eval mode, without a graph, then back to training mode", VALIDATION_CODE)
    detach = pytorch("A forward whose output you detach: build no graph for it", DETACHED_CODE)
    acting = pytorch("A forward whose output only chooses an action or a label: run it under torch.no_grad()",
                     ACTING_CODE)
    if picked and picked >= detached:
        return (acting, detach, evaluation)
    return (detach, evaluation) if detached else (evaluation, detach)


DETACH = frozenset({"aten::detach"})


def _followed_by(ctx: Context, rows: np.ndarray, names: frozenset[str]) -> int:
    """How many calls of ``names`` come, as the next outermost operator on their thread, right
    after an outermost operator that built one of the unused nodes ``rows``: ``model(x).detach()``
    records the model's operators, then the detach; ``q_net(obs).argmax()``, then the argmax
    (checked on torch 2.13)."""
    ev = ctx.trace.events
    wanted = ctx.trace.name_ids(names.__contains__)
    found = 0
    for lane in distinct(ev.lane[rows]).tolist():
        top = outermost_ops(ctx, lane)
        after = np.flatnonzero(wanted[ev.name[top[1:]]]) + 1  # positions of those calls with an operator before
        if after.size:
            found += int(np.count_nonzero(holding(ev, top[after - 1], rows)))
    return found


@rule("inference-train-mode")
def inference_train_mode(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: nothing in the trace trains (``Context.workload`` is not ``"training"``), yet
    dropout operators drew a random mask (an operator runs inside ``aten::dropout``: in eval mode
    it returns its input and calls nothing), or batch normalisation ran in training mode (an
    ``aten::batch_norm`` call right after the module's ``num_batches_tracked`` update,
    ``aten::add_``, which eval mode skips; :mod:`gpumagic.analysis.inference`): the model is in
    training mode. Threshold: ≥ 2 such calls of either, and for batch norm ≥ 90 % of its calls
    (an in-place residual join right before a batch norm, as in a pre-activation ResNet, puts an
    add_ before about half of an eval-mode model's calls). Dropout then zeroes a random share of the
    activations on every call, so the outputs change from run to run and are worse than the
    trained model's, and batch normalisation normalises with the batch's own statistics and
    updates its running ones with the inference data. Gain: none in speed (the mask is cheap); a
    correctness fix. False positives: Monte Carlo dropout, which samples with dropout on by
    design; an eval-mode model whose batch-norm calls nearly all follow an in-place addition.

    In a training trace: dropout calls that drew a mask under ``torch.no_grad()`` or
    ``torch.inference_mode()`` (no ``Sequence number``, where the trace's trained forwards record
    one), outside the backward and outside a custom ``autograd.Function``'s forward (a reentrant
    checkpoint's first forward runs under no_grad inside ``CheckpointFunction``, which records
    one): an evaluation, or a frozen part of the model run under no_grad, while the model was in
    training mode (:func:`_no_grad_train_mode`). Batch normalisation is not read there: a GAN's
    generator makes the discriminator's fakes under no_grad in training mode by design, and its
    batch-norm calls look like an evaluation's."""
    if ctx.workload == "training":
        return _no_grad_train_mode(ctx)
    d, b = dropout(ctx), batch_norm(ctx)
    drop = d.active if d.active.size >= MIN_ACTIVE_DROPOUT else d.active[:0]
    norm = b.active if b.active.size >= max(MIN_ACTIVE_DROPOUT, MIN_TRAIN_BATCH_NORM_SHARE * b.calls) \
        else b.active[:0]
    if not drop.size and not norm.size:
        return None
    ev = ctx.trace.events
    rows = np.sort(np.concatenate([drop, norm]))
    if drop.size and norm.size:
        title = (f"Dropout and batch normalisation run in training mode during inference ({drop.size:,} dropout "
                 f"calls drew a mask, {norm.size:,} batch-norm calls updated their running statistics)")
    elif drop.size:
        title = (f"Dropout is on during inference: the model is in training mode ({drop.size:,} of "
                 f"{d.calls:,} dropout calls drew a mask)")
    else:
        title = (f"Batch normalisation runs in training mode during inference: {norm.size:,} of {b.calls:,} calls "
                 "normalised with the batch's statistics and updated the running ones")
    seen = []
    if drop.size:
        seen.append(f"{drop.size:,} of the window's {d.calls:,} dropout calls ran operators inside them (a random "
                    "mask: training mode)")
    if norm.size:
        seen.append(f"{norm.size:,} of its {b.calls:,} batch-norm calls came right after an aten::add_ (the "
                    "module's num_batches_tracked update: training mode)")
    return finding(
        severity="medium",
        title=title,
        why="""A module stays in training mode until model.eval() is called. In training mode every dropout layer
        zeroes a random share of its input on each call, so predictions change from run to run and are worse
        than the trained model's; batch normalisation normalises with each batch's own statistics (a prediction
        then depends on the other samples in its batch) and keeps updating its running averages with the
        inference data, changing the model itself. Nothing here trains (no backward pass, no optimizer step), so
        this is inference run in the wrong mode, unless the randomness is wanted (Monte Carlo dropout).""",
        summary="; ".join(seen) + "; no backward pass or optimizer step ran.",
        numbers={"active_dropout_calls": int(drop.size), "dropout_calls": d.calls,
                 "train_mode_batch_norm_calls": int(norm.size), "batch_norm_calls": b.calls,
                 "threshold_calls": MIN_ACTIVE_DROPOUT},
        windows=windows(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows], "cpu", -1,
                        "dropout in training mode" if not norm.size else
                        "batch norm in training mode" if not drop.size else "training mode"),
        est_gain=0.0,
        gain_method="not a speed finding: the outputs are wrong, not slow",
        fixes=(pytorch("Switch the model to eval mode for inference", EVAL_CODE),),
        doc_url=EVAL_DOC,
    )


def _no_grad_train_mode(ctx: Context) -> Finding | None:
    """``inference-train-mode`` in a training trace: ≥ 2 dropout calls drew a mask in forward
    passes run without grad mode (:func:`gpumagic.analysis.inference.no_grad_dropout`)."""
    n = no_grad_dropout(ctx)
    if n.active.size < MIN_ACTIVE_DROPOUT:
        return None
    ev = ctx.trace.events
    rows = n.active
    return finding(
        severity="medium",
        title=f"A forward pass under no_grad ran in training mode: dropout drew a mask in {n.active.size:,} calls",
        why="""Besides the training steps, forward passes ran without grad mode (torch.no_grad() or
        torch.inference_mode(): an evaluation, a frozen part of the model, a distillation's teacher) while the model was in training
        mode: their dropout layers zeroed a random share of the activations, so what they computed changes from run
        to run (validation metrics are noisy and understate the model), and batch normalisation normalised with
        each batch's statistics and updated its running averages with these batches. model.eval() before them and
        model.train() after fixes it; a frozen part needs .eval() again after every model.train(), which switches
        every submodule back to training mode. Monte Carlo dropout samples this way on purpose.""",
        summary=(f"{n.active.size:,} dropout calls drew a mask in forward passes without grad mode (no autograd "
                 f"sequence number); the trained forward passes made {n.trained:,} dropout calls."),
        numbers={"active_no_grad_dropout_calls": int(n.active.size), "trained_dropout_calls": n.trained,
                 "threshold_calls": MIN_ACTIVE_DROPOUT},
        windows=windows(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows], "cpu", -1, "dropout on under no_grad"),
        est_gain=0.0,
        gain_method="not a speed finding: the evaluation's outputs are wrong, not slow",
        fixes=(pytorch("Evaluate in eval mode, then switch back to training mode", VALIDATION_CODE),
               pytorch("Keep a frozen part of the model, or a distillation's teacher, in eval mode", FROZEN_PART_CODE)),
        doc_url=EVAL_DOC,
    )


__all__ = ["inference_grad_enabled", "inference_train_mode"]
