"""Measure DataLoader settings instead of guessing them: batches per second over a small grid.

::

    result = gpumagic.tune_dataloader(train_dataset, batch_size=64)      # or an existing DataLoader
    result                        # table, plot and the recommended DataLoader(...) in a notebook
    result.recommended_kwargs     # {"num_workers": 4, "pin_memory": True, ...}

Each setting of the grid ``num_workers × pin_memory × persistent_workers × prefetch_factor``
(the last two only where ``num_workers > 0``) gets a fresh DataLoader, which is read for at
most ``max_seconds_per_config`` seconds or ``max_batches`` batches after its first batch. Worker
processes are shut down after every setting, also when it fails or is interrupted, so nothing
outlives the call. No batch may take longer than ``max_seconds_per_config`` + :data:`BATCH_GRACE_S`:
in workers DataLoader's ``timeout`` ends the wait (plus twice the time a worker takes to start
under ``spawn``/``forkserver``, measured once: a spawned worker imports torch before its first
batch); in the main process (``num_workers=0``) the reading runs on a daemon thread that is
abandoned when it stalls, and the setting is reported as "timed out" (a Python thread cannot be
stopped: a dataset stuck for ever keeps that thread).

How a setting is measured::

    iter() ─ first batch ─┬─ warm-up (num_workers × prefetch_factor batches) ─┬── measured batches ──┐
    └── startup_s ────────┘                                                   └── batches_per_s ─────┘ ≤ max_seconds

The warm-up skips every batch the workers can have prepared while the first one was being made
(the loader keeps ``prefetch_factor`` batches a worker in flight), which would otherwise time
their head start instead of their rate. An epoch that ends before the time or the batches are
used up is followed by the next, as in training, for the single process and persistent workers;
workers started anew each epoch stop at its end (their restart is ``restart_s``'s to measure).
With the default worker counts, more workers than CPUs are measured while doubling them keeps
paying (:data:`EXTEND_MIN_SPEEDUP`): a loader that waits on reads is faster with more processes
than cores. ``restart_s`` is the time to the first batch of a new epoch:
the cost ``persistent_workers=True`` saves. It is timed at a real epoch boundary, on a short
epoch of the same setting read to its end: restarting mid-epoch would make a persistent iterator
first drain every batch its workers had prefetched for the abandoned epoch (torch's
``_MultiProcessingDataLoaderIter._reset`` waits for them), which once made persistent workers
look slower to restart than fresh ones.

The measurement lives in the capture layer (it runs the user's loader, with torch, in worker
processes); what it returns, :class:`~gpumagic.tuning.tuner.TuneResult`, is plain data in
:mod:`gpumagic.tuning.tuner`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import multiprocessing
import os
import pickle
import sys
import time
import warnings
from collections.abc import Iterable
from typing import Any

from gpumagic.errors import exception_text
from gpumagic.tuning import stats
from gpumagic.tuning.tuner import TuneConfig, TuneResult, TuneRow

#: Batches in the short epoch after which ``restart_s`` is timed (enough for the workers to have
#: started; the epoch is read to its end so that nothing of it is left in flight).
RESTART_EPOCH_BATCHES = 2

#: Batch size used for a bare dataset when none is given (PyTorch's MNIST example's default).
DEFAULT_DATASET_BATCH_SIZE = 64
#: Default time read per setting after its first batch (a few dozen batches of a typical loader).
DEFAULT_SECONDS_PER_CONFIG = 2.0
DEFAULT_MAX_BATCHES = 200
#: A batch may take ``max_seconds_per_config`` plus this long before its setting is given up as
#: "timed out" (workers: DataLoader's ``timeout``; the main process: a watchdog). The margin covers
#: starting workers: a spawned worker imports torch before its first batch (a few seconds).
BATCH_GRACE_S = 5.0
#: Longest wait for a probe worker to start (see :func:`worker_start_s`).
START_PROBE_TIMEOUT_S = 60.0
#: How often the watchdog of a single-process measurement looks at its progress.
WATCH_INTERVAL_S = 0.05
#: Rounds of the grid: each setting is measured this many times, the settings in turn (ABAB, not
#: AABB), so that a change in the machine's load during the call hits every setting alike.
DEFAULT_ROUNDS = 2
#: With the default worker counts, when the most workers measured (as many as the CPUs) were the
#: fastest setting and clearly faster than the count before them (the lower bound of the 95 %
#: interval of their speed-up at least this), the loading waits more than it computes — files or
#: network read, a library that releases the GIL — and processes beyond the cores keep helping:
#: the count doubles, measured the same way, while each doubling is that much faster. A loader
#: bound by its CPU stops after one doubling that gains nothing.
EXTEND_MIN_SPEEDUP = 1.2
#: The most workers such doublings try (each worker is a process holding a copy of the dataset
#: object; PyTorch's DataLoader warns above the CPU count, which a waiting loader has no reason
#: to heed).
MAX_EXTENDED_WORKERS = 32
#: An epoch that ends with fewer batches measured than this is followed by the next (the single
#: process, persistent workers): enough batches for the interval of a speed-up, without resetting
#: a persistent iterator epoch after epoch for a dataset of a few dozen batches.
READ_ON_BELOW = 20
#: Start methods that pickle the dataset into each worker (everything but ``fork``).
PICKLING_START_METHODS = ("spawn", "forkserver")


# -- the public function --------------------------------------------------------------------------


def tune_dataloader(dataset_or_loader: Any, *, num_workers: Iterable[int] | None = None,
                    pin_memory: Iterable[bool] = (False, True), persistent_workers: Iterable[bool] = (True,),
                    prefetch_factor: Iterable[int] = (2,), batch_size: int | None = None,
                    max_seconds_per_config: float = DEFAULT_SECONDS_PER_CONFIG, max_batches: int = DEFAULT_MAX_BATCHES,
                    device: str | None = None, collate_fn=None, rounds: int = DEFAULT_ROUNDS) -> TuneResult:
    """Measure batches per second of a dataset (or of an existing DataLoader's dataset, batching
    and collate function) for each setting of the grid, and recommend the fastest.

    ``num_workers`` defaults to 0 and powers of two up to the CPUs this process may use; when
    the most of those workers are the fastest and clearly faster than half as many (a loader that
    waits on reads rather than computes), twice as many are measured next, and so on while each
    doubling is clearly faster (:data:`EXTEND_MIN_SPEEDUP`, up to :data:`MAX_EXTENDED_WORKERS`).
    ``pin_memory=True`` is measured only where CUDA is available (it does nothing otherwise).
    ``device`` is where each batch is copied, as a training loop would, with
    ``non_blocking=pin_memory``; by default ``"cuda"`` when available, else nothing is copied.
    An exception from the dataset in the single-process setting propagates (it is a bug in the
    dataset); a setting whose workers fail is reported as failed.

    The grid is measured ``rounds`` times, the settings in turn (ABAB), each for its share of
    ``max_seconds_per_config`` and ``max_batches``; each setting reports the 95 % interval of its
    speed-up over the single-process one, and the recommendation stays with the single process
    when that interval includes no change (as ``gpumagic.compare`` would say of two profiles).
    """
    import torch

    t0 = time.perf_counter()
    base = _base_loader_args(dataset_or_loader, batch_size, collate_fn)
    cuda = torch.cuda.is_available()
    device = device if device is not None else ("cuda" if cuda else None)
    notes: list[str] = []
    grid = build_grid(num_workers, pin_memory, persistent_workers, prefetch_factor, cuda, notes)
    _check_limits(max_seconds_per_config, max_batches)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, not {rounds!r}")
    warnings, workers_ok = fragility(base, notes)
    found: dict[TuneConfig, TuneRow] = {}
    start: list[float] = []  # the probe worker's start time, measured once
    measure = functools.partial(_measure_rounds, base, found, start, workers_ok, max_seconds_per_config,
                                max_batches, device, rounds)
    measure(grid)
    if num_workers is None:  # the default counts: beyond the CPUs while that keeps paying
        while (more := _doubled(grid, found)) is not None:
            grid.append(more)
            measure([more])
    rows = [found[c] for c in grid]
    baseline = next((r for r in rows if r.config.num_workers == 0 and r.batch_s), None)
    for r in rows:
        if baseline is not None and r.batch_s:
            ci = stats.speedup_interval(baseline.batch_s, r.batch_s, statistic="mean")
            r.speedup_ci = None if ci is None else [round(ci[0], 4), round(ci[1], 4)]
    bs = base.get("batch_size")
    result = TuneResult(rows=rows, batch_size=bs, warnings=warnings, notes=notes,
                        elapsed_s=round(time.perf_counter() - t0, 3))
    _add_result_notes(result, base["dataset"])
    if num_workers is None:
        _note_beyond_cpus(result, grid)
    return result


def _measure_rounds(base: dict[str, Any], found: dict[TuneConfig, TuneRow], start: list[float], workers_ok: bool,
                    max_seconds: float, max_batches: int, device: str | None, rounds: int,
                    grid: list[TuneConfig]) -> None:
    """Measure ``grid``'s settings ``rounds`` times, interleaved, into ``found``."""
    seconds = max_seconds / rounds
    for i in range(rounds):  # interleaved: every setting once per round, the batch limit shared out
        batches = max_batches // rounds + (1 if i < max_batches % rounds else 0)
        if batches == 0:
            break
        for config in grid:
            if config.num_workers > 0 and not workers_ok:
                found[config] = TuneRow(config, status="skipped",
                                        error="worker processes could not load the dataset (see warnings)")
                continue
            if config in found and found[config].status != "ok":
                continue  # a setting that failed or timed out is not tried again
            if config.num_workers > 0 and not start:
                start.append(worker_start_s(base))
            row = _measure(base, config, seconds, batches, device, start[0] if start else 0.0)
            if config in found:
                found[config].merge(row)
            else:
                found[config] = row


