"""Step markers are moved out of ``Optimizer.step`` annotations so that a thread's events nest."""

from __future__ import annotations

import json

from gpumagic.capture import CaptureOptions, CaptureSession
from gpumagic.capture.markers import nest_step_markers


def _x(name, ts, dur, cat="user_annotation", tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _trace(*events):
    return json.dumps({"schemaVersion": 1, "traceEvents": list(events)}, indent=1).encode()


def test_marker_edges_inside_an_optimizer_step_move_to_its_end():
    raw = _trace(
        _x("ProfilerStep#1", 100.0, 50.0, **{"External id": 3}),
        _x("Optimizer.step#SGD.step", 140.0, 20.0),  # the marker's end (150) falls inside: -> 160
        _x("ProfilerStep#2", 150.5, 40.0),
        _x("Optimizer.step#SGD.step", 180.0, 30.0),
        _x("aten::add", 120.0, 5.0, cat="cpu_op"),
    )
    events = json.loads(nest_step_markers(raw))["traceEvents"]
    assert events[0] == _x("ProfilerStep#1", 100.0, 60.0, **{"External id": 3})
    assert (events[2]["ts"], events[2]["dur"]) == (160.0, 50.0)  # 150.5 -> 160, 190.5 -> 210
    assert events[1] == _x("Optimizer.step#SGD.step", 140.0, 20.0)
    assert events[4] == _x("aten::add", 120.0, 5.0, cat="cpu_op")


def test_nested_optimizers_move_the_edge_past_the_outermost():
    raw = _trace(_x("Optimizer.step#Outer.step", 10.0, 30.0), _x("Optimizer.step#SGD.step", 15.0, 10.0),
                 _x("ProfilerStep#4", 20.0, 100.0))
    assert json.loads(nest_step_markers(raw))["traceEvents"][2]["ts"] == 40.0


def test_other_threads_gpu_copies_and_clean_traces_are_untouched():
    raw = _trace(_x("Optimizer.step#SGD.step", 10.0, 30.0, tid=2),
                 _x("ProfilerStep#1", 20.0, 100.0, cat="gpu_user_annotation"),
                 _x("ProfilerStep#2", 20.0, 100.0))
    assert nest_step_markers(raw) == raw


def test_a_name_with_escapes_or_braces_in_other_fields_is_handled():
    tricky = _x("ProfilerStep#1", 20.0, 100.0, note='a "quoted" {brace} \\ slash')
    raw = _trace(_x("Optimizer.step#SGD.step", 10.0, 30.0), tricky)
    moved = json.loads(nest_step_markers(raw))["traceEvents"][1]
    assert (moved["ts"], moved["args"]["note"]) == (40.0, 'a "quoted" {brace} \\ slash')


def _violations(events, tolerance_us=1e-3):
    """Pairs (outer, inner) where inner starts inside outer but ends after it, per thread."""
    out, by_thread = [], {}
    for e in events:
        by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    for evs in by_thread.values():
        stack = []
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + tolerance_us:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + tolerance_us:
                out.append((stack[-1]["name"], e["name"]))
            stack.append(e)
    return out


def test_a_captured_trace_nests_on_every_thread(train):
    session = CaptureSession(CaptureOptions())
    session.start()
    train(9)
    run = session.finish()
    events = [e for e in json.loads(run.bundle)["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("user_annotation", "cpu_op")]
    assert _violations(events) == []
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    optimizer_ends = [e["ts"] + e["dur"] for e in events if e["name"].startswith("Optimizer.step#")]
    assert len(steps) == 5
    # float µs timestamps: ts + dur of two events that end together can differ in the last digits
    unmatched = [s for s in steps if not any(abs(s["ts"] + s["dur"] - end) <= 0.002 for end in optimizer_ends)]
    assert unmatched == [], (unmatched, optimizer_ends)


def test_an_optimizer_step_cut_off_by_the_stop_is_shortened_not_followed():
    raw = _trace(_x("ProfilerStep#5", 100.0, 50.0),
                 _x("Optimizer.step#SGD.step", 140.0, 900.0, finished=False))  # ends when recording stopped
    events = json.loads(nest_step_markers(raw))["traceEvents"]
    assert (events[0]["ts"], events[0]["dur"]) == (100.0, 50.0)
    assert (events[1]["ts"], events[1]["dur"], events[1]["args"]["finished"]) == (140.0, 10.0, False)
