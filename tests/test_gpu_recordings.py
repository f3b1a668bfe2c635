"""Bundles recorded on a real GPU (an H200) by scripts/gpu_check.py: analysed here on any machine.

Each known-bad workload must keep its diagnosis, and the NVML samples recorded on the device must
reach the report (tests/data/gpu_check/README.md says how they were made)."""

from pathlib import Path

import pytest

from gpumagic.analysis import analyze

DATA = Path(__file__).parent / "data" / "gpu_check"
EXPECTED = {
    "starved_loader": {"dataloader-bound"},
    "pageable_item": {"pageable-memcpy", "host-sync"},
    "fp32_matmul": {"mixed-precision-off"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_workload_recorded_on_a_gpu_keeps_its_diagnosis(name):
    report = analyze(DATA / f"{name}.json.gz")
    assert EXPECTED[name] <= set(report.finding_ids), report.finding_ids
    assert "H200" in (report.metrics["gpu"]["primary_name"] or "")
    assert report.metrics["samples"]["count"] > 0  # NVML and host-CPU samples were recorded
    assert not report.metrics["trace"]["cpu_only"]
    assert all(f.est_gain <= report.combined_gain for f in report.findings)


def test_fp32_matmuls_on_a_busy_gpu_are_not_told_to_wait_for_the_host():
    report = analyze(DATA / "fp32_matmul.json.gz")
    assert report.metrics["gpu"]["busy_frac"] > 0.9
    assert not {"dataloader-bound", "host-sync", "launch-bound", "low-gpu-utilization"} & set(report.finding_ids)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_energy_from_the_recorded_power_samples(name):
    """Issue 30: these H200 recordings have NVML power samples but no energy counter (recorded before
    gpumagic read it), so energy is the integral of power: its mean power lies within the samples',
    and with power nearly flat over the window the idle share of energy follows the idle share of time."""
    report = analyze(DATA / f"{name}.json.gz")
    gpu, window = report.metrics.gpu, report.metrics.window
    power = report.trace.samples.gpu["power_w"]
    assert gpu.energy_source == "power"
    assert float(power.min()) <= gpu.energy_j / (window.dur_ms / 1e3) <= float(power.max())
    assert gpu.energy_j_per_step == pytest.approx(gpu.energy_j / report.metrics.steps.count, rel=1e-3)
    assert gpu.idle_energy_frac == pytest.approx(1 - gpu.busy_frac, abs=0.05)
