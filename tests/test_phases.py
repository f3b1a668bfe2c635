"""``metrics.phases`` on a built training step whose phases are known, on the host and the GPU."""

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracebuilder import TraceBuilder

from gpumagic import analyze

AUTOGRAD_TID = 101


def training_trace(steps=3):
    """Each 10 ms step: 2 ms waiting for data, 3 ms forward (two ops, each launching a 1 ms kernel),
    2 ms backward on the autograd thread (launching 4 ms of kernels), 1 ms optimizer step, then
    2 ms of host work outside every phase."""
    tb = TraceBuilder()
    for i in range(steps):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.dataloader(t, 2_000)
        for j, at in enumerate((t + 2_000, t + 3_500)):
            tb.op("aten::linear", at, 1_400)
            tb.kernel(f"fwd_kernel_{j}", at + 100, 1_000, launch_ts=at + 10)
        tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 5_000, 2_000, tid=AUTOGRAD_TID)
        tb.op("AddmmBackward0", t + 5_010, 1_900, tid=AUTOGRAD_TID)
        tb.runtime("cudaLaunchKernel", t + 5_020, 5)  # a launch on the autograd thread (no kernel of its own)
        tb.kernel("bwd_kernel", t + 5_100, 4_000, launch_ts=t + 5_050)
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t + 7_000, dur=1_000)
        tb.kernel("sgd_kernel", t + 9_200, 500, launch_ts=t + 7_100)
        tb.op("aten::item", t + 8_000, 2_000)  # host work after the optimizer: "other"
    return tb


def test_the_phases_on_the_host_add_up_to_the_step():
    m = analyze(training_trace().to_dict()).to_dict()["metrics"]
    ph = m["phases"]
    for parts, dur in zip(ph["per_step"], m["steps"]["durations_ms"]):
        assert sum(parts.values()) == pytest.approx(dur, abs=1e-3)
    assert ph["median_ms"] == pytest.approx({"data": 2.0, "forward": 3.0, "backward": 2.0, "optimizer": 1.0,
                                             "evaluation": 0.0, "other": 2.0}, abs=1e-3)
    assert ph["found"] == {"dataloader": True, "backward": True, "optimizer": True}


def test_gpu_time_by_the_phase_that_launched_it():
    ph = analyze(training_trace().to_dict()).to_dict()["metrics"]["phases"]
    assert ph["gpu_median_ms"] == pytest.approx({"data": 0.0, "forward": 2.0, "backward": 4.0, "optimizer": 0.5,
                                                 "evaluation": 0.0, "other": 0.0}, abs=1e-3)


def test_a_record_function_named_forward_marks_the_phase():
    tb = TraceBuilder()
    for i in range(3):
        t = i * 5_000
        tb.step(i + 1, t, 5_000)
        tb.add(cat="user_annotation", name="forward", ts=t + 1_000, dur=3_000)  # no ops recorded inside
    ph = analyze(tb.to_dict()).to_dict()["metrics"]["phases"]
    assert ph["median_ms"]["forward"] == pytest.approx(3.0)
    assert ph["median_ms"]["other"] == pytest.approx(2.0)


def test_no_steps_no_phases():
    tb = TraceBuilder()
    tb.op("aten::mm", 0, 100)
    assert "phases" not in analyze(tb.to_dict()).to_dict()["metrics"]


def _full_scan_within(start, end, lo, hi):
    """What ``_Spans.within`` replaced: every span read for every step."""
    from gpumagic.analysis import intervals as iv

    keep = (start < hi) & (end > lo)
    return iv.clip(iv.union(start[keep], end[keep]), lo, hi)


def _full_scan_hull(start, end, lo, hi):
    from gpumagic.analysis import intervals as iv

    keep = (start >= lo) & (start < hi)
    if not keep.any():
        return iv.empty()
    return iv.clip(iv.union(np.array([start[keep].min()]), np.array([end[keep].max()])), lo, hi)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1_000), st.integers(0, 400)), max_size=60),
       st.integers(-50, 1_100), st.integers(0, 500))
