"""``unfused-optimizer``: a CPU loop's Adam/AdamW/Adagrad steps run the per-parameter for-loop where
``fused=True`` runs one kernel (``analysis.optimizerimpl``, ``rules.optimizer``)."""

from __future__ import annotations

import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.analysis.context import build_context
from gpumagic.analysis.optimizerimpl import optimizer_steps
from gpumagic.trace import load


def _loop(opt: str = "Adam", inner: tuple[str, ...] = ("aten::lerp_", "aten::mul_", "aten::addcmul_", "aten::sqrt"),
          opt_us: float = 300, step_us: float = 1_000, steps: int = 6, gpu: bool = False) -> TraceBuilder:
    """A training loop whose optimizer step (``opt_us`` of ``step_us``) holds ``inner`` operators."""
    tb = TraceBuilder(cc=(8, 0) if gpu else None)
    for i in range(steps):
        t = i * step_us
        tb.step(i + 1, t, step_us)
        tb.op("aten::addmm", t + 10, step_us - opt_us - 150)
        tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + step_us - opt_us - 130, 100)
        o = t + step_us - opt_us - 20
        tb.op(f"Optimizer.step#{opt}.step", o, opt_us, cat="user_annotation")
        each = opt_us / (len(inner) + 1)
        for j, name in enumerate(inner):
            tb.op(name, o + 5 + j * each, each - 10)
        if gpu:
            tb.kernel("ampere_sgemm_128x64_nn", t + 20, 200, launch_ts=t + 12)
    return tb


def _bundle(tb: TraceBuilder, torch_version: str | None = None) -> dict:
    d = tb.to_dict()
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "machine": {}, "clock": {"anchor_epoch_ns": None},
                     "versions": {"torch": torch_version} if torch_version else {}}
    return d


def test_a_recorded_for_loop_adam_gets_the_fused_one_with_the_steps_share_as_its_bound():
    """Recorded on this project's 2-core machine (tests/data/MANIFEST.md): fused=True saved 0.37 of
    the plain loop's step where the steps took 0.50 of the profiled window."""
    r = analyze(os.path.join(DATA, "cpu_adam_forloop.json.gz"))
    assert r.metrics.host.optimizer_impl == "for-loop"
    f = r.finding("unfused-optimizer")
    assert f.est_gain == pytest.approx(r.metrics.host.optimizer_step_frac, abs=1e-3) and f.est_gain > 0.37
    assert not f.gain_method.startswith("estimate") and "the most fusing them can save" in f.gain_method
    assert "for-loop implementation" in f.evidence.summary and f.evidence.numbers["optimizer_steps"] >= 7
    assert [x.code for x in f.fixes] == [
        "optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=True)   # keep your other arguments"]
    assert f.evidence.windows and {w.label for w in f.evidence.windows} == {"optimizer step"}


def test_a_recorded_fused_adam_is_silent():
    r = analyze(os.path.join(DATA, "cpu_adam_fused.json.gz"))
    assert r.metrics.host.optimizer_impl == "fused" and r.finding("unfused-optimizer") is None


def test_foreach_is_told_apart_and_adamw_adds_the_trainer_setting():
    f = analyze(_bundle(_loop("AdamW", ("aten::_foreach_add_", "aten::_foreach_lerp_")))).finding("unfused-optimizer")
    assert "foreach implementation" in f.evidence.summary and "foreach=True" in f.why
    assert any('optim="adamw_torch_fused"' in x.code for x in f.fixes)
    for x in f.fixes:
        compile(x.code.replace("...", "x"), "<fix>", "exec")


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"opt": "SGD", "inner": ("aten::add_",)}, "SGD without momentum: one operator a parameter, nothing to merge"),
    ({"opt": "SGD", "inner": ("aten::_foreach_mul_", "aten::_foreach_add_")}, "SGD already foreach"),
    ({"opt": "RMSprop"}, "no fused kernel on the CPU"),
    ({"opt": "MyAdam"}, "a subclass or another library's optimizer"),
    ({"opt_us": 40}, "under 5 % of the window"),
    ({"gpu": True}, "a GPU run: launch-bound's ground"),
    ({"inner": ("aten::_foreach_add_", "aten::_fused_adam_")}, "already fused"),
])
def test_silent_where_fused_is_no_fix(kwargs, why):
    assert analyze(_bundle(_loop(**kwargs))).finding("unfused-optimizer") is None, why


