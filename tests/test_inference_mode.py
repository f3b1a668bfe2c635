"""``inference-grad-enabled`` (autograd nodes built that no backward pass used: inference with grad
mode on, or an evaluation inside a training loop) and ``inference-train-mode`` (dropout drawing
masks where nothing trains), from the operators' autograd sequence numbers, the backward's events
that carry them, and the operators inside ``aten::dropout``; and the loader's ``seq`` column."""

from __future__ import annotations

import glob
import gzip
import json
import os
import re

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze, load_trace
from gpumagic.analysis.rules.inference import MEDIUM_FRAC, MIN_ACTIVE_DROPOUT, MIN_NODES, MIN_UNUSED_FRAC
from gpumagic.trace.model import Kind

GRAD = os.path.join(DATA, "cpu_infer_grad.json.gz")
TRAIN_MODE = os.path.join(DATA, "cpu_infer_train_mode.json.gz")
COMPILED = os.path.join(DATA, "cpu_compiled_infer_grad.json.gz")
def _op(tb: TraceBuilder, name: str, ts: float, dur: float, seq: int | None) -> None:
    args = {"External id": 1} if seq is None else {"External id": 1, "Sequence number": seq, "Fwd thread id": 0}
    tb.add(cat="cpu_op", name=name, ts=ts, dur=dur, args=args)


def _inference(passes: int = 4, layers: int = 3, extra=None) -> dict:
    """A CPU loop of ``passes`` forward passes of ``layers`` layers under grad mode, recorded as
    torch 2.13 records them: ``aten::linear`` peeks the counter, its ``aten::t`` and ``aten::addmm``
    each take the number and build a node, then ``aten::gelu`` builds one."""
    tb = TraceBuilder(cc=None)
    counter, t = 100, 0.0
    for p in range(passes):
        tb.step(p + 1, t, layers * 50 + 10)
        at = t + 5
        for _ in range(layers):
            _op(tb, "aten::linear", at, 40, counter)
            _op(tb, "aten::t", at + 1, 4, counter)
            _op(tb, "aten::addmm", at + 6, 30, counter + 1)
            _op(tb, "aten::gelu", at + 42, 6, counter + 2)
            counter += 3
            at += 50
        t += layers * 50 + 20
    if extra:
        extra(tb, t)
    return tb.to_dict()


def _simple(passes: int, nodes_per_pass: int, frozen: bool = False, seq: bool = True, name: str = "aten::addmm",
            untracked_us: float = 0.0) -> dict:
    """``passes`` × ``nodes_per_pass`` operators of 10 µs on the main thread, each building a node
    (unless ``frozen``), and an operator of ``untracked_us`` µs without a number after each pass."""
    tb = TraceBuilder(cc=None)
    counter, t = 7, 0.0
    for p in range(passes):
        tb.step(p + 1, t, nodes_per_pass * 12 + untracked_us + 10)
        at = t + 2
        for _ in range(nodes_per_pass):
            _op(tb, name, at, 10, counter if seq else None)
            counter += 0 if frozen else 1
            at += 12
        if untracked_us:
            _op(tb, "aten::copy_", at, untracked_us, None)
        t += nodes_per_pass * 12 + untracked_us + 20
    return tb.to_dict()


def test_grad_mode_inference_fires_with_the_nodes_it_built():
    f = analyze(_simple(passes=4, nodes_per_pass=8)).finding("inference-grad-enabled")
    assert f is not None
    n = f.evidence.numbers
    assert n["unused_nodes"] == 4 * 8 - 1  # the last operator has no later number to compare with
    assert n["grad_mode_ops"] == 32 and n["unused_frac"] == pytest.approx(31 / 32, abs=1e-4)
    assert n["context"] == "inference" and f.title.startswith("Inference builds an autograd graph")
    assert f.est_gain == 0 and f.severity == "medium"
    code = f.fixes[0].code
    assert "model.eval()" in code and "with torch.inference_mode():" in code
    assert f.evidence.windows and all(w.lane == "cpu" for w in f.evidence.windows)


