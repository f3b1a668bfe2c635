"""The machine-state samples (issue 21) with a fake /proc and a fake NVML, and what the analysis
makes of them: who kept the cores busy, the loading threads' wait, other GPU processes, throttling."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from test_samplers import _fake_proc, _stat_line

from gpumagic.analysis import analyze
from gpumagic.capture.cpu import CpuTimes, ProcReader, cpu_row
from gpumagic.capture.nvml import FakeNvml, NvmlSampler, PynvmlBackend, throttle_names


def test_proc_reader_reads_the_main_thread_wait_and_load_average(tmp_path: Path):
    _fake_proc(tmp_path, [(10, 90)], main=30, workers={201: 3})
    (tmp_path / "100" / "task" / "100" / "stat").write_text(_stat_line(100, "python", 12, 0))
    (tmp_path / "100" / "schedstat").write_text("5000000 7000000 9\n")
    (tmp_path / "201" / "schedstat").write_text("1000000 2000000 3\n")
    (tmp_path / "loadavg").write_text("3.50 2.00 1.00 2/300 4000\n")
    t = ProcReader(tmp_path, pid=100).read()
    assert (t.main_thread_ticks, t.main_wait_ns, t.worker_wait_ns, t.loadavg_1m) == (12, 7_000_000, {201: 2_000_000}, 3.5)
    assert t.main_demand_ns == 12_000_000  # run + wait, as before


def test_cpu_row_has_the_main_thread_waits_and_load():
    before = CpuTimes([(0, 0)], main_ticks=0, main_demand_ns=0, main_wait_ns=0, worker_wait_ns={7: 0},
                      worker_demand_ns={7: 0}, main_thread_ticks=0)
    after = CpuTimes([(100, 100)], main_ticks=50, main_demand_ns=600_000_000, main_wait_ns=400_000_000,
                     worker_wait_ns={7: 250_000_000}, worker_demand_ns={7: 500_000_000}, main_thread_ticks=20,
                     loadavg_1m=2.25)
    row = cpu_row(before, after, dt_s=1.0, hz=100, t_epoch_ns=1)
    assert (row["main_thread"], row["main_wait"], row["workers_wait"], row["loadavg_1m"]) == (20.0, 40.0, 25.0, 2.25)
    plain = cpu_row(CpuTimes([(0, 0)], 0), CpuTimes([(1, 1)], 0), 1.0, 100, 1)
    assert not {"main_thread", "main_wait", "loadavg_1m"} & set(plain)  # unknown stays absent, not zero


def test_fake_nvml_records_other_processes_and_throttle_reasons():
    fake = FakeNvml({"GPU-a": [{"gpu_util": 90, "other_processes": 2, "throttle_reasons": 0x4 | 0x40}]})
    s = NvmlSampler(fake, [(0, "GPU-a")], 1.0)
    [row] = s.read(1)
    assert row["other_processes"] == 2 and throttle_names(row["throttle_reasons"]) == ["power cap",
                                                                                         "hardware thermal slowdown"]
    assert throttle_names(0x1 | 0x10) == []  # idle and sync boost are not a slowdown


def test_the_real_backend_counts_other_processes_and_reads_throttle_reasons():
    import os

    class Err(Exception):
        pass

    nv = SimpleNamespace(
        NVMLError=Err, NVML_CLOCK_SM=0, NVML_PCIE_UTIL_TX_BYTES=0, NVML_PCIE_UTIL_RX_BYTES=1,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=os.getpid()), SimpleNamespace(pid=1)],
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x20)  # an older nvidia-ml-py: the old name only
    backend = PynvmlBackend()
    backend._nv = nv
    out = backend.read("h", only={"other_processes", "throttle_reasons"})
    assert out == {"other_processes": 1, "throttle_reasons": 0x20}


def _bundle(tb, *, per_core, main, main_thread, workers=0.0, gpu=None, usable=2):
    d = tb.to_dict()
    times = list(range(0, 40_001_000, 2_000_000))
    n = len(times)
    d["gpumagic"] = {
        "format": 1, "label": "", "notes": [], "capture": {"with_stack": False},
        "machine": {"cpu_count": usable, "cpu_affinity": list(range(usable)), "cpu_quota_cores": None,
                    "usable_cores": float(usable), "usable_cores_source": "affinity"},
        "versions": {"torch": "2.13.0"}, "clock": {"anchor_epoch_ns": None},
        "samples": {"cpu": {"t_epoch_ns": times, "total": [sum(per_core) / usable] * n, "per_core": [per_core] * n,
                            "main": [main] * n, "main_thread": [main_thread] * n, "workers": [workers] * n,
                            "worker_count": [0] * n, "main_demand": [95.0] * n, "workers_demand": [0.0] * n,
                            "main_wait": [60.0] * n, "workers_wait": [0.0] * n, "loadavg_1m": [3.0] * n}},
    }
    if gpu is not None:
        d["gpumagic"]["samples"]["gpu"] = {"t_epoch_ns": times, "device": [0] * n, **{k: [v] * n for k, v in gpu.items()}}
    return analyze(d)


def _loader_trace():
    from test_diagnoses import _loader_trace as build

    return build(training=True)


def test_metrics_say_who_kept_the_cores_busy_and_the_gpu_state():
    r = _bundle(_loader_trace(), per_core=[100.0, 100.0], main=30.0, main_thread=20.0,
                gpu={"other_processes": 1, "throttle_reasons": 0x4, "sm_clock_mhz": 1400})
    h = r.metrics["host"]
    assert (h["own_busy_cores"], h["own_main_thread_cores"], h["own_other_threads_cores"]) == (0.3, 0.2, 0.1)
    assert h["other_busy_cores"] == 1.7 and h["shared_machine"] is True
    assert h["loader_runqueue_wait_frac"] == 0.6 and h["load_average_1m"] == 3.0
    assert (h["gpu_other_processes"], h["gpu_throttle_reasons"], h["gpu_sm_clock_mhz"]) == (1, ["power cap"], 1400.0)
    assert r.metrics["conditions"]["torch"] == "2.13.0" and r.metrics["conditions"]["capture_options"] == []
    f = r.finding("host-cpu-saturated")
    assert f.evidence.numbers["saturated_by"] == "others"
    assert "would get a larger share" in f.why and "will not hold" in f.why
    assert "cannot help" not in f.why and f.gain_method.startswith("estimate")
    assert "num_workers=1" in f.fixes[0].code  # 2 usable cores: one for the main process


def test_saturated_by_its_own_threads_the_finding_says_so_with_fewer_threads():
    r = _bundle(_loader_trace(), per_core=[100.0, 100.0], main=190.0, main_thread=100.0)
    f = r.finding("host-cpu-saturated")
    assert f.evidence.numbers["saturated_by"] == "own"
    assert "own threads" in f.title and "cannot help" in f.why
    # the cheaper batch first (the gain is about it), the thread fix after it, to be measured
    assert "torch.set_num_threads(1)" in f.fixes[-1].code and "measure it" in f.fixes[-1].description
    assert "torch.set_num_threads" not in f.fixes[0].code
    assert f.gain_method.startswith("upper bound")
    assert "Shared machine" not in r.to_text()  # other processes used too little to matter
