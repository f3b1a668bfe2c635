"""Capture sessions on CPU torch: step windows, caps, errors, refusals, samples, saving."""

from __future__ import annotations

import gzip
import json
import os
import sys
import time

import numpy as np
import pytest
import torch

from gpumagic.capture import CaptureOptions, CaptureSession, ProfilerBusyError, TorchMissingError
from gpumagic.capture.errors import OptionsError
from gpumagic.capture.nvml import FakeNvml
from gpumagic.capture.session import NO_CUDA_NOTE, active_session, finish_after

READING = {"gpu_util": 55, "mem_util": 20, "mem_used_bytes": 1 << 30, "mem_total_bytes": 8 << 30,
           "power_w": 120.0, "sm_clock_mhz": 1500, "pcie_tx_kbps": 10, "pcie_rx_kbps": 20}


def capture(fn, **options):
    session = CaptureSession(CaptureOptions(**options))
    session.start()
    try:
        fn()
    except BaseException as exc:
        finish_after(session, exc)
        raise
    return session, session.finish()


def step_names(run):
    return run.report.metrics["steps"]["names"]


def test_default_window_skips_one_step_and_records_five(train):
    session, run = capture(lambda: train(12), label="base")
    assert step_names(run) == [f"ProfilerStep#{i}" for i in range(1, 6)]
    assert session.stop_reason == "steps"
    facts = json.loads(run.bundle)["gpumagic"]["capture"]
    assert facts["optimizer_steps_seen"] == 12  # the hook keeps counting; recording stopped at 6
    assert facts["optimizer_parameters"] == 2  # the linear model's weight and bias
    assert facts["optimizer_parameter_elements"] == {"float32": 16 + 1}  # Linear(16, 1): its elements by dtype
    assert run.report.label == "base"


def test_skip_and_steps_options(train):
    _, run = capture(lambda: train(10), skip=3, steps=2)
    assert step_names(run) == ["ProfilerStep#3", "ProfilerStep#4"]


def test_all_steps_records_every_step_from_the_start(train):
    session, run = capture(lambda: train(8), all_steps=True)
    assert step_names(run) == [f"ProfilerStep#{i}" for i in range(8)]
    assert session.stop_reason == "end"


def test_a_loop_shorter_than_the_window_keeps_complete_steps_only(train):
    _, run = capture(lambda: (train(3), torch.ones(100).sum()))
    assert step_names(run) == ["ProfilerStep#1", "ProfilerStep#2"]
    assert any("Only 3 optimizer step(s) ran" in n for n in run.notes)
    # the cell returned: no step was running, the rest of the cell was
    assert any(n.startswith("The code after the last optimizer step") for n in run.notes)
    assert not any("still running" in n for n in run.notes)
    assert b"gpumagic::partial_step#3" in run.bundle


def test_a_second_optimizer_does_not_split_steps(tiny_model, train):
    """A second optimizer over the same parameters, stepping after the first every iteration (a
    GAN's, or a Lookahead-style wrapper's): new only at its first step, it never takes the count."""
    model, _ = tiny_model
    other = torch.optim.SGD(model.parameters(), lr=0.0)

    def gan_like():
        for _ in range(8):
            train(1)
            other.step()

    _, run = capture(gan_like)
    assert step_names(run) == [f"ProfilerStep#{i}" for i in range(1, 6)]
    assert json.loads(run.bundle)["gpumagic"]["capture"]["optimizer_parameters"] == 2  # the same two, held twice


@pytest.mark.parametrize("collect", [False, True])
def test_an_optimizer_built_anew_every_step_keeps_the_window(tiny_model, collect):
    """A loop that builds its optimizer every step: the count passes to each new one (a mistake,
    which the analysis reports), so ``steps`` still bounds the recording. With the garbage
    collector run each step, the old optimizer is gone before the new one steps."""
    import gc

    model, _ = tiny_model

    def rebuilt():
        for _ in range(12):
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            optimizer.zero_grad()
            model(torch.randn(8, 16)).pow(2).mean().backward()
            optimizer.step()
            del optimizer
            if collect:
                gc.collect()

    session, run = capture(rebuilt)
    assert session.stop_reason == "steps"
    assert step_names(run) == [f"ProfilerStep#{i}" for i in range(1, 6)]
    assert run.report.finding("optimizer-state-reset") is not None


def test_without_optimizer_steps_the_cap_stops_recording_mid_cell():
    def busy_for(seconds):
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            torch.ones(64).add_(1)  # a few traced ops every ~5 ms, Python in between
            sum(range(20_000))

    session, run = capture(lambda: busy_for(0.6), max_seconds=0.2)
    assert session.stop_reason == "cap"
    assert any("Recording stopped at the 0.2 s cap" in n for n in run.notes)
    window_ms = run.report.metrics["window"]["dur_ms"]
    assert 150 <= window_ms < 450  # recorded ~0.2 s of a 0.6 s cell