def test_nested_operators_count_each_node_once():
    """``aten::linear`` peeks the number its ``aten::t`` then takes: the pairs (linear, t) do not
    advance, (t, addmm) and (addmm, gelu) do."""
    f = analyze(_inference(passes=4, layers=3)).finding("inference-grad-enabled")
    assert f is not None
    assert f.evidence.numbers["unused_nodes"] == 4 * 3 * 3 - 1


def test_no_grad_frozen_and_few_nodes_are_silent():
    assert analyze(_simple(4, 8, seq=False)).finding("inference-grad-enabled") is None  # torch.no_grad()
    assert analyze(_simple(4, 8, frozen=True)).finding("inference-grad-enabled") is None  # requires_grad_(False)
    few = MIN_NODES // 4  # four passes of `few` nodes build 4 * few - 1 (the last is not counted)
    assert analyze(_simple(4, few)).finding("inference-grad-enabled") is None
    assert analyze(_simple(4, few + 1)).finding("inference-grad-enabled") is not None


def test_autograd_functions_advance_the_counter_without_grad_mode():
    """An ``autograd.Function``'s apply takes a number whatever the grad mode and is recorded by
    its class name (vLLM's TopK under inference mode): not counted as building."""
    assert analyze(_simple(4, 8, name="TopK")).finding("inference-grad-enabled") is None


def test_a_compiled_model_run_with_grad_mode_on():
    """torch.compile's AOTAutograd runs its training graph in a ``CompiledFunction`` (an
    autograd.Function recorded by that name) only under grad mode: a few calls suffice."""
    f = analyze(_simple(3, 1, name="CompiledFunction")).finding("inference-grad-enabled")
    assert f is not None
    assert f.evidence.numbers["compiled_calls"] == 2 and f.title.startswith("Inference runs torch.compile's training graph")
    assert analyze(_simple(2, 1, name="CompiledFunction")).finding("inference-grad-enabled") is None  # one counted


def test_a_small_share_of_the_operator_time_is_silent_unless_a_layer_built_the_nodes():
    """Unused nodes built by a metric's operators (``aten::sigmoid``) covering under MIN_UNUSED_FRAC
    of the operator time (an untracked operator after each pass takes the rest) are silent; low below
    MEDIUM_FRAC. Built by a layer's operator (``aten::addmm``: a model's forward) they fire at any
    share: the share moves with the machine's load, a layer's node does not."""
    grad_us = 8 * 10  # a pass's operators that build a node: 8 of 10 µs
    at_threshold = grad_us * (1 / MIN_UNUSED_FRAC - 1)  # untracked time a pass that puts the share at the threshold
    metric = "aten::sigmoid"
    assert analyze(_simple(4, 8, untracked_us=1.2 * at_threshold, name=metric)).finding("inference-grad-enabled") is None
    f = analyze(_simple(4, 8, untracked_us=0.8 * at_threshold, name=metric)).finding("inference-grad-enabled")
    assert f is not None and f.severity == "low" and f.evidence.numbers["layer_nodes"] == 0
    assert f.evidence.numbers["unused_frac"] < MEDIUM_FRAC
    f = analyze(_simple(4, 8, untracked_us=20 * at_threshold)).finding("inference-grad-enabled")
    assert f is not None and f.severity == "low" and f.evidence.numbers["unused_frac"] < 0.01
    n = f.evidence.numbers  # every node a layer's (the last operator has no later number: 31 of 32)
    assert n["layer_nodes"] == n["unused_nodes"] == 31 and "(31 of them by a layer's operator" in f.evidence.summary


def _with_training(tb: TraceBuilder, t: float) -> None:
    tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 10, 30)
    tb.op("Optimizer.step#SGD.step", t + 50, 20, cat="user_annotation")


def test_a_trace_whose_backward_carries_no_numbers_is_not_judged():
    """A backward pass whose events carry no sequence numbers: which nodes it used is unknown."""
    assert analyze(_inference(extra=_with_training)).finding("inference-grad-enabled") is None
    assert analyze(_dropout(active=True, extra=_with_training)).finding("inference-train-mode") is None


