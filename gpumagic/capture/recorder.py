"""One ``torch.profiler`` session driven by hand: start, clock anchor, step markers, stop, export.

No schedule: recording starts at :meth:`TorchRecorder.start` and ends at :meth:`stop`; the
capture decides when from optimizer steps or its time cap. Step markers are the
``ProfilerStep#N`` annotations torch's own ``profile.step()`` writes, so every trace reader
finds the step boundaries.

Only one profiler can record in a process: a ``torch.profiler.profile()`` started by the profiled
code replaces ours (preparing it stops Kineto's trace; stopping it disables the profiler), and
stopping or exporting ours after that makes torch crash (SIGSEGV in ``export_chrome_trace``, as
with plainly nested torch profilers). :class:`TakeoverWatch` notices such a start, and
:meth:`TorchRecorder.stop` then leaves the profiler alone and sets :attr:`TorchRecorder.taken_over`.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpumagic.capture.bundle import CLOCK_ANCHOR
from gpumagic.capture.options import CaptureOptions
from gpumagic.capture.quiet import profiler_warnings_hidden, quiet_kineto
from gpumagic.capture.steps import marker_name
from gpumagic.trace.links import CODE_START


def profiler_active() -> bool:
    """Whether a torch profiler is recording (on this thread, or anywhere via torch's flag)."""
    import torch
    import torch.autograd.profiler as autograd_profiler

    return bool(torch._C._autograd._profiler_enabled() or autograd_profiler._is_profiler_enabled)


#: The functions through which torch's Python profilers take the profiler (module, name): every
#: ``torch.profiler.profile`` / ``torch.autograd.profiler.profile`` calls ``_prepare_profiler`` then
#: ``_enable_profiler``, ``emit_nvtx`` / ``emit_itt`` call ``_enable_profiler``, and the legacy
#: profiler ``_enable_profiler_legacy`` (torch/autograd/profiler.py, profiler_legacy.py). torch
#: has no public way to ask who owns the profiler, so these module attributes are watched.
TAKEOVER_ENTRY_POINTS = (
    ("torch.autograd.profiler", "_prepare_profiler"),
    ("torch.autograd.profiler", "_enable_profiler"),
    ("torch.autograd.profiler_legacy", "_enable_profiler_legacy"),
)


class TakeoverWatch:
    """While installed, calls ``on_takeover()`` whenever torch's Python API starts a profiler.

    Each watched function is wrapped (the original still runs); :meth:`remove` puts back the
    originals, leaving alone any attribute that someone else replaced in the meantime. A name
    that a torch version lacks is skipped.
    """

    def __init__(self, on_takeover: Callable[[], None]) -> None:
        self._on_takeover = on_takeover
        self._wrapped: list[tuple[object, str, Callable, Callable]] = []

    def install(self) -> TakeoverWatch:
        import importlib

        for module_name, name in TAKEOVER_ENTRY_POINTS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            original = getattr(module, name, None)
            if callable(original):
                wrapper = self._wrap(original)
                setattr(module, name, wrapper)
                self._wrapped.append((module, name, original, wrapper))
        return self

    def _wrap(self, original: Callable) -> Callable:
        def watched(*args, **kwargs):
            self._on_takeover()
            return original(*args, **kwargs)

        watched.__wrapped__ = original
        return watched

    def remove(self) -> None:
        while self._wrapped:
            module, name, original, wrapper = self._wrapped.pop()
            if getattr(module, name, None) is wrapper:
                setattr(module, name, original)


class TorchRecorder:
    """Wraps ``torch.profiler.profile``. ``cuda`` adds CUDA activity to CPU activity."""

    def __init__(self, options: CaptureOptions, cuda: bool) -> None:
        self.options = options
        self.cuda = cuda
        self._prof = None
        self._marker = None
        self.open_step: int | None = None
        self.recording = False
        self.start_epoch_ns: int | None = None
        self.stop_epoch_ns: int | None = None
        #: True once other code took the profiler over; nothing of ours is then exported.
        self.taken_over = False
        self._watch: TakeoverWatch | None = None
        #: With ``memory``: torch's memory profile by category (:mod:`gpumagic.capture.memcats`),
        #: read at :meth:`export`, or why it could not be (a note).
        self.memory_categories: dict | None = None
        self.memory_categories_error: str | None = None

    def _note_takeover(self) -> None:
        self.taken_over = True

    def start(self) -> int:
        """Start recording; returns ``time.time_ns()`` at the clock anchor's start."""
        import torch.profiler as tp

        quiet_kineto()
        with tp.record_function("gpumagic::warmup"):  # first use costs ~1 ms: keep it off the anchor
            pass
        activities = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if self.cuda else [])
        # torch's memory categories (capture.memcats) need shapes and stacks besides memory records
        memory = self.options.memory
        prof = tp.profile(activities=activities, record_shapes=self.options.shapes or self.options.flops or memory,
                          with_stack=self.options.stack or memory, profile_memory=memory,
                          with_flops=self.options.flops)
        with profiler_warnings_hidden():
            prof.start()
        self._prof, self.recording = prof, True
        self.start_epoch_ns = time.time_ns()
        self._watch = TakeoverWatch(self._note_takeover).install()
        return self._anchor()

    def _anchor(self) -> int:
        import torch.profiler as tp

        rf = tp.record_function(CLOCK_ANCHOR)
        before = time.time_ns()
        rf.__enter__()
        after = time.time_ns()
        rf.__exit__(None, None, None)
        return (before + after) // 2

    def mark_code_start(self) -> None:
        """Record :data:`~gpumagic.trace.links.CODE_START`: the profiled code starts now."""
        import torch.profiler as tp

        with tp.record_function(CODE_START):
            pass

    def begin_step(self, step_index: int) -> None:
        """Close the open step marker, if any, and open ``ProfilerStep#step_index``."""
        import torch.profiler as tp

        self.end_step()
        if self.taken_over:
            return  # the profiler is someone else's now: leave their trace alone
        self._marker = tp.record_function(marker_name(step_index))
        self._marker.__enter__()
        self.open_step = step_index

    def end_step(self) -> None:
        if self._marker is not None:
            self._marker.__exit__(None, None, None)
            self._marker, self.open_step = None, None

    def stop(self) -> None:
        """Stop recording (leaves any open marker open: the caller closes it first). Idempotent.

        The profiler is stopped even when the wait for the GPU is interrupted; when other code
        took it over (see :class:`TakeoverWatch`), or it is no longer on, it is left alone.
        """
        if not self.recording:
            return
        try:
            _synchronize_cuda()  # let the last step's kernels finish inside the recording
        finally:
            try:
                self._release_profiler()
            finally:
                self.recording = False
                self.stop_epoch_ns = time.time_ns()

    def _release_profiler(self) -> None:
        import torch

        if self._watch is not None:
            self._watch.remove()
        if not torch.autograd._profiler_enabled():  # someone else's profiler started and ended
            self.taken_over = True
        if self.taken_over:
            self._prof = None  # never stopped or exported: torch would crash
            return
        with profiler_warnings_hidden():
            self._prof.stop()

    def export(self) -> bytes:
        """The Kineto JSON of the stopped session; frees the profiler's buffers."""
        if self.taken_over:
            raise RuntimeError("the profiler was taken over by other code: nothing to export")
        if self._prof is None or self.recording:
            raise RuntimeError("export() needs a started and stopped recording")
        fd, path = tempfile.mkstemp(prefix="gpumagic-", suffix=".json")
        os.close(fd)
        try:
            with profiler_warnings_hidden():
                counts = _flop_counts(self._prof) if self.options.flops else {}
                if self.options.memory:
                    self._read_memory_categories()
                self._prof.export_chrome_trace(path)
            raw = Path(path).read_bytes()
            return _with_flops(raw, counts) if counts else raw
        finally:
            os.unlink(path)
            self._prof = None


    def _read_memory_categories(self) -> None:
        import torch

        from gpumagic.capture.memcats import category_block

        device = f"cuda:{torch.cuda.current_device()}" if self.cuda else "cpu"
        try:
            self.memory_categories = category_block(self._prof, device)
        except Exception as exc:  # a private torch API: a note, never the user's error
            self.memory_categories_error = f"{type(exc).__name__}: {exc}"[:300]


def _flop_counts(prof) -> dict[int, tuple[str, int]]:
    """``with_flops=True`` computes FLOPs per operator (``FunctionEvent.flops``), but torch's
    Chrome-trace export does not write them; keyed by the operator's id (its ``External id``)."""
    return {int(e.id): (e.name, int(e.flops)) for e in prof.events() if getattr(e, "flops", 0)}


def _with_flops(raw: bytes, counts: dict[int, tuple[str, int]]) -> bytes:
    """The trace with ``args["flops"]`` on the operators the profiler counted (the trace layer
    reads it); a trace that is not strict JSON is returned unchanged."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return raw
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    for e in events if isinstance(events, list) else ():
        args = e.get("args") if isinstance(e, dict) and e.get("ph") == "X" else None
        hit = counts.get(args.get("External id")) if isinstance(args, dict) else None
        if hit is not None and hit[0] == e.get("name"):
            args["flops"] = hit[1]
    return json.dumps(doc).encode()


def _synchronize_cuda() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
