"""Bundles with a step timer's ``every_step`` block built by hand (issue 30), for the outlier tests
and the fixes' snippet checks."""

from __future__ import annotations

from tracebuilder import TraceBuilder


def block(steps, recorded=(1, 2), profiled=3, events=()):
    """An ``every_step`` block of these step durations (ms), back to back, 10 µs apart."""
    starts, t = [], 0.0
    for d in steps:
        starts.append(t)
        t += d + 0.01
    return {"step_ms": list(steps), "start_ms": starts, "recorded": list(recorded), "profiled": profiled,
            "events": list(events)}


def with_every_step(every_step):
    """A three-step GPU trace as a gpumagic bundle carrying ``every_step``."""
    tb = TraceBuilder()
    for i in range(3):
        tb.step(i + 1, i * 10_000, 10_000)
        tb.kernel("k", i * 10_000 + 100, 8_000, launch_ts=i * 10_000 + 50)
    d = tb.to_dict()
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "machine": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None}, "samples": {}, "every_step": every_step}
    return d


def outlier_bundle(kind):
    """Step 20 of 30 took 250 ms, with an event of ``kind`` (or none) running 230 ms of it; for
    ``"data"``, 230 ms of it waiting in the DataLoader's next() (the block's ``wait_ms``)."""
    steps = [10.0] * 30
    steps[20] = 250.0
    b = block(steps)
    if kind == "data":
        b["wait_ms"] = [0.5] * 30
        b["wait_ms"][20] = 230.0
    elif kind is not None:
        b["events"] = [{"kind": kind, "start_ms": b["start_ms"][20] + 1, "dur_ms": 230.0, "detail": ""}]
    return with_every_step(b)