def _training(steps: int = 4, nodes: int = 6, evaluation: int = 0, recompute: int = 0, old_names: bool = False,
              tail: int = 0, dropout: bool = False, compiling: bool = False, pick: bool = False) -> dict:
    """CPU training steps: a forward of ``nodes`` operators each building a node, a backward that
    evaluates each (``evaluate_function`` spans carrying the node's number, an operator inside;
    with ``old_names`` the 2021 spelling, the bare node ``AddmmBackward``), ``recompute`` operators
    building nodes again inside the first backward span (a checkpoint's recomputation), and an SGD
    step; then ``evaluation`` forward operators after each step that no backward uses, and
    ``tail`` forward operators at the end whose backward lies past the trace. ``dropout``: a
    training-mode dropout call in every forward, the training step's (its ``aten::mul`` builds a
    node the backward uses) and the evaluation's (one nobody uses). ``compiling``: the evaluation's
    operators run inside torch.compile's frame, as dynamo tracing a model's first call records them.
    ``pick``: an ``aten::argmax`` right after the evaluation's operators (an action chosen)."""
    tb = TraceBuilder(cc=None)
    counter, t = 500, 0.0
    step_us = nodes * 12 * 3 + recompute * 12 + evaluation * 12 + 100
    for i in range(steps):
        tb.step(i + 1, t, step_us)
        at = t + 2
        made = []
        for _ in range(nodes):
            _op(tb, "aten::addmm", at, 10, counter)
            made.append(counter)
            counter += 1
            at += 12
        if dropout:
            _op(tb, "aten::dropout", at, 10, counter)
            _op(tb, "aten::mul", at + 2, 5, counter)
            made.append(counter)
            counter += 1
            at += 12
        for k, seq in enumerate(reversed(made)):
            dur = 20 + (recompute * 12 if k == 0 else 0)
            name = "AddmmBackward" if old_names else "autograd::engine::evaluate_function: AddmmBackward0"
            _op(tb, name, at, dur, seq)
            _op(tb, "aten::mm", at + 2, 5, None)
            for j in range(recompute if k == 0 else 0):
                _op(tb, "aten::linear", at + 9 + 12 * j, 10, counter)
                counter += 1
            at += dur + 4
        tb.op("Optimizer.step#SGD.step", at, 20, cat="user_annotation")
        at += 24
        if compiling and evaluation:
            tb.op("entire_frame_compile", at - 1, evaluation * 12 + 2, cat="user_annotation")
        for _ in range(evaluation):
            _op(tb, "aten::addmm", at, 10, counter)
            counter += 1
            at += 12
        if evaluation and pick:
            _op(tb, "aten::argmax", at, 3, None)
            at += 5
        if evaluation and dropout:
            _op(tb, "aten::dropout", at, 10, counter)
            _op(tb, "aten::mul", at + 2, 5, counter)
            counter += 1
            at += 12
        t += step_us + 40
    for _ in range(tail):
        _op(tb, "aten::addmm", t, 10, counter)
        counter += 1
        t += 12
    return tb.to_dict()


def test_a_training_loop_whose_nodes_all_feed_a_backward_is_silent():
    assert analyze(_training()).finding("inference-grad-enabled") is None
    assert analyze(_training(old_names=True)).finding("inference-grad-enabled") is None  # 2021 traces


def test_an_evaluation_without_no_grad_inside_a_training_loop_fires():
    f = analyze(_training(evaluation=8)).finding("inference-grad-enabled")
    assert f is not None
    n = f.evidence.numbers
    # the evaluation's nodes of every step but the last (after the last backward: not judged)
    assert n["context"] == "training" and n["unused_nodes"] == 3 * 8
    assert "no backward pass used" in f.title
    assert analyze(_training(evaluation=8, old_names=True)).finding("inference-grad-enabled") is not None
    assert n["train_mode_dropout_calls"] == 0 and "compiled_calls" not in n
    codes = [fx.code for fx in f.fixes]  # training: an evaluation's fix and a detached forward's, no bare eval()
    assert "model.train()" in codes[0] and "with torch.no_grad():" in codes[1] and "eval" not in codes[1]
    assert "aten::detach" not in f.evidence.summary and n["detached_outputs"] == 0  # nothing detached the evaluation's


