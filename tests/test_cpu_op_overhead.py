"""``cpu-op-overhead``: a CPU model whose forward and backward call thousands of tiny operators (a
recurrent cell looped over time steps in Python), the per-call cost most of the step."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.analysis.rules.opoverhead import MAX_US_PER_OP, MIN_OPS_PER_STEP, MIN_PASSES_PER_STEP

RECORDED = os.path.join(DATA, "cpu_rnn_loop.json.gz")
PER_SAMPLE = os.path.join(DATA, "cpu_per_sample.json.gz")
GRU = os.path.join(DATA, "cpu_gru.json.gz")
INFER = os.path.join(DATA, "cpu_infer_per_sample.json.gz")
GENERATE = os.path.join(DATA, "cpu_generate.json.gz")
NOCACHE = os.path.join(DATA, "cpu_decode_nocache.json.gz")  # tests/test_decoding.py reads its finding
MAML = os.path.join(DATA, "cpu_maml.json.gz")
LBFGS = os.path.join(DATA, "cpu_lbfgs.json.gz")
SUMMED = os.path.join(DATA, "cpu_summed_losses.json.gz")


def test_a_recorded_rnn_cell_looped_in_python():
    """benchmarks/op_overhead.py --record (tests/data/MANIFEST.md): compile saved 0.57, nn.RNN 0.49."""
    r = analyze(RECORDED)
    f = r.finding("cpu-op-overhead")
    n = f.evidence.numbers
    assert n["calls_per_step"] >= 32 * 20  # about 20 calls, forward and backward, per time step
    assert n["per_call_us"] <= MAX_US_PER_OP
    assert f.est_gain == n["model_frac"] > 0.5 and f.gain_method.startswith("upper bound")
    med = r.metrics.phases.median_ms
    assert n["model_frac"] == pytest.approx((med.forward + med.backward) / r.metrics.steps.median_ms, abs=0.05)
    codes = " ".join(fx.code for fx in f.fixes)
    assert "torch.compile(model)" in codes and "torch.nn.RNN(" in codes


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz"))) - {RECORDED, PER_SAMPLE, GRU, INFER, GENERATE, MAML,
                                                                                         LBFGS, SUMMED, NOCACHE}))
def test_silent_on_every_other_recorded_trace(path):
    assert analyze(path).finding("cpu-op-overhead") is None


def _steps(calls: int, us_each: float, gpu: bool = False, name: str = "aten::add", every: int = 0):
    """Three training steps whose forward calls ``calls`` operators of ``us_each`` µs, back to
    back (every ``every``-th one ``name`` instead of ``aten::add``), then a backward of one node
    and an optimizer step."""
    tb = TraceBuilder(cc=(8, 0) if gpu else None)
    fwd = calls * us_each
    step = fwd + 300
    for i in range(3):
        t = i * step
        tb.step(i + 1, t, step)
        for c in range(calls):
            tb.op(name if every and c % every == 0 else "aten::add", t + c * us_each, us_each * 0.9)
        tb.op("autograd::engine::evaluate_function: AddBackward0", t + fwd, 100)
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t + fwd + 150, dur=100)
        if gpu:
            tb.kernel("k", t + 10, 5, launch_ts=t + 5)
    return tb.to_dict()


def test_thresholds():
    assert analyze(_steps(MIN_OPS_PER_STEP + 200, 2.0)).finding("cpu-op-overhead") is not None
    assert analyze(_steps(MIN_OPS_PER_STEP - 200, 2.0)).finding("cpu-op-overhead") is None  # too few calls
    assert analyze(_steps(MIN_OPS_PER_STEP + 200, 2 * MAX_US_PER_OP)).finding("cpu-op-overhead") is None  # real work
    assert analyze(_steps(MIN_OPS_PER_STEP + 200, 2.0, gpu=True)).finding("cpu-op-overhead") is None  # launch-bound's


def _layered_steps(products: int, accumulations: int, calls: int = 1400, us_each: float = 2.0) -> dict:
    """Three steps of ``calls`` tiny forward calls; each backward evaluates ``products`` matrix
    product nodes and accumulates ``accumulations`` parameter gradients."""
    tb = TraceBuilder(cc=None)
    fwd = calls * us_each
    bwd = (products + accumulations) * 10
    step = fwd + bwd + 300
    for i in range(3):
        t = i * step
        tb.step(i + 1, t, step)
        for c in range(calls):
            tb.op("aten::addmm" if c % 4 == 0 else "aten::relu", t + c * us_each, us_each * 0.9)
        nodes = (["autograd::engine::evaluate_function: AddmmBackward0"] * products
                 + ["autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"] * accumulations)
        for k, name in enumerate(nodes):
            tb.op(name, t + fwd + 10 * k, 9)
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t + fwd + bwd + 150, dur=100)
    return tb.to_dict()


def test_the_fused_recurrent_layer_only_where_weights_are_used_again():
    """A Python loop over time steps applies its few weights at every step (many products per
    gradient accumulated); a stack of small layers uses each weight once (a product per weight
    and bias): no recurrent layer to offer there."""
    loop = analyze(_layered_steps(products=160, accumulations=8)).finding("cpu-op-overhead")
    assert loop.evidence.numbers["matmuls_per_accumulation"] == 20.0
    assert any("torch.nn.RNN(" in fx.code for fx in loop.fixes) and "a loop over time steps has a fused layer" in loop.why
    layers = analyze(_layered_steps(products=40, accumulations=80)).finding("cpu-op-overhead")
    assert layers.evidence.numbers["matmuls_per_accumulation"] == 0.5
    assert [fx.code.strip().splitlines()[-1] for fx in layers.fixes] == ["model = torch.compile(model)"]
    assert "each weight is used about once a step" in layers.why and "fused layer" not in layers.why
    unknown = analyze(_steps(MIN_OPS_PER_STEP + 200, 2.0)).finding("cpu-op-overhead")  # no gradient accumulated
    assert unknown.evidence.numbers["matmuls_per_accumulation"] is None and len(unknown.fixes) == 2


def _nested_steps(wrappers: int, inner: int, plain: int, us_each: float = 2.0) -> dict:
    """Three training steps whose forward calls ``wrappers`` × (``aten::linear`` holding ``inner``
    ``aten::addmm``), then ``plain`` lone ``aten::mul``, back to back."""
    tb = TraceBuilder(cc=None)
    wrap_us = (inner + 1) * us_each
    fwd = wrappers * wrap_us + plain * us_each
    step = fwd + 300
    for i in range(3):
        t = i * step
        tb.step(i + 1, t, step)
        at = t
        for _ in range(wrappers):
            tb.op("aten::linear", at, wrap_us * 0.95)
            for k in range(inner):
                tb.op("aten::addmm", at + (k + 0.5) * us_each, us_each * 0.4)
            at += wrap_us
        for _ in range(plain):
            tb.op("aten::mul", at, us_each * 0.9)
            at += us_each
        tb.op("autograd::engine::evaluate_function: AddBackward0", t + fwd, 100)
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t + fwd + 150, dur=100)
    return tb.to_dict()


def test_the_evidence_names_where_the_calls_come_from():
    """An outermost operator counts the calls nested in it: 300 linears holding 3 addmm each make
    1,200 of the 1,801 calls a step (the backward's node one more), the 600 lone muls the rest."""
    f = analyze(_nested_steps(wrappers=300, inner=3, plain=600)).finding("cpu-op-overhead")
    assert f is not None
    assert "Most calls, counting those inside each: aten::linear 66.6 %, aten::mul 33.3 %." in f.evidence.summary


def test_actions_sampled_one_at_a_time_get_the_vector_of_environments():
    """A rollout: aten::multinomial 100 times a step among the tiny operators (one action after
    each single-observation forward)."""
    f = analyze(_steps(1200, 2.0, name="aten::multinomial", every=12)).finding("cpu-op-overhead")
    assert f.evidence.numbers["samples_per_step"] == 100 and "drawn 100 times a step" in f.why
    assert "gymnasium.vector.SyncVectorEnv" in f.fixes[0].code and "torch.compile" in f.fixes[1].code
    f = analyze(_steps(1200, 2.0, name="aten::multinomial", every=100)).finding("cpu-op-overhead")  # 12 a step
    assert f.evidence.numbers["samples_per_step"] == 12 and "torch.compile" in f.fixes[0].code
    assert "gymnasium" not in "".join(fx.code for fx in f.fixes)


def test_the_vector_of_environments_keeps_the_graph_a_policy_gradient_needs():
    """The fix's rollout runs as written and keeps the log-probabilities' graph (REINFORCE's loss
    is built from them: a rollout under no_grad would leave it nothing to differentiate), one
    action per environment a step."""
    pytest.importorskip("gymnasium")
    import torch

    f = analyze(_steps(1200, 2.0, name="aten::multinomial", every=12)).finding("cpu-op-overhead")
    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 2)
    ns = {"torch": torch, "policy": policy, "rollout_steps": 3, "device": "cpu",
          "make_env": lambda: __import__("gymnasium").make("CartPole-v1")}
    try:
        exec(f.fixes[0].code, ns)
    finally:
        torch.distributions.Distribution.set_default_validate_args(True)
    log_probs = torch.stack(ns["log_probs"])
    assert log_probs.shape == (3, 16) and log_probs.requires_grad
    (-(log_probs * torch.stack(ns["rewards"])).sum()).backward()
    assert policy.weight.grad is not None and len(ns["dones"]) == 3


