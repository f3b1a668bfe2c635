"""``frozen-forward``: a part of the model that builds no autograd node (a frozen backbone, a
teacher under ``torch.no_grad()``) runs every step; on a recorded loop, on built traces that vary
one condition at a time, and silent on every other recorded trace. And the phases: that part's
forward is the step's forward, not the loop's own code."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze

ID = "frozen-forward"
RECORDED = os.path.join(DATA, "cpu_frozen_backbone.json.gz")


def _op(tb: TraceBuilder, name: str, ts: float, dur: float, seq: int | None) -> None:
    args = {"External id": 1} if seq is None else {"External id": 1, "Sequence number": seq, "Fwd thread id": 0}
    tb.add(cat="cpu_op", name=name, ts=ts, dur=dur, args=args)


def _training(steps: int = 5, frozen_us: float = 400.0, mode: str = "frozen", frozen_op: str = "aten::conv2d",
              draw: bool | str = False, numbers: bool = True, gpu: bool = False, after: bool = False,
              head_us: float = 30.0, ema: str = "", loader: bool = True) -> dict:
    """A CPU training loop (a GPU one with ``gpu``: each operator launches a kernel as long as
    itself): per step a DataLoader wait, a part that trains nothing (``mode``: ``"frozen"``, grad
    mode on and its parameters frozen: numbered calls that do not advance the counter;
    ``"no_grad"``: calls without numbers; ``"trains"``: calls that build nodes) of two
    ``frozen_op`` calls of ``frozen_us`` each with a relu between (after the head with
    ``after``), then a head (``head_us``) and a loss that build nodes, their backward and an SGD step. With
    ``draw``, a ``torch.randn`` before the frozen part; without ``numbers``, no operator carries one.
    With ``ema``, the loop updates the frozen part's weights after each optimizer step under
    no_grad: ``"foreach"`` one ``torch._foreach_lerp_``, ``"loop"`` a ``mul_`` and an ``add_`` for
    each of 4 tensors, ``"sync"`` a ``copy_`` for each (``load_state_dict``). Without ``loader``,
    no DataLoader wait: the step's inputs come from elsewhere (an environment, a replay buffer)."""
    tb = TraceBuilder(cc=(8, 0) if gpu else None)
    counter, t = 10, 0.0

    def call(name: str, dur: float, seq: int | None, builds: bool) -> None:
        nonlocal t, counter
        _op(tb, name, t, dur, seq if numbers else None)
        if gpu:
            tb.runtime("cudaLaunchKernel", t + 1, 3)
            tb.kernel(f"k_{name.split('::')[-1]}", t + 5, dur, launch_ts=t + 1)
        counter += 1 if builds else 0
        t += dur + 5

    def frozen_part() -> None:
        for k in range(2):
            seq = None if mode == "no_grad" else counter
            call(frozen_op, frozen_us, seq, mode == "trains")
            if k == 0:
                call("aten::relu", frozen_us / 10, None if mode == "no_grad" else counter, mode == "trains")

    for s in range(steps):
        start = t
        if loader:
            tb.dataloader(t, 20)
        t += 25
        if draw:
            call(draw if isinstance(draw, str) else "aten::randn", 10, None, False)
        if not after:
            frozen_part()
        head, loss = counter, counter + 1
        call("aten::addmm", head_us, head, True)
        call("aten::cross_entropy_loss", 10, loss, True)
        if after:
            frozen_part()
        _op(tb, "autograd::engine::evaluate_function: NllLossBackward0", t, 10, loss if numbers else None)
        _op(tb, "autograd::engine::evaluate_function: AddmmBackward0", t + 12, 20, head if numbers else None)
        t += 40
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t, dur=20)
        t += 30
        writes = {"foreach": ["aten::_foreach_lerp_"], "loop": ["aten::mul_", "aten::add_"] * 4,
                  "sync": ["aten::copy_"] * 4}.get(ema, [])
        for name in writes:
            call(name, 3, None, False)
        tb.step(s + 1, start, t - start)
        t += 5
    return tb.to_dict()