def test_a_cell_shorter_than_the_cap_is_recorded_whole():
    session, run = capture(lambda: torch.ones(8).sum(), max_seconds=30)
    assert session.stop_reason == "end"
    assert run.report.metrics["steps"]["count"] == 0
    assert not any("cap" in n for n in run.notes)


def test_no_cuda_gives_a_cpu_only_note(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _, run = capture(lambda: torch.ones(2).sum())
    assert run.notes[0] == NO_CUDA_NOTE
    assert NO_CUDA_NOTE in run.report.notes


def test_an_error_stops_everything_and_leaves_a_partial_report(train):
    def failing():
        train(3)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        capture(failing)
    assert active_session() is None  # and the autouse fixture checks profiler, hook and threads


def test_the_partial_report_says_what_was_raised(train):
    session = CaptureSession(CaptureOptions())
    session.start()
    train(4)
    run = finish_after(session, KeyboardInterrupt())
    assert run.report is not None
    assert "The profiled code raised KeyboardInterrupt: this profile is partial." in run.report.notes
    assert "Step 4 was still running when recording ended; it is not counted as a step." in run.report.notes
    assert step_names(run) == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]


def test_a_report_failure_does_not_hide_the_codes_error(monkeypatch, capsys):
    import gpumagic.capture.session as session_module

    def broken(*_):
        raise RuntimeError("analysis bug")

    monkeypatch.setattr(session_module, "_analyse", broken)
    session = CaptureSession(CaptureOptions())
    session.start()
    run = finish_after(session, ValueError("user error"))
    assert run.report is None and run.bundle is not None
    assert "the partial report could not be built (RuntimeError: analysis bug)" in capsys.readouterr().err
    session = CaptureSession(CaptureOptions())
    session.start()
    run = session.finish()  # without a user error, ours costs the report, not the code's success
    assert run.report is None and run.analysis_error == "RuntimeError: analysis bug"
    assert run.kept_at is not None and run.kept_at.is_file()
    run.kept_at.unlink()
    run.kept_at.parent.rmdir()


def test_nested_sessions_are_refused():
    outer = CaptureSession(CaptureOptions())
    outer.start()
    try:
        with pytest.raises(ProfilerBusyError, match="already running"):
            CaptureSession(CaptureOptions()).start()
    finally:
        outer.finish()


def test_an_active_torch_profiler_is_refused():
    cpu_only = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu_only), pytest.raises(ProfilerBusyError, match="another torch"):
        CaptureSession(CaptureOptions()).start()
    assert active_session() is None


def test_torch_missing_gives_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(TorchMissingError, match="install it first") as info:
        CaptureSession(CaptureOptions()).start()
    assert isinstance(info.value, ImportError)
    assert active_session() is None


def test_a_bad_save_path_is_refused_before_recording(tmp_path):
    with pytest.raises(OptionsError, match="does not exist"):
        CaptureSession(CaptureOptions(save=str(tmp_path / "nope" / "x.json"))).start()
    assert active_session() is None


def test_finish_twice_or_before_start_is_an_error():
    from gpumagic.capture import CaptureError

    session = CaptureSession(CaptureOptions())
    with pytest.raises(CaptureError, match="not running"):
        session.finish()
    session.start()
    session.finish()
    with pytest.raises(CaptureError, match="not running"):
        session.finish()
    with pytest.raises(CaptureError, match="only once"):
        session.start()


def test_fake_nvml_samples_reach_the_trace_aligned_with_it(train):
    fake = FakeNvml({"GPU-x": [READING]})
    session = CaptureSession(CaptureOptions(interval_ms=10), nvml_backend=fake, nvml_devices=[(0, "x")])
    session.start()
    train(3)
    time.sleep(0.05)
    train(4)
    run = session.finish()
    gpu = run.trace.samples.gpu
    assert set(gpu["gpu_util"].tolist()) == {55} and set(gpu["device"].tolist()) == {0}
    assert len(gpu["t_ns"]) >= 3
    # samples bracket the recording: the first just before the profiler started (samplers start
    # first), the last when it stopped; a clock error would put them seconds or years away
    trace_end = int((run.trace.events.ts_ns + run.trace.events.dur_ns).max())
    assert -50_000_000 < gpu["t_ns"][0] <= 1_000_000
    assert abs(int(gpu["t_ns"][-1]) - trace_end) < 20_000_000
    assert not fake.initialised  # NVML shut down
    assert json.loads(run.bundle)["gpumagic"]["machine"]["nvidia_driver"] == "555.42"