def test_a_recorded_rnn_names_its_backward_and_linear_calls():
    summary = analyze(RECORDED).finding("cpu-op-overhead").evidence.summary
    assert "Most calls, counting those inside each: autograd::engine::evaluate_function: AddmmBackward0" in summary
    assert "aten::linear" in summary


def test_a_recorded_per_sample_loop_is_told_to_run_the_batch_at_once():
    """benchmarks/op_overhead.py --record: 32 samples, each its own forward and backward, one
    optimizer step (one pass on the batch saved 0.95 of the step, unprofiled)."""
    f = analyze(PER_SAMPLE).finding("cpu-op-overhead")
    n = f.evidence.numbers
    assert n["passes_per_step"] == 32 and "in 32 forward and backward passes" in f.title
    assert "loss_fn(model(x), y)" in f.fixes[0].code and "32 passes a step" in f.fixes[0].description
    assert "torch.compile(model)" in f.fixes[1].code  # still offered, after
    assert f.est_gain == n["model_frac"] > 0.9
    assert "Each step runs 32 backward passes" in f.why and "BatchNorm" in f.why


def test_one_backward_pass_gets_no_batch_fix():
    f = analyze(RECORDED).finding("cpu-op-overhead")
    assert f.evidence.numbers["passes_per_step"] == 1 and "passes" not in f.title
    assert all("loss_fn(model(x), y)" not in fx.code for fx in f.fixes)


