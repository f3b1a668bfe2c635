"""NVML and host CPU samplers, with a fake NVML and a fake /proc: no GPU needed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpumagic.capture.cpu import WORKER_COMM, CpuSampler, CpuTimes, ProcReader, cpu_row
from gpumagic.capture.nvml import MAX_DEVICES, FakeNvml, NvmlSampler, nvml_uuid, open_sampler
from gpumagic.capture.sampler import MISSING, PeriodicSampler

READING_A = {"gpu_util": 90, "mem_util": 40, "mem_used_bytes": 2_000, "mem_total_bytes": 8_000,
             "power_w": 250.0, "sm_clock_mhz": 1410, "pcie_tx_kbps": 100, "pcie_rx_kbps": 900}
READING_B = {**READING_A, "gpu_util": 10, "power_w": 80.0}


def test_fake_nvml_sampler_records_one_row_per_device_per_sample():
    fake = FakeNvml({"GPU-a": [READING_A, READING_B], "GPU-b": [READING_B]})
    notes: list[str] = []
    sampler, driver = open_sampler(fake, [(0, "a"), (1, "GPU-b")], 10.0, notes)
    assert driver == "555.42" and notes == [] and fake.initialised
    sampler.start()
    sampler.stop()
    cols = sampler.columns()
    assert cols["device"] == [0, 1, 0, 1]  # a sample at start, one at stop
    assert cols["gpu_util"] == [90, 10, 10, 10]  # device 0 cycles A, B; device 1 always B
    assert cols["power_w"] == [250.0, 80.0, 80.0, 80.0]
    assert cols["t_epoch_ns"][0] == cols["t_epoch_ns"][1] < cols["t_epoch_ns"][2]


def test_nvml_init_failure_becomes_a_note_not_an_error():
    notes: list[str] = []
    sampler, driver = open_sampler(FakeNvml({}, init_error="NVML Shared Library Not Found"), [(0, "a")], 0.1, notes)
    assert sampler is None and driver is None
    assert notes == ["GPU samples not recorded: NVML Shared Library Not Found."]


def test_unknown_device_is_noted_and_nvml_shut_down_when_nothing_is_left():
    fake = FakeNvml({"GPU-a": [READING_A]})
    notes: list[str] = []
    sampler, _ = open_sampler(fake, [(3, "zzz")], 0.1, notes)
    assert sampler is None and not fake.initialised
    assert notes == ["GPU samples not recorded for cuda:3: NVML has no device GPU-zzz."]


def test_devices_beyond_the_cap_are_noted():
    uuids = [f"GPU-{i}" for i in range(MAX_DEVICES + 2)]
    notes: list[str] = []
    sampler, _ = open_sampler(FakeNvml({u: [READING_A] for u in uuids}), list(enumerate(uuids)), 0.1, notes)
    assert len(sampler.handles) == MAX_DEVICES
    assert notes == [f"GPU samples cover the first {MAX_DEVICES} of {MAX_DEVICES + 2} devices in use."]


def test_a_failing_read_ends_sampling_and_is_kept_for_the_notes():
    sampler = NvmlSampler(FakeNvml({"GPU-a": [READING_A]}, fail_after=1), [(0, "GPU-a")], 0.005)
    sampler.start()
    time.sleep(0.05)
    sampler.stop()
    assert sampler.error == "RuntimeError: scripted NVML failure"
    assert len(sampler.rows) == 1


def test_unsupported_fields_are_dropped_or_marked_missing():
    partial = {k: v for k, v in READING_A.items() if k != "power_w"}
    no_pcie = {k: v for k, v in partial.items() if not k.startswith("pcie")}
    fake = FakeNvml({"GPU-a": [partial, no_pcie]})
    sampler = NvmlSampler(fake, [(0, "GPU-a")], 10.0)
    sampler.start()
    sampler.stop()
    cols = sampler.columns()
    assert "power_w" not in cols  # never readable: dropped
    assert cols["pcie_tx_kbps"] == [100, MISSING]  # readable once: kept, gap marked


class CountingSampler(PeriodicSampler):
    name = "counting"

    def read(self, t_epoch_ns):
        return [{"t_epoch_ns": t_epoch_ns, "n": len(self.rows)}]


def test_sampler_samples_on_schedule_on_a_named_daemon_thread():
    sampler = CountingSampler(0.01)
    sampler.start()
    assert sampler._thread.name == "gpumagic-counting" and sampler._thread.daemon
    time.sleep(0.1)
    sampler.stop()
    sampler.stop()  # idempotent
    assert 5 <= len(sampler.rows) <= 14  # ~10 periods, plus the first and last sample
    t = sampler.columns()["t_epoch_ns"]
    assert t == sorted(t)


def test_nvml_uuid_adds_the_prefix_torch_leaves_out():
    assert nvml_uuid("1234-ab") == "GPU-1234-ab"
    assert nvml_uuid("GPU-1") == "GPU-1" and nvml_uuid("MIG-2") == "MIG-2"


# --------------------------------------------------------------------------------- host CPU
def _stat_line(pid: int, comm: str, utime: int, stime: int) -> str:
    # fields after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    return f"{pid} ({comm}) S 1 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0\n"


def _fake_proc(root: Path, cores: list[tuple[int, int]], main: int, workers: dict[int, int],
               other_children: dict[int, int] = {}) -> None:  # noqa: B006 - read only
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for i, (busy, idle) in enumerate(cores):
        lines.append(f"cpu{i} {busy} 0 0 {idle} 0 0 0 0 0 0")
    (root / "stat").write_text("\n".join(lines) + "\nintr 1 2 3\n")
    (root / "100" / "task" / "100").mkdir(parents=True, exist_ok=True)
    (root / "100" / "stat").write_text(_stat_line(100, "python (kernel)", main, 0))
    children = {**workers, **other_children}
    (root / "100" / "task" / "100" / "children").write_text(" ".join(map(str, children)) + " ")
    for pid, ticks in children.items():
        (root / str(pid)).mkdir(exist_ok=True)
        comm = WORKER_COMM if pid in workers else "sh"
        (root / str(pid) / "stat").write_text(_stat_line(pid, comm, ticks, 0))
        (root / str(pid) / "comm").write_text(comm + "\n")


def test_proc_reader_reads_cores_process_and_only_data_loader_workers(tmp_path):
    _fake_proc(tmp_path, [(10, 90), (50, 50)], main=7, workers={201: 3, 202: 4}, other_children={300: 99})
    reader = ProcReader(tmp_path, pid=100)
    assert reader.available()
    times = reader.read()
    assert times.cores == [(10, 100), (50, 100)]
    assert times.main_ticks == 7  # the name "python (kernel)" has a space and parentheses
    assert times.worker_ticks == {201: 3, 202: 4}


def test_cpu_row_percentages():
    before = CpuTimes(cores=[(0, 0), (0, 0)], main_ticks=0, worker_ticks={1: 0, 2: 10})
    after = CpuTimes(cores=[(50, 100), (100, 100)], main_ticks=150, worker_ticks={1: 100, 2: 60, 3: 500})
    row = cpu_row(before, after, dt_s=1.0, hz=100, t_epoch_ns=5)
    assert row["per_core"] == [50.0, 100.0]
    assert row["total"] == 75.0
    assert row["main"] == 150.0  # two threads busy: more than one core
    # 100 + 50 ticks in 1 s at 100 Hz, and worker 3, new: started in the interval, it counts, up to
    # one core's worth (its 500 ticks would be time from before the interval)
    assert row["workers"] == 250.0
    assert row["worker_count"] == 3


def test_cpu_sampler_on_a_fake_proc(tmp_path):
    _fake_proc(tmp_path, [(0, 0)], main=0, workers={})
    sampler = CpuSampler(ProcReader(tmp_path, pid=100), 10.0)
    sampler.start()
    _fake_proc(tmp_path, [(30, 70)], main=25, workers={})
    sampler.stop()
    assert len(sampler.rows) == 1  # the first reading is the baseline
    assert sampler.rows[0]["total"] == 30.0 and sampler.rows[0]["worker_count"] == 0


def test_real_proc_is_readable_on_linux():
    reader = ProcReader()
    if not reader.available():
        pytest.skip("no Linux /proc here")
    times = reader.read()
    assert times.cores and all(busy <= total for busy, total in times.cores)
    assert times.main_ticks > 0  # this process has used CPU time