def test_a_gan_generator_whose_fakes_are_detached_fires_and_no_grad_silences_it():
    """A discriminator step on ``generator(noise).detach()`` builds the generator's graph for
    nothing; under torch.no_grad() it builds none. The advice runs the generator under no_grad
    and leaves its training mode alone (eval mode would change its batch norm)."""
    torch = pytest.importorskip("torch")
    import gpumagic

    torch.manual_seed(0)
    nn = torch.nn
    gen = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 32))
    disc = nn.Sequential(nn.Linear(32, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt = torch.optim.SGD(disc.parameters(), lr=1e-3)
    real = torch.randn(64, 32)

    def d_steps(detach: bool):
        with gpumagic.profile(steps=4, skip=1, display=False) as run:
            for _ in range(6):
                noise = torch.randn(64, 16)
                if detach:
                    fake = gen(noise).detach()
                else:
                    with torch.no_grad():
                        fake = gen(noise)
                loss = disc(fake).mean() - disc(real).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        return run.report

    f = d_steps(detach=True).finding("inference-grad-enabled")
    assert f is not None and f.evidence.numbers["context"] == "training"
    assert f.evidence.numbers["unused_nodes"] >= 3 * 8  # 3 linear (t, addmm) + 2 relu a step, each judged step
    assert "detached before use" in f.why and "fake = generator(noise)" in f.fixes[0].code  # the detach seen: first
    detaches = re.search(r"(\d+) times the next operator was aten::detach", f.evidence.summary)
    assert detaches and int(detaches.group(1)) == f.evidence.numbers["detached_outputs"] >= 3  # one a step (four)
    assert "inference-grad-enabled" not in d_steps(detach=False).finding_ids


def test_an_unused_forward_whose_output_is_picked_from_leads_with_no_grad_acting():
    f = analyze(_training(evaluation=8, pick=True)).finding("inference-grad-enabled")
    # the last step's evaluation follows the last backward: not judged (its backward may lie past the trace)
    assert f.evidence.numbers["picked_outputs"] == 3 and f.fixes[0].code.lstrip().startswith("with torch.no_grad():")
    g = analyze(_training(evaluation=8)).finding("inference-grad-enabled")
    assert g.evidence.numbers["picked_outputs"] == 0 and "model.eval()" in g.fixes[0].code


def test_operators_dynamo_traces_while_compiling_are_not_judged():
    """torch.compile's first call traces the model's forward under grad mode inside its compile
    frame (16 nodes in a probe of a 3-layer MLP on torch 2.13): the tracer's nodes, not the loop's."""
    assert analyze(_training(evaluation=8)).finding("inference-grad-enabled") is not None
    assert analyze(_training(evaluation=8, compiling=True)).finding("inference-grad-enabled") is None


def test_a_policys_draws_are_not_a_forward_run_with_grad_mode_on():
    """A REINFORCE rollout: ``Categorical(logits=policy(obs)).sample()`` computes the probabilities
    (softmax, reshape) under grad mode and draws with ``torch.multinomial``; the loss differentiates
    ``log_prob``, which reads the logits, so those nodes go unused every draw. They are the draw's,
    not a forward computation to run without a graph (the fix told a rollout to evaluate in eval
    mode): not counted. The policy's own forward, used by the backward, never was."""
    torch = pytest.importorskip("torch")
    import gpumagic
    from gpumagic.analysis.context import build_context
    from gpumagic.analysis.inference import grad_mode

    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)

    def episode(draws: bool):
        obs, logps, probs = torch.zeros(4), [], []
        for t in range(40):
            logits = policy(obs)
            d = torch.distributions.Categorical(logits=logits)
            if draws:
                a = d.sample()
            else:  # the probabilities computed, kept and never differentiated: an unused graph
                probs.append(logits.softmax(-1).reshape(-1, 2))
                a = torch.tensor(t % 2)
            logps.append(d.log_prob(a))
            obs = torch.randn(4)
        loss = -torch.stack(logps).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()

    def unused(draws: bool) -> int:
        episode(draws)
        with gpumagic.profile(steps=3, skip=1, display=False, nvml=False) as run:
            for _ in range(5):
                episode(draws)
        return grad_mode(build_context(run.trace)).nodes

    assert unused(draws=True) == 0
    assert unused(draws=False) >= 3 * 40 * 2  # softmax and reshape a step of each judged episode


def test_an_agent_acting_with_grad_mode_on_is_told_to_act_under_no_grad():
    """A DQN acting each step (``q_net(obs).argmax().item()``) with grad mode on: its forward builds
    a graph no backward reads; the argmax right after it says an action was chosen, and the fix
    for that comes first (not an evaluation in eval mode)."""
    torch = pytest.importorskip("torch")
    import gpumagic

    torch.manual_seed(0)
    q_net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.SGD(q_net.parameters(), lr=1e-2)
    states, targets = torch.randn(32, 4), torch.randn(32)

    def step():
        for _ in range(4):
            q_net(torch.randn(4)).argmax().item()  # acting
        loss = (q_net(states).max(1).values - targets).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    with gpumagic.profile(steps=4, skip=1, display=False, nvml=False) as run:
        for _ in range(6):
            step()
    f = run.report.finding("inference-grad-enabled")
    assert f is not None and f.evidence.numbers["picked_outputs"] >= 3 * 4  # each judged step's four actions
    assert "policy(observation).argmax" in f.fixes[0].code and "an agent choosing its actions" in f.why


def test_a_gan_step_cut_at_its_first_optimizer_is_judged_without_its_last_step():
    """A whole GAN iteration: the discriminator's update, then the generator's on the same fakes.
    The capture ends each step at the first optimizer's update, so the window's last step holds the
    generator's forward whose backward (the generator's loss) runs after the window: its nodes are
    used, just not inside the window, and the last step's are not judged. Fakes made twice, once
    under grad mode only to be detached for the discriminator, are unused in every step: found."""
    torch = pytest.importorskip("torch")
    import gpumagic

    torch.manual_seed(0)
    nn = torch.nn
    gen = nn.Sequential(nn.Linear(16, 64), *[m for _ in range(6) for m in (nn.Linear(64, 64), nn.ReLU())],
                        nn.Linear(64, 32))
    disc = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4)
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4)
    bce = nn.BCEWithLogitsLoss()
    real, ones, zeros = torch.randn(64, 32), torch.ones(64, 1), torch.zeros(64, 1)

    def iterations(twice: bool):
        with gpumagic.profile(steps=4, skip=1, display=False, nvml=False) as run:
            for _ in range(7):
                disc.zero_grad()
                bce(disc(real), ones).backward()
                fake = gen(torch.randn(64, 16))
                bce(disc(gen(torch.randn(64, 16)).detach() if twice else fake.detach()), zeros).backward()
                opt_d.step()
                gen.zero_grad()
                bce(disc(fake), ones).backward()
                opt_g.step()
        return run.report

    assert "inference-grad-enabled" not in iterations(twice=False).finding_ids
    f = iterations(twice=True).finding("inference-grad-enabled")
    # the unused forward a step: 8 linear layers (aten::t, aten::addmm) and 6 ReLUs; 3 of the 4 steps judged
    assert f is not None and f.evidence.numbers["unused_nodes"] == 3 * 22
    assert f.evidence.numbers["layer_nodes"] == 3 * 8