def test_spans_cut_to_a_step_by_search_equal_a_full_scan(spans, lo, width):
    """Each step reads only the spans near it (by binary search over start times and the running
    latest end): the same intervals as testing every span, long spans that start in an earlier
    step and reach into this one included."""
    from gpumagic.analysis.phases import _Spans

    spans = sorted(spans)  # the event table is sorted by start time
    start = np.array([s for s, _ in spans], dtype=np.int64)
    dur = np.array([d for _, d in spans], dtype=np.int64)
    ev = SimpleNamespace(ts_ns=start, dur_ns=dur)
    cut = _Spans(ev, np.arange(start.size))
    hi = lo + width
    for got, want in ((cut.within(lo, hi), _full_scan_within(start, start + dur, lo, hi)),
                      (cut.hull(lo, hi), _full_scan_hull(start, start + dur, lo, hi))):
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


def test_a_data_wait_that_began_in_the_previous_step_counts_in_both():
    tb = training_trace(steps=3)
    tb.dataloader(9_000, 3_500)  # from step 1's last millisecond to 0.5 ms past step 2's own wait
    ph = analyze(tb.to_dict()).to_dict()["metrics"]["phases"]
    assert ph["per_step"][0]["data"] == pytest.approx(3.0, abs=1e-3)  # its own 2 ms and the last 1
    assert ph["per_step"][1]["data"] == pytest.approx(2.5, abs=1e-3)  # clipped to step 2's start
    assert ph["spans_ns"][1]["data"] == [[10_000_000, 12_500_000]]


def _accumulated_step(micro=4):
    """One 20 ms CPU step of ``micro`` micro-batches (gradient accumulation): each a 1 ms forward
    (an addmm) then a 2 ms backward on the main thread (two engine nodes 0.2 ms apart), then the
    optimizer; 3 steps."""
    tb = TraceBuilder(cc=None)
    for i in range(3):
        t = i * 20_000
        tb.step(i + 1, t, 20_000)
        at = t + 500
        for _ in range(micro):
            tb.op("aten::addmm", at, 1_000)
            tb.op("autograd::engine::evaluate_function: AddmmBackward0", at + 1_000, 900)
            tb.op("aten::mm", at + 1_100, 700)  # the node's own operator, inside its span
            tb.op("autograd::engine::evaluate_function: TBackward0", at + 2_100, 900)  # 0.2 ms after the first
            at += 3_000
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=at, dur=1_000)
    return tb.to_dict()


def test_gradient_accumulation_keeps_each_micro_batch_forward_in_forward():
    med = analyze(_accumulated_step()).metrics.phases.median_ms
    assert med.forward == pytest.approx(4 * 1.0, abs=1e-3)  # every micro-batch's forward, not just the first
    assert med.backward == pytest.approx(4 * 2.0, abs=1e-3)  # each pass's gap between its nodes stays backward
    assert med.optimizer == pytest.approx(1.0, abs=1e-3)
    one = analyze(_accumulated_step(micro=1)).metrics.phases.median_ms
    assert (one.forward, one.backward) == pytest.approx((1.0, 2.0), abs=1e-3)


def test_a_compiled_forward_is_forward():
    """torch.compile: the graph runs inside ``Torch-Compiled Region`` → ``CompiledFunction`` and
    its backward is one node, ``CompiledFunctionBackward``; the loss after it is eager."""
    tb = TraceBuilder(cc=None)
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.op("TorchDynamo Cache Lookup", t + 100, 20)
        tb.op("Torch-Compiled Region: 0/0", t + 200, 3_000)
        tb.op("CompiledFunction", t + 250, 2_900)
        tb.op("aten::addmm", t + 300, 2_000)
        tb.op("aten::_log_softmax", t + 3_300, 200)
        tb.op("autograd::engine::evaluate_function: LogSoftmaxBackward0", t + 4_000, 300)
        tb.op("autograd::engine::evaluate_function: CompiledFunctionBackward", t + 4_300, 4_000)
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t + 8_500, dur=1_000)
    med = analyze(tb.to_dict()).metrics.phases.median_ms
    assert med.forward == pytest.approx(4.0 - 0.2, abs=1e-3)  # from the compiled region to the backward
    assert med.other == pytest.approx(0.2 + 0.2 + 0.5, abs=1e-3)  # before it (the cache lookup), and the gaps


