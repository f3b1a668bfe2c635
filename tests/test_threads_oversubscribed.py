"""``threads-oversubscribed``: more intra-op threads than the cores the process may use (a setting
or an OMP_NUM_THREADS copied from a larger machine, a container's CPU quota), on a recorded loop
and on built bundles that vary one condition at a time."""

from __future__ import annotations

import glob
import os

import pytest
from test_host_cores_idle import _bundle
from tracebuilder import DATA

from gpumagic import analyze

RECORDED = os.path.join(DATA, "cpu_threads16.json.gz")


def test_a_recorded_loop_on_16_threads_and_2_cores():
    """benchmarks/threads_speedup.py --record: two 1024 × 1024 layers on 16 intra-op threads, 2
    usable cores; unprofiled, 49.3 ms a step on 16 threads and 42.4 ms on 2."""
    f = analyze(RECORDED).finding("threads-oversubscribed")
    n = f.evidence.numbers
    assert n["intra_op_threads"] == 16 and n["usable_cores"] == 2 and n["suggested_num_threads"] == 2
    assert f.est_gain == n["parallel_ops_frac"] > 0.5 and f.gain_method.startswith("upper bound")
    assert "torch.set_num_threads(2)" in f.fixes[0].code and "OMP_NUM_THREADS=2" in f.fixes[0].code
    compile(f.fixes[0].code, "<fix>", "exec")


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz"))) - {RECORDED}))
def test_silent_on_every_other_recorded_trace(path):
    assert analyze(path).finding("threads-oversubscribed") is None


def _with(threads: int | None, usable: float = 2.0, source: str = "affinity", busy: float = 190.0,
          op_us: float = 20_000, gpu: bool = False) -> dict:
    d = _bundle(100.0, 190.0, busy, op_us=op_us, gpu=gpu)
    d["gpumagic"]["machine"].update(usable_cores=usable, usable_cores_source=source)
    if threads is not None:
        d["gpumagic"]["capture"]["intra_op_threads"] = threads
    return d


def test_more_threads_than_usable_cores_fires():
    f = analyze(_with(8)).finding("threads-oversubscribed")
    assert f is not None and f.evidence.numbers["suggested_num_threads"] == 2 and "its CPU affinity" in f.why
    quota = analyze(_with(8, usable=2.5, source="cgroup quota")).finding("threads-oversubscribed")
    assert quota.evidence.numbers["suggested_num_threads"] == 2 and "CPU quota (cgroup)" in quota.fixes[0].code


@pytest.mark.parametrize(("why", "kwargs"), [
    ("threads = cores", {"threads": 2}),
    ("3 threads on a quota of 2.5 cores: rounded up, not more than the cores", {"threads": 3, "usable": 2.5,
                                                                                 "source": "cgroup quota"}),
    ("a plain count of the machine's cores may not be what the process gets", {"threads": 8, "source": "cpu_count"}),
    ("the thread count was not recorded", {"threads": None}),
    ("calls too short to run in parallel", {"threads": 8, "op_us": 40}),
    ("a GPU run", {"threads": 8, "gpu": True}),
])
def test_it_stays_silent_when_a_condition_fails(why, kwargs):
    assert "threads-oversubscribed" not in analyze(_with(**kwargs)).finding_ids, why


def test_a_shared_machine_is_host_contended_s_to_size():
    """Other processes' load (busy 190 % of the cores with the process at 100 %): the threads are
    sized by host-contended to what they leave; this rule stays silent."""
    d = _with(8, busy=190.0)
    d["gpumagic"]["samples"]["cpu"]["main"] = [100.0] * 5
    r = analyze(d)
    assert r.metrics.host.get("shared_machine") and "threads-oversubscribed" not in r.finding_ids