def test_sgd_with_momentum_gets_foreach():
    """SGD's for-loop step with momentum buffers (aten::mul_ then add_ a parameter): foreach=True,
    not fused (measured slower than foreach on the CPU)."""
    f = analyze(_bundle(_loop("SGD", ("aten::mul_", "aten::add_", "aten::add_")))).finding("unfused-optimizer")
    assert f.title == "The optimizer (SGD) updates the parameters one at a time" and "momentum" in f.why
    assert [x.code for x in f.fixes] == [
        "optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, foreach=True)   # keep your other arguments"]
    assert "fused=True one kernel" not in f.why


def test_a_recorded_sgd_with_momentum():
    """benchmarks/optimizer_fused.py --record: an MLP 256-512-512-10 on 64 rows, SGD with momentum
    0.9; unprofiled, foreach=True saved 0.130 of the step, fused=True 0.080."""
    f = analyze(os.path.join(DATA, "cpu_sgd_momentum.json.gz")).finding("unfused-optimizer")
    assert f.evidence.numbers["implementation"] == "for-loop" and "foreach=True" in f.fixes[0].code
    assert f.est_gain > 0.13 and f.gain_method.startswith("the optimizer steps' share")


def _two_optimizers(adam_us: float, sparse_us: float = 500, steps: int = 6, sparse_backward: bool = False) -> dict:
    """A loop stepping a SparseAdam (sparse embeddings: no fused kernel) for ``sparse_us`` and an
    Adam for ``adam_us`` of each 1 ms step; with ``sparse_backward``, the embedding's backward
    makes its sparse gradient as torch 2.13 records it."""
    tb = TraceBuilder(cc=None)
    for i in range(steps):
        t = i * 1_000
        tb.step(i + 1, t, 1_000)
        tb.op("aten::embedding_bag", t + 10, 200)
        tb.op("autograd::engine::evaluate_function: EmbeddingBagBackward0", t + 220, 100)
        if sparse_backward:
            tb.op("aten::_embedding_bag_sparse_backward", t + 230, 50)
        tb.op("Optimizer.step#SparseAdam.step", t + 330, sparse_us, cat="user_annotation")
        tb.op("aten::_sparse_coo_tensor_unsafe", t + 340, sparse_us - 20)
        o = t + 340 + sparse_us
        tb.op("Optimizer.step#Adam.step", o, adam_us, cat="user_annotation")
        for j, name in enumerate(("aten::lerp_", "aten::mul_", "aten::addcmul_")):
            tb.op(name, o + 1 + j * adam_us / 3, adam_us / 3 - 2)
    return _bundle(tb)


def test_another_optimizers_steps_are_not_fusings_gain():
    """SparseAdam's steps (most of the window) have no fused kernel: the gain is Adam's share alone,
    and a small Adam beside them is silent."""
    f = analyze(_two_optimizers(adam_us=100)).finding("unfused-optimizer")
    assert f is not None and f.est_gain == pytest.approx(0.1, abs=0.01)  # Adam's 100 µs of each 1 ms, not 0.6
    assert f.evidence.numbers["optimizer_steps"] == 6 and f.evidence.numbers["operators_per_step"] == 3
    assert f.evidence.numbers["implementation"] == "for-loop"
    assert [w.end_ns - w.start_ns for w in f.evidence.windows] == [100_000] * 6  # Adam's steps, not SparseAdam's
    assert analyze(_two_optimizers(adam_us=20)).finding("unfused-optimizer") is None  # 2 %, however big SparseAdam's


