"""A capture session: profiler, step detection, samplers and time cap, started and torn down together.

Life of a session::

    start() ──► recording ──(last recorded step / time cap)──► stopped ──► finish() ──► Run
                     └───────────────(cell ends, raises or is interrupted)──────┘

``finish()`` always tears everything down (profiler, hook, threads, NVML) before it builds the
report, and one session at a time may be active in the process.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpumagic.capture import bundle
from gpumagic.capture.cpu import CpuSampler, ProcReader
from gpumagic.capture.deadline import Deadline
from gpumagic.capture.dynamo import DynamoWatch
from gpumagic.capture.errors import TORCH_INSTALL_HINT, CaptureError, OptionsError, ProfilerBusyError, TorchMissingError
from gpumagic.capture.everystep import StepTimer
from gpumagic.capture.interrupts import checkpoint, interrupts_held
from gpumagic.capture.machine import machine_info, versions
from gpumagic.capture.markers import nest_step_markers
from gpumagic.capture.modules import ModuleRanges
from gpumagic.capture.nvml import NvmlBackend, NvmlSampler, PynvmlBackend, open_sampler, torch_devices
from gpumagic.capture.options import CaptureOptions
from gpumagic.capture.recorder import TorchRecorder, profiler_active
from gpumagic.capture.run import Run
from gpumagic.capture.stages import LoaderStages
from gpumagic.capture.steps import OptimizerStepHook, StepAction, marker_name, step_action
from gpumagic.errors import exception_text

NO_CUDA_NOTE = "no CUDA device: CPU activity only"
#: Modules whose frames are on the main thread's stack only while torch.compile compiles: dynamo's
#: frame conversion (called on a cache miss, never by compiled code that runs) and inductor's
#: graph compilation (a backward graph compiles lazily, in the first backward).
COMPILING_MODULES = ("torch._dynamo.convert_frame", "torch._inductor.compile_fx")
#: While it compiles, the time cap looks again this often (s).
COMPILE_POLL_S = 0.5
TAKEN_OVER_NOTE = ("A torch.profiler in the cell took over the profiler; nothing was recorded "
                   "(torch can run one profiler at a time: remove it, or %%gpuprofile, to profile this cell).")
#: The named moments of :meth:`CaptureSession.finish`, in order, where tests inject interrupts
#: (``stop-sampler`` once per sampler; ``build``, ``analyse`` and ``save`` only when a trace is built).
CHECKPOINTS = ("finish", "stop-recording", "cancel-deadline", "stop-loader-stages", "remove-hook", "end-step",
               "stop-profiler", "stop-sampler", "shutdown-nvml", "release", "export", "build", "analyse", "save")

_active_lock = threading.Lock()
_active: CaptureSession | None = None


def active_session() -> CaptureSession | None:
    """The session now recording or awaiting ``finish()`` in this process, if any."""
    return _active


class CaptureSession:
    """One capture. ``nvml_backend`` with ``nvml_devices`` (``(cuda_index, uuid)`` pairs, by
    default the CUDA devices this process uses) and ``proc_root`` are injectable for tests.
    ``namespaces`` (the notebook's user namespace and the cell's locals) name the outermost modules'
    paths with ``modules``."""

    def __init__(self, options: CaptureOptions | None = None, *, nvml_backend: NvmlBackend | None = None,
                 nvml_devices: list[tuple[int, str]] | None = None, proc_root: str | os.PathLike = "/proc",
                 namespaces: tuple[dict[str, Any] | None, ...] = ()) -> None:
        self.options = options or CaptureOptions()
        self.run = Run(options=self.options, label=self.options.label)
        self.state = "new"
        self.stop_reason: str | None = None
        self._nvml_backend = nvml_backend
        self._nvml_devices = nvml_devices
        self._proc_root = proc_root
        self._recorder: TorchRecorder | None = None
        self._hook: OptimizerStepHook | None = None
        self._timer: StepTimer | None = None
        self._deadline: Deadline | None = None
        self._waited_for_compile = False  # the cap found torch.compile compiling, and waits
        self._samplers: list[Any] = []
        self._nvml: NvmlBackend | None = None
        self._nvml_driver: str | None = None
        self._anchor_ns: int | None = None
        self._started_at = 0.0
        self._recording_s: float | None = None
        self._partial_step: int | None = None
        self._deferred_error: BaseException | None = None
        self._stages: LoaderStages | None = None
        self._error: BaseException | None = None
        self._namespaces = namespaces
        self._modules: ModuleRanges | None = None
        self._dynamo: DynamoWatch | None = None
        self._intra_op_threads: int | None = None

    @property
    def notes(self) -> list[str]:
        return self.run.notes

    # ----------------------------------------------------------------------------- start
    def start(self) -> Run:
        """Start recording; returns the :class:`Run` that :meth:`finish` completes.

        Raises :class:`ProfilerBusyError` when another capture or torch profiler is active,
        :class:`TorchMissingError` without torch, :class:`OptionsError` for a bad save path.
        """
        if self.state != "new":
            raise CaptureError("a capture session can be started only once")
        _claim(self)
        try:
            self._start()
        except BaseException:
            self._teardown()
            self.state = "finished"
            _release(self)
            raise
        return self.run

    def _start(self) -> None:
        torch = _import_torch()
        if profiler_active():
            raise ProfilerBusyError("another torch profiler is already recording in this process; "
                                    "stop it before profiling with gpumagic")
        if self.options.save:
            try:
                bundle.check_target(self.options.save)
            except ValueError as exc:
                raise OptionsError(str(exc)) from None
        cuda = torch.cuda.is_available()
        if not cuda:
            self.notes.append(NO_CUDA_NOTE)
        self._start_samplers(cuda)
        self._intra_op_threads = _intra_op_threads(torch)
        self._recorder = TorchRecorder(self.options, cuda)
        self._anchor_ns = self._recorder.start()
        self._started_at = time.monotonic()
        self._dynamo = DynamoWatch().start()
        if self.options.modules:
            self._modules = ModuleRanges(*self._namespaces).install()
        self.state = "recording"
        self._timer = StepTimer()  # every step of the cell, timestamps only (removed at teardown)
        self._timer.install()
        # after the timer: both wrap DataLoader._get_iterator, and the stages' timers, stopped first
        # (when recording ends), put back the timer's wrapper, which sees the cell's later epochs
        self._start_stages()
        self._hook = OptimizerStepHook(self._on_step)
        self._hook.install()
        if self.options.first_recorded_step == 0:  # after the hooks: the first step is the code's time only
            self._recorder.begin_step(0)
        self._arm_deadline()
        self._recorder.mark_code_start()  # last: a window with no step starts here

    def _start_samplers(self, cuda: bool) -> None:
        interval_s = self.options.interval_ms / 1000.0
        if self.options.cpu:
            reader = ProcReader(self._proc_root)
            if reader.available():
                self._samplers.append(CpuSampler(reader, interval_s))
            else:
                self.notes.append("Host CPU samples not recorded: they need Linux's /proc.")
        if self.options.nvml and (cuda or self._nvml_devices):
            backend = self._nvml_backend or PynvmlBackend()
            devices = self._nvml_devices if self._nvml_devices is not None else torch_devices()
            sampler, self._nvml_driver = open_sampler(backend, devices, interval_s, self.notes)
            if sampler is not None:
                self._nvml = backend
                self._samplers.append(sampler)
        for sampler in self._samplers:
            sampler.start()

    def _start_stages(self) -> None:
        if not self.options.loader_stages:
            return
        self._stages = LoaderStages()
        try:
            self._stages.start()
        except Exception as exc:  # a torch without the fetchers these timers wrap: the capture goes on
            self._stages.stop()
            self._stages = None
            self.notes.append(f"Data-loader stages not timed: {type(exc).__name__}: {exception_text(exc)}.")

    def _arm_deadline(self, seconds: float | None = None) -> None:
        cap = self.options.cap_seconds if seconds is None else seconds
        if cap is None:
            return
        self._deadline = Deadline(cap, self._on_deadline)
        if not self._deadline.start():
            self._deadline = None

    # ------------------------------------------------------------------ while recording
    def _on_step(self, completed: int) -> None:
        """Optimizer step hook (on the capturing thread). Never raises into ``optimizer.step()``:
        a failure stops recording and is raised by :meth:`finish`."""
        timer = self._timer
        if timer is not None:
            timer.step_end()
        try:
            if self.state != "recording":
                return
            if timer is not None:
                timer.mark_profiled(completed)  # the step that ends here ran under the profiler
            self._advance(completed)
        except Exception as exc:  # re-raised by finish(), after the user's code has run
            self._deferred_error = exc
            self.state = "stopped"
        finally:
            if timer is not None:
                timer.resume()  # the profiler's start and stop above are no step's time

    def _advance(self, completed: int) -> None:
        if completed == 1 and self._deadline is not None:
            self._deadline.cancel()  # steps decide from now on, not the cap
        action = step_action(completed, self.options.first_recorded_step, self.options.last_recorded_step)
        if action in (StepAction.ADVANCE, StepAction.STOP) and self._timer is not None:
            self._timer.mark_recorded(completed - 1)  # ProfilerStep#(completed - 1) closes here
        if action in (StepAction.BEGIN, StepAction.ADVANCE):
            self._recorder.begin_step(completed)
        elif action is StepAction.STOP:
            self._recorder.end_step()
            self._stop_recording("steps")

    def _on_deadline(self) -> None:
        """Time cap reached (run on the main thread between two bytecodes). While torch.compile
        compiles the cap waits — a first compiled step takes seconds to minutes, and stopping
        inside it records nothing but the compilation — then gives the code a fresh cap."""
        if self.state != "recording" or (self._hook is not None and self._hook.completed):
            return
        if compiling_now():
            if not self._waited_for_compile:
                self.notes.append(f"The {self.options.cap_seconds:g} s time cap came while torch.compile was compiling: "
                                  "the cap waited for the compilation to end (stopping inside it would record "
                                  "nothing else).")
            self._waited_for_compile = True
            self._arm_deadline(COMPILE_POLL_S)
            return
        if self._waited_for_compile:
            self._waited_for_compile = False
            self.notes.append(f"The compilation over, the code had another {self.options.cap_seconds:g} s before "
                              "the time cap.")
            self._arm_deadline()
            return
        try:
            self._stop_recording("cap")
        except Exception as exc:  # cannot propagate from a pending call: finish() raises it
            self._deferred_error = exc
            self.state = "stopped"

    def _stop_recording(self, reason: str) -> None:
        self.state = "stopped"
        self.stop_reason = reason
        if threading.current_thread() is threading.main_thread():  # the code's own setting, set in the cell too
            self._intra_op_threads = _intra_op_threads(sys.modules.get("torch")) or self._intra_op_threads
        if self._recorder.open_step is not None:
            self._partial_step = self._recorder.open_step
            self._recorder.end_step()
        if self._modules is not None:
            self._modules.remove()  # its open ranges close while the profiler still records
        self._recorder.stop()
        self._recording_s = time.monotonic() - self._started_at
        for sampler in self._samplers:
            sampler.stop()  # joins the thread (at most one read, ~40 ms with NVML PCIe) and samples once more
        if self._stages is not None:
            self._stages.stop()

    # ---------------------------------------------------------------------------- finish
    def finish(self, error: BaseException | None = None) -> Run:
        """Stop everything, then build the report. ``error`` is what the profiled code raised.

        Teardown always completes and releases the session, whatever is raised or interrupted
        during it: SIGINT is held until it ends (see :mod:`gpumagic.capture.interrupts`) and each
        step runs even if an earlier one failed. An error while building the report propagates
        (the caller decides whether the code's own error wins).
        """
        if self.state in ("new", "finished"):
            raise CaptureError("this capture session is not running")
        with interrupts_held():
            self._tear_down()
        if self._deferred_error is not None:
            err = self._deferred_error
            raise CaptureError(f"profiling failed while the code ran ({type(err).__name__}: {err})") from err
        self._add_outcome_notes(error)
        self._error = error
        checkpoint("export")
        if self._recorder.taken_over:
            self.notes.insert(0, TAKEN_OVER_NOTE)
            self.run.taken_over = True
            self.run.report = _empty_report(self.notes, self.options.label)
            return self.run
        self._build(self._recorder.export())
        return self.run

    def _tear_down(self) -> None:
        try:
            _run_all([("finish", _nothing), ("stop-recording", self._stop_if_recording), *self._teardown_steps()])
        finally:
            try:
                checkpoint("release")
            finally:
                self.state = "finished"
                self.run.finished = True
                _release(self)

    def _stop_if_recording(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()  # first, so that the cap cannot fire during the teardown
        if self.state == "recording":
            self._stop_recording("end")

    def _teardown(self) -> None:
        _run_all(self._teardown_steps())

    def _teardown_steps(self) -> list[tuple[str, Callable[[], None]]]:
        """Every teardown step, each safe to run again after :meth:`_stop_recording`."""
        steps: list[tuple[str, Callable[[], None]]] = []
        if self._deadline is not None:
            steps.append(("cancel-deadline", self._deadline.cancel))
        if self._stages is not None:
            # before the step timer: the stage timers wrapped DataLoader._get_iterator over its wrapper,
            # and put back what they found (the timer's), which the timer then puts back in turn
            steps.append(("stop-loader-stages", self._stages.stop))
        if self._hook is not None or self._timer is not None:
            steps.append(("remove-hook", self._remove_hooks))
        if self._modules is not None:
            steps.append(("remove-hook", self._modules.remove))
        if self._dynamo is not None:
            steps.append(("remove-hook", self._dynamo.stop))
        if self._recorder is not None:
            steps += [("end-step", self._recorder.end_step), ("stop-profiler", self._recorder.stop)]
        steps += [("stop-sampler", s.stop) for s in self._samplers]
        if self._nvml is not None:
            steps.append(("shutdown-nvml", self._nvml.shutdown))
        return steps

    def _remove_hooks(self) -> None:
        try:
            if self._hook is not None:
                self._hook.remove()
        finally:
            if self._timer is not None:
                self._timer.remove()

    def _add_outcome_notes(self, error: BaseException | None) -> None:
        opts, seen = self.options, (self._hook.completed if self._hook else 0)
        if self.stop_reason == "cap":
            self.notes.append(f"Recording stopped at the {opts.cap_seconds:g} s cap (--max-seconds) before any "
                              f"optimizer step: the profile covers only the start of the code.")
        elif seen and opts.last_recorded_step is not None and seen < opts.last_recorded_step:
            self.notes.append(f"Only {seen} optimizer step(s) ran; gpumagic skips {opts.skip} and records "
                              f"{opts.steps}, so fewer steps were recorded than asked.")
        if self._partial_step is not None and seen:
            # a cell that returned after its last optimizer step ran no step then: what followed it is
            # the loop's end and the rest of the cell
            self.notes.append("The code after the last optimizer step (the end of the loop and whatever follows it "
                              "in the cell) is not counted as a step." if self.stop_reason == "end" and error is None
                              else f"Step {self._partial_step} was still running when recording ended; "
                                   "it is not counted as a step.")
        if error is not None:
            self.notes.append(f"The profiled code raised {type(error).__name__}: this profile is partial.")
        for sampler in self._samplers:
            if sampler.error:
                self.notes.append(f"{sampler.name.upper()} sampling stopped early: {sampler.error}.")
        if opts.shapes or opts.stack or opts.memory or opts.flops:
            self.notes.append("Shapes, FLOPs, stacks or memory were recorded: they add host time per operator, so "
                              "launch- and CPU-bound findings may be overstated.")
        if opts.modules:
            self.notes.append("Module times were recorded (--modules): a range per module call adds host time, so "
                              "launch- and CPU-bound findings may be overstated.")

    def _build(self, raw: bytes) -> None:
        checkpoint("build")
        if self._recorder.memory_categories_error:
            self.notes.append(f"Memory by category was not computed (torch's memory profiler failed: "
                              f"{self._recorder.memory_categories_error}).")
        raw = bundle.scrub_identity(nest_step_markers(raw))
        raw = bundle.shorten_paths(raw, cwd=_cwd(), home=os.path.expanduser("~"))
        if self._partial_step is not None:
            raw = bundle.rename_partial_step(raw, marker_name(self._partial_step), self._partial_step)
        section = bundle.make_section(
            label=self.options.label, notes=self.notes, capture=self._capture_facts(),
            machine=machine_info(self._nvml_driver), versions=versions(), anchor_epoch_ns=self._anchor_ns,
            samples=self._sample_columns(), loader_stages=self._stages.result if self._stages else None,
            extra=self._extra_blocks())
        if self._timer is not None:
            section["every_step"] = self._timer.section()
        self.run.bundle = bundle.splice(raw, section)
        checkpoint("analyse")
        try:
            self.run.report = _analyse(self.run.bundle, self.options.label, self.options.top_ops)
        except Exception as exc:  # gpumagic's bug, not the code's: its result stands, the recording is kept
            if self._error is not None:
                raise  # a partial report: the code's own error wins (finish_after)
            self.run.analysis_error = f"{type(exc).__name__}: {exception_text(exc)}"
            if not self.options.save:
                self.run.kept_at = _keep(self.run.bundle)
        if self.options.save:
            checkpoint("save")
            self._save(self.options.save)

    def _extra_blocks(self) -> dict[str, Any]:
        """The memory categories (``--memory``) and the code's error, for the bundle."""
        out: dict[str, Any] = {}
        if self._error is not None:
            out["error"] = bundle.error_block(self._error)
        rec = self._recorder
        if rec is not None and rec.memory_categories is not None:
            out["memory_categories"] = bundle.shorten_block(rec.memory_categories, cwd=_cwd(),
                                                            home=os.path.expanduser("~"))
        return out

    def _save(self, path: str) -> None:
        """Save the bundle; a failure (full disk, folder gone) keeps the report and says why."""
        try:
            self.run.save(path)
        except CaptureError as exc:
            self.run.save_error = str(exc)
            self.run.report.notes.append(f"The bundle was not saved: {exc}.")

    def _capture_facts(self) -> dict[str, Any]:
        facts = self.options.describe()
        facts.update({
            "cuda": bool(self._recorder and self._recorder.cuda),
            "optimizer_steps_seen": self._hook.completed if self._hook else 0,
            # distinct parameters held by the optimizers that stepped (analysis/rules/unusedgrads.py)
            "optimizer_parameters": self._hook.held_parameters if self._hook and self._hook.completed else None,
            # their elements by dtype (analysis/cpuprecision.py: a model in float64)
            "optimizer_parameter_elements": self._hook.held_elements if self._hook and self._hook.completed else None,
            "stop_reason": self.stop_reason,
            "partial_step": self._partial_step,
            "recording_s": None if self._recording_s is None else round(self._recording_s, 6),
            "intra_op_threads": self._intra_op_threads,
        })
        compiled = self._dynamo.facts() if self._dynamo is not None else None
        if compiled is not None:  # analysis/compile.py reads it; its source paths shortened as the trace's
            shortened = bundle.shorten_paths(json.dumps(compiled).encode(), cwd=_cwd(), home=os.path.expanduser("~"))
            facts["dynamo"] = json.loads(shortened)
        return facts

    def _sample_columns(self) -> dict[str, dict[str, list]]:
        out: dict[str, dict[str, list]] = {}
        for sampler in self._samplers:
            key = "gpu" if isinstance(sampler, NvmlSampler) else "cpu"
            if len(sampler.rows):
                out[key] = sampler.columns()
        return out


def _intra_op_threads(torch: Any) -> int | None:
    """``torch.get_num_threads()``: the intra-op threads an operator may use. Read on the main
    thread only (at start, and at stop when the loop stops there): with OpenMP the count is a
    per-thread setting, and another thread reads its own default."""
    if torch is None or threading.current_thread() is not threading.main_thread():
        return None
    try:
        return int(torch.get_num_threads())
    except Exception:  # a torch without the call, or one that fails: the count is unknown
        return None


def _keep(data: bytes) -> Path | None:
    """Write a recording the analysis failed on to a new folder of the system's temporary one,
    for ``gpumagic analyze`` after a fix or for a bug report; None when that fails too."""
    import tempfile

    try:
        return bundle.write(os.path.join(tempfile.mkdtemp(prefix="gpumagic-unanalysed-"), "trace.json.gz"), data)
    except (OSError, ValueError):
        return None


def _analyse(data: bytes, label: str, top_ops: int = 20):
    """Load the bundle through the trace loader (as ``gpumagic analyze`` would, in this
    process) and analyse it."""
    from gpumagic.analysis import analyze
    from gpumagic.trace.kineto import from_bytes

    trace = from_bytes(data, label or "live capture")
    return analyze(trace, label=label, top_ops=top_ops)


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # the working folder was removed: nothing to shorten against
        return ""


def _import_torch():
    try:
        import torch
    except ImportError:
        raise TorchMissingError(TORCH_INSTALL_HINT) from None
    return torch


def _claim(session: CaptureSession) -> None:
    global _active
    with _active_lock:
        if _active is not None:
            raise ProfilerBusyError("a gpumagic profile is already running; nested profiling is not supported")
        _active = session


def _release(session: CaptureSession) -> None:
    global _active
    with _active_lock:
        if _active is session:
            _active = None


def _run_all(steps: list[tuple[str, Callable[[], None]]]) -> None:
    """Run every ``(checkpoint name, step)`` even if some fail, or an interrupt lands at a
    checkpoint (the step still runs); then raise the first failure."""
    first: BaseException | None = None
    for name, step in steps:
        try:
            try:
                checkpoint(name)
            finally:
                step()
        except BaseException as exc:  # keep tearing down; re-raised below
            first = first or exc
    if first is not None:
        raise first


def _nothing() -> None:
    pass


def _empty_report(notes: list[str], label: str):
    """A report with no measurements, only ``notes`` (why nothing was recorded)."""
    from gpumagic.report.model import Report

    return Report(metrics=None, findings=[], notes=list(notes), label=label)


def finish_after(session: CaptureSession, error: BaseException | None) -> Run:
    """``session.finish(error)``, where the profiled code's own ``error`` wins.

    When the code raised and the partial report cannot be built, say so on stderr and return
    the run without a report, so that the caller re-raises the code's exception, not ours.
    """
    try:
        return session.finish(error)
    except BaseException as exc:  # an interrupt too: the code's own error is what the user sees
        if error is None:
            raise
        print(f"gpumagic: the partial report could not be built ({type(exc).__name__}: {exception_text(exc)})", file=sys.stderr)
        return session.run


def compiling_now() -> bool:
    """Whether torch.compile is compiling on this thread: a frame of :data:`COMPILING_MODULES` is
    on the stack (the time cap's callback runs on the main thread, between two of its bytecodes)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") in COMPILING_MODULES:
            return True
        frame = frame.f_back
    return False