def _passes_steps(passes: int, calls: int = 1200, us_each: float = 2.0, closure: bool = False,
                  node: str = "AddBackward0", derivatives: bool = False) -> dict:
    """Three steps, each ``passes`` × (a forward of ``calls // passes`` tiny operators, a layer's
    first, then a backward node ``node``), then an optimizer step: gradient accumulated pass by
    pass. With ``closure``, the passes run inside the optimizer step (``optimizer.step(closure)``,
    LBFGS). With ``derivatives``, only the first pass has a layer before it, the others follow
    on non-layer operators (a physics-informed loss: u = model(x), then u_x, u_xx, the loss)."""
    tb = TraceBuilder(cc=None)
    per = calls // passes
    pass_us = per * us_each + 40
    step = passes * pass_us + 300
    for i in range(3):
        t = i * step
        tb.step(i + 1, t, step)
        for k in range(passes):
            at = t + k * pass_us
            for c in range(per):
                layer = c == 0 and not (derivatives and k)
                tb.op("aten::addmm" if layer else "aten::add", at + c * us_each, us_each * 0.9)
            tb.op(f"autograd::engine::evaluate_function: {node}", at + per * us_each + 5, 30)
        if closure:  # the step holds the passes
            tb.add(cat="user_annotation", name="Optimizer.step#LBFGS.step", ts=t + 1, dur=passes * pass_us + 200)
        else:
            tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t + passes * pass_us + 100, dur=100)
    return tb.to_dict()


