"""Issue 21: a loader that sleeps (I/O-like) beside busy neighbours is not CPU-bound, though it
waits for a core each time it wakes; one that computes and is starved by them is. Decided on host
CPU samples recorded on a 2-core machine with four spinning neighbour processes
(tests/data/loader_samples_busy_neighbours.json, written by benchmarks/record_loader_samples.py),
replayed into a bundle: no live timing in the test."""

import json
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze

with open(os.path.join(DATA, "loader_samples_busy_neighbours.json")) as fh:
    RECORDED = json.load(fh)


def _loader_trace():
    tb = TraceBuilder()
    for i in range(4):  # each step waits 4 ms for the loader on the main thread (num_workers=0)
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.dataloader(t, 4_000)
        tb.kernel("ampere_sgemm_128x64_nn", t + 4_100, 5_800, launch_ts=t + 4_010)
        tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 9_000, 500)
    return tb


def _bundle(rows, drop=()):
    d = _loader_trace().to_dict()
    cores = RECORDED["usable_cores"]
    step = 40_000_000 // len(rows)  # the recorded rows, spread over the 40 ms window in order
    cpu = {k: [r[k] for r in rows] for k in rows[0] if k != "t_epoch_ns" and k not in drop}
    cpu["t_epoch_ns"] = [i * step for i in range(len(rows))]
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None},
                     "machine": {"cpu_count": cores, "cpu_affinity": list(range(cores)), "cpu_quota_cores": None,
                                 "usable_cores": float(cores), "usable_cores_source": "affinity"},
                     "samples": {"cpu": cpu}}
    return analyze(d)


def _mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


def test_the_recording_is_the_case_in_question():
    """Both loaders ran beside saturated cores and, counting run-queue wait as demand, both
    wanted at least half a core: the old test could not tell them apart."""
    for kind in ("sleeping", "cpu"):
        rows = RECORDED["scenarios"][kind]
        assert _mean(rows, "total") >= 90 and _mean(rows, "main_demand") >= 50, kind
    assert _mean(RECORDED["scenarios"]["sleeping"], "main") < 10  # it ran very little


@pytest.mark.parametrize(("kind", "cpu_bound"), [("sleeping", False), ("cpu", True)])
def test_a_sleeping_loader_beside_busy_neighbours_is_not_cpu_bound(kind, cpu_bound):
    r = _bundle(RECORDED["scenarios"][kind])
    assert r.metrics.host.loader_cpu_bound is cpu_bound
    assert r.metrics.host.shared_machine is True
    if not cpu_bound:  # never told that workers cannot help because the cores are busy
        assert "host-cpu-saturated" not in r.finding_ids
        f = r.finding("dataloader-bound")
        assert f is not None and "cannot help" not in f.why + f.evidence.summary


def test_without_the_wait_columns_run_plus_wait_still_decides():
    """An older bundle (demand recorded, run-queue wait not): the previous rule, run + wait."""
    r = _bundle(RECORDED["scenarios"]["cpu"], drop=("main_wait", "workers_wait"))
    assert r.metrics.host.loader_cpu_bound is True


IO_WORKERS = os.path.join(DATA, "cpu_io_loader_workers.json.gz")


def test_two_sleeping_workers_in_a_short_window_get_more_workers():
    """Recorded by benchmarks/dataloader_advice.py --record (tests/data/MANIFEST.md): two workers whose
    items sleep 3 ms (a read), three steps recorded, so the loop's waits cover less than one CPU
    sample's span. It read "the 2 worker(s) running already take what the cores allow (0.2 busy
    of 2): more would not help"; half a span of waiting judges the loading, which slept."""
    r = analyze(IO_WORKERS)
    h = r.metrics.host
    assert h.loader_cpu_bound is False and h.cpu_busy_cores < 1.0
    f = r.finding("dataloader-bound")
    assert "more would not help" not in f.evidence.summary and "workers waiting on I/O need no core" in f.evidence.summary
    assert f.evidence.numbers["suggested_num_workers"] == 4
    assert "num_workers=4" in f.fixes[0].code
    # the gain of two workers doubled: each makes a batch in two of today's steps, four one every half step
    # (benchmarks/dataloader_advice.py, io-workers: 26.3 → 13.1 ms a step, 0.50 saved)
    assert f.est_gain == pytest.approx(0.5, abs=0.01) and "each taking 2 of today's steps" in f.gain_method


