"""GpuProfileCallback profiles a few steps of Trainer.train() on a tiny model, on the CPU."""

from __future__ import annotations

import warnings

import pytest

from gpumagic.capture import OptionsError
from gpumagic.tuning import runs

pytestmark = pytest.mark.slow  # imports transformers (~5 s) and trains a few steps


@pytest.fixture
def Callback(hf):
    from gpumagic.integrations.huggingface import GpuProfileCallback

    return GpuProfileCallback


def test_records_steps_after_warmup_and_phrases_fixes_as_training_arguments(Callback, make_trainer, hf):
    runs.forget()
    # Host CPU samples every 10 s: none in this short window, so that other work on the machine (a
    # parallel test worker) cannot make host-cpu-saturated take the data loader's place.
    # Five recorded steps, not three: one step slowed by a busy machine at the window's start reads
    # as a warm-up (warmup-in-window), and the steady steps after it must still be enough to judge.
    callback = Callback(skip=2, steps=5, label="hf-tiny", display=False, interval_ms=10_000)
    assert isinstance(callback, hf.TrainerCallback)
    make_trainer(callback, max_steps=9).train()
    report = callback.report
    assert report is not None and not callback.is_recording
    assert report.metrics["steps"]["count"] == 5
    assert report.label == "hf-tiny" and runs.get("hf-tiny") is report
    assert callback.run.options.skip == 0 and callback.run.options.steps == 5  # started after 2 warm-up steps
    dl = report.finding("dataloader-bound")
    assert dl is not None, report.finding_ids  # 8 items × 4 ms of sleep per step
    first = dl.fixes[0]
    assert first.flavor == "huggingface"
    # the worker count follows the evidence (issue 10): the usable cores recorded at capture
    workers = dl.evidence.numbers.get("suggested_num_workers", 4)
    assert f"dataloader_num_workers={workers}" in first.code and "dataloader_persistent_workers=True" in first.code
    assert "dataloader_pin_memory" not in first.code  # CPU-only run: pinning would not help
    assert any(f.flavor == "pytorch" for f in dl.fixes)
    assert any(n.startswith("Fixes are phrased as TrainingArguments for transformers") for n in report.notes)
    runs.forget()


def test_skip_zero_records_from_the_start(Callback, make_trainer):
    callback = Callback(skip=0, steps=2, display=False)
    make_trainer(callback, max_steps=4, item_s=0, gradient_accumulation_steps=2).train()
    assert callback.report.metrics["steps"]["count"] == 2
    # the Trainer's batch and accumulation reach the capture (out-of-memory estimate, energy per sample)
    assert (callback.run.options.batch_size, callback.run.options.accumulation_steps) == (8, 2)


def test_training_shorter_than_asked_ends_the_recording(Callback, make_trainer):
    callback = Callback(skip=1, steps=5, display=False)
    make_trainer(callback, max_steps=3, item_s=0).train()
    assert callback.report is not None
    assert callback.report.metrics["steps"]["count"] == 2
    assert any("Only 2 optimizer step(s) ran" in n for n in callback.report.notes)