def test_the_passes_threshold():
    few = analyze(_passes_steps(MIN_PASSES_PER_STEP - 1)).finding("cpu-op-overhead")
    assert few.evidence.numbers["passes_per_step"] == MIN_PASSES_PER_STEP - 1
    assert "torch.compile" in few.fixes[0].code  # gradient accumulation over a few micro-batches: no batch fix
    many = analyze(_passes_steps(MIN_PASSES_PER_STEP)).finding("cpu-op-overhead")
    assert many.evidence.numbers["passes_per_step"] == MIN_PASSES_PER_STEP
    assert "loss_fn(model(x), y)" in many.fixes[0].code


def test_passes_an_optimizer_closure_runs_are_not_a_batch_split_up():
    """LBFGS evaluates the loss and gradient on the whole batch up to max_iter times inside its
    step: those passes are the optimizer's, not samples one at a time."""
    f = analyze(_passes_steps(20, closure=True)).finding("cpu-op-overhead")
    n = f.evidence.numbers
    assert n["passes_per_step"] == 0 and n["closure_passes_per_step"] == 20 and "passes" not in f.title
    assert all("loss_fn(model(x), y)" not in fx.code for fx in f.fixes) and "optimizer.step(closure)" in f.why


def test_a_recorded_lbfgs_fit():
    """benchmarks/op_overhead.py --record: a small tanh MLP fitted with LBFGS (max_iter=20, strong
    Wolfe line search): 21 closure passes a step, once told to run 'the whole batch in one pass'."""
    f = analyze(LBFGS).finding("cpu-op-overhead")
    n = f.evidence.numbers
    assert n["passes_per_step"] == 0 and n["closure_passes_per_step"] >= 10
    assert "torch.compile(model)" in f.fixes[0].code and "LBFGS" in f.why


def test_double_backward_is_not_told_to_compile():
    """Nodes of backward formulas (create_graph=True): torch.compile refuses double backward. One
    pass: more work per call; several inner passes (a loop over tasks): torch.func's vmap first."""
    one = analyze(_passes_steps(1, node="ThresholdBackwardBackward0")).finding("cpu-op-overhead")
    assert one.evidence.numbers["double_backward_nodes_per_step"] == 1
    assert all("torch.compile" not in fx.code for fx in one.fixes) and "double backward" in one.why
    assert "batch_size=8 * batch_size" in one.fixes[0].code and "vmap" not in one.why
    tasks = analyze(_passes_steps(4, node="MseLossBackwardBackward0")).finding("cpu-op-overhead")
    assert "vmap(adapted_loss" in tasks.fixes[0].code and len(tasks.fixes) == 2
    plain = analyze(_passes_steps(4)).finding("cpu-op-overhead")
    assert "torch.compile(model)" in plain.fixes[0].code
    # 4 tasks x 3 inner steps and the outer pass: 13 passes are inner gradient steps, not samples
    inner = analyze(_passes_steps(13, calls=1300, node="MseLossBackwardBackward0")).finding("cpu-op-overhead")
    assert inner.evidence.numbers["passes_per_step"] == 13
    assert "vmap(adapted_loss" in inner.fixes[0].code and len(inner.fixes) == 2
    assert "loss_fn(model(x), y)" not in "".join(fx.code for fx in inner.fixes) and "the batch goes" not in inner.why


def test_derivatives_of_one_forward_are_no_loop_over_tasks():
    """A physics-informed loss: one forward, then gradient passes one after another (u_x, then u_xx
    with create_graph=True), then the backward: 3 passes, but no forward of the model before the
    2nd: no tasks, no vmap over them. Its only fix gives each step more work, which shortens no
    step: no step time counted."""
    f = analyze(_passes_steps(3, node="MseLossBackwardBackward0", derivatives=True)).finding("cpu-op-overhead")
    assert f.evidence.numbers["passes_per_step"] == 3 and "vmap" not in f.why
    assert len(f.fixes) == 1 and "collocation points" in f.fixes[0].code
    assert f.est_gain == 0 and f.severity == "medium" and f.gain_method.startswith("not a step-time saving")
    tasks = analyze(_passes_steps(3, node="MseLossBackwardBackward0")).finding("cpu-op-overhead")
    assert "vmap(adapted_loss" in tasks.fixes[0].code and tasks.est_gain > 0.5


