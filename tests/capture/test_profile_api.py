"""``gpumagic.profile`` (context manager and decorator) and ``gpumagic.Profiler``."""

from __future__ import annotations

import pytest

import gpumagic.shells.api as api
from gpumagic.capture import CaptureError, OptionsError


def test_profile_block_gives_a_run_with_report_trace_and_save(train, tmp_path):
    with api.profile(label="block") as run:
        assert not run.finished and run.report is None
        with pytest.raises(CaptureError, match="still recording"):
            run.save(tmp_path / "early.json")
        train(8)
    assert run.finished and run.report.label == "block"
    assert run.trace is run.report.trace
    assert run.report.metrics["steps"]["count"] == 5
    assert run.save(tmp_path / "r.json.gz").stat().st_size > 0


def test_profile_block_reraises_and_keeps_a_partial_run(train):
    with pytest.raises(ZeroDivisionError), api.profile() as run:
        train(3)
        1 / 0  # noqa: B018
    assert run.finished and "ZeroDivisionError" in " ".join(run.report.notes)


def test_decorator_profiles_each_call_and_keeps_the_return_value(train):
    @api.profile(steps=2)
    def fit(n):
        train(n)
        return "done"

    assert fit.last_run is None
    assert fit(5) == "done"
    first = fit.last_run
    assert first.report.metrics["steps"]["names"] == ["ProfilerStep#1", "ProfilerStep#2"]
    fit(4)
    assert fit.last_run is not first


def test_decorator_reraises(train):
    @api.profile()
    def broken():
        raise KeyError("k")

    with pytest.raises(KeyError):
        broken()
    assert broken.last_run.finished


def test_profiler_across_calls_like_notebook_cells(train):
    prof = api.Profiler(label="cells", skip=0, steps=3)
    run = prof.start()
    assert prof.is_running
    train(2)  # "cell 1"
    train(5)  # "cell 2"
    assert prof.stop() is run and not prof.is_running
    assert run.report.metrics["steps"]["names"] == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    with pytest.raises(CaptureError, match="not running"):
        prof.stop()


def test_profiler_refuses_a_second_start():
    prof = api.Profiler()
    prof.start()
    try:
        with pytest.raises(CaptureError, match="already running"):
            prof.start()
    finally:
        prof.stop()


def test_option_errors():
    with pytest.raises(OptionsError, match="steps"):
        api.profile(steps=0)
    with pytest.raises(TypeError, match=r"unknown option.*stepz"):
        api.Profiler(stepz=3)


def test_display_only_in_a_notebook_unless_asked(monkeypatch, train):
    shown = []
    monkeypatch.setattr(api, "_display", shown.append)
    monkeypatch.setattr(api, "in_notebook", lambda: False)
    with api.profile():
        train(1)
    assert shown == []
    with api.profile(display=True) as run:
        train(1)
    assert shown == [run.report]
    monkeypatch.setattr(api, "in_notebook", lambda: True)
    with api.profile() as run2:
        train(1)
    with api.profile(display=False):
        train(1)
    assert shown == [run.report, run2.report]


def test_in_notebook_is_false_in_a_plain_process():
    assert api.in_notebook() is False


def test_flops_option_records_the_profilers_counts_and_shapes(tmp_path):
    """``flops=True`` (``%%gpuprofile --flops``): torch computes FLOPs per operator, gpumagic writes
    them into the trace (torch's own export leaves them out), and metrics.compute reads them."""
    import torch

    a, b = torch.randn(64, 128), torch.randn(128, 32)
    linear = torch.nn.Linear(128, 16)
    with torch.no_grad(), api.profile(flops=True) as run:
        for _ in range(3):
            torch.mm(a, b)
        linear(a)
    c = run.report.metrics["compute"]
    assert c["flops_source"] == "profiler"
    assert c["flops"] == 3 * 2 * 64 * 128 * 32 + 2 * 64 * 128 * 16
    assert c["dtype"] == "fp32" and c["peak_tflops"] is None  # CPU only: no GPU peak
    saved = gpumagic_load(run.save(tmp_path / "f.json.gz"))
    assert (saved.ops.flops > 0).sum() >= 4  # the counts travel in the bundle


def gpumagic_load(path):
    from gpumagic.trace import load

    return load(path)