def _closure_step(zero_grad: bool):
    """``LBFGS.step(closure)``, 3 steps of 30 ms: the step (27 ms) calls the closure twice — an
    optional ``optimizer.zero_grad()``, a 1.3 ms forward (``aten::linear`` around ``aten::t`` and
    ``aten::addmm``, then the loss's ``aten::sub``), a 1.4 ms backward — and does its own work
    after each: an ``aten::sub`` (named like the loss's, whose node the backward evaluates) and
    ``aten::dot`` calls."""
    tb = TraceBuilder(cc=None)
    for i in range(3):
        t = i * 30_000
        tb.step(i + 1, t, 30_000)
        tb.add(cat="user_annotation", name="Optimizer.step#LBFGS.step", ts=t + 1_000, dur=27_000)
        for at in (t + 1_100, t + 9_300):
            if zero_grad:
                tb.add(cat="user_annotation", name="Optimizer.zero_grad#LBFGS.zero_grad", ts=at, dur=100)
            tb.op("aten::linear", at + 200, 1_000)
            tb.op("aten::t", at + 210, 50)
            tb.op("aten::addmm", at + 300, 800)
            tb.op("aten::sub", at + 1_300, 100)  # the loss
            tb.op("autograd::engine::evaluate_function: SubBackward0", at + 1_500, 200)
            tb.op("autograd::engine::evaluate_function: AddmmBackward0", at + 1_750, 1_000)
            tb.op("autograd::engine::evaluate_function: TBackward0", at + 2_800, 100)
        tb.op("aten::sub", t + 4_100, 2_000)  # the step's own work between the closure's calls
        tb.op("aten::dot", t + 6_200, 3_000)
        tb.op("aten::dot", t + 12_300, 15_000)
    return tb.to_dict()


@pytest.mark.parametrize("zero_grad", [True, False])
def test_an_optimizer_that_runs_the_closure_keeps_its_forward_and_backward_out_of_the_optimizer(zero_grad):
    """LBFGS calls the forward and backward inside its ``step``: they are forward and backward,
    and only the step's own work is optimizer — not its ``aten::sub``, though the loss's
    ``SubBackward0`` is evaluated (found after ``zero_grad``, or from the node each pass
    evaluates last, ``TBackward0`` → ``aten::t`` inside ``aten::linear``)."""
    med = analyze(_closure_step(zero_grad)).metrics.phases.median_ms
    assert med.forward == pytest.approx(2 * 1.3, abs=1e-3)
    assert med.backward == pytest.approx(2 * 1.4, abs=1e-3)
    assert med.optimizer == pytest.approx(27.0 - 2 * 1.3 - 2 * 1.4, abs=1e-3)
    assert med.other == pytest.approx(3.0, abs=1e-3)


def test_a_closure_whose_zero_grad_comes_after_the_forward_falls_back_to_the_last_node():
    """A closure that zeroes the gradients after the loss (before backward): nothing after the
    zero_grad makes a node, so the forward is found from the node the pass evaluates last."""
    d = _closure_step(zero_grad=False)
    events = d["traceEvents"]
    for e in list(events):
        if e.get("name") == "aten::sub" and e["dur"] == 100:  # the loss: zero_grad right after it
            events.append({**e, "cat": "user_annotation", "name": "Optimizer.zero_grad#LBFGS.zero_grad",
                           "ts": e["ts"] + 110, "dur": 50})
    med = analyze(d).metrics.phases.median_ms
    assert med.forward == pytest.approx(2 * 1.3, abs=1e-3)
    assert med.backward == pytest.approx(2 * 1.4, abs=1e-3)


def _numbered(tb: TraceBuilder, name: str, ts: float, dur: float, seq: int | None) -> None:
    args = {"External id": 1} if seq is None else {"External id": 1, "Sequence number": seq, "Fwd thread id": 0}
    tb.add(cat="cpu_op", name=name, ts=ts, dur=dur, args=args)


#: The backward node each model call below builds (the autograd engine names it after the operator).
_NODE = {"aten::convolution": "ConvolutionBackward0", "aten::mm": "MmBackward0", "aten::fill_": "FillBackward0",
         "aten::mul": "MulBackward0", "aten::cross_entropy_loss": "NllLossBackward0"}