def test_a_recorded_maml_loop():
    """benchmarks/op_overhead.py --record: MAML over 4 sine tasks, an inner autograd.grad with
    create_graph=True each; vmap over the tasks gave the same gradients (the benchmark checks)."""
    f = analyze(MAML).finding("cpu-op-overhead")
    n = f.evidence.numbers
    assert n["double_backward_nodes_per_step"] >= 4 and n["passes_per_step"] == 5
    assert "vmap(adapted_loss" in f.fixes[0].code and all("torch.compile" not in fx.code for fx in f.fixes)


def test_the_tasks_fix_gives_the_loops_gradients():
    """The snippet's vmap over tasks, run on a small model: the gradients of the Python loop over
    the tasks with autograd.grad(create_graph=True)."""
    torch = pytest.importorskip("torch")
    from gpumagic.analysis.rules.opoverhead import TASKS_VMAP_CODE

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the step leaves the weights for the check
    sx, sy, qx, qy = (torch.randn(5, 6, 3), torch.randn(5, 6, 1), torch.randn(5, 6, 3), torch.randn(5, 6, 1))
    ns = {"torch": torch, "model": model, "loss_fn": loss_fn, "optimizer": optimizer, "tasks_support_x": sx,
          "tasks_support_y": sy, "tasks_query_x": qx, "tasks_query_y": qy}
    exec(compile(TASKS_VMAP_CODE, "<fix>", "exec"), ns)
    vmapped = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    from torch.func import functional_call
    params = dict(model.named_parameters())
    meta = 0
    for t in range(5):
        g = torch.autograd.grad(loss_fn(functional_call(model, params, (sx[t],)), sy[t]), list(params.values()),
                                create_graph=True)
        fast = {k: v - 0.01 * gi for (k, v), gi in zip(params.items(), g, strict=True)}
        meta = meta + loss_fn(functional_call(model, fast, (qx[t],)), qy[t])
    meta.backward()
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(vmapped, model.parameters(), strict=True))


def test_a_recorded_gru_is_not_told_to_compile_or_to_use_a_fused_layer():
    """nn.GRU on the CPU runs each time step as small operators inside aten::gru: compiling
    keeps the layer as it is (benchmarks/op_overhead.py: 4.2 ms a step eager, 4.3 compiled), and
    it is the fused layer already; 64 sequences a step cost 0.10 ms a sequence against 0.53."""
    f = analyze(GRU).finding("cpu-op-overhead")
    n = f.evidence.numbers
    assert f.title.startswith("The recurrent layer (aten::gru) calls") and n["fused_layer_frac"] >= 0.5
    codes = " ".join(fx.code for fx in f.fixes)
    assert "torch.compile" not in codes and "torch.nn.RNN(" not in codes and "batch_size=8 * batch_size" in codes
    assert f.est_gain == 0.0 and f.gain_method.startswith("not a step-time saving")
    assert n["model_frac"] > 0.5 and n["per_call_us"] <= MAX_US_PER_OP


def _wrapped_steps(wrapper: str, inner: int, plain: int) -> dict:
    """Three steps: a forward of one ``wrapper`` holding ``inner`` tiny operators, then ``plain``
    lone ones, a backward of 600 nodes and an optimizer step."""
    tb = TraceBuilder(cc=None)
    us = 2.0
    fwd = (inner + plain) * us + 10
    step = fwd + 600 * us + 300
    for i in range(3):
        t = i * step
        tb.step(i + 1, t, step)
        tb.op(wrapper, t, inner * us + 5)
        for c in range(inner):
            tb.op("aten::addmm", t + 2 + c * us, us * 0.8)
        for c in range(plain):
            tb.op("aten::mul", t + inner * us + 10 + c * us, us * 0.8)
        for c in range(600):
            tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + fwd + c * us, us * 0.8)
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t + fwd + 600 * us + 100, dur=100)
    return tb.to_dict()


