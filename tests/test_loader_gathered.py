"""``dataloader-bound`` where the loop gathers its step's batch from many of the loader's batches
(a loader of ``batch_size=1``, the samples stacked by hand): the loader should make the batch."""

from __future__ import annotations

import pytest
from tracebuilder import TraceBuilder

from gpumagic import analyze


def _loop(batches: int, passes: int = 1) -> dict:
    """CPU training steps, each ``batches`` DataLoader waits of 60 µs, then ``passes`` forward and
    backward passes (gradient accumulation when more than one) and an SGD step."""
    tb = TraceBuilder(cc=None)
    t = 0.0
    for s in range(5):
        start = t
        for k in range(batches):
            tb.dataloader(t, 60)
            t += 70
            if passes > 1 and k % (batches // passes) == batches // passes - 1:
                tb.op("aten::addmm", t, 50)
                tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 60, 40)
                t += 110
        if passes == 1:
            tb.op("aten::addmm", t, 50)
            tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 60, 40)
            t += 110
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t, dur=30)
        t += 40
        tb.step(s + 1, start, t - start)
        t += 5
    return tb.to_dict()


def test_many_batches_for_one_backward_pass_get_a_larger_batch_first():
    f = analyze(_loop(16)).finding("dataloader-bound")
    assert f is not None and f.evidence.numbers["loader_batches_per_step"] == 16
    assert f.fixes[0].description.startswith("Let the loader make the step's batch: batch_size 16 times")
    assert "batch_size=16 * batch_size" in f.fixes[0].code
    assert "takes 16 batches from the loader for each optimizer step" in f.evidence.summary


@pytest.mark.parametrize(("batches", "passes"), [(4, 1), (16, 16), (16, 4)])
def test_few_batches_or_gradient_accumulation_are_not_gathering(batches, passes):
    """A few batches a step, or one backward pass per batch (or per group: accumulation)."""
    f = analyze(_loop(batches, passes)).finding("dataloader-bound")
    assert f is not None and "loader_batches_per_step" not in f.evidence.numbers