def test_cpu_samples_are_recorded():
    def busy():
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < 0.8:  # ~40 sampling periods: robust on a loaded machine
            if i % 50 == 0:  # a traced op now and then; one every loop starves other threads of
                torch.ones(256).mul_(2)  # the GIL (the op drops and retakes it, and the taker wins)
            sum(range(20_000))  # keep the CPU busy without flooding the trace
            i += 1

    _, run = capture(busy, interval_ms=20, max_seconds=10)
    cpu = run.trace.samples.cpu
    assert len(cpu["t_ns"]) >= 5
    assert cpu["per_core"].shape == (len(cpu["t_ns"]), os.cpu_count())
    assert cpu["main"].max() > 20  # this process was busy
    # each sample's time since the reading before it: the first one's too (the sampler's first
    # reading, at the start, makes no sample, so without it the first sample's span is unknown)
    assert (cpu["span_ns"] > 0).all() and (cpu["span_ns"][1:] == np.diff(cpu["t_ns"])).all()


def test_save_writes_a_bundle_that_gpumagic_reads(tmp_path, train):
    from gpumagic.analysis import analyze

    path = tmp_path / "run.json.gz"
    _, run = capture(lambda: train(8), label="saved", save=str(path))
    assert run.saved_to == path
    data = json.loads(gzip.decompress(path.read_bytes()))
    assert data["gpumagic"]["label"] == "saved"
    assert any(e.get("name") == "gpumagic::clock_anchor" for e in data["traceEvents"])
    again = analyze(str(path))
    assert again.metrics["steps"]["names"] == step_names(run)
    assert again.label == "saved"


def test_nothing_from_the_environment_is_saved(tmp_path, monkeypatch, train):
    secret = "tok-9f8e7d6c5b4a-secret"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    path = tmp_path / "run.json"
    capture(lambda: train(7), save=str(path), label="env")
    text = path.read_text()
    assert secret not in text and "HF_TOKEN" not in text
    assert os.environ.get("USER", "\0nobody") not in json.loads(text)["gpumagic"].__repr__()
    # Kineto's own top-level fields that name the machine and the temporary export path
    data = json.loads(text)
    assert data.get("host_name", "") == "" and data.get("traceName", "") == ""


def test_scrub_identity_blanks_only_the_top_level_identity_fields():
    from gpumagic.capture.bundle import scrub_identity

    raw = (b'{"schemaVersion": 1, "host_name": "gpu-box-7.corp", "traceName": "/tmp/tmpab\\"c.json",'
           b' "traceEvents": [{"ph": "X", "name": "host_name", "args": {"note": "traceName"}}]}')
    out = json.loads(scrub_identity(raw))
    assert out["host_name"] == "" and out["traceName"] == ""
    assert out["traceEvents"][0]["name"] == "host_name" and out["traceEvents"][0]["args"] == {"note": "traceName"}


def test_profiling_does_not_change_results(train):
    torch.manual_seed(1)
    a = torch.randn(4, 4)
    expected = (a @ a).sum().item()
    session = CaptureSession(CaptureOptions())
    session.start()
    got = (a @ a).sum().item()
    session.finish()
    assert got == expected


def test_a_starved_data_loader_is_reported_as_dataloader_bound():
    from torch.utils.data import DataLoader, Dataset

    class SlowDataset(Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            time.sleep(0.001)  # 16 ms per batch of 16, against ~0.2 ms of compute
            return torch.randn(32), torch.randn(1)

    model = torch.nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loop():
        for i, (x, y) in enumerate(DataLoader(SlowDataset(), batch_size=16)):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i == 8:
                break

    _, run = capture(loop, label="starved")
    assert run.report.finding_ids[0] == "dataloader-bound"
    assert run.report.metrics["host"]["dataloader_frac"] > 0.5


def test_a_failure_in_the_step_hook_never_breaks_the_training_loop(monkeypatch, train):
    from gpumagic.capture import CaptureError
    from gpumagic.capture.recorder import TorchRecorder

    def broken(self, step_index):
        raise RuntimeError("marker failure")

    monkeypatch.setattr(TorchRecorder, "begin_step", broken)
    session = CaptureSession(CaptureOptions())
    session.start()
    train(8)  # the hook fails at step 1; the loop goes on
    with pytest.raises(CaptureError, match=r"profiling failed while the code ran \(RuntimeError: marker failure\)"):
        session.finish()
    # torn down without the normal stop: the loader-stage timers and the step timer both wrapped
    # DataLoader._get_iterator, and both are undone, the later first (it once stayed wrapped)
    from torch.utils.data import DataLoader

    assert not hasattr(DataLoader.__dict__["_get_iterator"], "__wrapped__")


@pytest.mark.slow
def test_kineto_log_lines_stay_out_of_stderr():
    import subprocess

    code = ("import torch, gpumagic\n"
            "with gpumagic.profile(display=False) as run:\n"
            "    torch.ones(4).add(1)\n"
            "assert run.report is not None\n")
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "USDT" not in done.stderr and "STAGE" not in done.stderr
    assert done.stderr.strip() == ""