@pytest.mark.parametrize("layer", ["aten::gru", "aten::lstm", "aten::rnn_tanh", "aten::rnn_relu"])
def test_the_fused_layer_must_make_half_the_forward_calls(layer):
    f = analyze(_wrapped_steps(layer, inner=400, plain=300)).finding("cpu-op-overhead")
    assert f.title.startswith(f"The recurrent layer ({layer})") and f.est_gain == 0.0
    f = analyze(_wrapped_steps(layer, inner=300, plain=400)).finding("cpu-op-overhead")  # under half: the usual fixes
    assert "recurrent layer" not in f.title and "torch.compile" in f.fixes[0].code and f.est_gain > 0
    f = analyze(_wrapped_steps("aten::linear", inner=400, plain=300)).finding("cpu-op-overhead")  # not a recurrent layer
    assert "recurrent layer" not in f.title


def test_a_recorded_inference_loop_one_sample_at_a_time():
    """benchmarks/op_overhead.py --record: a 3-layer MLP called on 100 samples one by one, each
    result read with .item() (unprofiled, 300 such samples took 14.7 ms, one call on their stack
    0.35 ms). No optimizer: no step, so the window as a whole is judged."""
    r = analyze(INFER)
    assert r.metrics.steps.count == 0
    f = r.finding("cpu-op-overhead")
    n = f.evidence.numbers
    assert n["calls"] >= MIN_OPS_PER_STEP and n["per_call_us"] <= MAX_US_PER_OP and n["item_calls"] == 100
    assert "torch.stack(samples)" in f.fixes[0].code and "torch.compile(model)" in f.fixes[1].code
    assert f.est_gain == n["loop_frac"] >= n["operators_frac"] and f.gain_method.startswith("upper bound")
    assert "100 .item() calls" in f.why and "policy acting step by step" in f.why and "generates token" not in f.why


def _inference_window(calls: int, us_each: float, backward: bool = False, gpu: bool = False) -> dict:
    """No step: ``calls`` operators of ``us_each`` µs back to back on the main thread, 1 µs apart
    (a backward node at the end, or a kernel, when asked)."""
    tb = TraceBuilder(cc=(8, 0) if gpu else None)
    for c in range(calls):
        tb.op("aten::addmm", c * (us_each + 1), us_each)
    end = calls * (us_each + 1)
    if backward:
        tb.op("autograd::engine::evaluate_function: AddmmBackward0", end + 5, 50)
    if gpu:
        tb.kernel("k", 10, 5, launch_ts=5)
    return tb.to_dict()


def test_the_inference_window_thresholds():
    f = analyze(_inference_window(MIN_OPS_PER_STEP + 100, 2.0)).finding("cpu-op-overhead")
    assert f is not None and f.evidence.numbers["calls"] == MIN_OPS_PER_STEP + 100
    assert f.evidence.numbers["item_calls"] == 0 and ".item()" not in f.evidence.summary
    assert analyze(_inference_window(MIN_OPS_PER_STEP - 100, 2.0)).finding("cpu-op-overhead") is None
    assert analyze(_inference_window(MIN_OPS_PER_STEP + 100, 2 * MAX_US_PER_OP)).finding("cpu-op-overhead") is None
    assert analyze(_inference_window(MIN_OPS_PER_STEP + 100, 2.0, gpu=True)).finding("cpu-op-overhead") is None
    # a backward without a step: training, whose calls are judged per step
    assert analyze(_inference_window(MIN_OPS_PER_STEP + 100, 2.0, backward=True)).finding("cpu-op-overhead") is None


