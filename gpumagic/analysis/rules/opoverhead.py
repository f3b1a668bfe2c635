"""``cpu-op-overhead``: a CPU-only model whose forward and backward run so many tiny operators that
the cost of calling each one, not its work, takes the step."""

from __future__ import annotations

import re

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.generation import GENERATE_COMPILE_CODE, generation, regrowth
from gpumagic.analysis.optimizerimpl import optimizer_steps
from gpumagic.analysis.phases import LAYER_OPS, main_op_starts, phase_intervals
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix
from gpumagic.trace.links import EVALUATE_PREFIX

#: An operator call costs about 3.6 µs before it does any work: "PyTorch can perform about 280,000
#: operations per second" on 1-element tensors (Horace He, "Making Deep Learning Go Brrrr From
#: First Principles", 2022, section "Overhead"). Forward and backward passes that average no more
#: than this per operator (every call counted, those inside others too) do little besides calling
#: them; under the profiler each call costs more, not less, so the average overstates the work.
MAX_US_PER_OP = 5.0
#: ... over enough calls for compiling to pay: a step's forward and backward call at least this
#: many operators. A three-layer MLP of 64 units on a batch of 8 calls 153 at 3–5 µs each, yet ran
#: slower compiled (3.0 against 1.8 ms a step on this project's 2-core machine: the compiled
#: graph's own call and guards cost more than the calls it saves); a Python loop over 64 time
#: steps calls 5,000 and ran 0.57 faster (benchmarks/op_overhead.py) ...
MIN_OPS_PER_STEP = 1000
#: ... and take at least this share of the window (the TensorBoard profiler plugin's 5 % line for
#: a bottleneck worth naming, doubled: some overhead is in every eager loop).
MIN_FRAC = 0.10
DOC = "https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html"
#: benchmarks/op_overhead.py on this project's 2-core machine (unprofiled, alternated rounds).
MEASURED = ("benchmarks/op_overhead.py: a Python loop over 64 time steps of an RNN cell, 8.0 ms a step eager, "
            "3.4 with torch.compile (0.57 saved), 4.1 with nn.RNN (0.49), for an upper bound of 0.96")
COMPILE_CODE = """
# torch.compile fuses the small operators into a few generated loops and calls them once.
# Compile the module whose forward holds the whole loop (over time steps, solver steps...): the loop
# is unrolled into one graph; compiling only the function it calls each step leaves a call a step.
# The first call compiles: seconds, minutes for a long unrolled loop.
model = torch.compile(model)
"""
FUSED_RNN_CODE = """
# A recurrent loop written step by step in Python: PyTorch's fused layer runs the whole
# sequence in one call (input of shape (time, batch, features); batch_first=True for (batch, time, ...))
rnn = torch.nn.RNN(input_size=x.shape[-1], hidden_size=32)   # or torch.nn.LSTM / torch.nn.GRU
outputs, last_hidden = rnn(x)
"""

#: A Python loop over time steps applies the same weights at every step: its backward evaluates
#: many matrix-product nodes (``AddmmBackward0``, ``MmBackward0``...) for each gradient it
#: accumulates into a parameter (``AccumulateGrad``, once a parameter a backward). A stack of
#: distinct layers has one product per weight and bias pair: tests/data's CPU loops read 0.17 to
#: 0.5 products per accumulation, a Python RNN-cell loop over 16 steps 10.8, a fused GRU 3.7. From
#: this ratio the weights are used again within the step, and the fused recurrent layer is
#: offered (a loop over time steps is one way to use them again); under it the model is many
#: small layers, each used once, and it is not.
MIN_WEIGHT_REUSE = 2.0
MATMUL_NODE = re.compile("^" + re.escape(EVALUATE_PREFIX) + r"(Addmm|Mm|Bmm|Matmul|Linear)Backward\d*$")
ACCUMULATE_NODE = EVALUATE_PREFIX + "torch::autograd::AccumulateGrad"

