"""An evaluation loop inside the recorded window is its own segment (``analysis.segments``): the
steady-state rules judge the training steps around it, not its batches, syncs and loader waits.
A module left in eval mode while the optimizer keeps stepping (a frozen backbone) is training."""

from __future__ import annotations

import os
from dataclasses import replace

import everystep_blocks as blocks
import pytest
from tracebuilder import TraceBuilder

from gpumagic import analyze
from gpumagic.analysis import everystep as es

STEP_US = 10_000
EVAL_STEP = 6  # the step that holds the evaluation (40 ms instead of 10)


def _bundle(eval_events, shift_ms=0.0, trace_origin_us=5_000_000):
    """Steps 0..12 on the timer's clock; 1..10 recorded. Step 6 lasts 40 ms in both clocks; the
    trace's steps start ``trace_origin_us`` later than the timer's (another clock)."""
    steps = [10.0] * 13
    steps[EVAL_STEP] = 40.0
    block = blocks.block(steps, recorded=range(1, 11), profiled=11, events=eval_events)
    tb = TraceBuilder(cc=None)
    for k in range(1, 11):
        ts = trace_origin_us + (block["start_ms"][k] + shift_ms) * 1000
        tb.step(k, ts, steps[k] * 1000)
        tb.op("aten::mm", ts + 100, steps[k] * 1000 - 200)
    d = tb.to_dict()
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "machine": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None}, "samples": {}, "every_step": block}
    return d, block


def _eval_in_step(block, k, start_after_ms=1.0, dur_ms=30.0):
    return {"kind": "eval", "start_ms": block["start_ms"][k] + start_after_ms, "dur_ms": dur_ms, "detail": ""}


def test_an_evaluation_loop_in_the_window_is_its_own_segment():
    _, block = _bundle([])
    d, _ = _bundle([_eval_in_step(block, EVAL_STEP)])
    r = analyze(d)
    segs = r.metrics.window.segments
    (ev,) = [s for s in segs if s.kind == "evaluation"]
    step6 = r.metrics.steps.bounds_ns[EVAL_STEP - 1]
    assert ev.start_ms == pytest.approx((step6[0] - r.metrics.window.start_ns) / 1e6 + 1.0, abs=0.01)
    assert ev.dur_ms == pytest.approx(30.0, abs=0.01)
    assert "no optimizer step" in ev.evidence[0]
    assert r.metrics.window.steady_frac < 1.0 and r.metrics.window.steady_judged_ms is not None
    assert any("evaluation" in n and "longest steady stretch" in n and "the other steady stretch too" in n
               for n in r.notes)
    assert r.finding("warmup-in-window") is None  # an evaluation is no warm-up


ADAM_INNER = ("aten::lerp_", "aten::mul_", "aten::addcmul_", "aten::sqrt")


def _adam_bundle(eval_events):
    """Like :func:`_bundle`, but each step ends in a 2.9 ms for-loop Adam update (unfused-optimizer)."""
    steps = [10.0] * 13
    steps[EVAL_STEP] = 40.0
    block = blocks.block(steps, recorded=range(1, 11), profiled=11, events=eval_events)
    tb = TraceBuilder(cc=None)
    for k in range(1, 11):
        ts = 5_000_000 + block["start_ms"][k] * 1000
        tb.step(k, ts, steps[k] * 1000)
        tb.op("aten::addmm", ts + 100, 4000)
        o = ts + steps[k] * 1000 - 3000
        tb.op("Optimizer.step#Adam.step", o, 2900, cat="user_annotation")
        for j, name in enumerate(ADAM_INNER):
            tb.op(name, o + 5 + j * 700, 690)
    d = tb.to_dict()
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "machine": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None}, "samples": {}, "every_step": block}
    return d, block


def test_a_steady_findings_gain_counts_every_steady_stretch():
    """An evaluation in the middle splits the training steps in two steady stretches: the rules
    judge the longer one, but the optimizer's for-loop runs in both, so the gain counts both
    (all ten 2.9 ms updates), not only the judged stretch's five."""
    _, block = _adam_bundle([])
    d, _ = _adam_bundle([_eval_in_step(block, EVAL_STEP)])
    r = analyze(d)
    assert [s.kind for s in r.metrics.window.segments] == ["steady", "evaluation", "steady"]
    window_ms = r.metrics.window.dur_ms
    f = r.finding("unfused-optimizer")
    assert f.evidence.numbers["optimizer_steps"] == 5  # judged on the longer stretch
    assert f.est_gain == pytest.approx(10 * 2.9 / window_ms, abs=0.005)  # not 5 * 2.9 / window_ms