def test_a_recorded_generation_is_told_to_batch_its_prompts():
    """benchmarks/op_overhead.py --record: a 2-layer GPT-2 built from a config generating 24 tokens
    greedily for one prompt (8 prompts of 40 tokens: 469 ms one call a prompt, 295 compiled, 70 ms
    in one call). Its tokens come one after another; its prompts need not."""
    f = analyze(GENERATE).finding("cpu-op-overhead")
    n = f.evidence.numbers
    assert n["tokens_picked"] == 24 and "generates token by token (24 tokens picked" in f.why
    assert "lm.generate(**batch" in f.fixes[0].code and 'padding_side = "left"' in f.fixes[0].code
    assert "pipe(prompts, batch_size=8" in f.fixes[1].code and f.fixes[1].flavor == "huggingface"
    assert "lm.forward = torch.compile(lm.forward)" in f.fixes[2].code and "torch.stack(samples)" not in f.fixes[0].code


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # importing transformers
def test_compiling_the_wrapper_compiles_nothing_that_generate_runs():
    """The reason the generation fix compiles ``lm.forward``: ``torch.compile(lm).generate(...)``
    runs the original module, and dynamo compiles no frame."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=1,
                                                              n_head=2, bos_token_id=0, eos_token_id=0)).eval()
    torch._dynamo.reset()
    counters.clear()
    with torch.inference_mode():
        out = torch.compile(lm).generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, do_sample=False,
                                         pad_token_id=0, eos_token_id=None)
    assert out.shape == (1, 7)
    assert counters["frames"]["total"] == 0  # nothing went through the compiled wrapper


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # importing transformers
def test_the_static_cache_fix_runs_and_generates_the_same_tokens():
    """The GPU rules' generation fix (``analysis.generation.GENERATE_GPU_CODE``), run as given on a
    GPT-2 built from a config: the same greedy tokens with the static cache (on a GPU transformers
    then compiles the forward; here, on the CPU, it runs eagerly)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from gpumagic.analysis.generation import GENERATE_GPU_CODE

    torch.manual_seed(0)
    lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=1,
                                                              n_head=2, bos_token_id=0, eos_token_id=0)).eval()
    settings = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    ids = torch.tensor([[3, 4, 5]])
    with torch.inference_mode():
        before = lm.generate(ids, **settings)
        exec(GENERATE_GPU_CODE, {"lm": lm, "torch": torch})
        assert lm.generation_config.cache_implementation == "static"
        assert torch.equal(lm.generate(ids, **settings), before)


def test_a_classifier_called_per_sample_is_not_taken_for_generation():
    """An attention model picking a class per sample (argmax) without growing anything by
    concatenation is a per-sample loop: the stacked call comes first."""
    tb = TraceBuilder(cc=None)
    at = 0.0
    for _ in range(100):
        for name in ("aten::addmm", "aten::softmax", "aten::addmm", "aten::add", "aten::gelu", "aten::addmm",
                     "aten::layer_norm", "aten::addmm", "aten::mul", "aten::sum", "aten::argmax"):
            tb.op(name, at, 2.0)
            at += 3.0
    f = analyze(tb.to_dict()).finding("cpu-op-overhead")
    assert f.evidence.numbers["tokens_picked"] == 100 and "torch.stack(samples)" in f.fixes[0].code


def test_the_pipeline_fix_gives_each_texts_prediction():
    """The Hugging Face pipeline fix, run on a text-classification pipeline built from a config:
    the whole list with a batch size gives what calling it once per text gives."""
    pytest.importorskip("transformers")
    import snippets_collect as sc

    from gpumagic.analysis.rules.opoverhead import PIPELINE_BATCH_CODE

    ns = sc._language_model("cpu")
    exec(compile(PIPELINE_BATCH_CODE, "<fix>", "exec"), ns)
    one_by_one = [ns["pipe"](t)[0] for t in ns["texts"]]
    assert [p["label"] for p in ns["predictions"]] == [p["label"] for p in one_by_one]
    assert all(abs(a["score"] - b["score"]) < 1e-4 for a, b in zip(ns["predictions"], one_by_one, strict=True))


