"""``memory-growth``: the allocator's floor (its lowest total in each step) climbs step after step."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder, busy_steps

from gpumagic import analyze
from gpumagic.analysis.rules.memgrowth import MIN_STEPS, SOON_STEPS

STEP_US = 1000.0
MIB = 2**20


def _gpu_loop(floors: list[int], working: int = 512 * MIB, capacity: int = 80 * 2**30) -> dict:
    """GPU steps whose allocator records go floor → floor + working → floor in each step."""
    tb = TraceBuilder(total_mem=capacity)
    busy_steps(tb, len(floors), STEP_US, kernel_us=800.0)
    for i, floor in enumerate(floors):
        t = i * STEP_US
        for at, allocated in ((t + 50, floor + working // 2), (t + 300, floor + working), (t + 700, floor)):
            tb.memory(at, allocated, floor + working + 64 * MIB)
    return tb.to_dict()


def _cpu_loop(floors: list[int], working: int = 4 * MIB) -> dict:
    """CPU-only steps (an operator each) with the CPU allocator's records (Device Type 0)."""
    tb = TraceBuilder(cc=None)
    for i, floor in enumerate(floors):
        t = i * STEP_US
        tb.step(i + 1, t, STEP_US)
        tb.op("aten::addmm", t + 10, 900)
        for at, allocated in ((t + 50, floor + working), (t + 700, floor)):
            tb.add(ph="i", cat="cpu_instant_event", name="[memory]", ts=at, s="t",
                   args={"Device Type": 0, "Device Id": -1, "Bytes": 0, "Total Allocated": allocated,
                         "Total Reserved": 0})
    return tb.to_dict()


def test_a_floor_rising_every_step_fires_with_the_rate_and_when_it_fills():
    base, rise = 6 * 2**30, 64 * MIB
    f = analyze(_gpu_loop([base + i * rise for i in range(6)])).finding("memory-growth")
    assert f is not None
    n = f.evidence.numbers
    assert n["growth_per_step_bytes"] == rise and n["steps"] == 6 and n["rises"] == 5 and n["device"] == "gpu"
    peak = base + 5 * rise + 512 * MIB
    assert n["steps_to_fill"] == round((80 * 2**30 - peak) / rise)
    assert f.severity == "medium" and f.est_gain == 0
    assert "64.00 MiB every step" in f.title
    assert any(x.diagnostic and "_record_memory_history" in x.code for x in f.fixes)
    assert ".item()" in f.fixes[0].code and ".detach().cpu()" in f.fixes[0].code


def test_cpu_records_in_a_trace_without_a_gpu():
    f = analyze(_cpu_loop([MIB + i * 8192 for i in range(6)])).finding("memory-growth")
    assert f is not None and f.evidence.numbers["device"] == "cpu"
    assert f.evidence.numbers["growth_per_step_bytes"] == 8192 and "steps_to_fill" not in f.evidence.numbers
    assert f.severity == "low"  # no machine block: the capacity is unknown, and 8 KiB a step is slow
    assert any(x.diagnostic and "gc.get_objects()" in x.code for x in f.fixes)


def test_a_slow_rise_is_low():
    """512 bytes a step (one kept scalar in the CUDA allocator's smallest block) fills 80 GiB in
    over a hundred million steps: still a leak, reported as low."""
    f = analyze(_gpu_loop([2**30 + i * 512 for i in range(6)])).finding("memory-growth")
    assert f is not None and f.severity == "low"
    assert f.evidence.numbers["steps_to_fill"] > SOON_STEPS


@pytest.mark.parametrize("floors", [
    [2**30] * 6,  # steady
    [2**30] + [2**30 + 256 * MIB] * 5,  # optimizer state made at the first step, then steady
    [2**30 + (i % 2) * MIB for i in range(6)],  # moves with the data: rises and falls
    [2**30 + i * MIB for i in range(5)] + [2**30],  # rises, then falls back (a bounded cache emptied)
    [2**30 + i * MIB for i in range(MIN_STEPS - 1)],  # too few steps to call it steady
], ids=["steady", "first-step-state", "up-and-down", "falls-back", "few-steps"])
def test_floors_that_do_not_climb_steadily_are_silent(floors):
    assert analyze(_gpu_loop(floors)).finding("memory-growth") is None


def test_two_flat_transitions_among_rises_still_fire():
    """A rise in ≥ 75 % of the transitions, none falling: a kept tensor every step, or nearly."""
    floors = [2**30, 2**30 + MIB, 2**30 + MIB, 2**30 + 2 * MIB, 2**30 + 3 * MIB, 2**30 + 4 * MIB,
              2**30 + 5 * MIB, 2**30 + 6 * MIB, 2**30 + 6 * MIB]
    assert analyze(_gpu_loop(floors)).finding("memory-growth") is not None  # 6 of 8 rose
    assert analyze(_gpu_loop(floors[:4] + floors[5:])).finding("memory-growth") is None  # 5 of 7


def test_without_allocator_records_it_is_silent():
    tb = TraceBuilder()
    busy_steps(tb, 6, STEP_US, kernel_us=800.0)
    assert analyze(tb.to_dict()).finding("memory-growth") is None


def _record(keep: bool):
    import torch

    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    kept = []
    with gpumagic.profile(steps=6, skip=1, display=False, memory=True) as run:
        for _ in range(9):
            out = model(x)
            loss = out.square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if keep:
                kept.append(out.detach())  # 32 × 64 float32 a step: 8 KiB
    return run.report


def test_a_recorded_cpu_loop_that_keeps_its_outputs():
    """Recorded here with torch on the CPU (PyTorch records the CPU allocator's totals too)."""
    f = _record(keep=True).finding("memory-growth")
    assert f is not None and f.evidence.numbers["device"] == "cpu"
    assert f.evidence.numbers["growth_per_step_bytes"] == 32 * 64 * 4
    assert any(x.diagnostic and "gc.get_objects()" in x.code for x in f.fixes)
    assert _record(keep=False).finding("memory-growth") is None


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "*.json.gz"))))
def test_silent_on_every_recorded_trace(path):
    assert analyze(path).finding("memory-growth") is None
