"""A real capture beside busy neighbours (processes this test starts and stops) with a loader that
sleeps, as one that waits on I/O does. What is asserted are decisions that hold however busy the
rest of the machine is: the capture records who kept the cores busy, a sleeping loader is never
told that workers cannot help, and a comparison lists the load difference exactly when the two
runs' own figures differ enough."""

from __future__ import annotations

import os

import pytest
from neighbours import busy_neighbours

torch = pytest.importorskip("torch")

import gpumagic  # noqa: E402
from gpumagic.tuning.comparison import LOAD_CHANGE_CORES, LOAD_CHANGE_SHARE, compare  # noqa: E402

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
HOST_KEYS = ("own_busy_cores", "own_main_thread_cores", "own_other_threads_cores", "own_workers_cores",
             "other_busy_cores", "shared_machine", "loader_runqueue_wait_frac", "load_average_1m",
             "gpu_other_processes", "gpu_throttle_reasons", "gpu_sm_clock_mhz")


class SleepyDataset(torch.utils.data.Dataset):
    """Each item waits 4 ms without using the CPU, as a read from a slow disk or network does."""

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        import time

        time.sleep(0.004)
        return torch.full((8,), float(i % 7)), torch.tensor(0.0)


def _train(steps: int = 9) -> None:
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(SleepyDataset(), batch_size=4, num_workers=0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        loss = (model(x).squeeze(1) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == steps:
            break


def _profile(label: str):
    with gpumagic.profile(label="", skip=1, steps=6, interval_ms=10, display=False) as run:
        _train()
    run.report.label = label
    return run.report


@pytest.fixture(scope="module")
def busy_report():
    with busy_neighbours(max(2, CORES)):
        return _profile("busy")


def test_the_capture_records_who_kept_the_cores_busy(busy_report):
    host = busy_report.metrics["host"]
    assert set(HOST_KEYS) <= set(host)
    assert host["own_busy_cores"] is not None and host["other_busy_cores"] is not None
    # the neighbours spin on every usable core while this process mostly sleeps
    assert host["other_busy_cores"] > host["own_busy_cores"]
    assert host["shared_machine"] is True
    assert host["load_average_1m"] is not None and host["load_average_1m"] > 0
    assert host["gpu_other_processes"] is None  # no NVML here: unknown, not zero
    text = busy_report.to_text()
    assert f"Shared machine: other processes used {host['other_busy_cores']:.1f} of {host['usable_cores']:g} cores" in text


def test_a_sleeping_loader_is_never_told_workers_cannot_help(busy_report):
    for f in busy_report.findings:
        assert "cannot help" not in f.why and "will not help" not in f.evidence.summary, f.id
        assert f.evidence.numbers.get("saturated_by") != "own", f.id
    dl = busy_report.finding("dataloader-bound")
    if dl is not None:  # the loop waits for the sleeping loader: workers are the fix
        assert dl.evidence.numbers.get("suggested_num_workers", 1) >= 1
        assert "num_workers=" in dl.fixes[0].code
        assert dl.gain_method.startswith("estimate")


def test_a_comparison_lists_the_load_difference_exactly_when_it_is_large(busy_report):
    quiet = _profile("quiet")  # whatever else runs here: the decision must follow the recorded figures
    d = compare(quiet, busy_report).to_dict()
    oa, ob = quiet.metrics["host"]["other_busy_cores"], busy_report.metrics["host"]["other_busy_cores"]
    big = abs(ob - oa) >= max(LOAD_CHANGE_CORES, LOAD_CHANGE_SHARE * CORES)
    assert ("other_busy_cores" in [c["key"] for c in d["conditions_detail"]]) is big
    assert d["change"] in ("faster", "slower", "no clear change")
    assert d["speedup_ci"] is None or d["speedup_ci"][0] <= d["speedup"] <= d["speedup_ci"][1]
    detail = {c["key"]: c for c in d["conditions_detail"]}
    if big and d["change"] == "slower" and ob > oa:
        assert detail["other_busy_cores"]["explains"] and d["caution"]
        assert compare(quiet, busy_report).to_text().splitlines()[1].startswith("CAUTION: ")


def test_the_regression_flag_follows_the_comparison(busy_report, tmp_path, monkeypatch):
    from gpumagic.tuning import runs
    from gpumagic.tuning.regression import regression

    monkeypatch.setenv("GPUMAGIC_HOME", str(tmp_path))
    quiet = _profile("quiet")
    runs.remember("loop", quiet)
    found = regression(busy_report, "loop")
    d = compare(quiet, busy_report).to_dict()
    assert (found is None) == (d["change"] != "slower")
    if found is not None:
        explaining = [c["sentence"] for c in d["conditions_detail"] if c["explains"]]
        assert found["explained_by"] == (explaining[0] if explaining else None)
        assert found["conditions"] == d["conditions"]
