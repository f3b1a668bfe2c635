"""Job analysis under dying workers, Ctrl-C and an empty cluster (issue 24, classes 5, 7 and 9), with
real processes: a real local pool whose workers a rank kills, a real ``gpumagic analyze -j 2``
interrupted by SIGINT to its process group, a real Dask scheduler on 127.0.0.1 without workers,
and a real Dask cluster whose worker a rank kills.

A rank "kills its worker" by sending itself SIGKILL from inside its analysis (what the
out-of-memory killer does), so where the death happens is deterministic; nothing here depends
on timing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from jobbuilder import build_job
from tracebuilder import DATA

from gpumagic.jobs import analyze_job, executors
from gpumagic.jobs.summary import summarize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = os.path.join(DATA, "h100_bert_small_inference.json.gz")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Eight small rank files: rank 3 kills its worker every time, rank 5 only the first time."""
    folder = tmp_path_factory.mktemp("job")
    paths = build_job(folder, ranks=8, source=SMALL)
    paths[3] = paths[3].rename(folder / "rank3.poison.json.gz")
    paths[5] = paths[5].rename(folder / "rank5.flaky.json.gz")
    return [str(p) for p in paths]


def _killing_summarize(path: str):
    """What a worker runs instead of summarize: the poison rank always dies, the flaky one once."""
    if ".poison." in path:
        os.kill(os.getpid(), signal.SIGKILL)
    if ".flaky." in path:
        flag = path + ".died"
        if not os.path.exists(flag):
            Path(flag).touch()
            os.kill(os.getpid(), signal.SIGKILL)
    return summarize(path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the pool forks on Linux only")
def test_a_dead_worker_costs_only_the_rank_that_killed_it_twice(job, monkeypatch):
    for p in job:
        if os.path.exists(p + ".died"):
            os.unlink(p + ".died")
    monkeypatch.setattr(executors, "summarize", _killing_summarize)
    ticks = []
    out = executors.run_local(job, 2, progress=lambda done, total: ticks.append((done, total)))
    failed = [i for i, s in enumerate(out) if not s.ok]
    assert failed == [3], [s.error for s in out]
    assert re.search(r"rank3\.poison\.json\.gz: the process analysing it died 2 times", out[3].error)
    assert out[5].ok and os.path.exists(job[5] + ".died")  # killed its first worker, analysed on the retry
    assert [s.path for s in out] == job  # in the order of the paths
    assert ticks[-1] == (8, 8) and [d for d, _ in ticks] == sorted(d for d, _ in ticks)
    assert executors.multiprocessing.active_children() == []


BLOCKING_CLI = """
import os, sys, time
import gpumagic.jobs.executors as ex
MARKS = sys.argv[1]
def block(path):  # a long analysis: says it started, then works until stopped
    open(os.path.join(MARKS, str(os.getpid())), "w").close()
    while True:
        time.sleep(0.05)
ex.summarize = block
from gpumagic.shells.cli import run
sys.argv = ["gpumagic", "analyze", *sys.argv[2:]]
run()
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_during_the_pool_exits_130_leaving_no_worker_and_no_output(job, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    out = tmp_path / "job.html"
    script = tmp_path / "cli.py"
    script.write_text(BLOCKING_CLI)
    proc = subprocess.Popen([sys.executable, str(script), str(marks), *job[:4], "-j", "2", "--format", "html",
                             "-o", str(out)], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        deadline = time.monotonic() + 120  # a bound for a stuck start-up, not a measurement
        while len(os.listdir(marks)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = [int(p) for p in os.listdir(marks)]
        assert len(workers) == 2, proc.stderr.read() if proc.poll() is not None else "no worker started"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert [pid for pid in workers if _alive(pid)] == []
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".job.html")] == []


def test_a_scheduler_without_workers_is_waited_on_for_a_bounded_time(job, monkeypatch):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp", host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        address = cluster.scheduler_address
        cli = subprocess.run([sys.executable, "-m", "gpumagic", "analyze", *job[:2], "--scheduler", address],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": ROOT, executors.DASK_WAIT_ENV: "0.5"})
        assert cli.returncode == 2, cli.stderr
        assert cli.stderr.count("\n") == 1 and "Traceback" not in cli.stderr, cli.stderr
        assert f"the Dask scheduler at {address} has no worker: waited 0.5 s" in cli.stderr
        with distributed.Client(cluster) as client:  # and in the Python API, the same bound
            with pytest.raises(executors.GpumagicError, match=r"waited 0\.5 s"):
                executors.run_dask(job[:2], client, wait_s=0.5)
            monkeypatch.setenv(executors.DASK_WAIT_ENV, "0.5")
            with pytest.raises(executors.GpumagicError, match=r"waited 0\.5 s"):
                analyze_job(job[:2], client=client)


DASK_KILLER = textwrap.dedent('''
    import json, os, signal, sys
    from gpumagic.jobs.summary import summarize

    def killing_summarize(path):
        if ".poison." in path:
            os.kill(os.getpid(), signal.SIGKILL)
        return summarize(path)

    if __name__ == "__main__":
        import dask
        import distributed
        import dask_killer
        from gpumagic.jobs import executors

        executors.summarize = dask_killer.killing_summarize  # by reference: the workers import it too
        with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \\
                distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                         dashboard_address=None) as cluster, distributed.Client(cluster) as client:
            out = executors.run_dask(sys.argv[1:], client, wait_s=60)
        print(json.dumps([[s.ok, s.error] for s in out]))
''')


def test_a_dead_dask_worker_costs_only_its_rank(job, tmp_path):
    """In a process of its own: a Dask cluster's processes (and multiprocessing's helpers) end with it."""
    pytest.importorskip("distributed")
    (tmp_path / "dask_killer.py").write_text(DASK_KILLER)
    ranks = [p for p in job if ".flaky." not in p][:4]
    assert any(".poison." in p for p in ranks)
    proc = subprocess.run([sys.executable, str(tmp_path / "dask_killer.py"), *ranks], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [ok for ok, _ in out] == [".poison." not in p for p in ranks], out
    assert any("KilledWorker" in (error or "") for ok, error in out if not ok), out


def test_a_cluster_that_lost_every_worker_is_given_up_on_after_the_bound():
    """Mid-job, a cluster whose workers all died (the scheduler reports none) is waited on for
    ``wait_s``, then named in one sentence; a worker coming back resets the wait."""

    class Cluster:
        def __init__(self):
            self.workers = {}

        def scheduler_info(self):
            return {"workers": self.workers}

    cluster = Cluster()
    since = executors._still_no_worker(cluster, None, 0.0, "tcp://127.0.0.1:1", 3)
    assert since is not None
    cluster.workers = {"tcp://w": {}}
    assert executors._still_no_worker(cluster, since, 0.0, "tcp://127.0.0.1:1", 3) is None
    cluster.workers = {}
    with pytest.raises(executors.GpumagicError, match=r"at tcp://127\.0\.0\.1:1 has had no worker for 0 s with 3 rank"):
        executors._still_no_worker(cluster, since - 1.0, 0.0, "tcp://127.0.0.1:1", 3)