def test_displays_the_report_when_asked(Callback, make_trainer, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    callback = Callback(skip=1, steps=1, display=True)
    make_trainer(callback, max_steps=2, item_s=0).train()
    assert shown == [callback.report]


def test_a_busy_profiler_leaves_training_unprofiled_with_a_warning(Callback, make_trainer):
    import gpumagic

    other = gpumagic.Profiler(display=False, all_steps=True)
    other.start()
    try:
        callback = Callback(skip=0, steps=1, display=False)
        with pytest.warns(RuntimeWarning, match="not profiling this training run"):
            make_trainer(callback, max_steps=2, item_s=0).train()
        assert callback.report is None and not callback.is_recording
    finally:
        other.stop()


def test_a_failed_train_is_closed_by_the_next_one(Callback, make_trainer):
    callback = Callback(skip=0, steps=50, display=False)
    with pytest.raises(RuntimeError, match="the dataset broke"):
        make_trainer(callback, max_steps=20, item_s=0, fail_at=24).train()
    assert callback.is_recording  # train() raised: no on_train_end
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_trainer(callback, max_steps=2, item_s=0).train()
    assert not callback.is_recording
    assert callback.report is not None and callback.report.metrics["steps"]["count"] == 2


def test_close_keeps_the_partial_report(Callback, make_trainer):
    callback = Callback(skip=0, steps=50, display=False)
    with pytest.raises(RuntimeError):
        make_trainer(callback, max_steps=20, item_s=0, fail_at=24).train()
    callback.close()
    assert not callback.is_recording
    assert callback.report is not None
    assert any("this profile is partial" in n for n in callback.report.notes)


def test_bad_options_fail_when_the_callback_is_made(Callback):
    with pytest.raises(OptionsError, match="steps must be an integer >= 1"):
        Callback(steps=0)
    with pytest.raises(TypeError):
        Callback(no_such_option=True)
    with pytest.raises(TypeError, match="all_steps does not apply"):
        Callback(all_steps=True)


def test_the_readme_snippet_shows_the_report_once(Callback, make_trainer, hf, monkeypatch):
    """README's Hugging Face cell, run as a notebook runs it (IPython, last line's value displayed,
    the callback displaying as it does in a kernel): one report shown, not two."""
    import re
    from pathlib import Path

    from ipyshell import ipython_shell

    import gpumagic.render.display
    from gpumagic.shells import hf_callback as huggingface

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Hugging Face Trainer"):]
    cell = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert "GpuProfileCallback(" in cell
    cell = cell.replace("steps=5", "steps=1")  # the same snippet, fewer steps: a test-sized run
    shown = []
    monkeypatch.setattr(huggingface, "_wants_display", lambda display: display is None or bool(display))
    monkeypatch.setattr(gpumagic.render.display, "show", lambda report: shown.append(report))
    trainer = make_trainer(None, max_steps=3, item_s=0)
    with ipython_shell("gpumagic") as ip:
        ip.user_ns.update(model=trainer.model, args=trainer.args, ds=trainer.train_dataset, Trainer=hf.Trainer)
        result = ip.run_cell(cell)
        result.raise_error()
        report = ip.user_ns["cb"].report
    assert report is not None and shown == [report]


def test_in_a_notebook_a_failed_train_is_closed_when_its_cell_ends_with_the_out_of_memory_finding(
        Callback, make_trainer, hf, monkeypatch):
    """``Trainer.train()`` that raises calls no callback; in IPython the recording is closed by the
    cell's ``post_run_cell`` event with the very error, so an out-of-memory error gets its finding
    (told the TrainingArguments' batch, for the largest-batch estimate) and no profiler is left running. The
    cell fails exactly as without the callback, and the event is unregistered afterwards."""
    import torch
    from ipyshell import ipython_shell
    from test_memory_categories import CUDA_MESSAGE

    from gpumagic.shells import hf_callback as huggingface

    shown = []
    monkeypatch.setattr(huggingface, "_wants_display", lambda display: True)
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    callback = Callback(skip=0, steps=50)
    error = torch.OutOfMemoryError(CUDA_MESSAGE)
    trainer = make_trainer(callback, max_steps=20, item_s=0, fail_at=24, error=error)
    with ipython_shell("gpumagic") as ip:
        before = list(ip.events.callbacks["post_run_cell"])
        ip.user_ns["trainer"] = trainer
        result = ip.run_cell("trainer.train()")
        assert result.error_in_exec is error  # the same object, as without the callback
        assert not callback.is_recording
        assert ip.events.callbacks["post_run_cell"] == before
        ip.run_cell("1 + 1").raise_error()  # a later cell: nothing of the callback's runs
    report = callback.report
    assert report is not None and shown == [report]
    oom = report.finding("out-of-memory")
    assert oom is not None and any("this profile is partial" in n for n in report.notes)
    assert oom.evidence.numbers["batch_size"] == 8  # per_device_train_batch_size, for the estimate
    assert report.finding_ids[0] == "out-of-memory"
