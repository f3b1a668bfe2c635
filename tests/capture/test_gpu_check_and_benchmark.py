"""``scripts/gpu_check.py`` and ``benchmarks/overhead.py`` stay runnable where there is no GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _load(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_exits_cleanly_without_cuda(monkeypatch, capsys, tmp_path):
    gpu_check = _load("scripts/gpu_check.py")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path / "out")]) == 0
    assert "no CUDA device here" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_gpu_check_flags_a_cpu_run_that_lacks_gpu_activity_and_samples():
    import gpumagic

    gpu_check = _load("scripts/gpu_check.py")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpumagic.profile(display=False) as run:
        for _ in range(7):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    problems = gpu_check.check_run("cpu", run, {"mixed-precision-off"})
    assert any("expected ['mixed-precision-off']" in p for p in problems)
    assert "cpu: the trace has no GPU activity" in problems
    assert any("no NVML samples" in p for p in problems)
    assert gpu_check.check_clean("cpu") == []


@pytest.mark.slow
def test_the_overhead_benchmark_runs_a_small_configuration(capsys):
    overhead = _load("benchmarks/overhead.py")
    threads = torch.get_num_threads()
    try:
        assert overhead.main(["--steps", "8", "--rounds", "1", "--phases", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert all(mode in out for mode in ("bare", "gpumagic", "torch_all"))
    phases = out.split("after the export, median of 1 runs", 1)[1]
    for step, _module, _attr in overhead.AFTER_EXPORT:
        assert step in phases
    assert "%%gpuprofile: live view (widgets)" in phases and "gpumagic after the export, in all" in phases