def test_worker_restarts_do_not_judge_the_loading():
    """The waits for new workers starting (each epoch without persistent workers) time a process
    start: the loading's own CPU is judged without them (tests/data/cpu_loader_restarts.json.gz,
    where they are most of the waits and read as "not CPU work, 4 workers can help")."""
    r = analyze(os.path.join(DATA, "cpu_loader_restarts.json.gz"))
    assert r.finding("dataloader-worker-restarts") is not None
    assert r.metrics.host.loader_cpu_bound is not False
    assert "workers waiting on I/O" not in r.finding("dataloader-bound").evidence.summary


def test_the_gain_of_more_workers_counts_those_running():
    """worker_gain: from the main process (running 0) w workers deliver a batch every wait / w; with
    r running, every r / w of today's step."""
    from gpumagic.analysis.loadergain import worker_gain

    host = {"own_busy_cores": 0.2, "other_busy_cores": 0.0, "usable_cores": 2.0}  # what worker_gain reads
    assert worker_gain(0.9, host, 4, running=0).gain == pytest.approx(1 - max(0.1, 0.9 / 4, 0.2 / 2))
    assert worker_gain(0.9, host, 4, running=2).gain == pytest.approx(0.5)
    assert worker_gain(0.9, host, 8, running=2).gain == pytest.approx(0.75)
    assert worker_gain(0.3, host, 4, running=2).gain == pytest.approx(0.3)  # the wait bounds it


def test_the_gain_of_workers_counts_the_threads_their_fix_takes_from_the_model():
    """A fix that sets fewer intra-op threads (to leave the workers their cores) slows the model's
    operators: those that used 1 + 0.85 / 0.85 = 2 cores run on one, about twice as long, and the
    workers hide the 15 % wait for a step 1.7× as long — nothing saved (benchmarks/loader_handoff.py
    case 2b measured such a fix 0.45× as fast). The threads left alone: the estimate as before."""
    from gpumagic.analysis.loadergain import compute_slowdown, worker_gain

    host = {"own_busy_cores": 1.9, "other_busy_cores": 0.0, "usable_cores": 2.0, "own_other_threads_cores": 0.85}
    slowdown, cores = compute_slowdown(host, 0.15, 1)
    assert cores == pytest.approx(2.0) and slowdown == pytest.approx(2.0)
    assert compute_slowdown(host, 0.15, None) == (1.0, 1.0) and compute_slowdown(host, 0.15, 2)[0] == 1.0
    slow = worker_gain(0.15, host, 1, threads_after=1)
    assert slow.gain == 0.0 and "about 2.00× as long" in slow.method
    plain = worker_gain(0.15, host, 1)
    assert plain.gain == pytest.approx(1 - max(0.85, 0.15, 1.9 / 2)) and "as long (as if" not in plain.method


def test_a_dataset_that_waits_gets_the_cache_not_a_batched_getitems():
    """The io-workers recording's slowest stage is the dataset's __getitem__, which sleeps (a read):
    a batched __getitems__ saves per-sample Python, not waiting; each sample read once does."""
    f = analyze(IO_WORKERS).finding("dataloader-bound")
    staged = f.fixes[-1]
    assert staged.description.startswith("SleepyItems.__getitem__ is the slowest stage")
    assert "mostly waits rather than computes" in staged.description and "__getitems__" not in staged.code
    assert "torch.save(" in staged.code  # the cache: read once, kept


def test_workers_that_leave_a_core_idle_are_not_called_enough_when_the_samples_cannot_tell(monkeypatch):
    """When the window is too short for the samples to judge the loading and the workers leave a
    whole core idle, "the workers running already take what the cores allow: more would not help"
    is not shown: the finding says so and measures (gpumagic.tune_dataloader) instead of a count."""
    from gpumagic.analysis import hostcpu

    monkeypatch.setattr(hostcpu, "MIN_WAIT_SAMPLES", 1e9)  # the samples never judge the loading
    f = analyze(IO_WORKERS).finding("dataloader-bound")
    assert "more would not help" not in f.evidence.summary
    assert "The 2 worker(s) running used 0." in f.evidence.summary and "too short for the CPU samples" in f.evidence.summary
    assert f.fixes[0].diagnostic and "gpumagic.tune_dataloader(loader)" in f.fixes[0].code
    assert not any("num_workers=" in x.code for x in f.fixes)  # no count below the workers running
    assert f.gain_method.startswith("upper bound") and f.est_gain == pytest.approx(f.evidence.numbers["gpu_idle_during_wait_frac"])