def _doubled(grid: list[TuneConfig], found: dict[TuneConfig, TuneRow]) -> TuneConfig | None:
    """The fastest setting with twice its workers, when it has the most workers measured and is
    clearly faster (:data:`EXTEND_MIN_SPEEDUP`) than the fastest with the next fewer; None otherwise."""
    ok = [found[c] for c in grid if c in found and found[c].batches_per_s and found[c].batch_s]
    if not ok:
        return None
    top = max(ok, key=lambda r: r.batches_per_s or 0.0)
    most = max(r.config.num_workers for r in ok)
    if top.config.num_workers != most or most == 0 or 2 * most > MAX_EXTENDED_WORKERS:
        return None
    fewer = [r for r in ok if r.config.num_workers < most]
    if not fewer:
        return None
    below = max(r.config.num_workers for r in fewer)
    prev = max((r for r in fewer if r.config.num_workers == below), key=lambda r: r.batches_per_s or 0.0)
    ci = stats.speedup_interval(prev.batch_s, top.batch_s, statistic="mean")
    if ci is None or ci[0] < EXTEND_MIN_SPEEDUP:
        return None
    more = dataclasses.replace(top.config, num_workers=2 * most)
    return None if more in grid else more


def _note_beyond_cpus(result: TuneResult, grid: list[TuneConfig]) -> None:
    """Why counts above the CPUs were measured, and what they showed (the recommendation's count)."""
    cpus = max(default_workers())
    beyond = [c.num_workers for c in grid if c.num_workers > cpus]
    if not beyond:
        return
    best = result.best
    fewer = max([0, *[c.num_workers for c in grid if c.num_workers < cpus]])
    result.notes.append(
        f"Up to {max(beyond)} workers, more than the {cpus} CPUs here, were measured: {cpus} workers were clearly "
        f"faster than {fewer}, and each doubling after them was tried while the one before had been clearly faster "
        f"(≥ {EXTEND_MIN_SPEEDUP:g}× at the low end of its 95 % interval)."
        + (" More processes than cores were faster: the loading waits (reads files or the network) more than it "
           "computes. PyTorch's DataLoader warns above the CPU count; the measurement is what counts."
           if best is not None and best.config.num_workers > cpus else
           f" More than {cpus} were not clearly faster: the loading computes, and the cores bound it."))


