"""``training-in-eval-mode``: with arguments recorded, every dropout call with ``p > 0`` in the
forward passes a backward ran through had ``train=False`` (``model.train()`` forgotten after a
validation)."""

from __future__ import annotations

import glob
import os
import warnings

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze

ID = "training-in-eval-mode"


def _loop(steps: int = 5, train: str = "False", p: str = "0.1", backward: bool = True, shapes: bool = True) -> dict:
    """Training steps of a two-layer model with one dropout between, as torch 2.13 records it with
    ``record_shapes``: each call's ``Sequence number`` (the next node's, for dropout) and its
    ``Concrete Inputs``; the backward's nodes carry the numbers of the nodes they run."""
    tb = TraceBuilder(cc=None)
    seq = 0
    t = 0.0
    for i in range(steps):
        tb.step(i + 1, t, 200)
        first = seq
        tb.add(cat="cpu_op", name="aten::addmm", ts=t + 2, dur=10, args=_args([[4, 8], [8, 8]], ["", ""], seq))
        seq += 1
        tb.add(cat="cpu_op", name="aten::dropout", ts=t + 14, dur=4, args=_args([[4, 8], [], []], ["", p, train], seq,
                                                                                  shapes))
        tb.add(cat="cpu_op", name="aten::addmm", ts=t + 20, dur=10, args=_args([[4, 8], [8, 8]], ["", ""], seq))
        seq += 1
        if backward:
            for k, s in enumerate(range(seq - 1, first - 1, -1)):
                tb.add(cat="cpu_op", name="autograd::engine::evaluate_function: AddmmBackward0", ts=t + 40 + 20 * k,
                       dur=15, args={"Sequence number": s})
        tb.op("Optimizer.step#SGD.step", t + 100, 20, cat="user_annotation")
        t += 220
    return tb.to_dict()


def _args(dims, concrete, seq, shapes: bool = True) -> dict:
    args = {"Sequence number": seq}
    if shapes:
        args.update({"Input Dims": dims, "Input type": ["float"] * len(dims), "Concrete Inputs": concrete})
    return args


def test_dropout_off_in_every_trained_forward():
    f = analyze(_loop()).finding(ID)
    assert f is not None and f.evidence.numbers["eval_dropout_calls"] == 5 and f.est_gain == 0
    assert "model.train()" in f.fixes[0].code


def test_dropout_on_a_zero_rate_or_no_arguments_is_silent():
    assert analyze(_loop(train="True")).finding(ID) is None
    assert analyze(_loop(p="0.")).finding(ID) is None  # p = 0 does nothing in either mode: not judged
    assert analyze(_loop(shapes=False)).finding(ID) is None


def test_a_forward_no_backward_ran_through_is_not_judged():
    assert analyze(_loop(backward=False)).finding(ID) is None


def _record(mode: str):
    import torch

    import gpumagic

    torch.manual_seed(0)
    backbone = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                                   torch.nn.Dropout(0.2))
    head = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 4))
    model = torch.nn.Sequential(backbone, head)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    with gpumagic.profile(steps=5, skip=1, display=False, shapes=True) as run:
        for _ in range(8):
            if mode == "train() each step":
                model.train()
            elif mode == "backbone in eval mode on purpose":
                model.train()
                backbone.eval()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            model.eval()  # a validation after each step
            if mode == "validation with grad mode on":
                model(x).sum()
            else:
                with torch.no_grad():
                    model(x).sum()
    return run.report


@pytest.mark.parametrize("mode", ["no train()", "validation with grad mode on"])
def test_recorded_training_left_in_eval_mode(mode):
    """Recorded here with torch on the CPU, ``model.train()`` never called again after the first
    validation: every recorded training forward runs dropout off; a validation with grad mode on
    builds nodes no backward uses, and is not counted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = _record(mode).finding(ID)
    assert f is not None
    assert f.evidence.numbers["eval_dropout_calls"] == 10 and f.evidence.numbers["frozen_batch_norm_calls"] == 5


@pytest.mark.parametrize("mode", ["train() each step", "backbone in eval mode on purpose"])
def test_recorded_training_mode_is_silent(mode):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _record(mode).finding(ID) is None


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "*.json.gz"))))
def test_silent_on_every_recorded_trace(path):
    assert analyze(path).finding(ID) is None
