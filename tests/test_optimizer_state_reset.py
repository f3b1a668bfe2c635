"""``optimizer-state-reset``: every update creates the optimizer's per-parameter state again, as a
loop that builds its optimizer every step does (torch.optim creates that state at a parameter's
first update only)."""

from __future__ import annotations

import glob
import os
import warnings

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze

ID = "optimizer-state-reset"
NODE = "torch::autograd::AccumulateGrad"
WRAPPER = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
#: What each optimizer creates at a parameter's first update, as torch 2.13 records it (checked
#: with the profiler, foreach on and off), and what it runs in every update.
ADAM = (("aten::zeros_like", "aten::zeros_like"), ("aten::lerp_", "aten::mul_", "aten::addcmul_"))
SGD_MOMENTUM = (("aten::clone",), ("aten::mul_", "aten::add_"))
RPROP = (("aten::zeros", "aten::zeros_like", "aten::full_like"), ("aten::clone", "aten::mul"))


def _loop(steps: int = 6, params: int = 4, cls: str = "Adam", ops=ADAM, fresh: bool = True, first_creates: bool = True,
          per_step_zeros: int = 0, closure: bool = False, second: str | None = None, wrapper: str | None = None,
          node_wrapper: bool = True) -> dict:
    """CPU training steps: a forward, a backward writing ``params`` gradients, then the update
    (``Optimizer.step#<cls>.step``). The update creates the optimizer's state (``ops[0]`` per
    parameter) when ``fresh`` (every update) or at the first update (``first_creates``), and runs
    ``ops[1]`` per parameter always, plus ``per_step_zeros`` ``aten::zeros`` calls (a buffer or
    two every update). ``closure``: the forward and backward run inside the update (LBFGS).
    ``second``: another optimizer's update after the same backward. ``wrapper``: an outer
    optimizer's update around the inner one."""
    tb = TraceBuilder(cc=None)
    t = 0.0
    create_us = 6 * len(ops[0]) * params
    for i in range(steps):
        creates = fresh or (first_creates and i == 0)
        step_us = 100 + params * 32 + (create_us if creates else 0) + params * 6 * len(ops[1]) + 40
        tb.step(i + 1, t, step_us)
        at = t + 2

        def forward_backward(at: float) -> float:
            tb.op("aten::addmm", at, 30)
            at += 40
            for _ in range(params):
                if node_wrapper:
                    tb.op(WRAPPER, at, 30)
                tb.op(NODE, at + 1, 28)
                tb.op("aten::detach", at + 3, 10)
                at += 32
            return at

        if not closure:
            at = forward_backward(at)
        span = (create_us if creates else 0) + params * 6 * len(ops[1]) + 10 + per_step_zeros * 6
        span += (params * 32 + 50) if closure else 0
        if wrapper:
            tb.op(f"Optimizer.step#{wrapper}.step", at - 1, span + 2, cat="user_annotation")
        tb.op(f"Optimizer.step#{cls}.step", at, span, cat="user_annotation")
        a = at + 2
        if closure:
            a = forward_backward(a)
        for _ in range(per_step_zeros):
            tb.op("aten::zeros", a, 4)
            a += 6
        for _ in range(params):
            for name in (ops[0] if creates else ()) + ops[1]:
                tb.op(name, a, 4)
                a += 6
        if second:
            tb.op(f"Optimizer.step#{second}.step", at + span + 5, 20, cat="user_annotation")
            for k in range(params):
                tb.op("aten::zeros_like", at + span + 6 + 3 * k, 2)
        t += step_us + 60
    return tb.to_dict()


def test_a_new_adam_every_step():
    f = analyze(_loop()).finding(ID)
    assert f is not None
    n = f.evidence.numbers
    assert n["updates"] == 6 and n["parameters"] == 4 and n["created_per_param"] == 2.0 and n["optimizer"] == "Adam"
    assert f.est_gain == 0 and f.severity == "medium"
    assert "torch.optim.Adam(model.parameters()" in f.fixes[0].code and "before the loop" in f.fixes[0].code
    assert [w.label for w in f.evidence.windows] == ["update creating state"] * 6


def test_a_kept_optimizer_creating_its_state_at_the_first_update_is_silent():
    assert analyze(_loop(fresh=False)).finding(ID) is None
    assert analyze(_loop(fresh=False, first_creates=False)).finding(ID) is None