def _steps_after(before: list[tuple[str, float, bool]], model: tuple[str, ...], numbers: bool = True) -> dict:
    """Four CPU training steps: the calls ``before`` (name, µs, whether it carries the counter's
    number; none builds a node) then the ``model``'s calls of 100 µs, each building the node
    :data:`_NODE` names, the backward evaluating them, and an SGD step. Without ``numbers`` no
    call carries a sequence number."""
    tb = TraceBuilder(cc=None)
    counter, t = 50, 0.0
    for s in range(4):
        start = t
        for name, dur, numbered in before:
            _numbered(tb, name, t, dur, counter if numbered and numbers else None)
            t += dur + 5
        for name in model:
            _numbered(tb, name, t, 100, counter if numbers else None)
            counter += 1
            t += 105
        for k, name in enumerate(reversed(model)):
            _numbered(tb, f"autograd::engine::evaluate_function: {_NODE[name]}", t, 50,
                      counter - 1 - k if numbers else None)
            t += 55
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t, dur=40)
        t += 50
        tb.step(s + 1, start, t - start)
        t += 5
    return tb.to_dict()


def _augmenting_loop(numbers: bool = True) -> dict:
    """Each step augments its batch with torch operators (a flip, an ``aten::fill_``: grad mode on,
    no input needs grad, so the autograd counter stays put) before the model; the model's own
    ``aten::fill_`` (a ``fill_diagonal_`` on the similarities, as SimCLR's loss does) builds a
    ``FillBackward0`` that the backward evaluates."""
    return _steps_after([(name, 300, True) for name in ("aten::flip", "aten::fill_", "aten::add")],
                        ("aten::convolution", "aten::mm", "aten::fill_", "aten::cross_entropy_loss"), numbers)


def test_an_augmentation_before_the_model_is_the_loops_own_code_though_its_names_match_the_models():
    """``aten::fill_`` matches a node the backward evaluates, but this call built none (its number
    did not advance the counter): the forward starts at the model's first operator, and the
    augmentation is ``other``. Without numbers the name is all there is to go by."""
    median = analyze(_augmenting_loop()).metrics.phases.median_ms
    assert median.other * 1e3 == pytest.approx(3 * 300 + 2 * 5, abs=20)
    assert median.forward * 1e3 == pytest.approx(4 * 105, abs=20)
    unnumbered = analyze(_augmenting_loop(numbers=False)).metrics.phases.median_ms
    assert unnumbered.other * 1e3 < 350  # from the fill_ on: forward by its name


def test_a_wrappers_work_without_grad_mode_before_the_model_stays_forward():
    """A wrapper's work under ``torch.no_grad()`` at the start of the model's call
    (DistributedDataParallel broadcasts its buffers so): an ``aten::mul`` without a number, whose
    name the model's own ``MulBackward0`` matches. A call without a number is not judged: its name
    starts the forward, as before numbers were read."""
    trace = _steps_after([("aten::mul", 300, False)], ("aten::convolution", "aten::mul", "aten::cross_entropy_loss"))
    median = analyze(trace).metrics.phases.median_ms
    assert median.forward * 1e3 == pytest.approx(305 + 3 * 105, abs=20) and median.other * 1e3 < 20


def test_an_ema_update_under_no_grad_before_the_model_is_the_loops_own_code():
    """``p_t.mul_(m).add_(p_s, alpha=1 - m)`` under no_grad after the optimizer (a teacher's EMA):
    no number, written in place, whatever node names it matches; a collective before the first
    layer (DistributedDataParallel's buffer broadcast) starts the forward."""
    def loop(first: str) -> dict:
        return _steps_after([(first, 50, False)] * 4, ("aten::convolution", "aten::mul", "aten::cross_entropy_loss"))
    ema = analyze(loop("aten::mul_")).metrics.phases.median_ms
    assert ema.other * 1e3 == pytest.approx(4 * 55, abs=20) and ema.forward * 1e3 == pytest.approx(3 * 105, abs=10)
    ddp = analyze(loop("c10d::broadcast_")).metrics.phases.median_ms
    assert ddp.other * 1e3 < 20 and ddp.forward * 1e3 == pytest.approx(4 * 55 + 3 * 105, abs=10)