def test_with_sparse_gradients_the_fix_gives_the_fused_step_the_dense_parameters_only():
    """A fused (or foreach) step raises on a sparse gradient: the fix leaves the sparse embeddings'
    parameters to their own optimizer, and runs on a model that has one."""
    import torch
    from torch import nn

    plain = analyze(_two_optimizers(adam_us=100)).finding("unfused-optimizer")
    assert "model.parameters(), lr=lr, fused=True" in plain.fixes[0].code
    f = analyze(_two_optimizers(adam_us=100, sparse_backward=True)).finding("unfused-optimizer")
    code = f.fixes[0].code
    assert "torch.optim.Adam(dense_params, lr=lr, fused=True)" in code

    class Recommender(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.EmbeddingBag(50, 4, sparse=True)
            self.mlp = nn.Linear(4, 1)

        def forward(self, ids):
            return self.mlp(self.emb(ids)).sum()

    torch.manual_seed(0)
    model = Recommender()
    with pytest.raises(RuntimeError, match="sparse"):  # what the fix avoids
        model(torch.randint(0, 50, (3, 2))).backward()
        torch.optim.Adam(model.parameters(), lr=0.1, fused=True).step()
    model.zero_grad(set_to_none=True)
    ns = {"torch": torch, "model": model, "lr": 0.1}
    exec(compile(code, "<fix>", "exec"), ns)
    assert {id(p) for p in ns["dense_params"]} == {id(p) for p in model.mlp.parameters()}
    before = model.mlp.weight.detach().clone()
    model(torch.randint(0, 50, (3, 2))).backward()
    ns["optimizer"].step()
    assert not torch.equal(model.mlp.weight, before)


def test_an_older_torch_is_told_to_upgrade():
    f = analyze(_bundle(_loop(), torch_version="2.3.1+cpu")).finding("unfused-optimizer")
    assert "PyTorch 2.3.1+cpu, older than 2.4" in f.evidence.summary
    assert "older than" not in analyze(_bundle(_loop(), torch_version="2.13.0")).finding("unfused-optimizer").evidence.summary


def test_another_librarys_optimizer_has_no_implementation_named():
    """apex's FusedAdam (the A100 trace) runs kernels of its own: neither 'for-loop' nor a finding."""
    r = analyze(os.path.join(DATA, "a100_training_rank0.json.gz"))
    assert r.metrics.host.optimizer_impl is None and r.metrics.host.optimizer_step_frac is not None
    steps = optimizer_steps(build_context(load(os.path.join(DATA, "a100_training_rank0.json.gz"))))
    assert steps.classes == ("FusedAdam",)


def test_no_optimizer_step_no_metric():
    r = analyze(os.path.join(DATA, "h100_bert_small_inference.json.gz"))
    assert r.metrics.host.optimizer_step_frac is None and r.metrics.host.optimizer_impl is None


def test_a_closure_the_step_runs_is_the_models_time_not_the_optimizers():
    """``optimizer.step(closure)`` with Adam (as code written for LBFGS calls every optimizer):
    the 10 ms step holds the closure's 3 ms forward and 4 ms backward, and 3 ms of Adam's own
    for-loop operators; the optimizer's share is what is left of each 20 ms step."""
    tb = TraceBuilder(cc=None)
    for i in range(4):
        t = i * 20_000
        tb.step(i + 1, t, 20_000)
        tb.op("Optimizer.step#Adam.step", t + 1_000, 10_000, cat="user_annotation")
        tb.op("Optimizer.zero_grad#Adam.zero_grad", t + 1_100, 100, cat="user_annotation")
        tb.op("aten::addmm", t + 1_300, 3_000)
        tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 4_400, 4_000)
        for j, name in enumerate(("aten::lerp_", "aten::mul_", "aten::addcmul_", "aten::sqrt")):
            tb.op(name, t + 8_500 + j * 600, 550)
    r = analyze(tb.to_dict())
    med = r.metrics.phases.median_ms  # the forward runs to the backward's start, 0.1 ms after addmm ends
    assert (med.forward, med.backward) == pytest.approx((3.1, 4.0), abs=1e-3)
    assert r.metrics.host.optimizer_step_frac == pytest.approx((10_000 - 3_100 - 4_000) / 20_000, abs=1e-3)
    assert r.finding("unfused-optimizer").est_gain == pytest.approx(0.145, abs=1e-3)


def test_an_update_that_ends_just_inside_the_window_is_the_step_before_its(tmp_path):
    """gpumagic's capture ends a step in the optimizer's post-hook, inside ``Optimizer.step#``'s
    range: the update before the first recorded step ends a microsecond into the window. It was
    counted as a step of its own (9 updates in 8 recorded steps of tests/data/cpu_adam_forloop,
    324 operators a step for 364); a step counts where its middle falls in the window."""
    tb = _loop()
    tb.op("Optimizer.step#Adam.step", -299, 300, cat="user_annotation")  # the update before, ending at 1 µs
    ctx = build_context(load(tb.write(tmp_path / "t.json")))
    ev = ctx.trace.events
    updates = ctx.trace.name_ids(lambda n: n.startswith("Optimizer.step#"))[ev.name]
    assert int(ctx.events_in_window(updates).sum()) == 7  # the one before overlaps the window by 1 µs
    assert optimizer_steps(ctx).calls == 6
    n = analyze(os.path.join(DATA, "cpu_adam_forloop.json.gz")).finding("unfused-optimizer").evidence.numbers
    assert n["optimizer_steps"] == 8 and n["operators_per_step"] == pytest.approx(364, abs=1)
