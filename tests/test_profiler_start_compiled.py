"""Compiled code's first call under a newly started profiler is slow even when it compiled long
before (``benchmarks/profiler_aftermath.py``): ``warmup-in-window`` then says to record more steps,
not only to skip some, when the step timer saw no compilation in the cell."""

from __future__ import annotations

from tracebuilder import TraceBuilder

from gpumagic import analyze


def _bundle(compiled_in_cell: bool) -> dict:
    tb = TraceBuilder(cc=None)
    t = 0
    for i in range(8):
        region = 40_000 if i == 0 else 300
        step = region + 1_000
        tb.step(i + 1, t, step)
        tb.op("Torch-Compiled Region: 0/0", t + 10, region)
        tb.op("aten::addmm", t + region + 50, 800)
        t += step
    d = tb.to_dict()
    events = [{"kind": "compile", "start_ms": 0.0, "dur_ms": 35.0, "detail": "0/0"}] if compiled_in_cell else []
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "machine": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None}, "samples": {},
                     "every_step": {"step_ms": [41.0] + [1.3] * 7, "start_ms": [0.0] + [41.0 + 1.3 * k for k in range(7)],
                                    "recorded": list(range(8)), "profiled": 8, "events": events}}
    return d


def test_a_region_compiled_before_the_profiler_gets_more_steps_recorded():
    f = analyze(_bundle(False)).finding("warmup-in-window")
    assert any("Torch-Compiled Region" in e for e in [f.evidence.summary])
    first = f.fixes[0]
    assert first.description.startswith("Record more steps") and first.code == "%%gpuprofile --steps 20"


def test_a_compilation_in_the_cell_keeps_the_skip_advice_only():
    f = analyze(_bundle(True)).finding("warmup-in-window")
    assert not any(x.description.startswith("Record more steps") for x in f.fixes)


def _capped_compile(stop_reason="cap", steps_seen=0):
    """A CPU capture that compiled for 5 s and was stopped by the time cap before any step."""
    tb = TraceBuilder(cc=None)
    tb.op("entire_frame_compile", 100, 5_000_000)
    tb.op("aten::mm", 5_000_200, 50)
    d = tb.to_dict()
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "machine": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None}, "samples": {},
                     "capture": {"max_seconds": 5.0, "stop_reason": stop_reason, "optimizer_steps_seen": steps_seen}}
    return d


def test_a_window_cut_by_the_time_cap_before_any_step_asks_for_more_time_first():
    """Skipping steps cannot help: the cap counts from the start, skipped steps included."""
    f = analyze(_capped_compile()).finding("warmup-in-window")
    assert f.fixes[0].code == "%%gpuprofile --max-seconds 120"
    assert "5 s time cap" in f.fixes[0].description
    other = analyze(_capped_compile(stop_reason="steps", steps_seen=6)).finding("warmup-in-window")
    assert "--max-seconds" not in " ".join(fx.code for fx in other.fixes)
