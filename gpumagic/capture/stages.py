"""Time each stage of the data pipeline while a capture records: in the main process and inside
the DataLoader's workers, without the user editing their dataset.

torch.profiler records how long the loop waits in ``DataLoader.__next__`` but not what the time
is spent on: worker processes are outside it, and one span covers the whole batch. These timers
split a batch into its stages, each measured as *self* wall-clock time (a stage that calls
another does not also count that one's time), so that the stages of a batch add up to its time::

    fetch of one batch ("other": what no stage below covers)
      ├─ Dataset.__getitem__ / __getitems__ (per sample or per batch), or next() of an
      │  IterableDataset's iterator
      │    ├─ each callable the dataset holds: the items of a composed transform (any object
      │    │  with a ``transforms`` list, torchvision's ``Compose`` or not), the items of a list
      │    │  of callables, a callable attribute (a loader, decoder, tokenizer, transform)
      │    ├─ the dataset class's own methods (``self.decode(path)``: reading/decoding as a
      │    │  separate call)
      │    └─ the same, one level down, for datasets a dataset holds (``Subset``, ``ConcatDataset``)
      └─ collate_fn
    pin_memory (main process: the loop's thread without workers, torch's pin thread with them)

How, while a session records (:class:`LoaderStages`):

- ``_MapDatasetFetcher.fetch`` and ``_IterableDatasetFetcher.fetch`` (torch.utils.data's fetchers,
  which every DataLoader uses to make a batch) are wrapped. At a fetcher's first batch the
  wrapper puts a timing proxy in front of its dataset, wraps its ``collate_fn`` and the dataset's
  callables in :class:`Timed`; each batch then runs inside a timed "other" frame.
- ``DataLoader._get_iterator`` is wrapped so that a loader with workers starts them with a
  ``worker_init_fn`` that first runs the user's own ``worker_init_fn`` (unchanged, with the same
  argument), then installs the same timers in the worker (on the worker's own copy of the
  dataset). Each worker writes its totals to a small file in a temporary folder every
  :data:`FLUSH_S` and when it exits, so a loop that breaks early (its workers shut down) keeps
  the timings.
- ``torch.utils.data._utils.pin_memory.pin_memory`` is wrapped.

Nothing changes what the pipeline computes: every wrapper calls the original with the same
arguments and returns its result or raises its exception. When recording stops, everything in the
main process is put back (the fetchers, the dataset's attributes, torch's functions). Workers
that outlive the session (``persistent_workers=True``) keep their pass-through wrappers: they
stop timing at their next report, when they find the folder gone. Persistent workers started
before the session are not timed; nor is the sampler (it runs in the main process, outside a
fetch). A timer costs about a microsecond per call (two clock reads and a few list operations);
where that would exceed :data:`TARGET_SHARE` of a batch, only some batches are timed.
``benchmarks/loader_stages_overhead.py`` measures it on a loader's throughput.

The totals go into the bundle (``"loader_stages"``: :meth:`LoaderStages.stop`); the analysis
turns them into ``metrics.host.loader_stages`` (:mod:`gpumagic.analysis.loaderstages`).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from gpumagic.trace.links import WORKER_START_PREFIX

#: The name of the batch's own frame: the time of a fetch that no stage covers.
OTHER = "other"
#: The stage torch's ``pin_memory`` is timed as (once per batch, after its fetch).
PIN_STAGE = "pin_memory"
#: A worker writes its totals at most this often (and when it exits): a file write per 50 ms is
#: far below a per-batch cost, and a loop that stops early loses at most this much of a worker's time.
FLUSH_S = 0.05
#: How many datasets deep the timers look (a Subset of a ConcatDataset of datasets: 3).
MAX_DEPTH = 3
#: Name of the worker report files in the session's folder.
WORKER_FILE = "worker-{pid}.json"
#: The most the timers' own cost may add to a batch they time. When a timed batch's timed calls
#: times the measured cost per call (:func:`timer_cost_ns`) exceed this share of its time (a
#: pipeline of microsecond-scale transforms), only one batch in ``ceil(share / TARGET_SHARE)`` is
#: timed: per-batch figures stay averages over the timed batches, while the cost the profiled
#: steps carry falls under this share. Chosen well below the 5 % issue 29 allows the timers.
TARGET_SHARE = 0.02
#: At most one batch in this many goes untimed-in-a-row (a batch is still timed often enough to
#: follow a pipeline whose cost changes), and the first :data:`MIN_TIMED` batches of each thread
#: are always timed (the first batch alone can be a cold one: file caches, lazy imports).
MAX_EVERY = 16
MIN_TIMED = 2

#: Where the timers of this process report; None: they pass straight through.
_sink: _Sink | None = None
_now = time.perf_counter_ns


def stage_name(fn: Any) -> str:
    """A function's (or bound method's) qualified name; for a callable object, its class's."""
    if isinstance(fn, functools.partial):
        return stage_name(fn.func)
    if inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isbuiltin(fn):
        name = getattr(fn, "__qualname__", None)
        if isinstance(name, str) and name:
            return name
    return type(fn).__qualname__