def test_dropout_drawing_masks_in_the_unused_computation_is_named():
    """The evaluation's training-mode dropout is counted; the training forward's is not (its node
    feeds the backward)."""
    f = analyze(_training(evaluation=8, dropout=True)).finding("inference-grad-enabled")
    assert f is not None and f.evidence.numbers["train_mode_dropout_calls"] == 3
    assert "drew a random mask: the model was in training mode" in f.evidence.summary
    assert analyze(_training(dropout=True)).finding("inference-grad-enabled") is None


def test_a_checkpoint_recomputation_and_a_forward_past_the_last_backward_are_the_backwards():
    """Nodes built inside a backward span (recomputed) and after the last backward began (their
    backward lies past the end of the trace) are not counted as unused."""
    assert analyze(_training(recompute=6, tail=20)).finding("inference-grad-enabled") is None


def _dropout(active: bool, calls: int = 4, extra=None, same_start: bool = False) -> dict:
    tb = TraceBuilder(cc=None)
    t = 0.0
    for i in range(calls):
        tb.step(i + 1, t, 100)
        _op(tb, "aten::addmm", t + 2, 30, None)
        _op(tb, "aten::dropout", t + 40, 20 if active else 1, None)
        if active:
            inner = t + 40 if same_start else t + 42
            _op(tb, "aten::bernoulli_", inner, 8, None)
            _op(tb, "aten::mul", t + 52, 4, None)
        _op(tb, "aten::gelu", t + 70, 10, None)
        t += 110
    if extra:
        extra(tb, t)
    return tb.to_dict()