def test_the_evaluation_is_its_own_phase_of_the_step_that_holds_it():
    """Step 6's 30 ms evaluation is its ``evaluation`` phase, not forward (its operators would read
    as the model's forward pass); the phases still add up to each step, the other steps have none."""
    _, block = _adam_bundle([])
    r = analyze(_adam_bundle([_eval_in_step(block, EVAL_STEP)])[0])
    ph = r.metrics.phases
    for parts, dur in zip(ph.per_step, r.metrics.steps.durations_ms, strict=True):
        assert sum(v for _, v in parts.items()) == pytest.approx(dur, abs=1e-3)
    evals = [p.evaluation for p in ph.per_step]
    assert evals[EVAL_STEP - 1] == pytest.approx(30.0, abs=0.01) and sum(evals) == pytest.approx(30.0, abs=0.01)
    assert ph.per_step[EVAL_STEP - 1].forward < 10.0 and ph.median_ms.evaluation == 0.0
    assert any(e - s == pytest.approx(30e6, abs=1e4) for s, e in ph.spans_ns[EVAL_STEP - 1]["evaluation"])


def test_a_steady_stretch_that_is_not_the_loop_is_not_counted():
    """Set-up before a cold start (a few operators, no kernel: the shared V100 trace's first
    162 ms) is steady by elimination, but not the loop the judged stretch runs: its time does not
    scale the gains."""
    from tracebuilder import DATA

    from gpumagic.analysis import segments
    from gpumagic.analysis.context import build_context
    from gpumagic.trace import load

    ctx = build_context(load(os.path.join(DATA, "volta_resnet50_coldstart_nw4.json.gz")))
    kinds = [s.kind for s in segments.segments(ctx).items]
    assert kinds == ["steady", "cold_start", "steady"] and segments.steady_others(ctx)[0].size == 0
    _, block = _adam_bundle([])
    ctx = build_context(load(_adam_bundle([_eval_in_step(block, EVAL_STEP)])[0]))
    assert segments.steady_others(ctx)[0].size == 1  # the training steps after the evaluation


def test_a_ratio_gain_scales_by_every_steady_stretch(monkeypatch):
    """A steady-state finding whose gain is a share of its stretch (no time it claims, such as
    cpu-op-overhead's) becomes that share of all the steady time, not of the judged stretch's."""
    import gpumagic.analysis as analysis
    from gpumagic.analysis.rules.base import finding

    def half(ctx, m):
        return replace(finding(severity="high", title="half", why="", summary="", numbers={}, est_gain=0.5,
                               gain_method="a share of the stretch", fixes=(), doc_url=""), id="cpu-op-overhead")

    monkeypatch.setattr(analysis, "CAUSE_RULES", (half,))
    monkeypatch.setattr(analysis, "STEADY_RULES", (half,))
    _, block = _adam_bundle([])
    r = analyze(_adam_bundle([_eval_in_step(block, EVAL_STEP)])[0])
    steady_ms = sum(s.dur_ms for s in r.metrics.window.segments if s.kind == "steady")
    assert r.finding("cpu-op-overhead").est_gain == pytest.approx(0.5 * steady_ms / r.metrics.window.dur_ms, abs=0.01)


def test_a_frozen_submodule_in_eval_mode_is_training():
    """``model.train(); model.backbone.eval()``: eval mode until the next epoch's train(), with
    optimizer steps all along: no evaluation, nothing cut from the window."""
    _, block = _bundle([])
    frozen = {"kind": "eval", "start_ms": block["start_ms"][0] + 1.0, "dur_ms": block["start_ms"][12], "detail": ""}
    r = analyze(_bundle([frozen])[0])
    assert [s.kind for s in r.metrics.window.segments] == ["steady"]
    assert not any("not all steady" in n for n in r.notes)


def _step_marks(d):
    steps = [e for e in d["traceEvents"] if e["name"].startswith("ProfilerStep#")]
    return [e["name"] for e in steps], [(int(e["ts"] * 1000), int((e["ts"] + e["dur"]) * 1000)) for e in steps]


