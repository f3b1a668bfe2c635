"""``step-outliers`` with nothing gpumagic watches to explain them: when the recorded steps called
the same operators yet took very different times (batches of varying length), it says so, and
its record fix records the shapes."""

from __future__ import annotations

import gzip
import json
import os

import everystep_blocks as blocks
from tracebuilder import DATA, TraceBuilder

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


def _contended_with_a_late_outlier(event=None):
    """The loop recorded beside two spinning processes (tests/data/cpu_contended.json.gz), its
    step timer carried on for 20 more steps of 30 ms, one of them 400 ms (with ``event`` beside it,
    or nothing)."""
    with gzip.open(os.path.join(DATA, "cpu_contended.json.gz"), "rt") as fh:
        d = json.load(fh)
    es = d["gpumagic"]["every_step"]
    for i in range(20):
        es["start_ms"].append(es["start_ms"][-1] + es["step_ms"][-1] + 0.01)
        es["step_ms"].append(400.0 if i == 12 else 30.0)
    if event is not None:
        es["events"] = [{"kind": event, "start_ms": es["start_ms"][-8] + 1, "dur_ms": 380.0, "detail": ""}]
    return d


def test_unexplained_outliers_on_a_busy_machine_are_low_and_say_so():
    """Nothing in the process explains the slow step and the neighbours took cores while recording:
    host-contended tells that story; the outlier is listed, low, "on a busy machine"."""
    r = analyze(_contended_with_a_late_outlier())
    f = r.finding("step-outliers")
    assert r.finding("host-contended") is not None
    assert f.severity == "low" and f.title.endswith(", on a busy machine"), (f.severity, f.title)
    assert "may have waited for the neighbours" in f.evidence.summary
    # a garbage collection explains it: the loop's own pause, judged by its share as on a quiet machine
    g = analyze(_contended_with_a_late_outlier("gc")).finding("step-outliers")
    assert g.evidence.numbers["explained_by_gc"] == 1
    assert g.severity == "high" and not g.title.endswith("busy machine")


def _periodic(later_long_ms, event=None):
    """A loop whose every fifth step runs more (a WGAN's generator update after five critic
    updates): 40 ms against 10; the window recorded steps 1–10 (two long ones, 5 and 10), and the
    long steps after it took ``later_long_ms`` (with ``event`` running through them, or nothing)."""
    steps = [40.0 if i % 5 == 0 and i else 10.0 for i in range(40)]
    for i in range(15, 40, 5):
        steps[i] = later_long_ms
    b = blocks.block(steps, recorded=range(1, 11), profiled=11)
    if event is not None:
        b["events"] = [{"kind": event, "start_ms": b["start_ms"][i] + 1, "dur_ms": later_long_ms - 12.0, "detail": ""}
                       for i in range(15, 40, 5)]
    return blocks.with_every_step(b)


def test_later_steps_as_long_as_recorded_ones_are_the_loops_own_work():
    """The window recorded such steps; the others findings judge them there: not outliers."""
    assert analyze(_periodic(40.0)).finding("step-outliers") is None
    assert analyze(_periodic(33.0)).finding("step-outliers") is None  # within 2/3 to 3/2 of 40 ms


def test_a_recorded_long_step_under_the_outliers_20_ms_bar_still_matches_later_ones():
    """A PPO loop's rollout every few updates: recorded at 29 ms against a 10 ms median (19 ms
    over, under the 20 ms an outlier needs), later ones at 31 ms (21 ms over): the same periodic
    work, not a pause the window missed."""
    b = _periodic(31.0)
    steps = b["gpumagic"]["every_step"]["step_ms"]
    steps[5] = steps[10] = 29.0
    assert analyze(b).finding("step-outliers") is None


def test_later_steps_far_longer_than_any_recorded_or_explained_are_still_outliers():
    f = analyze(_periodic(250.0)).finding("step-outliers")  # 6× the recorded long steps: a pause the window missed
    assert f is not None and f.evidence.numbers["outliers"] == 5 and "like_recorded" not in f.evidence.numbers
    g = analyze(_periodic(40.0, event="gc")).finding("step-outliers")  # a collection each time: its own fix
    assert g is not None and g.evidence.numbers["explained_by_gc"] == 5


def test_some_outliers_like_recorded_ones_are_named_apart():
    b = _periodic(40.0)
    b["gpumagic"]["every_step"]["step_ms"][23] = 300.0  # one pause besides the periodic steps
    f = analyze(b).finding("step-outliers")
    assert f.evidence.numbers["outliers"] == 1 and f.evidence.numbers["worst_index"] == 23
    assert f.evidence.numbers["like_recorded"] == 5
    assert "5 more took about as long as steps the window recorded (step 5, 40 ms, step 10, 40 ms)" in \
        f.evidence.summary


def test_workers_started_again_in_an_outlier_get_persistent_workers_even_when_the_start_is_short():
    """The start is timed (30 ms of a 240 ms excess), not the new workers' first batches made beside
    the step: persistent workers come first, then recording such a step for the rest."""
    steps = [10.0] * 30
    steps[20] = 250.0
    b = blocks.block(steps)
    b["events"] = [{"kind": "loader", "start_ms": b["start_ms"][20] + 1, "dur_ms": 30.0, "detail": "2 worker(s)"}]
    f = analyze(blocks.with_every_step(b)).finding("step-outliers")
    assert "explained_by_loader" not in f.evidence.numbers and f.evidence.numbers["with_loader"] == 1
    assert "persistent_workers=True" in f.fixes[0].code and "num_workers=2" in f.fixes[0].code
    assert "not the new workers' first batches" in f.fixes[0].description
    assert f.evidence.numbers["workers_started"] == 1
    assert f.fixes[1].code.startswith("%%gpuprofile --skip 20") and f.doc_url.endswith("data.html#torch.utils.data.DataLoader")
    b["events"][0]["detail"] = "workers stopped"  # a stop alone: no start in the step, nothing to keep alive
    g = analyze(blocks.with_every_step(b)).finding("step-outliers")
    assert not any("persistent_workers" in x.code for x in g.fixes)
