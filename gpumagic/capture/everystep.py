"""Every step of the cell, not just the recorded ones: one timestamp per optimizer step, and what ran
beside it that is known to make a step slow.

The profiler records a handful of steps; the garbage-collection pause or the checkpoint save that
makes every 50th step slow falls outside them. :class:`StepTimer` keeps going for the whole cell at
the cost of two clock reads and a list append per step (``benchmarks/step_timer_overhead.py``
measures it), fed by the optimizer hook that already finds the steps (:mod:`.steps`). Beside it,
it notes, with their times:

- Python garbage collections that take at least :data:`MIN_GC_NS`, through ``gc.callbacks``
  (Python docs, ``gc.callbacks``: called with ``"start"`` and ``"stop"`` around each collection);
- ``torch.save`` calls (``torch.save`` is wrapped while the cell runs, as
  :class:`gpumagic.capture.recorder.TakeoverWatch` wraps the profiler's entry points; code that
  bound ``save`` before the cell, ``from torch import save``, is not seen);
- ``torch.compile`` compilations and recompilations, through dynamo's compile callbacks
  (``torch._dynamo.callback.callback_handler``), registered once ``torch._dynamo`` is loaded;
- a switch to evaluation mode, ``Module.eval()`` (``Module.train(False)``), the start of an
  evaluation loop, and the switch back (``Module.train`` is wrapped likewise);
- a DataLoader starting its worker processes (``DataLoader._get_iterator`` of a loader with
  ``num_workers > 0``: every epoch without ``persistent_workers=True``), from the call until the
  new iterator's first batch is in (the workers set up and make it while the loop waits), and
  stopping them (``_MultiProcessingDataLoaderIter._shutdown_workers`` on an iterator whose
  workers still run: the end of each such epoch joins them).
  The iterator's ``_next_data`` is wrapped on that one instance for its first call only, through a
  weak reference, so no batch after the first pays anything and the iterator's shutdown of its
  workers is not held up by a reference cycle;
- how long each step waited in the DataLoader's ``next()`` (``_BaseDataLoaderIter.__next__``,
  wrapped while the cell runs: two clock reads a batch; calls from the cell's thread only, not a
  thread that prefetches batches into a queue), summed per step: the steps after the
  recorded ones may wait for batches the recorded ones found made (workers prefetch while the
  first steps run).

Times are ``time.perf_counter_ns()``; the bundle holds them in ms from the timer's start. A
step's duration runs from the end of gpumagic's work in the previous step's hook to the start of
this step's hook, so that the profiler's own start and stop (inside the hook) are no step's time.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import threading
import time
import weakref
from typing import Any

#: Collections shorter than this (ns) are not kept: young-generation collections run every few
#: hundred allocations and take microseconds; only a pause that can slow a step is worth a row.
MIN_GC_NS = 1_000_000
#: At most this many steps and events are kept (the rest are counted, not stored): a 100,000-step
#: cell keeps its bundle well under a megabyte of step times.
MAX_STEPS = 100_000
MAX_EVENTS = 10_000
MS = 1e6


class StepTimer:
    """Timestamps of every primary-optimizer step and of the events beside them, while installed."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter_ns()
        self._resume = self._t0
        self.durations_ns: list[int] = []
        self.starts_ns: list[int] = []
        self.recorded: list[int] = []
        self.profiled = 0
        self.dropped_steps = 0
        self.events: list[tuple[str, int, int, str]] = []
        self.waits_ns: list[int] = []  # each step's time in DataLoader next() calls
        self._wait_ns = 0
        self._loader_used = False
        self._thread = threading.get_ident()
        self.dropped_events = 0
        self._gc_start: int | None = None
        self._gc_owner: list | None = None
        self._patched: list[tuple[Any, str, Any, Any]] = []
        self._dynamo: Any = None
        self._dynamo_tried = False
        self._compile_starts: dict[str, int] = {}
        self._eval_started: int | None = None
        self._train_depth = 0
        # re-entrant: a garbage collection can run a callback (or an iterator's __del__) that adds an
        # event while this thread is adding one
        self._lock = threading.RLock()

    # ------------------------------------------------------------------------- install
    def install(self) -> StepTimer:
        self._t0 = self._resume = time.perf_counter_ns()
        self._thread = threading.get_ident()  # the cell's thread: its waits for a batch are the steps'
        gc.callbacks.append(self._on_gc)
        self._gc_owner = gc.callbacks
        torch = sys.modules.get("torch")
        if torch is not None:
            self._wrap_save(torch)
            self._wrap_train(torch)
            self._wrap_loader()
        if "torch._dynamo" in sys.modules:  # never imported here: loading dynamo takes seconds
            self._watch_dynamo()
        return self

    def remove(self) -> None:
        """Undo :meth:`install` (idempotent); a wrapped attribute someone else replaced since is left alone."""
        if self._gc_owner is not None:
            with contextlib.suppress(ValueError):
                self._gc_owner.remove(self._on_gc)
            self._gc_owner = None
        while self._patched:
            owner, name, original, wrapper = self._patched.pop()
            if owner.__dict__.get(name) is wrapper:
                setattr(owner, name, original)
        if self._dynamo is not None:
            for remove, cb in ((self._dynamo.remove_start_callback, self._on_compile_start),
                               (self._dynamo.remove_end_callback, self._on_compile_end)):
                with contextlib.suppress(ValueError):
                    remove(cb)
            self._dynamo = None

    # ---------------------------------------------------------------------- the steps
    def step_end(self) -> int:
        """The hook has started (the step's work is done): store the step's duration; returns its index."""
        now = time.perf_counter_ns()
        index = len(self.durations_ns) + self.dropped_steps
        if len(self.durations_ns) < MAX_STEPS:
            self.durations_ns.append(now - self._resume)
            self.starts_ns.append(self._resume - self._t0)
            self.waits_ns.append(self._wait_ns)
            self._wait_ns = 0
        else:
            self.dropped_steps += 1
        if not self._dynamo_tried and "torch._dynamo" in sys.modules:  # the cell started compiling
            self._watch_dynamo()
        return index

    def resume(self) -> None:
        """gpumagic's work in the hook is over: the next step starts now."""
        self._resume = time.perf_counter_ns()

    def mark_recorded(self, index: int) -> None:
        self.recorded.append(index)

    def mark_profiled(self, steps: int) -> None:
        """The first ``steps`` steps ran while the profiler recorded (recorded or skipped)."""
        self.profiled = steps

    @property
    def steps_seen(self) -> int:
        return len(self.durations_ns) + self.dropped_steps

    # --------------------------------------------------------------------- the events
    def _event(self, kind: str, start: int, end: int, detail: str = "") -> None:
        with self._lock:
            if len(self.events) < MAX_EVENTS:
                self.events.append((kind, start, end, detail))
            else:
                self.dropped_events += 1

    def _on_gc(self, phase: str, info: dict) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            self._gc_start = now
        elif self._gc_start is not None:
            start, self._gc_start = self._gc_start, None
            if now - start >= MIN_GC_NS:
                self._event("gc", start, now, f"generation {info.get('generation')}, "
                                               f"{info.get('collected', 0)} objects collected")

    def _wrap_save(self, torch: Any) -> None:
        original = getattr(torch, "save", None)
        if not callable(original):
            return
        timer = self

        @functools.wraps(original)
        def save(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                timer._event("torch.save", start, time.perf_counter_ns())

        self._patch(torch, "save", original, save)
        serialization = sys.modules.get("torch.serialization")
        if serialization is not None and serialization.__dict__.get("save") is original:
            self._patch(serialization, "save", original, save)

    def _wrap_train(self, torch: Any) -> None:
        module_cls = getattr(getattr(torch, "nn", None), "Module", None)
        original = None if module_cls is None else module_cls.__dict__.get("train")
        if not callable(original):
            return
        timer = self

        @functools.wraps(original)
        def train(module: Any, mode: bool = True) -> Any:
            timer._train_depth += 1
            try:
                return original(module, mode)
            finally:
                timer._train_depth -= 1
                if timer._train_depth == 0:  # the outermost call: children switch inside it
                    timer._mode(bool(mode))

        self._patch(module_cls, "train", original, train)

    def _wrap_loader(self) -> None:
        data = sys.modules.get("torch.utils.data")
        loader_cls = getattr(data, "DataLoader", None)
        original = None if loader_cls is None else loader_cls.__dict__.get("_get_iterator")
        if not callable(original):
            return
        timer = self

        @functools.wraps(original)
        def _get_iterator(loader: Any) -> Any:
            workers = getattr(loader, "num_workers", 0)
            if not isinstance(workers, int) or workers <= 0:
                return original(loader)
            start = time.perf_counter_ns()
            it = original(loader)
            timer._until_first_batch(it, start, f"{workers} worker(s)")
            return it

        self._patch(loader_cls, "_get_iterator", original, _get_iterator)
        base_cls = getattr(sys.modules.get("torch.utils.data.dataloader"), "_BaseDataLoaderIter", None)
        next_batch = None if base_cls is None else base_cls.__dict__.get("__next__")
        if callable(next_batch):
            @functools.wraps(next_batch)
            def __next__(it: Any) -> Any:
                if threading.get_ident() != timer._thread:  # a prefetching thread's wait blocks no step
                    return next_batch(it)
                start = time.perf_counter_ns()
                try:
                    return next_batch(it)
                finally:
                    timer._wait_ns += time.perf_counter_ns() - start
                    timer._loader_used = True

            self._patch(base_cls, "__next__", next_batch, __next__)
        iter_cls = getattr(sys.modules.get("torch.utils.data.dataloader"), "_MultiProcessingDataLoaderIter", None)
        shutdown = None if iter_cls is None else iter_cls.__dict__.get("_shutdown_workers")
        if not callable(shutdown):
            return

        @functools.wraps(shutdown)
        def _shutdown_workers(it: Any) -> Any:
            live = getattr(it, "_shutdown", True) is False  # a second call (its __del__) stops nothing
            start = time.perf_counter_ns()
            try:
                return shutdown(it)
            finally:
                if live:
                    timer._event("loader", start, time.perf_counter_ns(), "workers stopped")

        self._patch(iter_cls, "_shutdown_workers", shutdown, _shutdown_workers)

    def _until_first_batch(self, it: Any, start: int, detail: str) -> None:
        """A ``loader`` event from ``start`` to the end of ``it``'s first batch (``__next__`` calls
        ``self._next_data()``, an attribute lookup an instance attribute answers); at once if the
        iterator cannot be wrapped."""
        method = getattr(type(it), "_next_data", None)  # the class's function: a bound method would hold `it`
        try:
            ref = weakref.ref(it)
        except TypeError:
            ref = None
        if not callable(method) or ref is None or not hasattr(it, "__dict__"):
            self._event("loader", start, time.perf_counter_ns(), detail)
            return
        timer = self

        def first_batch() -> Any:
            owner = ref()
            try:
                return method(owner)
            finally:
                if owner is not None:
                    owner.__dict__.pop("_next_data", None)  # later batches go straight to the method
                timer._event("loader", start, time.perf_counter_ns(), detail)

        it._next_data = first_batch

    def _mode(self, training: bool) -> None:
        now = time.perf_counter_ns()
        if not training and self._eval_started is None:
            self._eval_started = now
        elif training and self._eval_started is not None:
            self._event("eval", self._eval_started, now)
            self._eval_started = None

    def _patch(self, owner: Any, name: str, original: Any, wrapper: Any) -> None:
        setattr(owner, name, wrapper)
        self._patched.append((owner, name, original, wrapper))

    def _watch_dynamo(self) -> None:
        self._dynamo_tried = True
        try:
            from torch._dynamo.callback import callback_handler
        except Exception:  # a torch without dynamo's callbacks
            return
        callback_handler.register_start_callback(self._on_compile_start)
        callback_handler.register_end_callback(self._on_compile_end)
        self._dynamo = callback_handler

    def _on_compile_start(self, args: Any) -> None:
        self._compile_starts[str(getattr(args, "compile_id", ""))] = time.perf_counter_ns()

    def _on_compile_end(self, args: Any) -> None:
        key = str(getattr(args, "compile_id", ""))
        start = self._compile_starts.pop(key, None)
        if start is not None:
            self._event("compile", start, time.perf_counter_ns(), key)

    # ------------------------------------------------------------------------ the bundle
    def section(self) -> dict[str, Any]:
        """The bundle's ``every_step`` block (ms from the timer's start)."""
        end = time.perf_counter_ns()
        if self._eval_started is not None:  # still evaluating when the cell ended
            self.events.append(("eval", self._eval_started, end, "still in eval mode at the end"))
        return {
            "step_ms": [round(d / MS, 4) for d in self.durations_ns],
            "start_ms": [round(t / MS, 4) for t in self.starts_ns],
            "recorded": sorted(set(self.recorded)),
            "profiled": self.profiled,
            "dropped_steps": self.dropped_steps,
            "events": [{"kind": k, "start_ms": round((s - self._t0) / MS, 4), "dur_ms": round((e - s) / MS, 4),
                        "detail": d} for k, s, e, d in self.events],
            "dropped_events": self.dropped_events,
            **({"wait_ms": [round(w / MS, 4) for w in self.waits_ns]} if self._loader_used else {}),
        }