def test_a_recorded_frozen_backbone_under_a_trained_head():
    """benchmarks/frozen_features.py --record (tests/data/MANIFEST.md): two frozen convolutions
    under a linear head on the CPU; nothing else fires (the backbone is the model's forward, not
    the loop's own code)."""
    report = analyze(RECORDED)
    f = report.finding(ID)
    n = f.evidence.numbers
    assert n["frozen_frac"] > 0.5 and n["steps_with_frozen"] == n["steps"] and n["measured_on"] == "host"
    assert n["layer_share"] >= 0.5 and f.est_gain == pytest.approx(n["frozen_frac"], abs=1e-3)
    assert "aten::conv2d" in f.evidence.summary and f.gain_method.startswith("estimate")
    assert "with torch.no_grad():" in f.fixes[0].code and "backbone(xb.to(device))" in f.fixes[0].code
    assert report.finding("loop-host-work") is None
    median = report.metrics.phases.median_ms
    assert median.forward > 10 * median.other


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz"))) - {RECORDED}))
def test_silent_on_every_other_recorded_trace(path):
    """The recorded training loops train what they run forward; an inference or a decoding window
    has no backward."""
    assert analyze(path).finding(ID) is None


@pytest.mark.parametrize("mode", ["frozen", "no_grad"])
def test_a_frozen_part_fires_whether_grad_mode_is_on_or_off(mode):
    f = analyze(_training(mode=mode)).finding(ID)
    assert f is not None and f.evidence.numbers["steps_with_frozen"] == 5
    # the two calls, the relu and the 5 µs between them, of each step's time
    step_us = 25 + 2 * 400 + 40 + 3 * 5 + 35 + 15 + 40 + 30
    assert f.evidence.numbers["frozen_frac"] == pytest.approx(5 * (2 * 400 + 40 + 2 * 5) / (5 * step_us + 4 * 5),
                                                              abs=0.01)


def test_a_frozen_part_after_the_head_is_found_too():
    """A teacher run after the student (``with torch.no_grad(): t = teacher(x)`` after ``s = student(x)``)."""
    assert analyze(_training(mode="no_grad", after=True)).finding(ID) is not None
    # a teacher of the student's own layer types: its calls' names match the student's nodes
    assert analyze(_training(mode="no_grad", frozen_op="aten::addmm")).finding(ID) is not None
    assert analyze(_training(mode="frozen", frozen_op="aten::addmm", after=True)).finding(ID) is not None


def test_silent_where_the_part_trains_or_is_small_or_not_layers():
    assert analyze(_training(mode="trains")).finding(ID) is None
    assert analyze(_training(head_us=10_000)).finding(ID) is None  # under 10 % of the window
    assert analyze(_training(head_us=6_000)).finding(ID) is not None  # over
    # a cast and a normalization build no node either: the inputs' preparation, not a model's layers
    assert analyze(_training(frozen_op="aten::div")).finding(ID) is None


def test_silent_where_random_numbers_feed_the_part():
    """Noise drawn each step before it (a GAN's generator under no_grad): its inputs are new every
    step, nothing to compute once."""
    assert analyze(_training(mode="no_grad", draw=True)).finding(ID) is None
    assert analyze(_training(mode="no_grad", draw="aten::normal")).finding(ID) is None


@pytest.mark.parametrize("draw", ["aten::randint", "aten::randperm"])
def test_indices_drawn_before_the_part_pick_stored_samples(draw):
    """A draw of indices before it (a latent-diffusion loop's timesteps drawn before its frozen VAE
    encodes the images; a sample of stored items) makes no new inputs: the part's outputs for
    each stored sample can be kept."""
    assert analyze(_training(mode="no_grad", draw=draw)).finding(ID) is not None


