"""A comparison's ``change``, ``speedup_ci`` and ``conditions``, from synthetic step samples: the
statistics and the decisions are checked on numbers, never on how fast this machine runs."""

from __future__ import annotations

import json
import re

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


def _bimodal(fast: float, slow: float, n_fast: int, n_slow: int, seed: int) -> np.ndarray:
    """Steps of a loop beside a neighbour that comes and goes: some at ``fast`` ms, some at ``slow``."""
    rng = np.random.default_rng(seed)
    steps = np.concatenate([fast * (1 + 0.05 * rng.standard_normal(n_fast)), slow * (1 + 0.05 * rng.standard_normal(n_slow))])
    return rng.permutation(steps)


BUSY = {"main_runqueue_wait_frac": 0.3, "other_busy_cores": 1.3, "shared_machine": True}


def test_a_busy_machine_needs_a_change_beyond_what_it_did_to_a_runs_own_steps():
    """The same loop beside a test run: mostly slow steps in one run, mostly fast in the other (the
    neighbour came and went). The bootstrap over steps calls that a large speed-up; the runs' own
    steps spread 30× apart (90th percentile over 10th), so it is no clear change."""
    before = _report(_bimodal(2.0, 216.0, 5, 15, 41), "a", BUSY)
    after = _report(_bimodal(2.0, 216.0, 14, 6, 42), "b", BUSY)
    d = compare(before, after).to_dict()
    assert stats.change_of(d["speedup"], tuple(d["speedup_ci"])) == "faster"  # the interval alone excludes 1
    assert d["contention_factor"] > 30
    assert d["change"] == "no clear change" and headline(d)[0] == "No clear change"
    assert "but the machine was busy, and it moved one run's own steps" in d["verdict"]
    # the interval is read in the direction the sentence names: never "speed-up interval 2–7×" for a slow-down
    assert re.search(r"\(\d[\d.]*× faster, 95 % interval [\d.]+–[\d.]+×\)", d["verdict"]), d["verdict"]
    back = compare(after, before).to_dict()
    assert back["change"] == "no clear change"
    assert re.search(r"\(\d[\d.]*× slower, 95 % interval [\d.]+–[\d.]+×\)", back["verdict"]), back["verdict"]
    assert any(n.startswith("The machine was busy (before: other processes used 1.3 of 2 cores, the loop's thread "
                            "waited for a core 30 % of the time; after: ") for n in d["notes"])
    assert any("The machine was busy" in line for line in render_text(d).splitlines())


def test_one_bimodal_run_on_a_busy_machine_is_enough():
    """Beside a test run the same loop read 2.9× slower (2.2–3.0×): one run's steps 2.1–3.9 ms, the
    other's 2.7–8.3 ms (p90/p10 about 2.6)."""
    d = compare(_report(_noisy(2.4, 20, 0.08, 43), "a", BUSY), _report(_bimodal(2.85, 7.0, 6, 14, 44), "b", BUSY)).to_dict()
    assert stats.change_of(d["speedup"], tuple(d["speedup_ci"])) == "slower"  # the interval alone excludes 1
    # the smallest slow-down the interval allows is within what the machine did to the second run's steps
    assert 1 / d["speedup_ci"][1] < d["contention_factor"] and d["change"] == "no clear change"


def test_steady_steps_on_a_busy_machine_keep_a_real_change():
    """A 30 ms sleep removed from each step, measured while other processes kept both cores busy:
    each run's steps within 10 %, so the 60× speed-up stands."""
    d = compare(_report(_noisy(31.0, 8, 0.02, 45), "a", BUSY), _report(_noisy(0.5, 8, 0.1, 46), "b", BUSY)).to_dict()
    assert d["contention_factor"] < 1.5 and d["change"] == "faster"


def test_a_quiet_machine_keeps_the_interval_alone():
    for host in ({"main_runqueue_wait_frac": 0.02, "shared_machine": False}, {}):
        d = compare(_report(_bimodal(2.0, 216.0, 5, 15, 41), "a", host),
                    _report(_bimodal(2.0, 216.0, 14, 6, 42), "b", host)).to_dict()
        assert d["contention_factor"] is None and d["change"] == "faster"


def test_the_busy_machines_factor_reads_as_a_plain_number():
    d = compare(_report(_bimodal(2.0, 216.0, 5, 15, 41), "a", BUSY), _report(_bimodal(2.0, 216.0, 14, 6, 42), "b", BUSY)).to_dict()
    factor = d["contention_factor"]
    assert factor >= 100
    assert f"it moved one run's own steps {factor:,.0f}× (90th percentile over 10th) apart." in d["verdict"]
    assert "e+" not in d["verdict"] and not any("e+" in n for n in d["notes"])


def test_a_wait_for_a_core_from_the_runs_own_workers_is_no_busy_machine():
    """Four DataLoader workers beside the loop on 2 cores kept its thread waiting for a core 15 % of
    the window, while other processes used 0.3 core: the run's own processes taking turns, not a
    busy machine. A 7× faster loop whose workers deliver in bursts (steps 1–8 ms) was read "no clear
    change, the machine was busy"; the interval alone decides now. With the other processes' load
    unknown (a cgroup quota), the same wait still marks the machine busy."""
    own = {"main_runqueue_wait_frac": 0.15, "other_busy_cores": 0.3, "shared_machine": False}
    before = _report(_noisy(11.8, 40, 0.03, 47), "nw0", {"main_runqueue_wait_frac": 0.0, "other_busy_cores": 0.0,
                                                        "shared_machine": False})
    after = _report(_bimodal(1.0, 8.0, 30, 10, 48), "nw4", own)
    d = compare(before, after).to_dict()
    assert d["contention_factor"] is None and d["change"] == "faster", d["verdict"]
    unknown = _report(_bimodal(1.0, 8.0, 30, 10, 48), "nw4", {"main_runqueue_wait_frac": 0.15,
                                                               "other_busy_cores": None, "shared_machine": None})
    assert compare(before, unknown).to_dict()["contention_factor"] is not None