def test_a_recorded_step_that_sums_per_sample_losses_is_told_to_batch():
    """benchmarks/op_overhead.py --record: 32 samples through an MLP one at a time, the losses summed
    into one backward. One backward pass a step, so no batch split was seen: it read "compile the
    model". The loss computed 32 times a step is the sign; one call on the batch comes first."""
    f = analyze(SUMMED).finding("cpu-op-overhead")
    n = f.evidence.numbers
    assert n["passes_per_step"] == 1 and n["loss_calls_per_step"] == 32
    assert f.fixes[0].description == "Call the model and the loss once on the whole batch, not 32 times a step"
    assert "loss_fn(model(x), y)" in f.fixes[0].code and "the loss computed 32 times" in f.title
    assert "torch.compile(model)" in f.fixes[1].code
    for other in (RECORDED, LBFGS, MAML, PER_SAMPLE):  # a time-step loop, closure passes, inner passes, a split batch
        g = analyze(other).finding("cpu-op-overhead")
        assert not g.fixes[0].description.startswith("Call the model and the loss once"), other


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # importing transformers
def test_the_generation_pipeline_fix_gives_each_prompts_text():
    """The text-generation pipeline fix, run as given (its max_new_tokens aside) on a GPT-2 built
    from a config: the whole list with a batch size, left-padded, gives the texts that calling the
    pipeline once per prompt gives (benchmarks/op_overhead.py --generation: 0.83 of the time saved)."""
    pytest.importorskip("transformers")
    import snippets_collect as sc
    from transformers import pipeline

    from gpumagic.analysis.rules.opoverhead import PIPELINE_GENERATE_CODE

    ns = sc._language_model("cpu")
    pipe = pipeline("text-generation", model=ns["lm"], tokenizer=ns["tokenizer"], device="cpu")
    prompts = ["hello world", "the cat sat on the mat", "the mat", "hello cat"]
    settings = {"max_new_tokens": 6, "do_sample": False}
    one_by_one = [pipe(p, **settings)[0]["generated_text"] for p in prompts]
    space = {"pipe": pipe, "prompts": prompts, "settings": settings}
    exec(compile(PIPELINE_GENERATE_CODE.replace("max_new_tokens=40", "**settings"), "<fix>", "exec"), space)
    assert [o[0]["generated_text"] for o in space["outputs"]] == one_by_one
    assert pipe.tokenizer.padding_side == "left"
    f = analyze(GENERATE).finding("cpu-op-overhead")
    assert any(x.code == PIPELINE_GENERATE_CODE.strip("\n") for x in f.fixes)


def test_a_recurrent_cell_called_once_a_time_step_gets_the_fused_layer_first():
    """A decoder's ``nn.GRUCell`` in a Python loop over time steps (teacher forcing): the fused layer
    over the whole sequence comes first, with the cell's weights; beside an ``nn.GRU`` (an encoder)
    the compile fix says TorchDynamo leaves that layer out of its graphs."""
    cells = analyze(_steps(1400, 2.0, name="aten::gru_cell", every=70)).finding("cpu-op-overhead")
    assert "calls a recurrent cell 20 times a step" in cells.fixes[0].description
    assert "torch.nn.GRU(cell.input_size, cell.hidden_size" in cells.fixes[0].code
    assert "allow_rnn" not in cells.fixes[1].description  # no fused layer in the trace
    few = analyze(_steps(1400, 2.0, name="aten::gru_cell", every=200)).finding("cpu-op-overhead")  # 7 a step
    assert "recurrent cell" not in few.fixes[0].description
    encoder = analyze(_steps(1400, 2.0, name="aten::gru", every=200)).finding("cpu-op-overhead")
    assert "allow_rnn is False" in encoder.fixes[0].description and "torch.compile" in encoder.fixes[0].code


@pytest.mark.parametrize("cell_class", ["GRUCell"])
def test_the_cell_fix_gives_the_loops_hidden_states(cell_class):
    torch = pytest.importorskip("torch")
    from gpumagic.analysis.rules.opoverhead import CELL_LAYER_CODE

    torch.manual_seed(0)
    cell = getattr(torch.nn, cell_class)(8, 16)
    step_inputs, h0 = torch.randn(4, 5, 8), torch.randn(4, 16)
    ns = {"torch": torch, "cell": cell, "step_inputs": step_inputs, "h0": h0}
    exec(compile(CELL_LAYER_CODE, "<fix>", "exec"), ns)
    h, states = h0, []
    for t in range(step_inputs.shape[1]):
        h = cell(step_inputs[:, t], h)
        states.append(h)
    assert torch.allclose(ns["outputs"], torch.stack(states, 1), atol=1e-6)
    assert torch.allclose(ns["h_last"][0], h, atol=1e-6)
