"""``unused-gradients``: each backward pass writes gradients for more tensors than the optimizers
that stepped hold (a head-only optimizer over a backbone left trainable)."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.render._format import fmt_gain

ID = "unused-gradients"
NODE = "torch::autograd::AccumulateGrad"
WRAPPER = "autograd::engine::evaluate_function: "


def _loop(steps: int = 6, written: int = 14, held: int | None = 2, accum: int = 1, seq: bool = True,
          checkpointed: bool | str = False) -> dict:
    """CPU training steps, ``accum`` forward and backward passes each, then one update. Each
    forward builds ``written`` nodes (sequence numbers counting up); its backward runs them from
    the highest down, each followed by the AccumulateGrad of one parameter (``written`` gradients a
    pass). ``held``: the parameters the optimizers hold, as a gpumagic capture records them (None:
    not a capture). ``seq``: the backward nodes carry their numbers (2021 traces do not).
    ``checkpointed``: a reentrant checkpoint's inner backward runs inside the first node, with
    higher numbers (its recomputation's)."""
    tb = TraceBuilder(cc=None)
    counter = 0
    t = 0.0
    for i in range(steps):
        step_us = accum * (written * 12 + written * 40 + 20) + 60
        tb.step(i + 1, t, step_us)
        at = t + 2
        tb.op("Optimizer.zero_grad#SGD.zero_grad", at, 4, cat="user_annotation")
        at += 6
        for _ in range(accum):
            first = counter
            for _ in range(written):
                tb.add(cat="cpu_op", name="aten::addmm", ts=at, dur=10, args={"Sequence number": counter})
                counter += 1
                at += 12
            for k in range(written):
                args = {"Sequence number": counter - 1 - k} if seq else {}
                tb.add(cat="cpu_op", name=WRAPPER + "AddmmBackward0", ts=at, dur=20, args=args)
                tb.add(cat="cpu_op", name="AddmmBackward0", ts=at + 1, dur=18, args=args)
                if checkpointed and k == 0:
                    for j in range(3):  # the inner backward's nodes: numbers above the pass's root
                        inner = {"Sequence number": counter + 100 + j} if seq else {}
                        tb.add(cat="cpu_op", name=WRAPPER + "MmBackward0", ts=at + 2 + 5 * j, dur=4, args=inner)
                    if checkpointed == "reentrant":  # and it writes its detached input's gradient
                        tb.op(WRAPPER + NODE, at + 17, 2)
                tb.op(WRAPPER + NODE, at + 22, 14)
                tb.op(NODE, at + 23, 12)
                at += 40
            assert counter - first == written
            at += 4
        tb.op("Optimizer.step#SGD.step", at, 20, cat="user_annotation")
        tb.op("aten::add_", at + 2, 4)
        t += step_us + 40
    d = tb.to_dict()
    if held is not None:
        d["gpumagic"] = {"format": 1, "label": "", "notes": [], "versions": {}, "clock": {"anchor_epoch_ns": None},
                         "capture": {"optimizer_steps_seen": steps, "optimizer_parameters": held}}
    return d


def test_a_head_only_optimizer_over_a_trainable_backbone():
    f = analyze(_loop()).finding(ID)
    assert f is not None
    n = f.evidence.numbers
    assert n["gradients_per_pass"] == 14 and n["optimizer_parameters"] == 2 and n["unused_gradients"] == 12
    assert 0 < f.est_gain <= n["backward_frac"] and f.est_gain == pytest.approx(n["backward_frac"] * 12 / 14, abs=1e-3)
    assert "p.requires_grad_(False)" in f.fixes[0].code and "if id(p) not in trained" in f.fixes[0].code
    assert fmt_gain(f.est_gain, f.gain_method).startswith("about") and f.gain_method.startswith("estimate")


def test_every_gradient_held_is_silent():
    assert analyze(_loop(held=14)).finding(ID) is None
    assert analyze(_loop(held=20)).finding(ID) is None  # frozen parameters in the optimizer: fewer written


def test_gradient_accumulation_counts_passes_not_micro_batches():
    assert analyze(_loop(held=14, accum=4)).finding(ID) is None
    f = analyze(_loop(held=2, accum=4)).finding(ID)
    assert f is not None and f.evidence.numbers["gradients_per_pass"] == 14


def test_a_reentrant_checkpoints_inner_backward_is_not_a_pass():
    assert analyze(_loop(held=14, checkpointed=True)).finding(ID) is None
    assert analyze(_loop(held=2, checkpointed=True)).finding(ID) is not None


def test_gradients_written_inside_another_node_are_not_judged():
    """A reentrant checkpoint's inner backward writes its detached inputs' gradients too: the
    writes no longer count parameters (recorded on torch 2.13: 15 writes a pass for 10 parameters)."""
    assert analyze(_loop(held=2, checkpointed="reentrant")).finding(ID) is None


def test_an_input_or_two_that_requires_grad_is_silent():
    assert analyze(_loop(written=14, held=12)).finding(ID) is None  # two extra: below 4


def test_without_a_capture_or_sequence_numbers_it_is_not_judged():
    assert analyze(_loop(held=None)).finding(ID) is None
    assert analyze(_loop(seq=False)).finding(ID) is None
    assert analyze(_loop(steps=2)).finding(ID) is None


def _record(mode: str):
    import torch

    import gpumagic

    torch.manual_seed(0)
    backbone = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(4)))
    head = torch.nn.Linear(64, 4)
    model = torch.nn.Sequential(backbone, head)
    if mode == "frozen":
        backbone.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters() if mode == "all" else head.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
    with gpumagic.profile(steps=5, skip=1, display=False) as run:
        for _ in range(8):
            opt.zero_grad()
            for _ in range(2 if mode == "head, accumulated" else 1):
                torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return run.report


@pytest.mark.parametrize("mode", ["head", "head, accumulated"])
def test_recorded_head_only_fine_tuning_fires(mode):
    f = _record(mode).finding(ID)
    assert f is not None
    assert f.evidence.numbers["gradients_per_pass"] == 10 and f.evidence.numbers["optimizer_parameters"] == 2


@pytest.mark.parametrize("mode", ["frozen", "all"])
def test_recorded_frozen_or_whole_model_is_silent(mode):
    assert _record(mode).finding(ID) is None


def test_recorded_reentrant_checkpointing_is_silent():
    import torch
    from torch.utils.checkpoint import checkpoint

    import gpumagic

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(4))
    head = torch.nn.Linear(64, 4)
    opt = torch.optim.SGD([*blocks.parameters(), *head.parameters()], lr=1e-3)
    x, y = torch.randn(32, 64, requires_grad=True), torch.randint(0, 4, (32,))

    def forward(h):
        for b in blocks:
            h = checkpoint(b, h, use_reentrant=True)
        return head(h)

    with gpumagic.profile(steps=5, skip=1, display=False) as run:
        for _ in range(8):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(forward(x), y).backward()
            opt.step()
    assert run.report.finding(ID) is None


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "*.json.gz"))))
def test_silent_on_every_recorded_trace(path):
    assert analyze(path).finding(ID) is None