def _with_later_waits(d, later_wait_ms, later_steps=30, step_ms=10.0):
    """Bundle ``d`` with a step timer block: steps 1..4 recorded, then ``later_steps`` steps of
    ``step_ms`` each waiting ``later_wait_ms`` in the DataLoader's next()."""
    import everystep_blocks as blocks

    steps = [step_ms] * (5 + later_steps)
    b = blocks.block(steps, recorded=(1, 2, 3, 4), profiled=5)
    b["wait_ms"] = [0.0] * 6 + [later_wait_ms] * (len(steps) - 6)
    g = d.setdefault("gpumagic", {"format": 1, "label": "", "notes": [], "capture": {}, "machine": {}, "versions": {},
                                  "clock": {"anchor_epoch_ns": None}, "samples": {}})
    g["every_step"] = b
    return d


def _no_wait_trace():
    """A CPU-only loop (a GPU's idle time would bound a loader finding by the recorded steps')."""
    tb = TraceBuilder(cc=None)
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.op("aten::addmm", t + 100, 8_000)
        tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 8_500, 1_000)
    return tb.to_dict()


def test_steps_after_the_recorded_ones_that_wait_for_batches_are_reported():
    """The recorded steps waited for no batch (workers had made them ahead); the 30 steps after
    them (29 judged: the first after the profiler stopped is not) spent half their time in the
    loader's next(): dataloader-bound says so, with that share
    as an upper bound (dataloader-bound-later: the window's own finding stays silent), and measures
    instead of giving a count."""
    r = analyze(_with_later_waits(_no_wait_trace(), 5.0))
    assert r.finding("dataloader-bound") is None  # the recorded window waited for nothing
    f = r.finding("dataloader-bound-later")
    assert f.title == "The loop waits for the data loader after the recorded steps"
    assert f.evidence.numbers["later_wait_frac"] == pytest.approx(0.5) and f.evidence.numbers["later_steps"] == 29
    assert f.est_gain == pytest.approx(0.5) and f.gain_method.startswith("upper bound")
    assert all(x.diagnostic for x in f.fixes) and "tune_dataloader" in f.fixes[0].code
    assert f.fixes[1].code.startswith("%%gpuprofile --skip ")


@pytest.mark.parametrize(("wait", "later"), [(0.3, 30), (5.0, 5)])
def test_little_or_few_later_waits_say_nothing(wait, later):
    """3 % of the later steps (under the 5 % line), or five steps only: no finding."""
    assert analyze(_with_later_waits(_no_wait_trace(), wait, later)).finding("dataloader-bound-later") is None


def test_a_recorded_wait_with_longer_later_waits_says_the_estimate_is_low():
    """The recorded window waits 40 % of the time; the later steps 90 %: the finding adds that its
    estimate, from the recorded steps, is low."""
    f = analyze(_with_later_waits(_loader_trace().to_dict(), 9.0)).finding("dataloader-bound")
    assert "After the recorded steps the loop waited longer: 90.0 % of the time of the 29 steps" in f.evidence.summary
    assert analyze(_with_later_waits(_loader_trace().to_dict(), 9.0)).finding("dataloader-bound-later") is None
    near = analyze(_with_later_waits(_loader_trace().to_dict(), 5.0)).finding("dataloader-bound")
    assert "waited longer" not in near.evidence.summary and near.evidence.numbers["later_wait_frac"] == pytest.approx(0.5)


def test_busy_cores_that_are_not_the_workers_do_not_make_them_enough(monkeypatch):
    """The same short window with the cores shown 85 % busy (the main process and the profiler, not
    the workers, which used a fifth of a core between them): CPU-bound workers would have used a
    core each, so the workers are not called enough; the finding measures."""
    import copy
    import gzip

    from gpumagic.analysis import hostcpu

    monkeypatch.setattr(hostcpu, "MIN_WAIT_SAMPLES", 1e9)  # the samples never judge the loading
    with gzip.open(IO_WORKERS, "rt") as fh:
        d = json.load(fh)
    busy = copy.deepcopy(d)
    cpu = busy["gpumagic"]["samples"]["cpu"]
    cpu["per_core"] = [[85.0] * len(row) for row in cpu["per_core"]]
    cpu["total"] = [85.0] * len(cpu["total"])
    r = analyze(busy)
    assert r.metrics.host.cpu_busy_cores >= 1.5 and r.metrics.host.own_workers_cores < 0.5
    f = r.finding("dataloader-bound")
    assert "more would not help" not in f.evidence.summary and "The 2 worker(s) running used" in f.evidence.summary
    assert f.fixes[0].diagnostic and "tune_dataloader" in f.fixes[0].code
