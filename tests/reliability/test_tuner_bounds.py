"""``tune_dataloader`` bounds its time: a dataset that hangs, in the main process or in workers,
costs its setting about ``max_seconds_per_config`` + ``BATCH_GRACE_S`` and is reported as "timed
out"; a DataLoader with ``multiprocessing_context`` set is accepted.

Each hanging case runs in a child interpreter with a timeout, so that a regression fails the test
instead of hanging the suite. The bound asserted is generous (it checks that the tuner ends, not
how fast): without the fix these cases took DataLoader's 60 s timeout, or never ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from gpumagic.capture.dataloader import BATCH_GRACE_S, DEFAULT_ROUNDS

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_SECONDS = 1.0
#: Child start-up (importing torch), worker start and shutdown, on a loaded 2-core machine.
SLACK_S = 20.0

SCRIPT = """
import json, multiprocessing, sys, time
sys.path.insert(0, {here!r})
import hanging_datasets as d
from gpumagic import tune_dataloader
from torch.utils.data import DataLoader
if __name__ == "__main__":  # spawned workers import this script again
    t0 = time.monotonic()
    result = tune_dataloader({source}, batch_size=8, num_workers={workers}, max_seconds_per_config={max_s})
    print(json.dumps({{"rows": [(r.config.num_workers, r.status, r.error) for r in result.rows],
                      "warnings": result.warnings, "elapsed_s": time.monotonic() - t0,
                      "children": len(multiprocessing.active_children()), "text": result.to_text()}}))
"""


def tune_in_child(source: str, workers: list[int], tmp_path, max_seconds: float = MAX_SECONDS) -> dict:
    script = tmp_path / "tune.py"
    script.write_text(SCRIPT.format(here=HERE, source=source, workers=workers, max_s=max_seconds))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_dataset_hanging_in_the_main_process_times_out(tmp_path):
    out = tune_in_child("d.HangsInMainProcess()", [0], tmp_path)
    [(workers, status, error)] = out["rows"]
    assert (workers, status) == (0, "timed out")
    # the budget is shared out over the interleaved rounds: a hang costs one round's share and the grace
    assert f"no batch for {MAX_SECONDS / DEFAULT_ROUNDS + BATCH_GRACE_S:g} s in the main process" in error
    assert any("timed out" in w for w in out["warnings"])
    assert "timed out" in out["text"]
    assert out["elapsed_s"] < MAX_SECONDS + BATCH_GRACE_S + SLACK_S


def test_a_dataset_hanging_in_workers_times_out_and_leaves_no_worker(tmp_path):
    out = tune_in_child("d.HangsInWorkers()", [0, 2], tmp_path)
    statuses = {(w, s) for w, s, _ in out["rows"]}
    assert (0, "ok") in statuses and {s for w, s in statuses if w == 2} == {"timed out"}
    assert all(f"more than {MAX_SECONDS / DEFAULT_ROUNDS + BATCH_GRACE_S:g} s" in e for w, s, e in out["rows"] if w == 2)
    assert out["children"] == 0
    timed_out = sum(1 for _, s, _ in out["rows"] if s == "timed out")
    assert out["elapsed_s"] < timed_out * (MAX_SECONDS + BATCH_GRACE_S) + MAX_SECONDS + SLACK_S


def test_a_loader_with_a_multiprocessing_context_is_accepted(tmp_path):
    loader = 'DataLoader(d.Items(), batch_size=8, num_workers=2, multiprocessing_context="spawn")'
    out = tune_in_child(loader, [0, 2], tmp_path, max_seconds=0.3)
    assert [(w, s) for w, s, _ in out["rows"]] == [(0, "ok"), (2, "ok")], out["text"]
    assert out["children"] == 0