def test_dropout_drawing_masks_fires():
    f = analyze(_dropout(active=True)).finding("inference-train-mode")
    assert f is not None
    assert f.evidence.numbers["active_dropout_calls"] == 4 and f.evidence.numbers["dropout_calls"] == 4
    assert "model.eval()" in f.fixes[0].code and f.est_gain == 0


def test_a_mask_starting_with_its_dropout_call_counts():
    """Microsecond timestamps can give the call and its first operator the same start."""
    f = analyze(_dropout(active=True, same_start=True)).finding("inference-train-mode")
    assert f is not None and f.evidence.numbers["active_dropout_calls"] == 4


def test_dropout_traced_while_torch_compile_compiles_is_not_the_models_mode():
    """torch.compile tracing a model runs its operators on fake tensors inside dynamo's frame
    compilation: a GPT-2 in eval mode, its forward compiled, read "45 of 45 dropout calls drew a
    mask" while it compiled. Calls inside ``entire_frame_compile`` are left out; those after it
    are the model's."""
    def compiling(tb, t):
        tb.op("entire_frame_compile", 0, t, cat="user_annotation")

    assert analyze(_dropout(active=True, extra=compiling)).finding("inference-train-mode") is None

    def compiled_then_run(tb, t):
        tb.op("entire_frame_compile", 0, 2 * 110 - 5, cat="user_annotation")  # the first two calls compile

    f = analyze(_dropout(active=True, calls=6, extra=compiled_then_run)).finding("inference-train-mode")
    assert f.evidence.numbers["active_dropout_calls"] == 4 and f.evidence.numbers["dropout_calls"] == 4


def test_eval_mode_dropout_and_a_single_mask_are_silent():
    assert analyze(_dropout(active=False)).finding("inference-train-mode") is None  # eval: returns its input
    assert analyze(_dropout(active=True, calls=MIN_ACTIVE_DROPOUT - 1)).finding("inference-train-mode") is None


def test_recorded_grad_mode_loop():
    """tests/data/cpu_infer_grad.json.gz: five forward passes of five Linear, four GELU and four
    LayerNorm layers with grad mode on (18 nodes a pass)."""
    r = analyze(GRAD)
    f = r.finding("inference-grad-enabled")
    assert f is not None and f.evidence.numbers["unused_nodes"] >= 3 * 18 - 1
    assert r.finding("inference-train-mode") is None  # eval mode: every dropout call returns its input


def test_recorded_train_mode_loop():
    """tests/data/cpu_infer_train_mode.json.gz: the same model in training mode under no_grad."""
    r = analyze(TRAIN_MODE)
    f = r.finding("inference-train-mode")
    assert f is not None and f.evidence.numbers["active_dropout_calls"] == f.evidence.numbers["dropout_calls"] >= 12
    assert r.finding("inference-grad-enabled") is None  # no_grad: no numbers at all