def test_sgd_momentum_is_created_by_a_clone():
    f = analyze(_loop(cls="SGD", ops=SGD_MOMENTUM)).finding(ID)
    assert f is not None and f.evidence.numbers["created_per_param"] == 1.0 and "clone" in f.evidence.summary
    assert analyze(_loop(cls="SGD", ops=SGD_MOMENTUM, fresh=False)).finding(ID) is None


def test_a_clone_in_every_update_of_another_optimizer_is_not_state():
    """Rprop clones in every update; only its zeros count, which a kept optimizer runs once."""
    assert analyze(_loop(cls="Rprop", ops=RPROP, fresh=False)).finding(ID) is None
    assert analyze(_loop(cls="Rprop", ops=RPROP)).finding(ID) is not None


def test_a_buffer_or_two_made_in_every_update_is_silent():
    """An optimizer that makes a norm buffer in each update (apex's LAMB does): far below one a parameter."""
    assert analyze(_loop(params=20, fresh=False, per_step_zeros=2)).finding(ID) is None


def test_a_closure_optimizer_is_not_judged():
    """LBFGS runs the forward and backward inside its step: their operators are not its state."""
    assert analyze(_loop(closure=True, cls="LBFGS", ops=(("aten::zeros_like",), ("aten::add_",)))).finding(ID) is None


def test_a_second_optimizer_after_the_same_backward_is_not_judged():
    """A second optimizer's first update after the same backward: not judged, the first one's updates are."""
    assert analyze(_loop(fresh=False, second="AdamW")).finding(ID) is None
    f = analyze(_loop(second="AdamW")).finding(ID)
    assert f is not None and f.evidence.numbers["optimizer"] == "Adam"


def test_a_wrapper_and_its_inner_optimizer_count_as_one_update():
    f = analyze(_loop(wrapper="Lookahead")).finding(ID)
    assert f is not None and f.evidence.numbers["updates"] == 6 and f.evidence.numbers["optimizer"] == "Lookahead"
    assert "YourOptimizer" in f.fixes[0].code  # not a torch.optim class: no constructor guessed
    assert analyze(_loop(wrapper="Lookahead", fresh=False)).finding(ID) is None


def test_too_few_updates_and_the_2021_spelling():
    assert analyze(_loop(steps=2)).finding(ID) is None
    assert analyze(_loop(node_wrapper=False)).finding(ID) is not None


def _record(make, fresh: bool, steps: int = 5):
    import torch

    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = make(model.parameters())
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    with gpumagic.profile(steps=steps, skip=1, display=False) as run:
        for _ in range(steps + 3):
            if fresh:
                optimizer = make(model.parameters())
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    return run.report


def test_recorded_accumulation_counts_the_parameters_once():
    """Four micro-batches an update: each gradient is written four times, the parameters stay four."""
    import torch

    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    with gpumagic.profile(steps=5, skip=1, display=False) as run:
        for _ in range(8):
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
            for _ in range(4):
                torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    f = run.report.finding(ID)
    assert f is not None and f.evidence.numbers["parameters"] == 4 and f.evidence.numbers["created_per_param"] == 1.0


def _optimizers():
    import torch

    return {
        "Adam": lambda p: torch.optim.Adam(p, lr=1e-3),
        "AdamW-foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
        "Adam-fused": lambda p: torch.optim.Adam(p, lr=1e-3, fused=True),
        "SGD-momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
        "RMSprop": lambda p: torch.optim.RMSprop(p, lr=1e-3),
        "Rprop": lambda p: torch.optim.Rprop(p, lr=1e-3),
        "Adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-3),
        "NAdam": lambda p: torch.optim.NAdam(p, lr=1e-3),
    }


@pytest.mark.parametrize("name", list(_optimizers()))
def test_recorded_loops_built_anew_fire_and_kept_stay_silent(name):
    """Recorded here with torch on the CPU: the optimizer built in the loop fires, built once not."""
    make = _optimizers()[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh, kept = _record(make, True), _record(make, False)
    f = fresh.finding(ID)
    assert f is not None and f.evidence.numbers["parameters"] == 4
    assert fresh.metrics["steps"]["count"] == 5  # the step window holds with a new optimizer each step
    assert kept.finding(ID) is None


def test_sgd_without_momentum_has_no_state_to_lose():
    import torch

    assert _record(lambda p: torch.optim.SGD(p, lr=1e-2), True).finding(ID) is None


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "*.json.gz"))))
def test_silent_on_every_recorded_trace(path):
    assert analyze(path).finding(ID) is None