#: A step that samples this many times (``aten::multinomial``: ``torch.distributions.Categorical.sample``,
#: ``torch.multinomial``) draws its samples one at a time: a reinforcement-learning rollout acting
#: in one environment after another, a forward pass on a single observation before each action.
MIN_SAMPLES_PER_STEP = 16
SAMPLING = "aten::multinomial"
VECTOR_ENV_CODE = """
import gymnasium

# no validation of each distribution's arguments and samples: a few small operator calls every time
# one is built (on by default); turn it off once the code runs
torch.distributions.Distribution.set_default_validate_args(False)
envs = gymnasium.vector.SyncVectorEnv([make_env for _ in range(16)])   # make_env builds one environment
observations, _ = envs.reset(seed=0)
log_probs, rewards, dones = [], [], []
for t in range(rollout_steps):
    # one forward for all 16 (under torch.no_grad() where the update computes the log-probabilities
    # again, as PPO does; with grad where the loss uses these, as REINFORCE does)
    logits = policy(torch.as_tensor(observations, dtype=torch.float32, device=device))
    action_dist = torch.distributions.Categorical(logits=logits)   # probs=... for a policy ending in a softmax
    actions = action_dist.sample()                                 # 16 actions in one call
    log_probs.append(action_dist.log_prob(actions))
    observations, reward, terminations, truncations, _ = envs.step(actions.cpu().numpy())
    rewards.append(torch.as_tensor(reward, dtype=torch.float32))
    dones.append(torch.as_tensor(terminations | truncations))   # each environment resets itself when done:
    # a return sums an environment's rewards up to its own end of episode
"""
#: A step that runs this many backward passes (median) runs its batch a sample, or a few samples,
#: at a time: a loop of ``loss.backward()`` over the samples before one ``optimizer.step()``.
#: Gradient accumulation runs several passes a step too, but of micro-batches whose operators do
#: real work, which this rule's per-call test already leaves out. One pass on the whole batch
#: calls each operator once instead of once per sample: benchmarks/op_overhead.py's per-sample
#: loop (32 samples through a 3-layer MLP), 8.2 ms a step, took 0.42 ms batched (0.95 saved).
MIN_PASSES_PER_STEP = 8
BATCH_CODE = """
# one forward and one backward for the whole batch instead of one pass per sample
# (x: the samples stacked along a first, batch dimension; y: their targets)
optimizer.zero_grad()
loss = loss_fn(model(x), y)   # the mean over the batch: the gradient of the summed per-sample losses / batch size
loss.backward()               # (a loop that added the losses undivided: loss_fn with reduction="sum")
optimizer.step()
"""
#: Where torch.compile is no fix (a double backward): more samples a step, the same fixed cost per
#: call spread over more work.
MORE_WORK_CODE = """
# more samples a step: each operator call works on a larger tensor for the same fixed cost
loader = torch.utils.data.DataLoader(dataset, batch_size=8 * batch_size, shuffle=True)
# (a physics-informed loss: draw 8 times as many collocation points each step)
# a larger batch changes the optimisation: retune the learning rate and watch the loss curve
"""
#: Differentiating through gradients (``torch.autograd.grad(..., create_graph=True)``: MAML's inner
#: step, a gradient penalty, a physics-informed network's derivatives) records autograd nodes of
#: backward formulas, ``ThresholdBackwardBackward0``, ``MseLossBackwardBackward0``...; from this
#: many a step, torch.compile is no fix: "torch.compile with aot_autograd does not currently support
#: double backward" (RuntimeError; checked on torch 2.13 with a compiled MLP under
#: ``autograd.grad(create_graph=True)`` and ``.backward()``).
MIN_DOUBLE_BACKWARD_PER_STEP = 1
DOUBLE_BACKWARD = "BackwardBackward"
#: A step of several inner gradient passes through the same model (a meta-learning loop over tasks:
#: MAML) batches them with torch.func: vmap over the tasks of an inner grad step. The functorch
#: MAML example does so; benchmarks/op_overhead.py's MAML case (a 1 → 40 → 40 → 1 MLP, sine tasks of
#: 10 points): the same gradients, 4 tasks 3.1 → 2.2 ms a step, 16 tasks 15.7 → 2.3 ms.
MIN_INNER_PASSES = 3
TASKS_VMAP_CODE = """
from torch.func import functional_call, grad, vmap

def adapted_loss(params, support_x, support_y, query_x, query_y, inner_lr=0.01, inner_steps=1):
    # one task: inner gradient steps on its support set (as many as your loop takes), then the
    # adapted weights' loss on its query set
    fast = params
    for _ in range(inner_steps):
        g = grad(lambda p: loss_fn(functional_call(model, p, (support_x,)), support_y))(fast)
        fast = {k: fast[k] - inner_lr * g[k] for k in fast}
    return loss_fn(functional_call(model, fast, (query_x,)), query_y)

# tasks_*: every task's batch stacked along a first dimension, (tasks, samples, ...)
optimizer.zero_grad()
task_losses = vmap(adapted_loss, in_dims=(None, 0, 0, 0, 0))(
    dict(model.named_parameters()), tasks_support_x, tasks_support_y, tasks_query_x, tasks_query_y)
task_losses.sum().backward()   # the same gradients as the loop over tasks, from one batched pass
optimizer.step()
"""

#: The loss functions of ``torch.nn.functional`` as the profiler names their operators
#: (native_functions.yaml); ``cross_entropy`` calls ``nll_loss`` inside its own call, counted once.
LOSS_OPS = frozenset({"aten::cross_entropy_loss", "aten::nll_loss", "aten::nll_loss_nd", "aten::mse_loss",
                      "aten::l1_loss", "aten::smooth_l1_loss", "aten::huber_loss", "aten::binary_cross_entropy",
                      "aten::binary_cross_entropy_with_logits", "aten::kl_div", "aten::poisson_nll_loss",
                      "aten::soft_margin_loss", "aten::multilabel_margin_loss", "aten::multi_margin_loss",
                      "aten::margin_ranking_loss", "aten::hinge_embedding_loss", "aten::cosine_embedding_loss",
                      "aten::triplet_margin_loss", "aten::ctc_loss"})