@pytest.mark.parametrize("ema", ["foreach", "loop", "sync"])
def test_silent_where_the_loop_writes_the_weights_itself(ema):
    """An EMA teacher (BYOL, DINO, a mean teacher) or a synced target network: its weights change,
    its outputs cannot be stored. The writes come after the optimizer, outside the model."""
    assert analyze(_training(mode="no_grad", ema=ema)).finding(ID) is None
    assert analyze(_training(mode="no_grad")).finding(ID) is not None


@pytest.mark.parametrize(("stage", "fires"), [("RandomResizedCrop", False), ("ColorJitter", False),
                                              ("Normalize", True)])
def test_silent_where_the_loaders_stages_name_a_random_augmentation(stage, fires):
    """gpumagic's loader stage timers name the pipeline's transforms: a random one makes each
    epoch's inputs differ, and nothing can be computed once."""
    d = _training()
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "machine": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None}, "samples": {},
                     "loader_stages": {"batches": 4, "workers": 2, "stages": [
                         {"name": stage, "where": "worker", "self_ns": 80_000_000, "calls": 16},
                         {"name": "other", "where": "worker", "self_ns": 3_000_000, "calls": 4}]}}
    assert (analyze(d).finding(ID) is not None) == fires


def test_the_same_layer_types_with_autograd_get_a_caveat():
    """A teacher of the student's own layer types: perhaps one module run twice (a perceptual
    loss's feature network on output and target); the why says what can be stored then."""
    f = analyze(_training(mode="no_grad", frozen_op="aten::addmm")).finding(ID)
    assert "The same layer types also ran with autograd" in f.why
    assert "The same layer types" not in analyze(_training(mode="no_grad")).finding(ID).why


def _close_step(tb: TraceBuilder, s: int, start: float, t: float) -> float:
    """An SGD update at ``t`` ends step ``s`` (begun at ``start``); the next step's start."""
    tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t, dur=20)
    tb.step(s + 1, start, t + 30 - start)
    return t + 35


def _acting(steps: int = 5, same: bool = True, loader: bool = False,
            acting: tuple[str, ...] = ("aten::addmm", "aten::relu", "aten::addmm", "aten::multinomial")) -> dict:
    """An actor-critic loop on the CPU: per step (a DataLoader wait first with ``loader``) a rollout
    of 3 actions, each a forward of a two-layer policy under no_grad (``acting``: addmm, relu, addmm
    of 200 µs each and a ``multinomial``), then the update: the same policy's forward with autograd
    (with ``same``; else a network whose activation differs: tanh), a loss, its backward and a step."""
    tb = TraceBuilder(cc=None)
    counter, t = 10, 0.0

    def call(name: str, dur: float, seq: int | None) -> None:
        nonlocal t, counter
        _op(tb, name, t, dur, seq)
        counter += seq is not None
        t += dur + 5

    for s in range(steps):
        start = t
        if loader:
            tb.dataloader(t, 20)
        t += 25
        for _ in range(3):
            for name in acting:
                call(name, 200 if name == "aten::addmm" else 20, None)
        first = counter
        for name in ("aten::addmm", "aten::relu" if same else "aten::tanh", "aten::addmm", "aten::mse_loss"):
            call(name, 200 if name == "aten::addmm" else 20, counter)
        _op(tb, "autograd::engine::evaluate_function: MseLossBackward0", t, 10, first + 3)
        _op(tb, "autograd::engine::evaluate_function: AddmmBackward0", t + 12, 20, first)
        t = _close_step(tb, s, start, t + 40)
    return tb.to_dict()


