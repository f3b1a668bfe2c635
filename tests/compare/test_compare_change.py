"""A comparison's ``change``, ``speedup_ci`` and ``conditions``, from synthetic step samples: the
statistics and the decisions are checked on numbers, never on how fast this machine runs."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from gpumagic.render.comparison import headline, render_fragment, render_text
from gpumagic.report.metrics import ConditionsMetrics, DeviceMetrics
from gpumagic.report.model import Report
from gpumagic.tuning import stats
from gpumagic.tuning.comparison import compare


def _report(steps_ms, label="", host=None, conditions=None, device="Test GPU") -> Report:
    """A report whose steps, host load, conditions and device are the given ones: the metrics of
    a recorded trace (typed records) with those sections replaced."""
    from recorded import analysed

    steps = [float(x) for x in steps_ms]
    med = float(np.median(steps)) if steps else None
    m = analysed("h100_bert_small_inference").metrics
    rep = msgspec.structs.replace
    trace = rep(m.trace, source=label, devices=[DeviceMetrics(id=0, name=device, compute_capability=9.0, total_memory_bytes=0)])
    metrics = rep(
        m, trace=trace, gpu=rep(m.gpu, primary_device=0, busy_frac=0.5),
        window=rep(m.window, source="steps", dur_ms=sum(steps)),
        steps=rep(m.steps, count=len(steps), durations_ms=steps, median_ms=med, p90_ms=max(steps) if steps else None),
        host=rep(m.host, usable_cores=2.0, **(host or {})),
        conditions=ConditionsMetrics(**{"torch": None, "cuda": None, "gpumagic": None, "capture_options": None,
                                        **(conditions or {})}),
    )
    return Report(metrics=metrics, findings=[], notes=[], label=label)


def _noisy(median: float, n: int, spread: float, seed: int) -> np.ndarray:
    return median * (1 + spread * np.random.default_rng(seed).standard_normal(n))


def test_interval_is_deterministic_and_brackets_the_point():
    a, b = _noisy(100, 20, 0.05, 1), _noisy(70, 20, 0.05, 2)
    ci = stats.speedup_interval(a, b)
    assert ci == stats.speedup_interval(a, b)  # seeded: the same steps give the same interval
    point = stats.speedup_point(a, b)
    assert ci[0] < point < ci[1]
    assert stats.change_of(point, ci) == "faster"
    assert stats.change_of(1 / point, (1 / ci[1], 1 / ci[0])) == "slower"


def test_overlapping_runs_are_no_clear_change_and_a_tiny_shift_is_not_a_change():
    a, b = _noisy(100, 12, 0.3, 3), _noisy(95, 12, 0.3, 4)
    ci = stats.speedup_interval(a, b)
    assert ci[0] < 1 < ci[1]
    assert stats.change_of(stats.speedup_point(a, b), ci) == "no clear change"
    # a 1 % change pinned down tightly is still within a quiet machine's run-to-run jitter
    assert stats.change_of(1.01, (1.005, 1.015)) == "no clear change"


def test_too_few_steps_give_no_interval():
    assert stats.speedup_interval([100] * 4, [50] * 20) is None
    assert stats.change_of(2.0, None) == "no clear change"
    assert "too few steps" in stats.fmt_speedup(2.0, None)


def test_digits_follow_the_interval():
    assert stats.fmt_speedup(1.4, (1.2, 1.6)) == "1.4× faster (1.2–1.6×)"
    assert stats.fmt_speedup(1.4, (1.38, 1.42)) == "1.40× faster (1.38–1.42×)"
    assert stats.fmt_speedup(13.05, (2.0, 40.0)) == "13× faster (2–40×)"
    assert stats.fmt_speedup(1 / 1.4, (1 / 1.42, 1 / 1.38)) == "1.40× slower (1.38–1.42×)"
    # a lower bound of 1.03 is not printed as "1.0": that would read as "maybe no change"
    assert stats.fmt_speedup(1.4, (1.03, 1.44)) == "1.40× faster (1.03–1.44×)"


def test_comparison_carries_change_and_interval_in_json_and_views():
    before, after = _report(_noisy(140, 15, 0.02, 5), "a"), _report(_noisy(100, 15, 0.02, 6), "b")
    cmp = compare(before, after)
    d = json.loads(cmp.to_json())
    assert d["change"] == "faster" and cmp.change == "faster"
    lo, hi = d["speedup_ci"]
    assert lo < d["speedup"] < hi and lo > 1
    assert d["verdict"].startswith(f"{d['speedup']:.2f}× faster (")
    assert "faster (" in render_text(d).splitlines()[1]
    assert headline(d)[0] == "Speed-up"


def test_a_slower_run_looks_slower():
    before, after = _report(_noisy(100, 15, 0.02, 7), "a"), _report(_noisy(140, 15, 0.02, 8), "b")
    d = compare(before, after).to_dict()
    assert d["change"] == "slower"
    label, shown, direction = headline(d)
    assert (label, direction) == ("Slow-down", "worse") and "× slower (" in shown
    html = render_fragment(d)
    assert "Speed-up" not in html and "Slow-down" in html and "var(--gm-bad)" in html
    assert "▼ worse" in html  # the direction in words, not colour alone


def test_conditions_list_differences_and_lead_when_they_explain_the_change():
    quiet = {"other_busy_cores": 0.1, "gpu_other_processes": 0, "gpu_throttle_reasons": [], "gpu_sm_clock_mhz": 1980.0}
    busy = {"other_busy_cores": 1.8, "gpu_other_processes": 1, "gpu_throttle_reasons": ["power cap"], "gpu_sm_clock_mhz": 1500.0}
    versions_a = {"torch": "2.13.0", "cuda": "12.8", "capture_options": []}
    versions_b = {"torch": "2.14.0", "cuda": "12.8", "capture_options": ["with_stack"]}
    before = _report(_noisy(100, 15, 0.02, 9), "a", quiet, versions_a)
    after = _report(_noisy(150, 15, 0.02, 10), "b", busy, versions_b)
    d = compare(before, after).to_dict()
    keys = [c["key"] for c in d["conditions_detail"]]
    assert keys == ["other_busy_cores", "gpu_other_processes", "gpu_throttle_reasons", "gpu_sm_clock_mhz", "torch",
                    "capture_options"]
    assert d["conditions"][0] == "Other processes kept 0.1 cores busy before and 1.8 after (of 2 usable)."
    assert "cuda" not in keys  # only what differed
    assert d["caution"].startswith("Read with care: other processes kept 0.1 cores busy")
    text = render_text(d).splitlines()
    assert text[1].startswith("CAUTION: ")  # the caution leads, the verdict follows
    assert d["change"] == "slower"  # the change stays; the caution says why not to trust it
    # the same difference does not "explain" a run that got faster despite it
    faster = compare(before, _report(_noisy(60, 15, 0.02, 11), "c", busy, versions_a)).to_dict()
    assert faster["change"] == "faster" and faster["caution"] is None
    assert faster["conditions"]


def test_same_conditions_list_nothing():
    host = {"other_busy_cores": 0.2}
    d = compare(_report([100] * 6, "a", host), _report([100] * 6, "b", host)).to_dict()
    assert d["conditions"] == [] and d["caution"] is None


@pytest.mark.parametrize("n", [1, 4])
def test_comparison_with_too_few_steps_says_so(n):
    d = compare(_report([100] * n, "a"), _report([50] * n, "b")).to_dict()
    assert d["change"] == "no clear change" and d["speedup_ci"] is None
    assert "too few steps" in d["verdict"]
    assert headline(d)[0] == "No clear change"


def test_a_labelled_run_slower_than_its_previous_run_is_flagged(tmp_path, monkeypatch):
    from gpumagic.tuning import runs
    from gpumagic.tuning.regression import regression, regression_note

    monkeypatch.setenv("GPUMAGIC_HOME", str(tmp_path))
    assert regression(_report([100] * 8, "x"), "lbl") is None  # nothing earlier under the label
    runs.remember("lbl", _report(_noisy(100, 15, 0.02, 12), "lbl", {"other_busy_cores": 0.1}))
    same = regression(_report(_noisy(101, 15, 0.02, 13), "lbl", {"other_busy_cores": 0.1}), "lbl")
    assert same is None  # within the noise: no flag
    slow = _report(_noisy(140, 15, 0.02, 14), "lbl", {"other_busy_cores": 0.1})
    flagged = regression(slow, "lbl")
    assert set(flagged) == {"compared_with", "change", "speedup", "speedup_ci", "conditions", "explained_by"}
    assert flagged["change"] == "slower" and flagged["explained_by"] is None and flagged["compared_with"].startswith("r")
    assert regression_note(flagged).startswith("Regression: 1.")
    slow.regression = flagged
    assert json.loads(slow.to_json())["regression"] == flagged  # top-level key, JSON-clean
    # the same slow-down with other processes' load up: the condition is named instead
    busy = _report(_noisy(140, 15, 0.02, 14), "lbl", {"other_busy_cores": 1.9})
    named = regression(busy, "lbl")
    assert named["explained_by"].startswith("Other processes kept 0.1 cores busy before and 1.9 after")
    assert regression_note(named).startswith("Slower than r") and "Regression" not in regression_note(named)


def test_history_rows_carry_each_runs_step_spread(tmp_path, monkeypatch):
    from gpumagic.tuning import runs

    monkeypatch.setenv("GPUMAGIC_HOME", str(tmp_path))
    runs.remember("lbl", _report([100, 110, 90, 100, 105, 95], "lbl"))
    [row] = runs.history().runs
    assert row.step_spread["count"] == 6 and row.step_spread["median_ms"] == 100
    assert row.step_spread["p10_ms"] < 100 < row.step_spread["p90_ms"]
    assert "(6)" in runs.history().to_text()


def test_a_busy_machine_needs_a_change_beyond_what_waiting_for_a_core_can_do():
    """The same code rerun beside a test run read 22× faster (interval 2-34×): its loop thread
    waited for a core 64-67 % of the time in both runs. A change is called only beyond
    1 / ((1 − wait before)(1 − wait after)), here 1 / (0.4 · 0.4) = 6.25."""
    busy = {"main_runqueue_wait_frac": 0.6}
    before, after = _report(_noisy(100, 20, 0.05, 21), "a", busy), _report(_noisy(30, 20, 0.05, 22), "b", busy)
    d = compare(before, after).to_dict()
    assert stats.change_of(d["speedup"], tuple(d["speedup_ci"])) == "faster"  # the interval alone excludes 1
    assert d["contention_factor"] == pytest.approx(6.25)
    assert d["change"] == "no clear change" and headline(d)[0] == "No clear change"
    assert "the machine was busy: the neighbours' load alone can move one run's steps 6.2× against the other's" \
        in d["verdict"]
    assert any(n.startswith("The machine was busy (before: the loop's thread waited for a core 60 % of the time; "
                            "after: the loop's thread waited for a core 60 % of the time)") for n in d["notes"])
    assert any("waited for a core" in line for line in render_text(d).splitlines())
    # beyond the factor, the change is called
    far = compare(before, _report(_noisy(5, 20, 0.05, 23), "c", busy)).to_dict()
    assert far["change"] == "faster" and far["speedup_ci"][0] > far["contention_factor"]


def test_a_quiet_machine_or_a_small_wait_keeps_the_interval_alone():
    for host in ({"main_runqueue_wait_frac": 0.02}, {}):
        d = compare(_report(_noisy(100, 20, 0.05, 21), "a", host), _report(_noisy(70, 20, 0.05, 22), "b", host)).to_dict()
        assert d["contention_factor"] is None and d["change"] == "faster"
    # one run on a busy machine is enough to ask for more: 1 / 0.8 = 1.25 (the quiet run counts 1)
    d = compare(_report(_noisy(100, 20, 0.05, 21), "a", {"main_runqueue_wait_frac": 0.2}),
                _report(_noisy(90, 20, 0.05, 22), "b", {"main_runqueue_wait_frac": 0.01})).to_dict()
    assert d["contention_factor"] == pytest.approx(1.25) and d["change"] == "no clear change"


def test_a_shared_machine_counts_the_neighbours_cores_too():
    """Beside a test run the same loop read 2.9× slower (2.2–3.0×): its thread waited for a core
    28 % and 16 % of the time (1.7× between them) while other processes used 0.6 of the 2 cores in
    each run. Each of its two intra-op threads had its core about 70 % of the time, so each busy run's
    steps may stretch by 1 / 0.7²: a change must clear (1 / 0.49)² = 4.16."""
    def host(wait):
        return {"main_runqueue_wait_frac": wait, "other_busy_cores": 0.6, "shared_machine": True,
                "intra_op_threads": 2}

    before = _report(_noisy(2.4, 20, 0.04, 31), "a", host(0.28))
    same_code = compare(before, _report(_noisy(6.9, 20, 0.04, 32), "b", host(0.16))).to_dict()
    assert stats.change_of(same_code["speedup"], tuple(same_code["speedup_ci"])) == "slower"
    assert same_code["contention_factor"] == pytest.approx((1 / 0.49) ** 2, rel=1e-3)
    assert same_code["change"] == "no clear change"
    assert any("before: other processes used 0.6 of 2 cores, the loop's thread waited for a core 28 % of the time"
               in n for n in same_code["notes"])
    assert compare(before, _report(_noisy(14.0, 20, 0.04, 33), "c", host(0.16))).to_dict()["change"] == "slower"
    # one intra-op thread waits for one core only: 1 / 0.7 a run
    one = compare(_report(_noisy(2.4, 20, 0.04, 31), "a", {**host(0.01), "intra_op_threads": 1}),
                  _report(_noisy(6.9, 20, 0.04, 32), "b", {**host(0.01), "intra_op_threads": 1})).to_dict()
    assert one["contention_factor"] == pytest.approx(1 / 0.49, rel=1e-3) and one["change"] == "slower"