def test_recorded_compiled_model_with_grad_mode_on():
    """tests/data/cpu_compiled_infer_grad.json.gz: six calls of a torch.compile'd MLP with grad
    mode on (its ``_nograd`` twin, under torch.no_grad(), records no CompiledFunction: silent)."""
    f = analyze(COMPILED).finding("inference-grad-enabled")
    assert f is not None and f.evidence.numbers["compiled_calls"] >= 5
    assert f.evidence.numbers["context"] == "inference"


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz"))) - {GRAD, TRAIN_MODE, COMPILED}))
def test_silent_on_every_other_recorded_trace(path):
    """Training traces (every node feeds a backward; the A100 trace's eight ``aten::sigmoid`` a step
    for a metric stay under the share), HF pipelines (no_grad, eval mode: ``aten::dropout`` without
    children) and vLLM's capture (autograd Functions under inference mode)."""
    r = analyze(path)
    assert r.finding("inference-grad-enabled") is None and r.finding("inference-train-mode") is None


def test_the_loader_reads_sequence_numbers_on_every_path():
    """The ``seq`` column holds what the file writes, -1 on every other event, whether the file
    is loaded from bytes or from a parsed dict."""
    with gzip.open(GRAD, "rb") as fh:
        doc = json.load(fh)
    written = sorted(e["args"]["Sequence number"] for e in doc["traceEvents"]
                     if e.get("ph") == "X" and "Sequence number" in e.get("args", {}))
    assert written
    for trace in (load_trace(GRAD), load_trace(doc)):
        seq = trace.events.seq
        assert sorted(seq[seq >= 0].tolist()) == written
        assert (seq[trace.events.kind != Kind.CPU_OP] == -1).all()