def test_silent_where_the_trained_network_acts_without_grad():
    """A rollout: the policy's forward under no_grad, the same calls as its forward with autograd in
    the update: the trained network acting on new observations (A2C, PPO) or a DQN's target
    network, a copy of it, on replayed states; with a DataLoader, the model's loss on a fixed
    batch under no_grad. Not a frozen part. A different network (another sequence of calls), or a
    deeper one of the same layer types (a teacher), still fire."""
    assert analyze(_acting()).finding(ID) is None
    assert analyze(_acting(loader=True)).finding(ID) is None
    assert analyze(_acting(same=False)).finding(ID) is not None
    # the same layer types, deeper: repeats of the trained calls must hold every layer's call
    deeper = ("aten::addmm", "aten::relu", "aten::addmm", "aten::relu", "aten::addmm", "aten::relu", "aten::addmm")
    assert analyze(_acting(acting=deeper)).finding(ID) is None  # two repeats of addmm, relu, addmm
    assert analyze(_acting(acting=deeper[:5])).finding(ID) is not None  # one repeat and a layer over
    # a one-layer head's calls occur in any frozen part: two layers' calls at least are matched
    assert analyze(_training(mode="no_grad", frozen_op="aten::addmm", loader=False)).finding(ID) is not None


def test_a_dropout_in_the_trained_part_before_the_frozen_one_is_no_draw_of_inputs():
    """The student's dropout (``aten::dropout`` drawing its mask with a nested ``aten::bernoulli_``)
    runs before the teacher: a draw inside the model, not the loop drawing the teacher's inputs."""
    d = _training(mode="no_grad", after=True)
    for e in [e for e in d["traceEvents"] if e.get("name") == "aten::addmm"]:
        d["traceEvents"].append({**e, "name": "aten::bernoulli_", "ts": e["ts"] + 1, "dur": 3,
                                 "args": {"External id": 1}})
    assert analyze(d).finding(ID) is not None
    assert analyze(_training(mode="no_grad", after=True, draw=True)).finding(ID) is None  # the loop's own draw


def test_silent_without_sequence_numbers():
    """A trace whose operators carry no numbers cannot tell grad mode: nothing is judged."""
    assert analyze(_training(numbers=False)).finding(ID) is None


def test_on_a_gpu_the_kernels_it_launched_are_measured():
    f = analyze(_training(gpu=True)).finding(ID)
    assert f is not None and f.evidence.numbers["measured_on"] == "GPU kernels"


def test_the_frozen_part_is_the_steps_forward_phase():
    """Its calls come before the first operator whose node the backward evaluates; the forward
    starts at the first layer's operator all the same."""
    report = analyze(_training(frozen_op="aten::convolution"))
    median = report.metrics.phases.median_ms
    assert median.forward * 1e3 > 2 * 400 and median.other * 1e3 < 50


def test_the_fix_trains_on_the_backbones_outputs():
    """The fix's cached features are the backbone's outputs, and the head trains on them."""
    import torch
    from torch import nn

    from gpumagic.analysis.rules.frozen import CACHE_CODE

    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU())
    head = nn.Linear(16, 3)
    before = head.weight.detach().clone()
    dataset = torch.utils.data.TensorDataset(torch.randn(20, 8), torch.randint(0, 3, (20,)))
    ns = {"torch": torch, "backbone": backbone, "head": head, "dataset": dataset, "batch_size": 4,
          "device": "cpu", "epochs": 2, "loss_fn": nn.CrossEntropyLoss(),
          "optimizer": torch.optim.SGD(head.parameters(), lr=0.1)}
    exec(compile(CACHE_CODE, "<fix>", "exec"), ns)
    with torch.no_grad():
        expected = backbone.eval()(dataset.tensors[0])
    assert torch.allclose(ns["cached"].tensors[0], expected)
    assert torch.equal(ns["cached"].tensors[1], dataset.tensors[1])
    assert not torch.equal(head.weight, before) and not ns["cached"].tensors[0].requires_grad


def _with_draw_inside(name: str) -> dict:
    """:func:`_training` with ``name`` drawn inside each frozen part (nested in its relu's span)."""
    d = _training(mode="no_grad")
    for e in [e for e in d["traceEvents"] if e.get("name") == "aten::relu"]:
        d["traceEvents"].append({**e, "name": name, "ts": e["ts"] + 1, "dur": 3, "args": {"External id": 1}})
    return d


