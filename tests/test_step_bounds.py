"""Step bounds (analysis.context._steps): each ProfilerStep# span extended to the end of the GPU
work launched inside it, never past the next step's start; the same as a sweep per step."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumagic.analysis.context import _steps


def by_sweep(ts, dur, steps, launch_ts):
    """The definition, one step at a time over every GPU event."""
    starts, ends = ts[steps], ts[steps] + dur[steps]
    gpu = np.flatnonzero(launch_ts >= 0)
    g_launch, g_end = launch_ts[gpu], ts[gpu] + dur[gpu]
    bounds = []
    for i in range(steps.size):
        in_step = (g_launch >= starts[i]) & (g_launch < ends[i])
        end = max(int(ends[i]), int(g_end[in_step].max()) if in_step.any() else 0)
        if i + 1 < steps.size:
            end = min(end, int(starts[i + 1])) if starts[i + 1] > starts[i] else end
        bounds.append((int(starts[i]), end))
    return bounds


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_step_ends_match_a_sweep_per_step(data):
    n = data.draw(st.integers(1, 60))
    ts = np.array(sorted(data.draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))), dtype=np.int64)
    dur = np.array(data.draw(st.lists(st.integers(0, 300), min_size=n, max_size=n)), dtype=np.int64)
    steps = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n))), dtype=np.int64)
    # some events are GPU work launched at a time (any: before, inside or after a step), others not
    launch_ts = np.array(data.draw(st.lists(st.integers(-1, 1300), min_size=n, max_size=n)), dtype=np.int64)
    launch_ts[steps] = -1  # a step annotation is host work
    trace = SimpleNamespace(events=SimpleNamespace(ts_ns=ts, dur_ns=dur, name=np.zeros(n, np.int32)),
                            names=["ProfilerStep#1"])
    bounds, names = _steps(trace, steps, {}, launch_ts)
    assert bounds == by_sweep(ts, dur, steps, launch_ts)
    assert names == ["ProfilerStep#1"] * steps.size


def test_no_gpu_work_and_work_after_the_last_step():
    ts = np.array([0, 10, 50, 60], dtype=np.int64)
    dur = np.array([40, 5, 40, 100], dtype=np.int64)
    trace = SimpleNamespace(events=SimpleNamespace(ts_ns=ts, dur_ns=dur, name=np.zeros(4, np.int32)), names=["s"])
    none = np.full(4, -1, dtype=np.int64)
    assert _steps(trace, np.array([0, 2]), {}, none)[0] == [(0, 40), (50, 90)]
    launched = none.copy()
    launched[3] = 55  # launched in step 2, runs to 160: the last step reaches it
    launched[1] = 20  # launched in step 1, ends at 15: inside the step already
    assert _steps(trace, np.array([0, 2]), {}, launched)[0] == [(0, 40), (50, 160)]