def default_workers() -> tuple[int, ...]:
    """0, then 2, 4, 8, ... up to the CPUs this process may run on."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    out = [0]
    n = 2
    while n <= cpus:
        out.append(n)
        n *= 2
    return tuple(out)


def build_grid(num_workers, pin_memory, persistent_workers, prefetch_factor, cuda: bool, notes: list[str]) -> list[TuneConfig]:
    """The settings to measure, validated, in order (fewest workers first, no duplicates)."""
    workers = _ints("num_workers", default_workers() if num_workers is None else num_workers, 0)
    prefetch = _ints("prefetch_factor", prefetch_factor, 1)
    persist = _bools("persistent_workers", persistent_workers)
    pins = _bools("pin_memory", pin_memory)
    if not cuda and True in pins:
        pins = [p for p in pins if not p] or [False]
        notes.append("pin_memory=True was not measured: no CUDA device here, and pinned memory only speeds up "
                     "copies to a GPU. When you train on a GPU, use pin_memory=True with .to(device, non_blocking=True).")
    grid: dict[TuneConfig, None] = {}
    for w, pin, per, pf in itertools.product(sorted(set(workers)), pins, persist, prefetch):
        grid[TuneConfig(w, pin, per, pf) if w > 0 else TuneConfig(0, pin)] = None
    return list(grid)


def _ints(name: str, values: Iterable[int], minimum: int) -> list[int]:
    values = list(values) if isinstance(values, Iterable) else [values]
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < minimum]
    if not values or bad:
        raise ValueError(f"{name} must be integers >= {minimum}, not {values!r}")
    return values


def _bools(name: str, values: Iterable[bool]) -> list[bool]:
    values = list(values) if isinstance(values, Iterable) else [values]
    if not values or any(not isinstance(v, bool) for v in values):
        raise ValueError(f"{name} must be True and/or False, not {values!r}")
    return list(dict.fromkeys(values))


def _check_limits(max_seconds: float, max_batches: int) -> None:
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)) or not math.isfinite(max_seconds) or max_seconds <= 0:
        raise ValueError(f"max_seconds_per_config must be a positive number of seconds, not {max_seconds!r}")
    if isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1:
        raise ValueError(f"max_batches must be an integer >= 1, not {max_batches!r}")


def _base_loader_args(source: Any, batch_size: int | None, collate_fn) -> dict[str, Any]:
    """The DataLoader arguments every setting shares (dataset, batching, collate, worker init)."""
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    if isinstance(source, DataLoader):
        base: dict[str, Any] = {"dataset": source.dataset, "collate_fn": collate_fn or source.collate_fn,
                                "worker_init_fn": source.worker_init_fn,
                                "multiprocessing_context": source.multiprocessing_context}
        if batch_size is None and source.batch_size is None:
            base["batch_sampler"] = source.batch_sampler
        else:
            base.update(batch_size=batch_size or source.batch_size, drop_last=source.drop_last)
            if not isinstance(source.dataset, IterableDataset):
                base["sampler"] = source.sampler
        return base
    if not isinstance(source, Dataset) and not (hasattr(source, "__getitem__") and hasattr(source, "__len__")):
        raise TypeError(f"tune_dataloader() takes a Dataset or a DataLoader, not {type(source).__name__}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be an integer >= 1, not {batch_size!r}")
    base = {"dataset": source, "batch_size": batch_size or DEFAULT_DATASET_BATCH_SIZE}
    if collate_fn is not None:
        base["collate_fn"] = collate_fn
    return base


# -- fragility ------------------------------------------------------------------------------------


def start_method(base: dict[str, Any]) -> str:
    """How worker processes start: the loader's multiprocessing context, else the process-wide
    method, else the platform default (the first of ``get_all_start_methods()``)."""
    ctx = base.get("multiprocessing_context")
    if isinstance(ctx, str):
        return ctx
    if ctx is not None:
        return ctx.get_start_method()
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def interactive_main() -> bool:
    """True in a notebook or REPL: ``__main__`` has no file that a spawned worker could re-import."""
    return not hasattr(sys.modules.get("__main__"), "__file__")


def fragility(base: dict[str, Any], notes: list[str], method: str | None = None,
              interactive: bool | None = None) -> tuple[list[str], bool]:
    """Warnings about worker processes, and whether workers can work here at all.

    Under ``spawn``/``forkserver`` (macOS, Windows; Linux from Python 3.14) every worker
    unpickles the dataset, collate_fn and worker_init_fn: a class or function defined in a
    notebook cell (``__main__``) cannot be found there, and a lambda or local function cannot be
    pickled. Under ``fork`` both work, but the same notebook would break on those platforms.
    """
    method = start_method(base) if method is None else method
    interactive = interactive_main() if interactive is None else interactive
    problems = _pickling_problems(base, interactive)
    if not problems:
        return [], True
    listed = "; ".join(problems)
    if method in PICKLING_START_METHODS:
        remedy = "Move these definitions into a .py module and import them"
        if any("cannot be pickled" in p for p in problems):
            remedy += ", and use named functions instead of lambdas or local functions"
        return [f"Worker processes start with {method!r} here, so they must import and unpickle what the DataLoader "
                f"uses: {listed}. Settings with num_workers > 0 were skipped. {remedy}."], False
    notes.append(f"Workers start with {method!r} here, so this works; on macOS and Windows ('spawn') it would fail: "
                 f"{listed}. Defining these in a .py module keeps the notebook portable.")
    return [], True


def _pickling_problems(base: dict[str, Any], interactive: bool) -> list[str]:
    problems = []
    dataset_type = type(base["dataset"])
    if interactive and dataset_type.__module__ == "__main__":
        problems.append(f"the dataset class {dataset_type.__name__} is defined in the notebook (__main__)")
    for name in ("collate_fn", "worker_init_fn"):
        fn = base.get(name)
        if fn is None or getattr(fn, "__module__", "") == "torch.utils.data._utils.collate":
            continue
        if interactive and getattr(fn, "__module__", None) == "__main__" and getattr(fn, "__name__", "") != "<lambda>":
            problems.append(f"{name} {getattr(fn, '__name__', fn)!s} is defined in the notebook (__main__)")
            continue
        try:
            pickle.dumps(fn)
        except Exception as exc:  # pickle raises PicklingError, AttributeError or TypeError by object
            problems.append(f"{name} cannot be pickled ({type(exc).__name__}: {_first_line(exc)})")
    return problems


def _first_line(exc: BaseException) -> str:
    text = exception_text(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- measuring ------------------------------------------------------------------------------------


def worker_start_s(base: dict[str, Any]) -> float:
    """Seconds a worker process takes to start and import torch under the loader's start method
    (0 for ``fork``, whose children inherit the loaded modules); measured with one probe process."""
    import importlib

    method = start_method(base)
    if method not in PICKLING_START_METHODS:
        return 0.0
    ctx = base.get("multiprocessing_context")
    ctx = ctx if ctx is not None and not isinstance(ctx, str) else multiprocessing.get_context(method)
    probe = ctx.Process(target=importlib.import_module, args=("torch",), daemon=True, name="gpumagic-start-probe")
    t0 = time.perf_counter()
    probe.start()
    probe.join(START_PROBE_TIMEOUT_S)
    if probe.is_alive():
        probe.terminate()
        probe.join()
    return time.perf_counter() - t0


def _measure(base: dict[str, Any], config: TuneConfig, max_seconds: float, max_batches: int, device: str | None,
             start_s: float = 0.0) -> TuneRow:
    """Read one setting's DataLoader; its workers are shut down before this returns or raises.
    No batch may take longer than ``max_seconds`` + :data:`BATCH_GRACE_S` (+ twice ``start_s``, the
    time a worker takes to start, with workers)."""
    batch_timeout_s = max_seconds + BATCH_GRACE_S
    if config.num_workers == 0:
        single = {k: v for k, v in base.items() if k != "multiprocessing_context"}  # DataLoader refuses it without workers
        return _watched(lambda on_batch: _read_setting(single, config, max_seconds, max_batches, device, 0, on_batch),
                        config, batch_timeout_s)
    batch_timeout_s = round(batch_timeout_s + 2 * start_s, 1)
    try:
        with warnings.catch_warnings():
            # "This DataLoader will create N worker processes in total. Our suggested max number of
            # worker...": the measurement of those workers is the answer this warning guesses at
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
            return _read_setting(base, config, max_seconds, max_batches, device, batch_timeout_s)
    except Exception as exc:
        if "timed out" in str(exc):  # DataLoader's RuntimeError("DataLoader timed out after N seconds")
            return _timed_out(TuneRow(config), f"a worker took more than {batch_timeout_s:g} s for a batch")
        return _failed(TuneRow(config), f"{type(exc).__name__}: {_first_line(exc)}")


def _read_setting(base: dict[str, Any], config: TuneConfig, max_seconds: float, max_batches: int, device: str | None,
                  timeout: float, on_batch=None) -> TuneRow:
    from torch.utils.data import DataLoader

    loader = DataLoader(**base, **config.loader_kwargs(), timeout=timeout)
    row = TuneRow(config)
    iterators: list[Any] = []
    try:
        if not _read(loader, row, max_seconds, max_batches, device, iterators, on_batch):
            return _failed(row, "the dataset yielded no batch")
        row.restart_s = _restart(base, config, loader, iterators, device, on_batch)
    finally:
        _shutdown(loader, iterators)
    if row.batches_per_s and base.get("batch_size"):
        row.samples_per_s = round(row.batches_per_s * base["batch_size"], 1)
    return row


def _watched(measure, config: TuneConfig, batch_timeout_s: float) -> TuneRow:
    """``measure(on_batch)`` on a daemon thread, abandoned when no batch arrives for
    ``batch_timeout_s``; its exception (a bug in the dataset) is raised here."""
    import threading

    state: dict[str, Any] = {"last": time.monotonic(), "row": None, "error": None}

    def on_batch() -> None:
        state["last"] = time.monotonic()

    def run() -> None:
        try:
            state["row"] = measure(on_batch)
        except BaseException as exc:  # handed to the calling thread below
            state["error"] = exc

    thread = threading.Thread(target=run, name="gpumagic-tuner-main-process", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(WATCH_INTERVAL_S)
        if thread.is_alive() and time.monotonic() - state["last"] > batch_timeout_s:
            return _timed_out(TuneRow(config), f"no batch for {batch_timeout_s:g} s in the main process; the reading "
                                               "was abandoned (its thread stays blocked in the dataset)")
    if state["error"] is not None:
        raise state["error"]
    return state["row"]


def _read(loader, row: TuneRow, max_seconds: float, max_batches: int, device: str | None, iterators: list,
          on_batch=None) -> bool:
    """First batch (startup), warm-up, then the measured batches; False when there was no batch.

    The warm-up is every batch that can have been under way before the first one arrived: the
    loader keeps ``prefetch_factor`` batches a worker in flight, and while the slowest worker
    started the others made theirs. Read at once, those would time the workers' head start, not
    their rate (a 16-batch epoch read by 8 workers once measured 30× the single process for a
    dataset that allows at most 4×). Where an epoch ends before the time or the batches are used
    up and fewer than :data:`READ_ON_BELOW` batches were measured, the next epoch is read on, with
    a persistent loader or the single process (a loader that starts new workers each epoch stops
    at its end: those starts are ``restart_s``'s)."""
    config = row.config
    pinned = config.pin_memory
    t0 = time.perf_counter()
    iterator = iter(loader)
    iterators.append(iterator)
    if not _take(iterator, 1, device, pinned, on_batch=on_batch):
        return False
    t_first = time.perf_counter()
    row.startup_s = round(t_first - t0, 4)
    deadline = t_first + max_seconds
    go_on = config.num_workers == 0 or config.persistent_workers
    ahead = config.num_workers * (config.prefetch_factor or 0)
    warmed = _take(iterator, ahead, device, pinned, deadline, on_batch)
    if warmed < ahead and go_on and time.perf_counter() < deadline:  # the epoch ended inside the warm-up
        iterator = iter(loader)
        iterators.append(iterator)
    t_start = time.perf_counter()
    row.batches = 0
    while True:
        want = max_batches - row.batches
        got = _take(iterator, want, device, pinned, deadline, on_batch, row.batch_s)
        row.batches += got
        # got 0: an epoch with nothing left (or nothing at all) ends it, never another empty epoch
        if got in (0, want) or time.perf_counter() >= deadline or not go_on or row.batches >= READ_ON_BELOW:
            break
        iterator = iter(loader)  # the epoch ended: the next one, as a training loop goes on
        iterators.append(iterator)
    elapsed = time.perf_counter() - t_start
    row.seconds = round(elapsed, 4)
    # the rate from the clock's own reading: rounded first, a batch of under 50 µs (a tiny
    # in-memory dataset) read as 0 s and so as no rate at all
    if row.batches and elapsed > 0:
        row.batches_per_s = round(row.batches / elapsed, 3)
    else:
        row.error = "too few batches to measure after the warm-up"
    return True


def _take(iterator, n: int, device: str | None, pinned: bool, deadline: float | None = None, on_batch=None,
          durations: list[float] | None = None) -> int:
    """Read up to ``n`` batches (stopping at the deadline or the end of the epoch); returns how
    many. ``on_batch()`` is called after each batch (the single-process watchdog's heartbeat);
    ``durations`` gets each batch's seconds."""
    got = 0
    last = time.perf_counter()
    while got < n and (deadline is None or time.perf_counter() < deadline):
        try:
            batch = next(iterator)
        except StopIteration:
            break
        _to_device(batch, device, pinned)
        got += 1
        if durations is not None:
            now = time.perf_counter()
            durations.append(now - last)
            last = now
        if on_batch is not None:
            on_batch()
    if device is not None and got and str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    return got


def _to_device(batch: Any, device: str | None, non_blocking: bool) -> Any:
    """Copy the tensors of a batch (nested in lists, tuples, named tuples and dicts) to ``device``."""
    if device is None:
        return batch
    if hasattr(batch, "to") and hasattr(batch, "is_pinned"):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: _to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [_to_device(v, device, non_blocking) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


def _restart(base: dict[str, Any], config: TuneConfig, loader, iterators: list, device: str | None,
             on_batch=None) -> float | None:
    """Seconds from ``iter()`` to the first batch of a second epoch, after a short first epoch of
    the same setting was read to its end (see the module docstring); None for an iterable
    dataset, whose epoch end cannot be reached in bounded time."""
    from torch.utils.data import DataLoader, IterableDataset

    sampler = getattr(loader, "batch_sampler", None)
    if isinstance(loader.dataset, IterableDataset) or sampler is None:
        return None
    index_batches = list(itertools.islice(iter(sampler), RESTART_EPOCH_BATCHES))
    if not index_batches:
        return None
    _shutdown_iterator(iterators[-1])  # the measuring loader's workers would compete with these
    shared = {k: v for k, v in base.items() if k not in ("batch_size", "drop_last", "sampler", "batch_sampler")}
    short = DataLoader(**shared, batch_sampler=index_batches, **config.loader_kwargs(), timeout=loader.timeout)
    first = iter(short)
    iterators.append(first)
    _take(first, len(index_batches) + 1, device, short.pin_memory, on_batch=on_batch)  # the first epoch, to its end
    t0 = time.perf_counter()
    again = iter(short)
    iterators.append(again)
    got = _take(again, 1, device, short.pin_memory, on_batch=on_batch)
    return round(time.perf_counter() - t0, 4) if got else None


def _shutdown(loader, iterators: list) -> None:
    """Stop the worker processes (and pin-memory threads) of every iterator of ``loader``."""
    for iterator in [*iterators, getattr(loader, "_iterator", None)]:
        _shutdown_iterator(iterator)
    loader._iterator = None


def _shutdown_iterator(iterator) -> None:
    """torch's own worker shutdown, run now rather than whenever the iterator is collected."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()


def _timed_out(row: TuneRow, message: str) -> TuneRow:
    _failed(row, message)
    row.status = "timed out"
    return row


def _failed(row: TuneRow, message: str) -> TuneRow:
    row.status, row.error = "failed", message
    row.batches_per_s = row.samples_per_s = None
    return row


def _add_result_notes(result: TuneResult, dataset: Any) -> None:
    from torch.utils.data import IterableDataset

    if any(r.status == "failed" for r in result.rows):
        result.warnings.append("Some settings failed: their worker processes raised or died (see the table).")
    if any(r.status == "timed out" for r in result.rows):
        result.warnings.append("Some settings timed out: a batch took longer than max_seconds_per_config + "
                               f"{BATCH_GRACE_S:g} s, so the dataset may hang (see the table).")
    rows = [r for r in result.rows if r.batches_per_s]
    if rows and min(r.batches for r in rows) < 5:
        result.notes.append("Fewer than 5 batches were measured for some settings (small dataset or short time): "
                            "treat the rates as rough.")
    if isinstance(dataset, IterableDataset) and any(r.config.num_workers for r in result.rows):
        result.notes.append("IterableDataset: each worker iterates its own copy unless the dataset shards by "
                            "torch.utils.data.get_worker_info().")
