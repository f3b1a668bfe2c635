"""``step-outliers`` with nothing gpumagic watches to explain them: when the recorded steps called
the same operators yet took very different times (batches of varying length), it says so, and
its record fix records the shapes."""

from __future__ import annotations

import everystep_blocks as blocks
from tracebuilder import TraceBuilder

from gpumagic import analyze


def _bundle(step_us, ops_per_step):
    """Recorded steps 1..3 of ``step_us`` µs, each calling ``ops_per_step[i]`` operators; the timer's
    step 20 of 30 took 250 ms with nothing beside it."""
    steps = [10.0] * 30
    steps[20] = 250.0
    b = blocks.block(steps, recorded=(1, 2, 3), profiled=4)
    tb = TraceBuilder(cc=None)
    t = 0.0
    for i, (dur, n) in enumerate(zip(step_us, ops_per_step, strict=True)):
        tb.step(i + 1, t, dur)
        for k in range(n):
            tb.op("aten::mm", t + k * dur / n, dur / n * 0.8)
        t += dur
    d = tb.to_dict()
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "machine": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None}, "samples": {}, "every_step": b}
    return d


def test_the_same_operators_taking_longer_point_at_the_inputs():
    f = analyze(_bundle([10_000, 10_000, 40_000], [50, 50, 50])).finding("step-outliers")
    assert "called the same 50 operators each, yet took from 10.0 to 40.0 ms" in f.evidence.summary
    assert any(fx.code.endswith("--steps 1 --shapes") for fx in f.fixes)


def test_no_sentence_when_the_steps_called_different_operators_or_took_alike():
    assert "called the same" not in analyze(_bundle([10_000, 10_000, 40_000], [50, 50, 80])).finding(
        "step-outliers").evidence.summary  # the long step did more: something else ran in it
    assert "called the same" not in analyze(_bundle([10_000, 11_000, 12_000], [50, 50, 50])).finding(
        "step-outliers").evidence.summary  # steps alike: the recorded window shows no such spread