def _cut(trace: dict, keep_backward: int, markers: bool) -> dict:
    """``trace`` ended inside its last backward pass: of that pass's node events (the last step's),
    only the first ``keep_backward``, and nothing after them (a profiler stopped by a time limit, an
    on-demand trace of a fixed duration); with ``markers``, the step markers of the steps that
    ended before the cut (a marker is written when its step ends), else none (a trace recorded
    without ``prof.step()``: the window is the whole trace)."""
    events = trace["traceEvents"]
    last_step = max(e["ts"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    nodes = sorted(e["ts"] for e in events if e.get("name", "").startswith("autograd::engine")
                   and e["ts"] >= last_step)
    cut = nodes[keep_backward]
    out = dict(trace)
    out["traceEvents"] = [e for e in events if e.get("ph") == "M" or (
        markers and e["ts"] + e.get("dur", 0) <= cut if e.get("name", "").startswith("ProfilerStep#") else e["ts"] < cut)]
    return out


@pytest.mark.parametrize("markers", [False, True])
def test_a_trace_cut_inside_a_backward_pass_does_not_call_its_forward_unused(markers):
    """The last forward's nodes that the cut pass had not reached yet are not judged unused."""
    assert analyze(_cut(_training(steps=4, nodes=40), keep_backward=5, markers=markers)).finding(
        "inference-grad-enabled") is None
    # the same cut trace with an evaluation after each complete step: those are still found, but for
    # the one right before the cut pass's forward (after the previous pass: not told from that forward)
    f = analyze(_cut(_training(steps=4, nodes=40, evaluation=20), keep_backward=5, markers=markers)).finding(
        "inference-grad-enabled")
    assert f is not None and f.evidence.numbers["unused_nodes"] == 2 * 20


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_batch_norm_in_training_mode_during_inference(mode):
    """A small CNN with batch norm and no dropout (a ResNet-like model) run under no_grad: in
    training mode each BatchNorm2d call follows its num_batches_tracked update (aten::add_) and
    normalises with the batch's statistics; in eval mode neither happens and nothing fires."""
    torch = pytest.importorskip("torch")
    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    getattr(model, mode)()
    x = torch.randn(4, 3, 16, 16)
    with gpumagic.profile(display=False) as run, torch.no_grad():
        for _ in range(3):
            model(x)
    f = run.report.finding("inference-train-mode")
    if mode == "eval":
        assert f is None
        return
    n = f.evidence.numbers
    assert n["train_mode_batch_norm_calls"] == n["batch_norm_calls"] == 6 and n["active_dropout_calls"] == 0
    assert "Batch normalisation runs in training mode" in f.title and "model.eval()" in f.fixes[0].code


def test_a_batch_norm_call_is_judged_by_the_operator_just_before_it():
    """The thread's previous operator that ended before the call: an aten::add_ (the counter) is
    training mode; a convolution's inner operator, or an add_ earlier with another operator after
    it, is not."""
    def trace(before: list[str]) -> dict:
        tb = TraceBuilder()
        t = 0
        for _ in range(3):
            for name in before:
                tb.op(name, t, 20)
                t += 30
            tb.op("aten::batch_norm", t, 50)
            tb.op("aten::native_batch_norm", t + 5, 40)  # inside the call: not before it
            t += 100
        return tb.to_dict()
    assert analyze(trace(["aten::conv2d", "aten::add_"])).finding("inference-train-mode") is not None
    assert analyze(trace(["aten::add_", "aten::conv2d"])).finding("inference-train-mode") is None
    assert analyze(trace(["aten::conv2d"])).finding("inference-train-mode") is None


def test_an_in_place_residual_before_some_batch_norms_is_not_training_mode():
    """A pre-activation ResNet in eval mode: ``out += shortcut`` ends a block and the next block
    starts with its batch norm, so an add_ comes right before half of the calls; in training mode
    every call follows its counter's add_."""
    def trace(training: bool) -> dict:
        tb = TraceBuilder()
        t = 0
        for _ in range(6):  # blocks: bn1 right after the residual join, bn2 after conv1
            for before in ("aten::add_", "aten::conv2d"):
                tb.op(before, t, 20)
                if training:  # the module's counter, before every call
                    tb.op("aten::add_", t + 25, 2)
                tb.op("aten::batch_norm", t + 30, 50)
                t += 100
        return tb.to_dict()
    assert analyze(trace(training=False)).finding("inference-train-mode") is None
    f = analyze(trace(training=True)).finding("inference-train-mode")
    assert f is not None and f.evidence.numbers["train_mode_batch_norm_calls"] == 12


def _live_loop(side):
    """Seven steps of an MLP on 4,096 rows, five recorded; ``side(logits)`` runs after each and is kept."""
    import torch

    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(4096, 256), torch.randint(0, 10, (4096,))
    kept = []
    with gpumagic.profile(skip=1, steps=5, nvml=False, display=False) as run:
        for _ in range(7):
            logits = model(x)
            torch.nn.functional.cross_entropy(logits, y).backward()
            opt.step()
            opt.zero_grad()
            kept.append(side(model, x, y, logits))
    return run.report


def test_a_small_validation_forward_fires_whatever_its_share_and_a_metric_stays_silent():
    """A validation loss on 16 rows kept with its graph: about 1 % of the operator time, under the 5 %
    line (notebook 15's case on 256 rows read 6–10 % quiet and under 5 % beside busy neighbours), but
    its nodes come from the model's layers. A metric's sigmoids on the logits (40 nodes) stay silent."""
    import torch
    import torch.nn.functional as F

    val = _live_loop(lambda model, x, y, logits: F.cross_entropy(model(x[:16]), y[:16]))
    f = val.finding("inference-grad-enabled")
    assert f is not None and f.evidence.numbers["layer_nodes"] >= 8 and f.evidence.numbers["context"] == "training"
    metric = _live_loop(lambda model, x, y, logits: torch.stack([torch.sigmoid(logits[:64]).view(-1).mean(),
                                                                 torch.sigmoid(logits[:64, :1]).view(-1).mean()]))
    assert metric.finding("inference-grad-enabled") is None