#: What a collate function of the user's own is called after its name (``pad_batch (collate_fn)``,
#: ``DataCollatorWithPadding (collate_fn)``): its role, which its name need not say.
COLLATE_ROLE = " (collate_fn)"


def collate_stage(fn: Any) -> str:
    """A loader's collate function as a stage: ``default_collate`` as it is, any other one by its
    name and role, so that the analysis tells padding or tokenizing apart from stacking."""
    name = stage_name(fn)
    return name if name == "default_collate" else name + COLLATE_ROLE


class _ThreadTotals:
    """One thread's open frames (time their children took) and totals per stage."""

    __slots__ = ("batches", "fetched", "skip", "stack", "totals")

    def __init__(self) -> None:
        self.stack: list[int] = []
        self.totals: dict[str, list[int]] = {}
        self.batches = 0  # batches timed
        self.fetched = 0  # batches made, timed or not
        self.skip = 0  # batches to make untimed before the next timed one


def timer_cost_ns() -> int:
    """What one timed call costs this process, in ns: the fastest of three runs of 50 timed calls
    of a function that does nothing, inside a batch's frame (measured once per process, in about
    0.1 ms)."""
    global _cost_ns
    if _cost_ns is None:
        sink = _Sink("calibration")
        mine = sink._mine()
        mine.stack.append(0)
        best = None
        for _ in range(3):
            t0 = _now()
            for _ in range(50):
                sink.call("calibration", _nothing, (), {})
            best = _now() - t0 if best is None else min(best, _now() - t0)
        _cost_ns = max(1, int(best or 0) // 50)
    return _cost_ns


def _nothing() -> None:
    return None


_cost_ns: int | None = None


class _Sink:
    """The totals of one process: per thread, merged when read (no lock on the timed path)."""

    def __init__(self, where: str, path: str | None = None) -> None:
        self.where = where
        self.path = path
        self._local = threading.local()
        self._threads: list[_ThreadTotals] = []
        self._lock = threading.Lock()
        self._last_flush = time.perf_counter()

    def _mine(self) -> _ThreadTotals:
        mine = getattr(self._local, "t", None)
        if mine is None:
            mine = self._local.t = _ThreadTotals()
            with self._lock:
                self._threads.append(mine)
        return mine

    def call(self, name: str, fn: Any, args: tuple, kwargs: dict, root: bool = False,
             alone: bool = False) -> Any:
        """``fn(*args, **kwargs)``, its self time added to stage ``name`` (a recursive call of a
        stage adds its calls again but not its time: each frame counts only its own).

        ``root``: a batch's fetch, timed or (see :data:`TARGET_SHARE`) made untimed. Any other
        stage is timed only inside a timed fetch, unless ``alone`` (``pin_memory``, which torch
        calls after the fetch)."""
        try:
            mine = self._local.t
        except AttributeError:
            mine = self._mine()
        stack = mine.stack
        if root:
            mine.fetched += 1
            if mine.skip:
                mine.skip -= 1
                return fn(*args, **kwargs)  # untimed: the stages inside find no frame and pass through
            before = sum(t[1] for t in mine.totals.values())
        elif not stack and not alone:
            return fn(*args, **kwargs)
        stack.append(0)
        t0 = _now()
        done = False
        try:
            out = fn(*args, **kwargs)
            done = True
            return out
        finally:
            elapsed = _now() - t0
            children = stack.pop()
            total = mine.totals.get(name)
            if total is None:
                total = mine.totals[name] = [0, 0]
            total[0] += elapsed - children
            total[1] += 1
            if stack:
                stack[-1] += elapsed
            if root and done:  # a fetch that ended the epoch (StopIteration) made no batch
                mine.batches += 1
                if mine.batches >= MIN_TIMED and elapsed > 0:
                    calls = sum(t[1] for t in mine.totals.values()) - before
                    share = calls * timer_cost_ns() / elapsed
                    mine.skip = min(MAX_EVERY, -int(-share // TARGET_SHARE)) - 1 if share > TARGET_SHARE else 0
                if self.path is not None and time.perf_counter() - self._last_flush >= FLUSH_S:
                    self.flush()

    def snapshot(self) -> dict[str, Any]:
        """``{"where", "batches", "fetched", "stages": {name: [self_ns, calls]}}`` over every
        thread (``batches``: those timed; ``fetched``: all made)."""
        with self._lock:
            threads = list(self._threads)
        stages: dict[str, list[int]] = {}
        batches = fetched = 0
        for t in threads:
            batches += t.batches
            fetched += t.fetched
            for name, (ns, calls) in list(t.totals.items()):
                merged = stages.setdefault(name, [0, 0])
                merged[0] += ns
                merged[1] += calls
        return {"where": self.where, "batches": batches, "fetched": fetched, "stages": stages}

    def flush(self) -> None:
        """Write this worker's totals (whole, through a rename); when the session's folder is
        gone (recording ended), stop timing."""
        global _sink
        self._last_flush = time.perf_counter()
        if self.path is None:
            return
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.snapshot(), fh)
            os.replace(tmp, self.path)
        except OSError:
            self.path = None
            if _sink is self:
                _sink = None


class Timed:
    """A callable that times the one it wraps as a stage (passes straight through while nothing
    records). Attribute reads go to the wrapped callable; it pickles as itself."""

    __slots__ = ("__wrapped__", "stage")

    def __init__(self, fn: Any, stage: str | None = None) -> None:
        self.__wrapped__ = fn
        self.stage = stage or stage_name(fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sink = _sink
        if sink is None:
            return self.__wrapped__(*args, **kwargs)
        try:  # _Sink.call, inlined: this is the path every transform call takes
            mine = sink._local.t
        except AttributeError:
            mine = sink._mine()
        stack = mine.stack
        if not stack:  # called outside a batch's fetch (the loop calling the dataset itself): not a stage
            return self.__wrapped__(*args, **kwargs)
        stack.append(0)
        t0 = _now()
        try:
            return self.__wrapped__(*args, **kwargs)
        finally:
            elapsed = _now() - t0
            children = stack.pop()
            total = mine.totals.get(self.stage)
            if total is None:
                total = mine.totals[self.stage] = [0, 0]
            total[0] += elapsed - children
            total[1] += 1
            if stack:
                stack[-1] += elapsed

    def __getattr__(self, name: str) -> Any:
        if name in ("__wrapped__", "stage"):
            raise AttributeError(name)
        return getattr(self.__wrapped__, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance() sees the wrapped callable's class, as before
        return type(self.__wrapped__)

    def __reduce__(self) -> tuple:
        return (Timed, (self.__wrapped__, self.stage))

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


class _PinTimed(Timed):
    """``pin_memory``: a stage of its own, outside the fetch (torch calls it after the batch is made)."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sink = _sink
        if sink is None:
            return self.__wrapped__(*args, **kwargs)
        return sink.call(self.stage, self.__wrapped__, args, kwargs, alone=True)

    def __reduce__(self) -> tuple:
        return (_PinTimed, (self.__wrapped__, self.stage))


class _Proxy:
    """Stands in front of a map-style dataset: ``proxy[i]`` is ``dataset[i]``, timed as
    ``Class.__getitem__``; every other attribute is the dataset's."""

    __slots__ = ("_get", "dataset")

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._get = f"{type(dataset).__qualname__}.__getitem__"

    def __getitem__(self, index: Any) -> Any:
        sink = _sink
        if sink is None:
            return self.dataset[index]
        return sink.call(self._get, self.dataset.__getitem__, (index,), {})

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "_get"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance() sees the dataset's class, as before
        return type(self.dataset)

    def __reduce__(self) -> tuple:
        return (type(self), (self.dataset,))


class _BatchedProxy(_Proxy):
    """A :class:`_Proxy` for a dataset with ``__getitems__`` (a batch of indices at once)."""

    __slots__ = ("_gets",)

    def __init__(self, dataset: Any) -> None:
        super().__init__(dataset)
        self._gets = f"{type(dataset).__qualname__}.__getitems__"

    def __getitems__(self, indices: Any) -> Any:
        sink = _sink
        if sink is None:
            return self.dataset.__getitems__(indices)
        return sink.call(self._gets, self.dataset.__getitems__, (indices,), {})


class _TimedIterator:
    """An iterable dataset's iterator, each ``next()`` timed as ``Class.__iter__``."""

    __slots__ = ("it", "stage")

    def __init__(self, it: Any, stage: str) -> None:
        self.it, self.stage = it, stage

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        sink = _sink
        if sink is None:
            return next(self.it)
        return sink.call(self.stage, next, (self.it,), {})


def proxy_for(dataset: Any) -> _Proxy:
    batched = callable(getattr(dataset, "__getitems__", None))
    return (_BatchedProxy if batched else _Proxy)(dataset)


# -- what a dataset holds ---------------------------------------------------------------------------


class _Undo:
    """What instrumenting changed in the user's objects, to put back (the main process only)."""

    def __init__(self) -> None:
        self.steps: list[tuple[Any, Any, Any, str]] = []  # (container, key, old value, "attr"|"item"|"del")

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        had = name in vars(obj)
        old = vars(obj).get(name)
        setattr(obj, name, value)
        self.steps.append((obj, name, old, "attr" if had else "del"))

    def setitem(self, seq: list, i: int, value: Any) -> None:
        old = seq[i]
        seq[i] = value
        self.steps.append((seq, i, old, "item"))

    def undo(self) -> None:
        for container, key, old, kind in reversed(self.steps):
            try:
                if kind == "item":
                    container[key] = old
                elif kind == "attr":
                    setattr(container, key, old)
                else:
                    delattr(container, key)
            except Exception:  # an object that refuses now refused nothing earlier; keep restoring the rest
                pass
        self.steps.clear()


def _is_dataset(value: Any) -> bool:
    from torch.utils.data import Dataset

    return isinstance(value, (Dataset, _Proxy))


def _wrappable(value: Any) -> bool:
    """A callable worth timing: not a class, not already timed, not a dataset."""
    return (callable(value) and not isinstance(value, (type, Timed, _Proxy)) and not _is_dataset(value))


def _callables(seq: Any) -> bool:
    return isinstance(seq, list) and bool(seq) and all(callable(v) and not isinstance(v, type) for v in seq)


def instrument(dataset: Any, undo: _Undo | None, depth: int = 0) -> None:
    """Put timers on what ``dataset`` holds (see the module docstring); ``undo`` records each
    change (None in a worker, whose dataset is its own copy)."""
    if depth >= MAX_DEPTH or isinstance(dataset, _Proxy):
        return
    state = getattr(dataset, "__dict__", None)
    if not isinstance(state, dict):
        return
    u = undo or _Undo()
    for name, value in list(state.items()):
        try:
            if _is_dataset(value):
                instrument(value, undo, depth + 1)
                u.setattr(dataset, name, proxy_for(value))
            elif isinstance(value, list) and value and all(_is_dataset(v) for v in value):
                for i, v in enumerate(value):
                    instrument(v, undo, depth + 1)
                    u.setitem(value, i, proxy_for(v))
            elif _callables(value):
                _wrap_items(value, u)
            elif _callables(getattr(value, "transforms", None)) and not isinstance(value, Timed):
                _wrap_items(value.transforms, u)  # a composed transform: time each item, not the loop
            elif _wrappable(value):
                u.setattr(dataset, name, Timed(value))
        except Exception:  # an attribute that refuses a new value is left untimed
            continue
    _wrap_methods(dataset, u)
    if undo is None:
        u.steps.clear()


def _wrap_items(seq: list, u: _Undo) -> None:
    for i, v in enumerate(seq):
        if isinstance(v, Timed):
            continue
        inner = getattr(v, "transforms", None)
        if _callables(inner):  # a Compose inside a Compose
            _wrap_items(inner, u)
        else:
            u.setitem(seq, i, Timed(v))


def _wrap_methods(dataset: Any, u: _Undo) -> None:
    """The dataset class's own methods (not torch's, not dunders) as timed instance attributes."""
    seen: set[str] = set()
    for cls in type(dataset).__mro__:
        if cls is object or cls.__module__.startswith("torch."):
            continue
        for name, raw in vars(cls).items():
            if name in seen or name.startswith("__") or name in vars(dataset):
                continue
            seen.add(name)
            if inspect.isfunction(raw) and not inspect.isgeneratorfunction(raw):
                try:
                    u.setattr(dataset, name, Timed(getattr(dataset, name)))
                except Exception:  # a dataset that refuses instance attributes keeps its methods untimed
                    return


# -- the fetchers -----------------------------------------------------------------------------------


def _prepare(fetcher: Any, undo: _Undo | None, touched: list | None) -> None:
    """At a fetcher's first batch: a proxy in front of its dataset, timers on the dataset's
    callables and on the collate function."""
    fetcher._gpumagic_timed = True
    dataset = fetcher.dataset
    if touched is not None:
        touched.append((fetcher, dataset, fetcher.collate_fn, getattr(fetcher, "dataset_iter", None)))
    instrument(dataset, undo)
    if hasattr(fetcher, "dataset_iter"):  # an iterable dataset: its iterator was made at the fetcher's start
        fetcher.dataset_iter = _TimedIterator(fetcher.dataset_iter, f"{type(dataset).__qualname__}.__iter__")
    else:
        fetcher.dataset = proxy_for(dataset)
    if _wrappable(fetcher.collate_fn):
        fetcher.collate_fn = Timed(fetcher.collate_fn, collate_stage(fetcher.collate_fn))


def _timed_fetch(original: Any, undo: _Undo | None, touched: list | None) -> Any:
    @functools.wraps(original)
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        sink = _sink
        if sink is None:
            return original(self, possibly_batched_index)
        if not getattr(self, "_gpumagic_timed", False):
            try:
                _prepare(self, undo, touched)
            except Exception:  # an object that refuses the timers: this fetcher's batches are timed whole ("other")
                self._gpumagic_timed = True
        return sink.call(OTHER, original, (self, possibly_batched_index), {}, root=True)

    fetch._gpumagic_original = original  # type: ignore[attr-defined]
    return fetch


def _fetcher_classes() -> list[Any]:
    from torch.utils.data._utils import fetch as fetchers

    return [getattr(fetchers, n) for n in ("_MapDatasetFetcher", "_IterableDatasetFetcher") if hasattr(fetchers, n)]


def _patch_fetchers(undo: _Undo | None, touched: list | None) -> list[tuple[Any, Any]]:
    """Wrap the fetchers' ``fetch``; returns what to put back."""
    patched = []
    for cls in _fetcher_classes():
        current = cls.__dict__.get("fetch")
        if current is None:
            continue
        original = getattr(current, "_gpumagic_original", current)  # a forked worker inherits the parent's
        cls.fetch = _timed_fetch(original, undo, touched)
        patched.append((cls, original))
    return patched


def worker_start_name(workers: int) -> str:
    """The range recorded around the start of a DataLoader's worker processes (the multi-process
    iterator's creation: ``iter(loader)``, each epoch without ``persistent_workers``), with the
    worker count: ``analysis.loaderrestart`` reads it."""
    return f"{WORKER_START_PREFIX} ({int(workers)} workers)"


# -- workers --------------------------------------------------------------------------------------


class WorkerInit:
    """The ``worker_init_fn`` a profiled loader starts its workers with: the user's own first
    (same argument, its exceptions unchanged), then the timers of this worker."""

    def __init__(self, user_fn: Any, folder: str) -> None:
        self.user_fn, self.folder = user_fn, folder

    def __call__(self, worker_id: int) -> None:
        if self.user_fn is not None:
            self.user_fn(worker_id)
        start_worker(self.folder)

    def __reduce__(self) -> tuple:
        return (WorkerInit, (self.user_fn, self.folder))


def start_worker(folder: str) -> None:
    """Time this worker's stages, reporting to ``folder`` as it goes and when it exits."""
    import multiprocessing.util

    global _sink
    if not os.path.isdir(folder):
        _sink = None
        return
    sink = _Sink("worker", os.path.join(folder, WORKER_FILE.format(pid=os.getpid())))
    _sink = sink
    _patch_fetchers(None, None)
    multiprocessing.util.Finalize(sink, sink.flush, exitpriority=10)  # run when the worker's loop ends
    sink.flush()


# -- the session's side ---------------------------------------------------------------------------


class LoaderStages:
    """The timers of one capture session: :meth:`start` before the code runs, :meth:`stop` (safe to
    call again) when recording ends; it returns the bundle's ``"loader_stages"`` block."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.result: dict[str, Any] | None = None
        self._undo = _Undo()
        self._touched: list[tuple[Any, Any, Any, Any]] = []
        self._patched: list[tuple[Any, Any]] = []
        self._get_iterator: Any = None
        self._pin: Any = None
        self._sink: _Sink | None = None
        self.started = False

    def start(self) -> None:
        global _sink
        from torch.autograd.profiler import record_function
        from torch.utils.data import DataLoader
        from torch.utils.data._utils import pin_memory as pin_module

        self.started = True  # from here on, stop() puts back whatever was installed, also after a failure
        self.folder = tempfile.mkdtemp(prefix="gpumagic-stages-")
        self._sink = _Sink("main")
        self._patched = _patch_fetchers(self._undo, self._touched)
        folder = self.folder
        original = self._get_iterator = DataLoader.__dict__["_get_iterator"]

        @functools.wraps(original)
        def _get_iterator(loader: Any) -> Any:
            if loader.num_workers == 0 or _sink is None:
                return original(loader)
            user_fn = loader.worker_init_fn
            loader.worker_init_fn = WorkerInit(user_fn, folder)
            try:
                with record_function(worker_start_name(loader.num_workers)):  # the workers start here
                    return original(loader)
            finally:
                loader.worker_init_fn = user_fn

        DataLoader._get_iterator = _get_iterator
        pin = self._pin = pin_module.pin_memory
        pin_module.pin_memory = _PinTimed(pin, PIN_STAGE)
        _sink = self._sink

    def stop(self) -> dict[str, Any] | None:
        """Read the totals (this process's and every worker report), put everything back and
        remove the folder; the block for the bundle, or None when no batch was timed."""
        global _sink
        if not self.started:
            return self.result
        self.started = False
        if _sink is self._sink:
            _sink = None
        try:
            self.result = self._collect()
        except Exception:  # a report that cannot be read loses the stages, never the capture
            self.result = None
        finally:
            self._restore()
        return self.result

    def _restore(self) -> None:
        from torch.utils.data import DataLoader
        from torch.utils.data._utils import pin_memory as pin_module

        for cls, original in self._patched:
            cls.fetch = original
        self._patched = []
        for fetcher, dataset, collate, it in self._touched:
            fetcher.dataset, fetcher.collate_fn = dataset, collate
            if it is not None:
                fetcher.dataset_iter = it
            fetcher._gpumagic_timed = False
        self._touched = []
        self._undo.undo()
        if self._get_iterator is not None:
            DataLoader._get_iterator = self._get_iterator
            self._get_iterator = None
        if self._pin is not None:
            pin_module.pin_memory = self._pin
            self._pin = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def _collect(self) -> dict[str, Any] | None:
        reports = [self._sink.snapshot()] if self._sink is not None else []
        if self.folder is not None:
            for entry in sorted(os.listdir(self.folder)):
                if not entry.endswith(".json"):
                    continue
                try:
                    with open(os.path.join(self.folder, entry), encoding="utf-8") as fh:
                        reports.append(json.load(fh))
                except (OSError, ValueError):  # a report being replaced right now: the previous one is gone
                    continue
        return aggregate(reports)


def aggregate(reports: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The bundle's block from per-process totals: ``{"batches", "fetched", "workers", "stages":
    [{"name", "where", "self_ns", "calls", "batches"}]}``, largest first; None when no batch was
    timed. ``batches``: the batches timed, ``fetched``: all made (more when the timers sampled,
    :data:`TARGET_SHARE`); a row's ``batches`` is what its time covers: the timed batches for
    the stages of a fetch, every batch for ``pin_memory`` (timed on each, outside the fetch)."""
    batches = fetched = 0
    workers = 0
    stages: dict[tuple[str, str], list[int]] = {}
    for r in reports:
        where = r.get("where")
        if where not in ("main", "worker"):
            continue
        workers += where == "worker"
        batches += int(r.get("batches") or 0)
        fetched += int(r.get("fetched") or r.get("batches") or 0)
        for name, (ns, calls) in (r.get("stages") or {}).items():
            merged = stages.setdefault((str(name), where), [0, 0])
            merged[0] += int(ns)
            merged[1] += int(calls)
    if not batches:
        return None
    rows = [{"name": n, "where": w, "self_ns": max(0, ns), "calls": c,
             "batches": max(fetched, batches) if n == PIN_STAGE else batches} for (n, w), (ns, c) in stages.items()]
    rows.sort(key=lambda r: -r["self_ns"] / r["batches"])
    return {"batches": batches, "fetched": max(fetched, batches), "workers": workers, "stages": rows}