def test_an_evaluation_needs_most_steps_to_agree_on_the_clocks():
    _, block = _bundle([])
    d, _ = _bundle([_eval_in_step(block, EVAL_STEP)])
    b = es.read(d["gpumagic"]["every_step"], [])
    names, bounds = _step_marks(d)
    assert len(es.evaluation_spans_ns(b, names, bounds)) == 1
    drifting = [(s + 3_000_000 * i, e + 3_000_000 * i) for i, (s, e) in enumerate(bounds)]  # 3 ms more each step
    assert es.evaluation_spans_ns(b, names, drifting) == []  # a trace and a block from different captures
    one_off = [(bounds[0][0] + 50_000_000, bounds[0][1] + 50_000_000), *bounds[1:]]  # one hook preempted 50 ms
    assert len(es.evaluation_spans_ns(b, names, one_off)) == 1


def test_is_evaluation_means_no_optimizer_step_inside():
    ends = [10.0, 20.0, 30.0]
    assert es.is_evaluation({"start_ms": 11.0, "dur_ms": 8.0}, ends)
    assert not es.is_evaluation({"start_ms": 11.0, "dur_ms": 10.0}, ends)  # the step ending at 20 ran inside
    assert es.is_evaluation({"start_ms": 31.0, "dur_ms": 100.0}, ends)  # after the last step


def test_an_eval_mode_span_with_steps_in_it_explains_no_outlier():
    steps = [10.0] * 30
    steps[20] = 250.0
    b = blocks.block(steps)
    b["events"] = [{"kind": "eval", "start_ms": b["start_ms"][2], "dur_ms": b["start_ms"][29] - b["start_ms"][2],
                    "detail": ""}]
    (o,) = es.outliers(es.read(b, []))
    assert o["index"] == 20 and o["causes"] == []
    f = analyze(blocks.with_every_step(b)).finding("step-outliers")
    assert "record such a step" in " ".join(fx.description for fx in f.fixes)
    assert "Evaluation ran inside" not in " ".join(fx.description for fx in f.fixes)


def _train(evaluate_at=None, frozen=False):
    """Ten optimizer steps of a small CPU model under ``gpumagic.profile`` (steps 1–5 recorded);
    an evaluation loop after step ``evaluate_at``; ``frozen``: the first layer kept in eval mode."""
    import torch

    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpumagic.profile(steps=5, nvml=False, display=False) as run:
        model.train()
        if frozen:
            model[1].eval()  # running statistics frozen: the optimizer still steps every layer
        for i in range(10):
            loss = model(torch.randn(16, 32)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i == evaluate_at:
                model.eval()
                with torch.no_grad():
                    for _ in range(20):
                        model(torch.randn(256, 32)).argmax(1)
                model.train()
    return run.report


def test_a_live_evaluation_inside_the_recorded_steps():
    r = _train(evaluate_at=2)  # after step 2's optimizer step: inside recorded step 3
    (ev,) = [s for s in r.metrics.window.segments if s.kind == "evaluation"]
    k = r.metrics.steps.names.index("ProfilerStep#3")
    step3 = r.metrics.steps.bounds_ns[k]
    start = r.metrics.window.start_ns + ev.start_ms * 1e6
    assert step3[0] <= start and start + ev.dur_ms * 1e6 <= step3[1] + 1e6  # inside step 3 (1 ms for the clocks)
    phases = r.metrics.phases.per_step
    assert phases[k].evaluation == pytest.approx(ev.dur_ms, abs=1.0)  # the segment, inside its step (1 ms for the clocks)
    assert all(p.evaluation == 0.0 for i, p in enumerate(phases) if i != k)


def test_a_live_frozen_submodule_is_no_evaluation():
    r = _train(frozen=True)
    assert "evaluation" not in {s.kind for s in r.metrics.window.segments}


@pytest.mark.parametrize("kind,page", [("eval", "optimization_tutorial"), ("torch.save", "async_checkpoint"),
                                       ("compile", "recompilation"), ("gc", "gc.html"), (None, "gc.html")])
def test_the_outliers_page_follows_what_explains_them(kind, page):
    f = analyze(blocks.outlier_bundle(kind)).finding("step-outliers")
    assert page in f.doc_url