def test_a_part_that_samples_its_output_gets_the_distribution_stored():
    """A VAE encoder whose latent is drawn (mean + std × randn_like): storing its output would keep
    one draw for good, so the fix stores the mean and std and draws each step. A dropout's mask
    inside it is no such draw (the stored outputs are computed in eval mode)."""
    f = analyze(_with_draw_inside("aten::randn_like")).finding(ID)
    assert "draws random numbers itself" in f.why and "torch.randn_like(mean)" in f.fixes[0].code
    f = analyze(_with_draw_inside("aten::bernoulli_")).finding(ID)
    assert "draws random numbers itself" not in f.why and "backbone.eval()" in f.fixes[0].code


def test_the_sampled_fix_keeps_drawing_from_the_encoders_distribution():
    """SAMPLED_CODE stores the encoder's mean and std (diffusers' split and clamp) and draws a new
    latent every step: two epochs see different latents of the same sample, around its mean."""
    import torch
    from torch import nn

    from gpumagic.analysis.rules.frozen import SAMPLED_CODE

    torch.manual_seed(0)
    encoder, head = nn.Linear(8, 6), nn.Linear(3, 2)
    dataset = torch.utils.data.TensorDataset(torch.randn(12, 8), torch.randint(0, 2, (12,)))
    seen: list[torch.Tensor] = []
    head.register_forward_hook(lambda mod, args, out: seen.append(args[0].detach().clone()))
    ns = {"torch": torch, "encoder": encoder, "head": head, "dataset": dataset, "batch_size": 12,
          "device": "cpu", "epochs": 2, "loss_fn": nn.CrossEntropyLoss(),
          "optimizer": torch.optim.SGD(head.parameters(), lr=0.1)}
    exec(compile(SAMPLED_CODE, "<fix>", "exec"), ns)
    with torch.no_grad():
        mean, logvar = encoder(dataset.tensors[0]).chunk(2, dim=1)
    cached = ns["cached"].tensors
    assert torch.allclose(cached[0], mean) and torch.allclose(cached[1], torch.exp(0.5 * logvar))
    assert len(seen) == 2 and not torch.allclose(seen[0], seen[1])  # shuffled, and drawn anew


def _compiled(steps: int = 5, grad: bool = True) -> dict:
    """A torch.compile'd model trained on the CPU: per step a DataLoader wait, the forward as one
    ``Torch-Compiled Region: 0/0`` (no number of its own) around a ``CompiledFunction`` (an
    ``aten::mm`` inside, inductor's extern matmul) whose number the backward's
    ``CompiledFunctionBackward`` carries (without ``grad``, neither numbered), a head that
    trains, the backward, a step."""
    tb = TraceBuilder(cc=None)
    counter, t = 10, 0.0
    for s in range(steps):
        start = t
        tb.dataloader(t, 20)
        t += 25
        _op(tb, "Torch-Compiled Region: 0/0", t, 900, None)
        _op(tb, "CompiledFunction", t + 5, 880, counter if grad else None)
        _op(tb, "aten::mm", t + 10, 800, None)  # inductor's extern matmul, called from the generated code
        compiled = counter
        counter += grad
        t += 905
        _op(tb, "aten::addmm", t, 30, counter)
        head = counter
        counter += 1
        t += 35
        _op(tb, "autograd::engine::evaluate_function: AddmmBackward0", t, 20, head)
        if grad:
            _op(tb, "autograd::engine::evaluate_function: CompiledFunctionBackward", t + 22, 600, compiled)
        t = _close_step(tb, s, start, t + 630)
    return tb.to_dict()


def test_a_compiled_model_that_trains_is_no_frozen_part():
    """torch.compile records the forward as a ``Torch-Compiled Region`` without a number around the
    ``CompiledFunction`` that builds the node: the region built it, and it is the step's forward."""
    report = analyze(_compiled())
    assert report.finding(ID) is None and report.metrics.phases.median_ms.forward * 1e3 > 800
