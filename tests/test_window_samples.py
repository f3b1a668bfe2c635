"""CPU samples for a window shorter than the sampling period (``analysis.hostcpu.window_samples``):
five 4 ms steps fall between two 100 ms samples, and the sample after the window, which covers
all of it, describes the machine's load; a comparison then sees the load both runs ran beside."""

from __future__ import annotations

import pytest
from tracebuilder import TraceBuilder

from gpumagic import analyze
from gpumagic.tuning.comparison import compare


def _short_run(other_pct: float, sample_ms: list[float], step_us: float = 4_000) -> dict:
    """Five CPU-only steps from 0 to 20 ms; CPU samples at ``sample_ms`` on 2 usable cores, the
    main thread using one core and other processes ``other_pct`` of the other."""
    tb = TraceBuilder(cc=None)
    for i in range(5):
        t = i * step_us
        tb.step(i + 1, t, step_us)
        tb.op("aten::addmm", t + 10, step_us - 200)
        tb.op("Optimizer.step#SGD.step", t + step_us - 150, 100)
    d = tb.to_dict()
    times = [int(ms * 1e6) for ms in sample_ms]
    busy = 100.0 + other_pct
    d["gpumagic"] = {
        "format": 1, "label": "", "notes": [], "capture": {}, "versions": {}, "clock": {"anchor_epoch_ns": None},
        "machine": {"cpu_count": 2, "cpu_affinity": [0, 1], "cpu_quota_cores": None,
                    "usable_cores": 2.0, "usable_cores_source": "affinity"},
        "samples": {"cpu": {"t_epoch_ns": times, "total": [busy / 2] * len(times),
                            "per_core": [[100.0, other_pct]] * len(times), "main": [100.0] * len(times),
                            "workers": [0.0] * len(times), "worker_count": [0] * len(times)}},
    }
    return d


def test_the_sample_after_a_short_window_describes_it():
    r = analyze(_short_run(90.0, [60.0, 160.0]))
    host = r.metrics["host"]
    assert r.metrics["samples"]["count"] == 1  # the one at 60 ms: it covers the whole window
    assert host["other_busy_cores"] == pytest.approx(0.9) and host["shared_machine"] is True
    assert host["cpu_busy_cores"] == pytest.approx(1.9)


def test_samples_inside_the_window_are_the_ones_used():
    r = analyze(_short_run(90.0, [10.0, 60.0]))
    assert r.metrics["samples"]["count"] == 1  # the 10 ms sample; the later one is not needed
    none_after = analyze(_short_run(90.0, [-50.0]))  # only a sample before the window: nothing covers it
    assert none_after.metrics["samples"]["count"] == 0 and none_after.metrics["host"]["other_busy_cores"] is None


def test_a_comparison_of_short_runs_names_the_load_they_ran_beside():
    """The same loop, the second run beside a neighbour that kept a core busy and every step 4×
    longer: the comparison says so before the verdict (before, neither run had an in-window sample,
    and a 4× slowdown read as the code's)."""
    quiet, busy = analyze(_short_run(0.0, [60.0])), analyze(_short_run(95.0, [200.0], step_us=16_000))
    d = compare(quiet, busy).to_dict()
    keys = {c["key"]: c for c in d["conditions_detail"]}
    assert d["change"] == "slower" and keys["other_busy_cores"]["explains"] and d["caution"]
