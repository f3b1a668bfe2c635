"""``gradients-reset-mid-accumulation``: gradient accumulation whose loop calls
``optimizer.zero_grad()`` before every micro-batch, so each update follows the last one alone."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze

ID = "gradients-reset-mid-accumulation"


def _built(updates: int = 4, every: int = 4, reset: str = "each", loader: bool = True, writes: bool = True,
           second: bool = False) -> dict:
    """A built CPU trace of the same loop: per micro-batch a DataLoader batch (with ``loader``), a
    forward operator and its backward node (growing sequence numbers), a gradient write (the
    last micro-batch's only, without ``writes``: the others ``torch.autograd.grad`` passes); an
    ``Optimizer.step#SGD.step`` after every ``every``; ``Optimizer.zero_grad#`` before each
    micro-batch (``reset`` "each") or after each update ("after"). With ``second``, a second
    optimizer steps after each update, on the same passes."""
    tb = TraceBuilder(cc=None)
    t, seq = 0.0, 10
    for u in range(updates):
        start = t
        for k in range(every):
            if loader:
                tb.dataloader(t, 10)
            t += 12
            if reset == "each":
                tb.op("Optimizer.zero_grad#SGD.zero_grad", t, 4, cat="user_annotation")
            t += 6
            tb.add(cat="cpu_op", name="aten::addmm", ts=t, dur=30, args={"External id": 1, "Sequence number": seq,
                                                                         "Fwd thread id": 0})
            t += 35
            tb.add(cat="cpu_op", name="autograd::engine::evaluate_function: AddmmBackward0", ts=t, dur=30,
                   args={"External id": 1, "Sequence number": seq, "Fwd thread id": 0})
            if writes or k == every - 1:
                tb.op("torch::autograd::AccumulateGrad", t + 32, 5)
            seq += 1
            t += 45
        tb.op("Optimizer.step#SGD.step", t, 20, cat="user_annotation")
        tb.op("aten::add_", t + 2, 10)
        t += 25
        if second:
            tb.op("Optimizer.step#Adam.step", t, 20, cat="user_annotation")
            tb.op("aten::add_", t + 2, 10)
            t += 25
        if reset == "after":
            tb.op("Optimizer.zero_grad#SGD.zero_grad", t, 4, cat="user_annotation")
            t += 6
        tb.step(u + 1, start, t - start)
        t += 5
    return tb.to_dict()


def _record(mode: str, every: int = 4):
    """Recorded here on the CPU: a small MLP, 4 updates, each after ``every`` micro-batches.
    ``mode``: "each micro-batch" (the mistake), "after the update" (right), "once a pass" (no
    accumulation: zero_grad, backward, step each micro-batch)."""
    import torch

    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    data = torch.utils.data.TensorDataset(torch.randn(6 * every * 8, 32), torch.randint(0, 4, (6 * every * 8,)))
    with gpumagic.profile(steps=4, skip=1, display=False) as run:
        for i, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=8)):
            if mode == "each micro-batch":
                optimizer.zero_grad()
            (torch.nn.functional.cross_entropy(model(x), y) / every).backward()
            if (i + 1) % every == 0:
                optimizer.step()
                if mode == "after the update":
                    optimizer.zero_grad()
    return run.report


def test_zero_grad_before_every_micro_batch():
    f = _record("each micro-batch").finding(ID)
    n = f.evidence.numbers
    assert n["updates_with_reset"] == n["accumulating_updates"] >= 2 and n["passes_per_update"] == 4
    assert n["dropped_frac"] == pytest.approx(0.75) and f.severity == "high" and f.est_gain == 0
    assert f.fixes[0].code.index("optimizer.step()") < f.fixes[0].code.rindex("optimizer.zero_grad()")
    two = _record("each micro-batch", every=2).finding(ID)
    assert two.evidence.numbers["dropped_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize("mode", ["after the update", "once a pass"])
def test_silent_where_the_gradients_are_reset_once_an_update(mode):
    assert _record(mode).finding(ID) is None


def test_built_loops_vary_one_condition():
    assert analyze(_built()).finding(ID).evidence.numbers["dropped_frac"] == pytest.approx(0.75)
    assert analyze(_built(reset="after")).finding(ID) is None
    assert analyze(_built(every=1)).finding(ID) is None  # no accumulation: a reset each update is right
    assert analyze(_built(updates=1)).finding(ID) is None  # one update: too few to call it a habit


def test_passes_that_are_no_micro_batches_are_not_judged():
    """Reset between backward passes that are no micro-batches of a loader: an adversarial
    example's backward on the same batch (FGSM: backward for the input's gradient, zero_grad,
    the adversarial loss's backward), a second optimizer resetting its own gradients, or
    ``torch.autograd.grad`` passes that write no ``.grad`` (a gradient penalty, a physics-informed
    loss's derivatives)."""
    assert analyze(_built(writes=False)).finding(ID) is None
    assert analyze(_built(second=True)).finding(ID) is None  # a reset may be the other optimizer's
    d = _built()  # a loader in the window, but no batch between the passes (one batch, two passes)
    d["traceEvents"] = [e for e in d["traceEvents"] if not e.get("name", "").startswith("enumerate(DataLoader)")
                        or e["ts"] < 1]
    assert analyze(d).finding(ID) is None


def test_batches_from_a_list_are_judged_by_their_passes_alike():
    """No DataLoader (batches indexed from a tensor): passes that each write the same gradients
    are micro-batches of one model; passes that write different ones are not (an adversarial
    example's backward writes the input's gradient too)."""
    assert analyze(_built(loader=False)).finding(ID).evidence.numbers["dropped_frac"] == pytest.approx(0.75)
    d = _built(loader=False)
    first = [e for e in d["traceEvents"] if e.get("name") == "torch::autograd::AccumulateGrad"][::4]
    for e in first:  # the first pass of each update writes one gradient more
        d["traceEvents"].append({**e, "ts": e["ts"] + 1, "dur": 1})
    assert analyze(d).finding(ID) is None


def test_it_leads_the_checklist_as_a_mistake():
    report = _record("each micro-batch")
    assert report.findings[0].id == ID


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "*.json.gz"))))
def test_silent_on_every_recorded_trace(path):
    assert analyze(path).finding(ID) is None


def test_the_fix_updates_with_the_mean_of_the_micro_batches():
    """The fix's loop, run on 2 micro-batches of 4 samples: the update is one step on the mean
    gradient of all 8 samples (what one batch of 8 gives), and the gradients are reset after it."""
    import torch

    from gpumagic.analysis.rules.accumreset import ACCUMULATE_CODE

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    reference = torch.nn.Linear(8, 3)
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    ns = {"torch": torch, "model": model, "loader": loader, "device": "cpu", "accumulation_steps": 2,
          "loss_fn": torch.nn.CrossEntropyLoss(), "optimizer": torch.optim.SGD(model.parameters(), lr=0.5)}
    exec(compile(ACCUMULATE_CODE, "<fix>", "exec"), ns)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    torch.nn.CrossEntropyLoss()(reference(x), y).backward()
    ref_opt.step()
    assert torch.allclose(model.weight, reference.weight, atol=1e-6) and model.weight.grad is None
