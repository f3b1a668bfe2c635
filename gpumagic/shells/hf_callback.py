"""Hugging Face ``Trainer``: profile a few training steps, and phrase fixes as ``TrainingArguments``.

::

    from gpumagic.integrations.huggingface import GpuProfileCallback

    callback = GpuProfileCallback(skip=2, steps=5)     # leave 2 warm-up steps out, record 5
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[callback])
    trainer.train()            # in a notebook the report is displayed (once) when the 5 steps are done
    report = callback.report   # the Report, fixes first as TrainingArguments (a bare last line would show it again)

The callback records from the end of optimizer step ``skip`` (after ``skip`` warm-up steps; with
``skip=0`` from the start of training) for ``steps`` optimizer steps, through
:class:`gpumagic.Profiler`. If ``Trainer.train()`` raises while recording (the Trainer calls no
callback then), the recording is closed when the notebook cell ends (IPython's ``post_run_cell``
event, registered only while recording), with the error: its partial report, and for an
out-of-memory error the ``out-of-memory`` finding, follow the traceback. Outside IPython it is
closed at the next ``train()`` or by :meth:`GpuProfileCallback.close`.

What the fixes say (the ``TrainingArguments`` advice per finding, checked against the installed
transformers) is analysis: :mod:`gpumagic.analysis.advice.huggingface`; this shell only applies it.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import TYPE_CHECKING, Any

from gpumagic.analysis.advice.huggingface import huggingface_fixes

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Report

HF_INSTALL_HINT = "GpuProfileCallback needs transformers: pip install 'gpumagic[hf]' (or pip install transformers)"


def trainer_imported() -> bool:
    """Whether this process imported ``transformers.Trainer`` (a hint that fixes should be Trainer-first)."""
    return "transformers.trainer" in sys.modules


# -- the callback ---------------------------------------------------------------------------------


class _ProfileSteps:
    """The callback's logic, independent of transformers (the class itself is built on first use)."""

    def __init__(self, *, skip: int = 1, steps: int = 5, label: str = "", display: bool | None = None,
                 all_ranks: bool = False, trainer_fixes: bool = True, **options: Any) -> None:
        from gpumagic.capture import CaptureOptions

        if "all_steps" in options:
            raise TypeError("GpuProfileCallback records `steps` optimizer steps; all_steps does not apply "
                            "(wrap trainer.train() in %%gpuprofile --all to record everything)")
        CaptureOptions(label=label, skip=skip, steps=steps, **options)  # bad values fail here, not mid-training
        self.skip, self.steps, self.label = skip, steps, label
        self.display, self.all_ranks, self.trainer_fixes = display, all_ranks, trainer_fixes
        self.options = options
        self.run = None
        self.report: Report | None = None
        self._profiler = None
        self._start_at: int | None = None  # global step after which recording starts; None: not profiling
        self._batch_size: int | None = None  # the TrainingArguments' per-device batch, for the capture
        self._accumulation = 1  # its gradient_accumulation_steps: batches per optimizer step
        self._shell = None  # the IPython shell whose post_run_cell event closes a failed recording

    @property
    def is_recording(self) -> bool:
        return self._profiler is not None

    def on_train_begin(self, args, state, control, **kwargs):
        self.close()
        self.run = self.report = None
        self._start_at = None
        batch = getattr(args, "per_device_train_batch_size", None)
        self._batch_size = batch if type(batch) is int and batch > 0 else None  # out-of-memory estimate, energy per sample
        accumulation = getattr(args, "gradient_accumulation_steps", 1)
        self._accumulation = accumulation if type(accumulation) is int and accumulation > 0 else 1
        if state.is_world_process_zero or self.all_ranks:
            self._start_at = state.global_step + self.skip
            if self.skip == 0:
                self._start()

    def on_step_end(self, args, state, control, **kwargs):
        if self._start_at is None:
            return
        if self._profiler is None and self.run is None and self.skip and state.global_step >= self._start_at:
            self._start()
        elif self._profiler is not None and state.global_step >= self._start_at + self.steps:
            self._finish(args)

    def on_train_end(self, args, state, control, **kwargs):
        if self._profiler is not None:
            self._finish(args)

    def close(self) -> None:
        """Stop a recording left open by a ``train()`` that raised (its partial report is kept)."""
        if self._profiler is not None:
            self._finish(None, RuntimeError("Trainer.train() did not finish"))

    def _start(self) -> None:
        from gpumagic.capture import CaptureError
        from gpumagic.shells.api import Profiler

        options = dict(self.options)
        if self._batch_size is not None:
            options.setdefault("batch_size", self._batch_size)
            options.setdefault("accumulation_steps", self._accumulation)
        profiler = Profiler(display=False, label=self.label, skip=0, steps=self.steps, **options)
        profiler.record = False  # _finish records the report with its TrainingArguments fixes
        try:
            profiler.start()
        except CaptureError as exc:  # training goes on unprofiled; say why
            warnings.warn(f"gpumagic: not profiling this training run: {exc}", RuntimeWarning, stacklevel=2)
            self._start_at = None
            return
        self._profiler = profiler
        self._watch_cell()

    def _watch_cell(self) -> None:
        """In IPython, close the recording when the cell that runs ``train()`` fails."""
        shell = _shell()
        if shell is not None:
            shell.events.register("post_run_cell", self._after_cell)
            self._shell = shell

    def _unwatch_cell(self) -> None:
        shell, self._shell = self._shell, None
        if shell is not None:
            with contextlib.suppress(ValueError):  # already gone (the shell was reset)
                shell.events.unregister("post_run_cell", self._after_cell)

    def _after_cell(self, result: Any) -> None:
        error = getattr(result, "error_in_exec", None)
        if self._profiler is not None and isinstance(error, BaseException):
            self._finish(None, error)  # train() raised: no on_train_end will come

    def _finish(self, training_args: Any, error: BaseException | None = None) -> None:
        self._unwatch_cell()
        profiler, self._profiler = self._profiler, None
        self.run = profiler.stop(error)
        report = self.run.report
        if report is not None and self.trainer_fixes:
            report = huggingface_fixes(report, training_args=training_args)
        self.report = report
        if report is None:
            return
        if self.label and error is None:
            from gpumagic.shells.api import record_run

            record_run(self.run, source="huggingface", report=report)
        if _wants_display(self.display):
            from IPython.display import display

            display(report)


