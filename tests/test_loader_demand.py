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
