"""A window with no step starts where the profiled code starts (the capture's
``gpumagic::code_start`` range), not at the capture's own set-up before it."""

from __future__ import annotations

import pytest
from tracebuilder import TraceBuilder

from gpumagic import analyze
from gpumagic.trace.links import CODE_START


def _trace(marker_at: float | None, steps: bool = False) -> dict:
    tb = TraceBuilder(cc=None)
    tb.add(cat="user_annotation", name="gpumagic::clock_anchor", ts=0, dur=30)
    if marker_at is not None:
        tb.add(cat="user_annotation", name=CODE_START, ts=marker_at, dur=2)
    for i in range(10):
        tb.op("aten::addmm", 1_000 + i * 100, 90)
    if steps:
        tb.step(1, 1_000, 500)
        tb.step(2, 1_500, 500)
    return tb.to_dict()


def test_the_window_starts_at_the_end_of_the_code_start_range():
    assert analyze(_trace(None)).metrics.window.dur_ms == pytest.approx(1.99)  # from the anchor
    assert analyze(_trace(600)).metrics.window.dur_ms == pytest.approx(1.99 - 0.602)


def test_steps_bound_the_window_whatever_the_marker_says():
    assert analyze(_trace(600, steps=True)).metrics.window.dur_ms == pytest.approx(1.0)


def test_a_marker_after_every_operator_leaves_the_window_as_it_was():
    """(a capture that recorded no code: nothing after the marker to start a window)"""
    assert analyze(_trace(5_000)).metrics.window.dur_ms == pytest.approx(5.002)  # the anchor to the marker


def test_a_capture_records_the_marker_after_its_own_set_up():
    torch = pytest.importorskip("torch")
    import gpumagic

    x = torch.randn(64, 64)
    with gpumagic.profile(display=False) as run:
        for _ in range(20):
            x = x @ x.T / 64
    ev = run.trace.events
    names = run.trace.names
    marker = [i for i, n in enumerate(names) if n == CODE_START]
    anchor = [i for i, n in enumerate(names) if n == "gpumagic::clock_anchor"]
    assert len(marker) == 1 and len(anchor) == 1
    at = ev.ts_ns[ev.name == marker[0]]
    assert at.size == 1 and at[0] > ev.ts_ns[ev.name == anchor[0]][0]
    mm = ev.ts_ns[ev.name == names.index("aten::mm")]
    assert mm.min() > at[0]
    assert run.report.metrics.window.dur_ms * 1e6 <= int((ev.ts_ns + ev.dur_ns).max() - at[0]) + 1


def test_a_first_recorded_step_starts_after_the_capture_s_hooks(monkeypatch):
    """With skip=0 the first step marker opens once the step hooks are installed: their set-up is
    the capture's, not the step's."""
    torch = pytest.importorskip("torch")
    import torch.profiler as tp

    import gpumagic
    from gpumagic.capture import session

    installed = session.OptimizerStepHook.install

    def install(self):
        with tp.record_function("test::hooks installed"):
            pass
        return installed(self)

    monkeypatch.setattr(session.OptimizerStepHook, "install", install)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpumagic.profile(steps=2, skip=0, display=False) as run:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    ev, names = run.trace.events, run.trace.names
    hooks = ev.ts_ns[ev.name == names.index("test::hooks installed")]
    first = ev.ts_ns[ev.name == names.index("ProfilerStep#0")]
    assert hooks.size == 1 and first.size == 1 and first[0] > hooks[0]
    assert run.report.metrics.window.start_ns == first[0]