#: PyTorch's fused recurrent layers (``nn.RNN``/``LSTM``/``GRU``). On the CPU, without a oneDNN
#: kernel for the case, the layer's one operator runs each time step as separate small operators
#: (and autograd records a node for each of them): the calls are inside the fused layer already,
#: and torch.compile keeps the layer as one call to the same operator. Where these hold at least
#: :data:`MIN_FUSED_SHARE` of the forward's calls, neither fix applies.
FUSED_RECURRENT = frozenset({"aten::gru", "aten::lstm", "aten::rnn_tanh", "aten::rnn_relu"})
#: One time step of a recurrent cell (``nn.GRUCell``, ``nn.LSTMCell``, ``nn.RNNCell``): from this many
#: calls a step, the model loops over time steps in Python, and the fused layer is the first fix
#: where each step's input is known beforehand (an encoder, a decoder under teacher forcing).
CELL_OPS = frozenset({"aten::gru_cell", "aten::lstm_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell"})
MIN_CELL_CALLS = 8
#: The cell loop as one call of the fused layer, the cell's weights carried over (``nn.GRUCell``'s
#: ``weight_ih``... are ``nn.GRU``'s ``weight_ih_l0``...; the same equations, torch.nn docs): the
#: layer's output at each time step is the loop's hidden state there.
CELL_LAYER_CODE = """
# the model's cell, called once a time step, each step's input known beforehand (teacher forcing):
#     h = h0
#     for t in range(step_inputs.shape[1]): h = cell(step_inputs[:, t], h)
# one layer runs the whole sequence, with the cell's weights (nn.LSTMCell -> nn.LSTM: the state is (h, c))
layer = torch.nn.GRU(cell.input_size, cell.hidden_size, batch_first=True)
layer.load_state_dict({name + "_l0": w for name, w in cell.state_dict().items()})
outputs, h_last = layer(step_inputs, h0.unsqueeze(0))   # outputs[:, t]: the loop's h after step t
# keep the layer in the model in place of the cell (build it once, not every step)
"""
#: TorchDynamo breaks the graph around ``nn.RNN``/``nn.LSTM``/``nn.GRU`` unless
#: ``torch._dynamo.config.allow_rnn`` is set ("Disables graph breaking on rnn", False by default,
#: torch 2.13): compiling a model that holds one leaves the layer, and the graph around it, split.
RNN_GRAPH_BREAK = ("; nn.RNN, nn.LSTM and nn.GRU stay outside the compiled graphs (TorchDynamo breaks the graph "
                   "around them: torch._dynamo.config.allow_rnn is False by default), so expect less")
MIN_FUSED_SHARE = 0.5
#: benchmarks/op_overhead.py, the GRU case (hidden 64, 20 time steps, Adam), unprofiled.
MEASURED_FUSED = ("benchmarks/op_overhead.py: a GRU of 8 sequences, 4.2 ms a step eager and 4.3 compiled; 64 "
                  "sequences, 6.2 ms a step: 0.10 ms a sequence against 0.53")
BIGGER_BATCH_CODE = """
# more sequences a step: the layer's per-time-step calls grow far less than the batch
loader = torch.utils.data.DataLoader(dataset, batch_size=8 * batch_size, shuffle=True)
# a larger batch changes the optimisation: retune the learning rate and watch the loss curve
"""

#: A window with no step and no backward (inference): from this many ``.item()`` calls in it, the
#: evidence says the results came back to Python one by one.
MIN_ITEM_CALLS = 16
INFER_BATCH_CODE = """
# samples: the inputs the loop went through one at a time, each of one sample's shape
# (very many: a few hundred at a time, with torch.split or a DataLoader)
with torch.inference_mode():
    outputs = model(torch.stack(samples))       # one call for the whole batch
predictions = outputs.argmax(dim=1).tolist()    # one conversion to Python, not .item() per sample
"""

#: A Hugging Face pipeline called on one input at a time: given the whole list and a batch size it
#: pads and batches them itself (transformers' "Pipeline batching"). Its docs advise against
#: batching on a CPU for models whose calls do real work; this path fires only where the calls
#: cost more than their work. benchmarks/op_overhead.py on this project's 2-core machine (64 texts
#: of 10-29 words, BERTs built from a config, 5 alternated rounds): 2 layers of 64 units 78.8 ms one
#: text a call, 19.8 ms with batch_size=16; 4 layers of 256 units 386.1 against 147.1 ms; the same
#: labels.
PIPELINE_BATCH_CODE = """
predictions = pipe(texts, batch_size=16)   # the whole list: the pipeline pads and batches the texts itself
# from a datasets.Dataset: pipe(KeyDataset(dataset, "text"), batch_size=16)
"""

#: Token-by-token generation (:mod:`gpumagic.analysis.generation`): one prompt after another
#: decodes each one's tokens in their own passes; one call for all the prompts decodes a token of
#: each in one pass. benchmarks/op_overhead.py, a 2-layer GPT-2 of 64 units built from a config, 8
#: prompts of 40 new tokens: 469 ms one call a prompt, 295 compiled, 70 ms in one call.
GENERATE_BATCH_CODE = """
# many prompts: one generate call for all of them (lm: your causal language model, tokenizer: its tokenizer)
tokenizer.padding_side = "left"                        # decoder-only models pad on the left
tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
batch = tokenizer(prompts, return_tensors="pt", padding=True)
with torch.inference_mode():
    out = lm.generate(**batch, max_new_tokens=40, pad_token_id=tokenizer.pad_token_id)
texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
"""

