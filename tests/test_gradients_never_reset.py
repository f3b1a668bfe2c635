"""``gradients-never-reset``: every step's backward adds to gradients an earlier step left, after an
optimizer step, and nothing resets them (a loop without ``optimizer.zero_grad()``)."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze

WRAPPER = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
NODE = "torch::autograd::AccumulateGrad"


def _loop(steps: int = 6, params: int = 4, reset: str = "none", update_every: int = 1, wrapper: bool = True) -> dict:
    """CPU training steps of ``params`` parameters, as torch 2.13 records them. ``reset``: "none"
    (no zeroing), "optimizer" (``optimizer.zero_grad()``: grads set to None), "none_by_hand"
    (``p.grad = None``: nothing recorded), "in_place" (``aten::zero_`` per parameter). A
    parameter's AccumulateGrad adds in place (``aten::add_``) when a gradient is there, else
    stores the new one (``aten::detach``). ``update_every``: the optimizer steps (and the
    optimizer's reset) once every that many recorded steps (gradient accumulation)."""
    tb = TraceBuilder(cc=None)
    has_grad = False
    t = 0.0
    for i in range(steps):
        step_us = 60 + params * 40 + 40
        tb.step(i + 1, t, step_us)
        at = t + 2
        updating = (i + 1) % update_every == 0
        if reset == "optimizer" and i % update_every == 0:
            tb.op("Optimizer.zero_grad#SGD.zero_grad", at, 4, cat="user_annotation")
            has_grad = False
        elif reset == "none_by_hand" and i % update_every == 0:
            has_grad = False
        elif reset == "in_place" and i % update_every == 0:
            for k in range(params):
                tb.op("aten::zero_", at + k, 1)
        at += 10
        tb.op("aten::addmm", at, 30)
        at += 40
        for _ in range(params):
            if wrapper:
                tb.op(WRAPPER, at, 30)
            tb.op(NODE, at + 1, 28)
            tb.op("aten::add_" if has_grad else "aten::detach", at + 3, 10)
            at += 32
        has_grad = True
        if updating:
            tb.op("Optimizer.step#SGD.step", at, 30, cat="user_annotation")
            for k in range(params):
                tb.op("aten::add_", at + 2 + 6 * k, 4)  # the update itself: p.add_(grad, alpha=-lr)
        t += step_us + 10
    return tb.to_dict()


def test_a_loop_that_never_resets_the_gradients():
    f = analyze(_loop()).finding("gradients-never-reset")
    assert f is not None
    n = f.evidence.numbers
    assert n["updates"] == 5 and n["parameters"] == 4 and n["adding_frac"] == 1.0
    assert f.est_gain == 0 and "optimizer.zero_grad()" in f.fixes[0].code
    assert "never reset" in f.title


def test_the_2021_spelling_without_the_engine_span():
    assert analyze(_loop(wrapper=False)).finding("gradients-never-reset") is not None


@pytest.mark.parametrize("reset", ["optimizer", "none_by_hand", "in_place"])
def test_a_reset_of_any_kind_is_silent(reset):
    assert analyze(_loop(reset=reset)).finding("gradients-never-reset") is None


def test_gradient_accumulation_on_purpose_is_silent():
    """Four recorded micro-steps per update, the gradients reset after each update (by the
    optimizer, or set to None by hand: nothing recorded); and a window inside one long
    accumulation, with no update in it."""
    for reset in ("optimizer", "none_by_hand"):
        assert analyze(_loop(steps=16, reset=reset, update_every=4)).finding("gradients-never-reset") is None
    assert analyze(_loop(steps=8, update_every=100)).finding("gradients-never-reset") is None


def test_never_reset_with_an_update_every_few_steps_fires():
    """Accumulating forever, an update every second step: each update's gradients survive it."""
    f = analyze(_loop(steps=10, update_every=2)).finding("gradients-never-reset")
    assert f is not None and f.evidence.numbers["updates"] == 4


@pytest.mark.parametrize("reset", ["optimizer", "none_by_hand"])
def test_a_long_accumulation_reads_only_the_first_pass_after_each_update(reset):
    """Sixteen micro-batches per update (a Hugging Face Trainer with gradient_accumulation_steps=16
    read "never reset" on this project's machine): after the reset the first pass stores the
    gradients and the other fifteen add to them on purpose, 15/16 of the writes between two
    updates. The first pass after each update is what tells."""
    assert analyze(_loop(steps=64, reset=reset, update_every=16)).finding("gradients-never-reset") is None
    f = analyze(_loop(steps=64, update_every=16)).finding("gradients-never-reset")  # never reset: still found
    assert f is not None and f.evidence.numbers["parameters"] == 4 and f.evidence.numbers["updates"] == 3


def test_too_few_updates_are_silent():
    assert analyze(_loop(steps=3)).finding("gradients-never-reset") is None  # two updates with a backward after


def _record(reset: bool):
    import torch

    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    with gpumagic.profile(steps=5, skip=1, display=False) as run:
        for _ in range(8):
            if reset:
                opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return run.report


def test_a_recorded_loop_without_zero_grad():
    """Recorded here with torch on the CPU: without ``optimizer.zero_grad()`` it fires, with it not."""
    f = _record(reset=False).finding("gradients-never-reset")
    assert f is not None and f.evidence.numbers["parameters"] == 4
    assert _record(reset=True).finding("gradients-never-reset") is None


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "*.json.gz"))))
def test_silent_on_every_recorded_trace(path):
    assert analyze(path).finding("gradients-never-reset") is None
