"""``updates-without-gradients``: every backward writes gradients, yet no optimizer update runs
anything (torch.optim skips parameters whose ``.grad`` is None): ``zero_grad()`` between
``backward()`` and ``step()``, or an optimizer over other parameters."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze

ID = "updates-without-gradients"
NODE = "torch::autograd::AccumulateGrad"
WRAPPER = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"


def _loop(steps: int = 6, params: int = 4, reset: str = "before", empty: bool = True, working_every: int = 0,
          second: str | None = None) -> dict:
    """CPU training steps: forward, backward writing ``params`` gradients, the update. ``reset``:
    where ``Optimizer.zero_grad#`` runs — "before" the forward, "between" the backward and the
    update, or "none". ``empty``: the update runs no operator (no gradient found); else one
    ``aten::add_`` a parameter. ``working_every``: every that many steps, an update that works
    anyway. ``second``: "working" or "empty", a second optimizer's update after the same backward."""
    tb = TraceBuilder(cc=None)
    t = 0.0
    for i in range(steps):
        step_us = 100 + params * 32 + params * 6 + 80
        tb.step(i + 1, t, step_us)
        at = t + 2
        if reset == "before":
            tb.op("Optimizer.zero_grad#Adam.zero_grad", at, 4, cat="user_annotation")
        at += 8
        tb.op("aten::addmm", at, 30)
        at += 40
        for _ in range(params):
            tb.op(WRAPPER, at, 30)
            tb.op(NODE, at + 1, 28)
            tb.op("aten::detach", at + 3, 10)
            at += 32
        if reset == "between":
            tb.op("Optimizer.zero_grad#Adam.zero_grad", at, 4, cat="user_annotation")
            at += 6
        works = not empty or (working_every and i % working_every == 0)
        span = params * 6 + 4 if works else 3
        tb.op("Optimizer.step#Adam.step", at, span, cat="user_annotation")
        if works:
            for k in range(params):
                tb.op("aten::add_", at + 2 + 6 * k, 4)
        at += span + 4
        if second:
            tb.op("Optimizer.step#SGD.step", at, 10, cat="user_annotation")
            if second == "working":
                tb.op("aten::add_", at + 2, 4)
        t += step_us + 20
    return tb.to_dict()


def test_zero_grad_between_backward_and_step():
    f = analyze(_loop(reset="between")).finding(ID)
    assert f is not None and f.severity == "high"
    n = f.evidence.numbers
    assert n["updates"] == 6 and n["gradients_written"] == 4 and n["zero_grad_between"] == 6
    assert "between backward() and step()" in f.evidence.summary
    assert f.fixes[0].code.index("zero_grad") < f.fixes[0].code.index("backward()")


def test_no_reset_in_between_names_the_other_causes():
    """Gradients set to None by hand (nothing recorded), or an optimizer over other parameters."""
    for reset in ("none", "before"):
        f = analyze(_loop(reset=reset)).finding(ID)
        assert f is not None and f.severity == "medium" and f.evidence.numbers["zero_grad_between"] == 0
        assert "other parameters" in f.evidence.summary and f.fixes[0].diagnostic


def test_updates_that_run_anything_are_silent():
    assert analyze(_loop(empty=False)).finding(ID) is None
    assert analyze(_loop(working_every=3)).finding(ID) is None  # one update that works in the window


def test_a_frozen_optimizer_beside_one_that_works_is_silent():
    """The first optimizer's parameters are frozen (its updates run nothing); the second, after
    the same backward, updates the rest."""
    assert analyze(_loop(second="working")).finding(ID) is None
    assert analyze(_loop(second="empty")).finding(ID) is not None


def test_too_few_updates_are_silent():
    assert analyze(_loop(steps=2, reset="between")).finding(ID) is None


def _record(mode: str, stack: bool = False):
    import torch

    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if mode == "other model":  # the model rebuilt after the optimizer was made
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    with gpumagic.profile(steps=5, skip=1, display=False, stack=stack) as run:
        for _ in range(8):
            if mode in ("right", "other model"):
                optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if mode == "between":
                optimizer.zero_grad()
            optimizer.step()
    return run.report


@pytest.mark.parametrize("stack", [False, True])
def test_recorded_zero_grad_between_backward_and_step(stack):
    """Recorded here with torch on the CPU; with ``stack`` the empty updates hold Python frames, not operators."""
    f = _record("between", stack=stack).finding(ID)
    assert f is not None and f.evidence.numbers["zero_grad_between"] == 5 and f.evidence.numbers["gradients_written"] == 4


def test_recorded_optimizer_over_another_model():
    f = _record("other model").finding(ID)
    assert f is not None and f.evidence.numbers["zero_grad_between"] == 0
    assert _record("right").finding(ID) is None


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "*.json.gz"))))
def test_silent_on_every_recorded_trace(path):
    assert analyze(path).finding(ID) is None