def _shell() -> Any:
    """The running IPython shell, or ``None`` (IPython is not imported just to ask)."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def _wants_display(display: bool | None) -> bool:
    if display is not None:
        return bool(display)
    from gpumagic.shells.api import in_notebook

    return in_notebook()


def _callback_class() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError(HF_INSTALL_HINT) from None

    class GpuProfileCallback(_ProfileSteps, TrainerCallback):
        """A ``transformers.TrainerCallback`` that profiles ``steps`` optimizer steps after ``skip``
        warm-up steps and exposes ``callback.report`` (displayed in a notebook unless
        ``display=False``).

        Options: ``skip`` (default 1), ``steps`` (default 5), ``label`` (also remembers the report
        for ``gpumagic.compare`` and ``%%gpuprofile --compare``), ``display``, ``all_ranks`` (profile
        every process of a distributed run, not only rank 0), ``trainer_fixes`` (phrase fixes as
        TrainingArguments, default True), and the capture options of :func:`gpumagic.profile`
        (``max_seconds``, ``interval_ms``, ``nvml``, ``shapes``, ``stack``, ``memory``, ``save``).
        """

    GpuProfileCallback.__module__ = "gpumagic.integrations.huggingface"  # its public path
    return GpuProfileCallback


def __getattr__(name: str) -> Any:
    if name == "GpuProfileCallback":
        cls = _callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GpuProfileCallback", "trainer_imported"]  # noqa: F822 (GpuProfileCallback: built by __getattr__)