#: A text-generation pipeline called once per prompt: given the list and a batch size it pads the
#: prompts (on the left, with a pad token, which GPT-2's tokenizer lacks) and decodes a batch's
#: tokens in the same passes. benchmarks/op_overhead.py --generation: a 2-layer GPT-2 of 64 units,
#: 16 prompts of 20 new tokens, the same texts either way.
PIPELINE_GENERATE_CODE = """
# a text-generation pipeline called once per prompt: give it the whole list and a batch size
pipe.tokenizer.padding_side = "left"                    # decoder-only models pad on the left
pipe.tokenizer.pad_token = pipe.tokenizer.pad_token or pipe.tokenizer.eos_token
outputs = pipe(prompts, batch_size=8, max_new_tokens=40)   # your generation arguments as before
"""

@rule("cpu-op-overhead")
def cpu_op_overhead(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a CPU-only trace whose steps' forward and backward phases (``metrics.phases``)
    call ≥ 1,000 operators a step (median; every call on the main thread, nested ones too) at
    ≤ 5 µs each on average (the phases' time ÷ their calls), and take ≥ 10 % of the window: the
    per-call cost of eager PyTorch (about 3.6 µs, Horace He's measurement) is most of it. Gain:
    the forward and backward's share of the window, an upper bound — torch.compile removes the
    calls' cost but still does the work, and the profiler's per-call cost inflates that share.
    Fixes: ``torch.compile(model)``; a loop over time steps → ``nn.RNN``/``LSTM``/``GRU``, when
    one is a Python loop of many tiny operators (not offered where the backward evaluates fewer
    than ``MIN_WEIGHT_REUSE`` matrix products per gradient accumulated into a parameter: many
    small layers, each weight used once a step); first, where a step with one backward pass calls a
    loss function (``LOSS_OPS``) ≥ 8 times in its forward (the model called per sample, the losses
    summed), one call of the model and the loss on the batch; first, where a step runs ≥ 8 backward passes
    (median; each after its own forward: the batch a sample at a time), one forward and backward
    on the whole batch (not where the step runs a double backward: those passes are a
    meta-learning loop's inner gradient steps). Where PyTorch's own recurrent layer (``aten::gru``, ``aten::lstm``,
    ``aten::rnn_*``) makes ≥ half of the forward's calls, neither fix applies (the layer is fused
    already and compiling keeps it as it is): the finding says so, suggests more sequences a step,
    and estimates no step-time gain. Backward passes that start inside an optimizer step are the
    optimizer's closure evaluations (LBFGS) and are not counted as passes. A step with autograd
    nodes of backward formulas (``…BackwardBackward0``: ``create_graph=True``) gets no compile fix
    (torch.compile refuses double backward) but more work per call — a change to the training,
    not a shorter step: gain 0, medium — and with ≥ 3 inner passes each after a forward through
    the model's layers (a loop over tasks; not a physics-informed loss's derivatives, passes one
    after another on one forward's output) first torch.func's vmap over the tasks. A window with no step and no backward (inference), its
    calls counted over the window (≥ 1,000 at ≤ 5 µs, ≥ 10 % of it): a model called once per
    sample, first told to call it on a stack of samples, then to compile; gain, the share of the
    window from the first call to the last (the loop's Python included), an upper bound. The
    evidence names the outermost operators that
    make most of the calls, counting the calls nested in each (a reinforcement-learning loop's
    ``aten::multinomial``, from sampling actions one at a time, or a backward node). False positives: a model of many small
    operators that each do real work in under 5 µs (a long chain of tiny layers on one sample)
    gains less, though compilation still fuses them."""
    if ctx.device >= 0:
        return None
    if not ctx.step_bounds:
        return _inference(ctx) if ctx.workload == "inference" else None
    if m.phases is None:
        return None
    starts = main_op_starts(ctx)
    ev = ctx.trace.events
    steps = optimizer_steps(ctx).spans  # closures run inside them
    layer_ts = _layer_starts(ctx)
    per_step, calls, busy, spans, passes, forwards, closure, fed = [], 0, 0, [], [], [], [], []
    for parts, (lo, hi) in zip(phase_intervals(ctx), ctx.step_bounds, strict=True):
        model = iv.merge(parts["forward"], parts["backward"])
        in_step = int(np.count_nonzero(iv.contains(steps, parts["backward"][0]))) if steps[0].size else 0
        passes.append(parts["backward"][0].size - in_step)
        fed.append(_passes_after_layers(parts["backward"], lo, layer_ts))
        closure.append(in_step)
        forwards.append(parts["forward"])
        n = int(np.count_nonzero(iv.contains(model, starts[slice(*np.searchsorted(starts, (lo, hi)))])))
        per_step.append(n)
        calls += n
        busy += iv.total(model)
        spans.append(model)
    frac = busy / ctx.window_ns if ctx.window_ns else 0.0
    if not calls or frac < MIN_FRAC:
        return None
    us_per_op = busy / calls / 1e3
    ops_per_step = median_of(per_step)
    if ops_per_step < MIN_OPS_PER_STEP or us_per_op > MAX_US_PER_OP:
        return None
    sampling = ctx.events_in_window(ctx.masks["cpu_op"] & (ev.lane == ctx.main_lane)
                                    & ctx.trace.name_ids(lambda n: n == SAMPLING)[ev.name])
    samples_per_step = int(np.count_nonzero(sampling)) / len(ctx.step_bounds)
    one_at_a_time = samples_per_step >= MIN_SAMPLES_PER_STEP
    passes_per_step = median_of(passes)
    closure_per_step = median_of(closure)
    second_order = int(np.count_nonzero(ctx.events_in_window(
        ctx.masks["cpu_op"] & ctx.host_name_ids(lambda n: DOUBLE_BACKWARD in n)[ev.name]))) / len(ctx.step_bounds)
    double = second_order >= MIN_DOUBLE_BACKWARD_PER_STEP
    # many passes a step, each after its own forward: the batch a sample at a time; not the inner
    # gradient steps of a double backward (meta-learning), which one pass on the batch would change
    per_sample = passes_per_step >= MIN_PASSES_PER_STEP and not double
    # a loop over tasks runs the model again before each inner gradient pass (on the task's support
    # set, then with its adapted weights); derivatives of one output (a physics-informed loss's
    # u_x, then u_xx) are gradient passes one after another, with no layer between them
    tasks = double and median_of(fed) >= MIN_INNER_PASSES
    losses_per_step = _loss_calls(ctx, forwards) / len(ctx.step_bounds)
    # one backward a step, but the loss computed sample by sample: the forward called per sample, the
    # losses summed (not the optimizer's closure passes, nor a double backward's inner passes)
    summed = (not per_sample and not double and closure_per_step < 2 and passes_per_step >= 1
              and losses_per_step >= MIN_PASSES_PER_STEP)
    forward_calls, forward_total = _outer_calls(ctx, forwards)
    names = ctx.trace.names
    fused = {names[n]: c for n, c in enumerate(forward_calls.tolist()) if c and names[n] in FUSED_RECURRENT}
    if forward_total and sum(fused.values()) >= MIN_FUSED_SHARE * forward_total:
        return _fused_recurrent(ctx, spans, max(fused, key=fused.__getitem__), sum(fused.values()) / forward_total,
                                ops_per_step, us_per_op, frac)
    reuse = _weight_reuse(ctx)
    layers = reuse is not None and reuse < MIN_WEIGHT_REUSE  # many small layers, each weight used once
    in_forward = _main_ops_in(ctx, forwards)
    cells = int(np.count_nonzero(ctx.host_name_ids(CELL_OPS.__contains__)[ev.name[in_forward]])) / len(ctx.step_bounds)
    fixes: tuple[Fix, ...] = (
        pytorch("Compile the model: its small operators become a few fused loops, called once"
                + (RNN_GRAPH_BREAK if fused else ""), COMPILE_CODE),)
    if cells >= MIN_CELL_CALLS:
        fixes = (pytorch(f"The model calls a recurrent cell {cells:,.0f} times a step, one time step each: where each "
                         "step's input is known beforehand (an encoder, a decoder fed the targets), PyTorch's fused "
                         "layer runs the whole sequence in one call", CELL_LAYER_CODE), *fixes)
    elif not layers:
        fixes += (pytorch("If the model loops over time steps in Python through a recurrent cell (an RNN, LSTM or GRU "
                          "written by hand), use PyTorch's fused recurrent layer instead", FUSED_RNN_CODE),)
    if double:  # torch.compile refuses double backward
        fixes = (pytorch("Give each call more work: more samples (or collocation points) in each step's batch, "
                         "fewer steps", MORE_WORK_CODE),)
    more_work = double and not (tasks or one_at_a_time)  # the only fix gives each step more work
    if tasks:
        fixes = (pytorch("If the step loops over tasks (meta-learning), adapt them all in one batched call: "
                         "torch.func's vmap over an inner grad step", TASKS_VMAP_CODE), *fixes)
    if per_sample:
        fixes = (pytorch(f"Run the whole batch through one forward and one backward, not {passes_per_step:,.0f} "
                         "passes a step", BATCH_CODE), *fixes)
    if summed:
        fixes = (pytorch(f"Call the model and the loss once on the whole batch, not {losses_per_step:,.0f} times a step",
                         BATCH_CODE), *fixes)
    if one_at_a_time:
        fixes = (pytorch("If this is a reinforcement-learning rollout, step many environments together: one forward "
                         "and one sample a step serve them all", VECTOR_ENV_CODE), *fixes)
    return finding(
        severity="medium" if more_work else severity_for(frac),
        title=(f"The model calls {ops_per_step:,.0f} tiny operators a step"
               + (f" in {passes_per_step:,.0f} forward and backward passes" if per_sample else "")
               + (f", the loss computed {losses_per_step:,.0f} times" if summed else "")
               + ": calling them costs more than their work"),
        why=f"""Each PyTorch operator call pays a fixed cost before it computes anything — the Python binding, the
        dispatcher, autograd's bookkeeping — about 3.6 µs on a 1-element tensor. This model's forward and backward
        call {ops_per_step:,.0f} operators a step at {us_per_op:.1f} µs each on average: the calls, not the
        arithmetic, take the time """
        + (f"""(many small layers: the backward evaluates {reuse:.1f} matrix products for each gradient it
        accumulates into a parameter, so each weight is used about once a step, not again and again as in a loop
        over time steps).""" if layers else "(many small layers, or a Python loop over time steps or elements).")
        + ("" if double else " torch.compile fuses them into a few generated loops" + (
            "." if layers else "; a loop over time steps has a fused layer."))
        + (f""" Here samples are drawn {samples_per_step:,.0f} times a step (aten::multinomial), one at a time: a
        reinforcement-learning rollout acting in one environment after another, each action after a forward pass
        on one observation, or generation token by token. A vector of environments stepped together turns those
        calls into one forward and one sample per step for all of them.""" if one_at_a_time else "")
        + (f""" Each step runs {passes_per_step:,.0f} backward passes, each after its own forward: the batch goes
        through the model a sample (or a few) at a time, and every operator is called once per pass. One pass on the
        whole batch calls each once, on a tensor with a batch dimension, and gives the same gradient when the loss is
        the batch's mean (a model with BatchNorm normalises over the batch, so its results change with the batch's
        size). If you need each sample's own gradient (per-sample clipping, DP-SGD), torch.func's vmap over grad
        computes them all in one batched pass (PyTorch's per-sample-gradients tutorial).""" if per_sample else "")
        + (f""" The loss is computed {losses_per_step:,.0f} times a step before one backward pass: the forward runs a
        sample (or a few) at a time and the losses are added up. One call of the model and the loss on the whole
        batch does the same arithmetic in one call per operator; with the loss's mean over the batch, the gradient
        is the summed losses' divided by the batch size (reduction="sum" keeps the sum).""" if summed else "")
        + (f""" The optimizer itself evaluates the model {closure_per_step:,.0f} times a step (optimizer.step(closure),
        as LBFGS does, each pass on the whole batch): those passes are what the optimizer asks for, not a batch split
        up.""" if closure_per_step >= 2 else "")
        + (f""" The step differentiates through gradients ({second_order:,.0f} autograd nodes of backward formulas a
        step, such as ThresholdBackwardBackward0: autograd.grad with create_graph=True, as MAML's inner step, a gradient
        penalty or a physics-informed loss does), and torch.compile does not support that ("torch.compile with
        aot_autograd does not currently support double backward"): the calls' cost stays, so give each call more
        work.""" if double else "")
        + (""" More samples a step spread the same calls over more work: the time per sample falls while the step
        takes somewhat longer, a change to the training, so no step time saved is counted.""" if more_work else "")
        + (""" Its several inner gradient passes look like a loop over tasks: torch.func's vmap runs an inner grad
        step for every task in one batched call, with the same gradients (the functorch MAML example).""" if tasks
           else ""),
        summary=(f"Forward and backward: {ops_per_step:,.0f} operator calls a step (median), {us_per_op:.1f} µs each "
                 f"on average, {pct(frac)} of the window.{_callers(ctx, spans)}"),
        numbers={"calls_per_step": int(ops_per_step), "per_call_us": round(us_per_op, 3), "model_frac": round(frac, 4),
                 "samples_per_step": round(samples_per_step, 1), "passes_per_step": round(passes_per_step, 1),
                 "closure_passes_per_step": round(closure_per_step, 1),
                 "double_backward_nodes_per_step": round(second_order, 1),
                 "loss_calls_per_step": round(losses_per_step, 1),
                 "matmuls_per_accumulation": None if reuse is None else round(reuse, 2),
                 "threshold_calls_per_step": MIN_OPS_PER_STEP, "threshold_per_call_us": MAX_US_PER_OP},
        est_gain=0.0 if more_work else frac,
        gain_method=(("not a step-time saving: more samples a step make each step somewhat longer and each sample "
                      "much cheaper, a change to the training (a larger batch)") if more_work else
                     ("upper bound: the forward and backward's share of the window; compilation removes the calls' "
                      f"cost but still does their work, and the profiler's per-call cost inflates the share ({MEASURED})")),
        fixes=fixes,
        doc_url=DOC,
    )


def _layer_starts(ctx: Context) -> np.ndarray:
    """Start times (ns, in order) of the main thread's layer operators (:data:`LAYER_OPS`)."""
    ev = ctx.trace.events
    rows = ctx.events_in_window(ctx.masks["cpu_op"] & (ev.lane == ctx.main_lane)
                                & ctx.host_name_ids(LAYER_OPS.__contains__)[ev.name])
    return np.sort(ev.ts_ns[rows])


def _passes_after_layers(backward: iv.Intervals, lo: int, layer_ts: np.ndarray) -> int:
    """How many of a step's backward passes (``backward``, the step starting at ``lo``) follow a
    layer's operator since the pass before them (or the step's start): a forward of the model
    before each, not a pass on the gradients the one before it returned."""
    starts, ends = backward
    since = np.concatenate([[lo], ends[:-1]]) if starts.size else starts
    return int(np.count_nonzero(np.searchsorted(layer_ts, starts) > np.searchsorted(layer_ts, since)))


def _weight_reuse(ctx: Context) -> float | None:
    """Matrix-product backward nodes (:data:`MATMUL_NODE`) per gradient accumulated into a
    parameter (:data:`ACCUMULATE_NODE`) in the window; None where none accumulated (gradients
    taken with ``torch.autograd.grad`` or torch.func) or no product was differentiated."""
    ev = ctx.trace.events
    host = ctx.events_in_window(ctx.masks["host"])
    products = int(np.count_nonzero(host & ctx.host_name_ids(lambda n: bool(MATMUL_NODE.match(n)))[ev.name]))
    accumulated = int(np.count_nonzero(host & ctx.host_name_ids(lambda n: n == ACCUMULATE_NODE)[ev.name]))
    return products / accumulated if products and accumulated else None


#: How many outermost operators the evidence names, each with at least this share of the calls.
TOP_CALLERS = 3
MIN_CALLER_SHARE = 0.05


def _inference(ctx: Context) -> Finding | None:
    """A window with no step and no backward: its operator calls as a whole (see the rule)."""
    ev = ctx.trace.events
    mask = ctx.events_in_window(ctx.masks["cpu_op"] & (ev.lane == ctx.main_lane))
    calls = int(np.count_nonzero(mask))
    if calls < MIN_OPS_PER_STEP:
        return None
    spans = [ctx.intervals(mask)]
    busy = iv.total(spans[0])
    frac = busy / ctx.window_ns
    us_per_op = busy / calls / 1e3
    if frac < MIN_FRAC or us_per_op > MAX_US_PER_OP:
        return None
    rows = np.flatnonzero(mask)
    first, last = int(ev.ts_ns[rows].min()), int((ev.ts_ns[rows] + ev.dur_ns[rows]).max())
    span = (min(last, ctx.hi) - max(first, ctx.lo)) / ctx.window_ns
    items = int(np.count_nonzero(mask & ctx.trace.name_ids(lambda n: n == "aten::item")[ev.name]))
    gen = generation(ctx)
    picks, decoding = gen.tokens, gen.decoding
    grown = regrowth(ctx)  # None unless the window decodes
    recomputing = grown is not None and grown.recomputing
    if decoding:
        fixes: tuple[Fix, ...] = (
            pytorch("If you generate for many prompts one after another, generate for all of them in one call",
                    GENERATE_BATCH_CODE),
            huggingface("A text-generation pipeline called once per prompt: give it the whole list and a batch size",
                        PIPELINE_GENERATE_CODE),
            pytorch("Compile the model's forward: each token's small operators become a few fused loops",
                    GENERATE_COMPILE_CODE))
    else:
        fixes = (pytorch("If the model is called once per sample, call it once on a stack of them", INFER_BATCH_CODE),
                 pytorch("Compile the model: its small operators become a few fused loops, called once", COMPILE_CODE),
                 huggingface("A Hugging Face pipeline called once per input: give it the whole list and a batch size",
                             PIPELINE_BATCH_CODE))
    return finding(
        severity=severity_for(span),
        title=f"The window calls {calls:,} tiny operators at {us_per_op:.1f} µs each: calling them costs more than "
              "their work",
        why=f"""Each PyTorch operator call pays a fixed cost before it computes anything — the Python binding, the
        dispatcher — about 3.6 µs on a 1-element tensor. With no backward and no optimizer step this window is
        inference, and its {calls:,} operator calls average {us_per_op:.1f} µs: the calls, not the arithmetic, take
        the time."""
        + (f""" Here a language model generates token by token ({picks:,} tokens picked, attention, the sequence
        grown by concatenation): """
           + ("""every new token runs the model over the whole sequence again, for want of a key/value cache (see
        decoding-without-cache); with one, each token is a pass for one position.""" if recomputing else
              """every new token is a pass through the model for one position.""")
           + """ The tokens of one prompt must come one after another, but the prompts need not: one generate call
        for many prompts decodes a token of each in the same pass. torch.compile fuses each pass's small
        operators."""
           if decoding else
           """ The usual cause is a model called once per sample (a loop over rows, requests or images): called
        once on a stack of them, each operator runs once for the whole batch."""
           + (f""" The results came back to Python one at a time too ({items:,} .item() calls): convert the batch's
        output once.""" if items >= MIN_ITEM_CALLS else "")
           + """ A loop that cannot be batched (a policy acting step by step) still gains from torch.compile, which
        fuses each call's small operators."""),
        summary=(f"{calls:,} operator calls on the main thread at {us_per_op:.1f} µs each on average, {pct(frac)} of "
                 f"the window; from the first to the last, {pct(span)}."
                 + (f" {items:,} .item() calls." if items >= MIN_ITEM_CALLS else "") + _callers(ctx, spans)),
        numbers={"calls": calls, "per_call_us": round(us_per_op, 3), "operators_frac": round(frac, 4),
                 "loop_frac": round(span, 4), "item_calls": items, "tokens_picked": picks,
                 "threshold_calls": MIN_OPS_PER_STEP, "threshold_per_call_us": MAX_US_PER_OP},
        est_gain=span,
        gain_method=("upper bound: the share of the window from the first operator call to the last (the loop's "
                     "Python between the calls included); one call on a batch, or a compiled one, still does the work"),
        fixes=fixes,
        doc_url=DOC,
    )


def _loss_calls(ctx: Context, spans: list[iv.Intervals]) -> int:
    """The main thread's loss-function calls (:data:`LOSS_OPS`) inside ``spans``, one nested in
    another counted once."""
    ev = ctx.trace.events
    rows = _main_ops_in(ctx, spans, ctx.host_name_ids(LOSS_OPS.__contains__)[ev.name])
    return int(np.count_nonzero(iv.outermost(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows])[1])) if rows.size else 0


def _main_ops_in(ctx: Context, spans: list[iv.Intervals], mask: np.ndarray | None = None) -> np.ndarray:
    """Rows of the main thread's operators (among ``mask``, when given) that start inside ``spans``."""
    ev = ctx.trace.events
    ops = ctx.masks["cpu_op"] & (ev.lane == ctx.main_lane)
    rows = np.flatnonzero(ops if mask is None else ops & mask)
    if not rows.size or not spans:
        return rows[:0]
    where = iv.union(np.concatenate([s[0] for s in spans]), np.concatenate([s[1] for s in spans]))
    inside: np.ndarray = rows[iv.contains(where, ev.ts_ns[rows])]
    return inside


def _outer_calls(ctx: Context, spans: list[iv.Intervals]) -> tuple[np.ndarray, int]:
    """(per name id, the calls made by the main thread's outermost operators of that name inside
    ``spans``, their own and those nested in them; all the calls inside ``spans``)."""
    ev = ctx.trace.events
    rows = _main_ops_in(ctx, spans)
    if not rows.size:
        return np.zeros(len(ctx.trace.names)), 0
    order, outer = iv.outermost(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows])
    rows = rows[order]
    group = np.cumsum(outer) - 1
    return np.bincount(ev.name[rows[outer]], weights=np.bincount(group), minlength=len(ctx.trace.names)), int(rows.size)


def _callers(ctx: Context, spans: list[iv.Intervals]) -> str:
    """`` Most calls: aten::linear 42 % (with the calls inside it), ...``: the main thread's
    outermost operators in the steps' forward and backward (``spans``), by the calls they make,
    their own and those nested in them; empty when none reaches :data:`MIN_CALLER_SHARE`."""
    per_name, total = _outer_calls(ctx, spans)
    top = [n for n in np.argsort(-per_name, kind="stable")[:TOP_CALLERS].tolist()
           if total and per_name[n] >= MIN_CALLER_SHARE * total]
    if not top:
        return ""
    names = ctx.trace.names
    listed = ", ".join(f"{names[n]} {pct(per_name[n] / total)}" for n in top)
    return f" Most calls, counting those inside each: {listed}."


def _fused_recurrent(ctx: Context, spans: list[iv.Intervals], layer: str, share: float, ops_per_step: float,
                     us_per_op: float, frac: float) -> Finding:
    """The calls come from inside PyTorch's own recurrent layer: neither compiling nor the fused
    layer helps; more sequences a step amortise the calls (a saving per sequence, not per step)."""
    return finding(
        severity="medium",
        title=(f"The recurrent layer ({layer}) calls {ops_per_step:,.0f} tiny operators a step: calling them costs "
               "more than their work"),
        why=f"""The model already uses PyTorch's recurrent layer, but on the CPU {layer} runs each time step as
        separate small operators, forward and backward, and each call pays a fixed cost (about 3.6 µs on a
        1-element tensor) before it computes anything: {ops_per_step:,.0f} calls a step at {us_per_op:.1f} µs each on
        average. torch.compile keeps the layer as one call to the same operator, so it cannot fuse them. What the
        calls cost does not grow with the batch: more sequences a step spread the same calls over more work, so
        the time per sequence falls while the step takes little longer. That is a change to the training (a
        larger batch), so it is not counted as step time saved.""",
        summary=(f"Forward and backward: {ops_per_step:,.0f} operator calls a step (median), {us_per_op:.1f} µs each "
                 f"on average, {pct(frac)} of the window; {layer} makes {pct(share)} of the forward's calls."
                 f"{_callers(ctx, spans)}"),
        numbers={"calls_per_step": int(ops_per_step), "per_call_us": round(us_per_op, 3), "model_frac": round(frac, 4),
                 "fused_layer_frac": round(share, 4),
                 "threshold_calls_per_step": MIN_OPS_PER_STEP, "threshold_per_call_us": MAX_US_PER_OP},
        est_gain=0.0,
        gain_method=("not a step-time saving: a larger batch takes somewhat longer a step and much less per sequence "
                     f"({MEASURED_FUSED})"),
        fixes=(pytorch("Give each step more sequences: the layer's per-time-step calls grow far less than the "
                       "batch", BIGGER_BATCH_CODE),),
        doc_url="https://pytorch.org/docs/stable/generated/torch.nn.GRU.html",
    )


__all__ = ["cpu_op_overhead"]
