"""``cpu-op-overhead``: a CPU model whose forward and backward call thousands of tiny operators (a
recurrent cell looped over time steps in Python), the per-call cost most of the step."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.analysis.rules.opoverhead import MAX_US_PER_OP, MIN_OPS_PER_STEP

RECORDED = os.path.join(DATA, "cpu_rnn_loop.json.gz")


def test_a_recorded_rnn_cell_looped_in_python():
    """benchmarks/op_overhead.py --record (tests/data/MANIFEST.md): compile saved 0.57, nn.RNN 0.49."""
    r = analyze(RECORDED)
    f = r.finding("cpu-op-overhead")
    n = f.evidence.numbers
    assert n["calls_per_step"] >= 32 * 20  # about 20 calls, forward and backward, per time step
    assert n["per_call_us"] <= MAX_US_PER_OP
    assert f.est_gain == n["model_frac"] > 0.5 and f.gain_method.startswith("upper bound")
    med = r.metrics.phases.median_ms
    assert n["model_frac"] == pytest.approx((med.forward + med.backward) / r.metrics.steps.median_ms, abs=0.05)
    codes = " ".join(fx.code for fx in f.fixes)
    assert "torch.compile(model)" in codes and "torch.nn.RNN(" in codes


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz"))) - {RECORDED}))
def test_silent_on_every_other_recorded_trace(path):
    assert analyze(path).finding("cpu-op-overhead") is None


def _steps(calls: int, us_each: float, gpu: bool = False, name: str = "aten::add", every: int = 0):
    """Three training steps whose forward calls ``calls`` operators of ``us_each`` µs, back to
    back (every ``every``-th one ``name`` instead of ``aten::add``), then a backward of one node
    and an optimizer step."""
    tb = TraceBuilder(cc=(8, 0) if gpu else None)
    fwd = calls * us_each
    step = fwd + 300
    for i in range(3):
        t = i * step
        tb.step(i + 1, t, step)
        for c in range(calls):
            tb.op(name if every and c % every == 0 else "aten::add", t + c * us_each, us_each * 0.9)
        tb.op("autograd::engine::evaluate_function: AddBackward0", t + fwd, 100)
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t + fwd + 150, dur=100)
        if gpu:
            tb.kernel("k", t + 10, 5, launch_ts=t + 5)
    return tb.to_dict()


def test_thresholds():
    assert analyze(_steps(MIN_OPS_PER_STEP + 200, 2.0)).finding("cpu-op-overhead") is not None
    assert analyze(_steps(MIN_OPS_PER_STEP - 200, 2.0)).finding("cpu-op-overhead") is None  # too few calls
    assert analyze(_steps(MIN_OPS_PER_STEP + 200, 2 * MAX_US_PER_OP)).finding("cpu-op-overhead") is None  # real work
    assert analyze(_steps(MIN_OPS_PER_STEP + 200, 2.0, gpu=True)).finding("cpu-op-overhead") is None  # launch-bound's


def _nested_steps(wrappers: int, inner: int, plain: int, us_each: float = 2.0) -> dict:
    """Three training steps whose forward calls ``wrappers`` × (``aten::linear`` holding ``inner``
    ``aten::addmm``), then ``plain`` lone ``aten::mul``, back to back."""
    tb = TraceBuilder(cc=None)
    wrap_us = (inner + 1) * us_each
    fwd = wrappers * wrap_us + plain * us_each
    step = fwd + 300
    for i in range(3):
        t = i * step
        tb.step(i + 1, t, step)
        at = t
        for _ in range(wrappers):
            tb.op("aten::linear", at, wrap_us * 0.95)
            for k in range(inner):
                tb.op("aten::addmm", at + (k + 0.5) * us_each, us_each * 0.4)
            at += wrap_us
        for _ in range(plain):
            tb.op("aten::mul", at, us_each * 0.9)
            at += us_each
        tb.op("autograd::engine::evaluate_function: AddBackward0", t + fwd, 100)
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t + fwd + 150, dur=100)
    return tb.to_dict()


def test_the_evidence_names_where_the_calls_come_from():
    """An outermost operator counts the calls nested in it: 300 linears holding 3 addmm each make
    1,200 of the 1,801 calls a step (the backward's node one more), the 600 lone muls the rest."""
    f = analyze(_nested_steps(wrappers=300, inner=3, plain=600)).finding("cpu-op-overhead")
    assert f is not None
    assert "Most calls, counting those inside each: aten::linear 66.6 %, aten::mul 33.3 %." in f.evidence.summary


def test_actions_sampled_one_at_a_time_get_the_vector_of_environments():
    """A rollout: aten::multinomial 100 times a step among the tiny operators (one action after
    each single-observation forward)."""
    f = analyze(_steps(1200, 2.0, name="aten::multinomial", every=12)).finding("cpu-op-overhead")
    assert f.evidence.numbers["samples_per_step"] == 100 and "drawn 100 times a step" in f.why
    assert "gymnasium.vector.SyncVectorEnv" in f.fixes[0].code and "torch.compile" in f.fixes[1].code
    f = analyze(_steps(1200, 2.0, name="aten::multinomial", every=100)).finding("cpu-op-overhead")  # 12 a step
    assert f.evidence.numbers["samples_per_step"] == 12 and "torch.compile" in f.fixes[0].code
    assert "gymnasium" not in "".join(fx.code for fx in f.fixes)


def test_a_recorded_rnn_names_its_backward_and_linear_calls():
    summary = analyze(RECORDED).finding("cpu-op-overhead").evidence.summary
    assert "Most calls, counting those inside each: autograd::engine::evaluate_function: AddmmBackward0" in summary
    assert "aten::linear" in summary
