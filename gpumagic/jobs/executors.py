"""Where the per-rank analyses run: in this process, in a local process pool, or on a Dask cluster.

Each runs :func:`~gpumagic.jobs.summary.summarize` once per rank file and returns the summaries in
the order of the paths; ``progress(done, total)`` is called after each one. A rank whose analysis
fails — a bad file, an unexpected error in its analysis, or its analysis killing the process
analysing it twice — comes back as a summary with ``error`` set (naming the file and the exception), and the others go on: one
odd file among a thousand ranks must not cost the job report.

- :func:`run_local` with ``processes=1`` analyses the ranks one after another here; with more, in a
  :class:`concurrent.futures.ProcessPoolExecutor` (forked on Linux; elsewhere spawned, which needs
  the caller's script to guard its entry with ``if __name__ == "__main__":``), so that a process
  holds one rank's events at a time and its peak memory is that of the largest rank.
- :func:`run_dask` submits the same function to a Dask ``distributed.Client`` (``client.map``);
  the workers read the files themselves, from a path they share or an fsspec URL. Dask is imported
  only here, and only when a client is given.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

from gpumagic import _allocator
from gpumagic.errors import GpumagicError, exception_text
from gpumagic.jobs.summary import RankSummary, failed, summarize

Progress = Callable[[int, int], None]


def _tick(progress: Progress | None, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)


def crashed(path: str, exc: BaseException) -> RankSummary:
    """The summary of a rank whose analysis raised something other than a bad-input error."""
    return failed(path, f"{path}: its analysis failed ({type(exc).__name__}: {exception_text(exc)})")


def _summarize_here(path: str) -> RankSummary:
    try:
        return summarize(path)
    except Exception as exc:  # reported in the job as this rank's error (see the module docstring)
        return crashed(path, exc)


#: A rank is reported failed when the process analysing it died this many times: once among
#: others (which rank killed the pool is unknown), once more analysed alone.
DEATHS_TO_FAIL = 2
#: Rounds in a row in which the pool died with no rank running (killed from outside) before the
#: ranks left are reported failed rather than tried again.
MAX_EMPTY_BREAKS = 3


def run_local(paths: Sequence[str], processes: int, progress: Progress | None = None) -> list[RankSummary]:
    """Analyse ``paths`` with ``processes`` processes (1: in this process).

    A worker that dies (the out-of-memory killer, a crash in a native library, a ``kill``) costs
    at most the rank it was on: every rank it had not finished goes to a fresh pool; the ranks
    that were running when it died are then analysed one at a time in a pool of one, so that a
    second death names its rank, which alone is reported failed. Ctrl-C stops and reaps every
    worker (they ignore SIGINT, so the terminal shows no traceback of theirs) and re-raises.
    """
    total = len(paths)
    if processes <= 1 or total <= 1:
        out = []
        for i, p in enumerate(paths):
            out.append(_summarize_here(p))
            _tick(progress, i + 1, total)
        return out
    results: dict[int, RankSummary] = {}
    todo = list(range(total))
    empty_breaks = 0
    while todo:
        todo, running = _pool_round(paths, todo, processes, results, progress)
        if running is None:  # the pool did not die: todo is empty
            break
        if not running:
            empty_breaks += 1
            if empty_breaks >= MAX_EMPTY_BREAKS:
                for i in todo:
                    results[i] = failed(paths[i], f"{paths[i]}: not analysed: the process pool kept dying")
                _tick(progress, len(results), total)
                break
            continue
        empty_breaks = 0
        todo = [i for i in todo if i not in running]
        for i in running:  # one at a time: a death now is this rank's own
            _, died = _pool_round(paths, [i], 1, results, progress)
            if i in results:
                continue
            if died:
                results[i] = failed(paths[i], f"{paths[i]}: the process analysing it died {DEATHS_TO_FAIL} times "
                                              "(out of memory?)")
                _tick(progress, len(results), total)
            else:  # its process died before it began: with the others again
                todo.append(i)
    return [results[i] for i in range(total)]


#: Set in each worker by :func:`_worker_start`: one flag per rank, raised when its analysis begins.
_started = None


def _worker_start(started) -> None:
    """In each pool worker: Ctrl-C is the parent's to handle (it stops the workers), so a worker
    ignores SIGINT and never prints a KeyboardInterrupt traceback of its own; and its allocator
    keeps freed memory for the next rank (:func:`_keep_freed_memory`)."""
    global _started
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _started = started
    _keep_freed_memory()


#: What a pool worker's allocator keeps at the top of its heap (glibc's ``M_TOP_PAD``) when it
#: grows it or when memory is freed, instead of handing it back: about two ranks' columns and
#: structs of a 26 MB trace.
WORKER_TOP_PAD = 64 << 20


def _keep_freed_memory() -> bool:
    """In a pool worker (this package's own process, never the caller's): let glibc keep up to
    :data:`WORKER_TOP_PAD` of freed heap, so that each rank reuses the pages of the one before
    instead of the kernel zeroing fresh ones (:mod:`gpumagic._allocator`). On 16 A100 ranks in a
    pool of two this cut the workers' page faults by 45 % and their system time by half (0.69 s
    to 0.37 s of about 6.4 s of CPU: about 5 %), with the same peak RSS. Returns whether the
    setting was taken (not on other systems than Linux with glibc)."""
    return _allocator.mallopt({_allocator.M_TOP_PAD: WORKER_TOP_PAD})


def _summarize_rank(index: int, path: str) -> RankSummary:
    _started[index] = 1
    return summarize(path)


def _pool_round(paths: Sequence[str], indices: list[int], processes: int, results: dict[int, RankSummary],
                progress: Progress | None) -> tuple[list[int], list[int] | None]:
    """Analyse ``indices`` in one process pool. Returns the ranks left unfinished and, when a
    worker died, those that had started (None when the pool lived to the end)."""
    # fork on Linux, as gpumagic.trace.pieces does: the workers start at once and never re-import the
    # caller's __main__ (a script without an ``if __name__ == "__main__":`` guard would otherwise
    # run again in every worker under spawn or forkserver)
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    started = context.RawArray("b", len(paths))
    pool = ProcessPoolExecutor(max_workers=min(processes, len(indices)), mp_context=context,
                               initializer=_worker_start, initargs=(started,))
    broken = False
    try:
        futures = {pool.submit(_summarize_rank, i, paths[i]): i for i in largest_first(paths, indices)}
        for fut in as_completed(futures):
            i = futures[fut]
            exc = fut.exception()
            if isinstance(exc, BrokenProcessPool):
                broken = True
                continue
            results[i] = crashed(paths[i], exc) if exc is not None else fut.result()
            _tick(progress, len(results), len(paths))
    except BaseException:  # Ctrl-C: stop every worker now, leave no process behind
        _kill_workers(pool)
        raise
    pool.shutdown(wait=True)
    left = [i for i in indices if i not in results]
    return left, ([i for i in left if started[i]] if broken else None)


def largest_first(paths: Sequence[str], indices: list[int]) -> list[int]:
    """``indices`` with the largest local files first (ties and URLs, whose size is not asked, in
    their order): the pool hands ranks out as workers free up, so the long ranks start first and
    the last ones to finish are short, and the workers finish together (longest-processing-time-
    first list scheduling, Graham 1969). The results keep the order of ``paths``."""
    def size(i: int) -> int:
        try:
            return os.path.getsize(paths[i]) if "://" not in paths[i] else 0
        except OSError:  # missing: that rank's error, found by its worker
            return 0

    return sorted(indices, key=lambda i: -size(i))


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    # The executor has no public way to stop running calls; its worker processes are in _processes
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for proc in processes:
        with contextlib.suppress(Exception):
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        with contextlib.suppress(Exception):
            proc.join(5)


def for_workers(path: str) -> str:
    """A path as Dask workers should see it: URLs as they are, local paths absolute (the workers
    must share the file system, with the same mount point)."""
    return path if "://" in path else os.path.abspath(path)


#: Environment variable: how long (seconds) a Dask job waits while its cluster has no worker.
DASK_WAIT_ENV = "GPUMAGIC_DASK_WAIT_S"
#: Default of :data:`DASK_WAIT_ENV`: time for a cluster's workers to start (or be replaced).
DEFAULT_DASK_WAIT_S = 60.0
#: How often the cluster's workers are counted while no rank finishes (seconds).
_POLL_S = 0.2


def dask_wait_s() -> float:
    """How long a Dask job waits with no worker: :data:`DASK_WAIT_ENV` or :data:`DEFAULT_DASK_WAIT_S`."""
    from gpumagic._env import env_float

    return env_float(DASK_WAIT_ENV, DEFAULT_DASK_WAIT_S, minimum=0.1, maximum=86_400, what="seconds")


def run_dask(paths: Sequence[str], client, progress: Progress | None = None, *,
             wait_s: float | None = None) -> list[RankSummary]:
    """Analyse ``paths`` on the workers of ``client`` (a ``distributed.Client``).

    A worker that dies costs at most the rank it was on: the scheduler gives its tasks to the
    other workers, a task that comes back as ``KilledWorker`` (it was on workers that died
    ``distributed.scheduler.allowed-failures`` times, perhaps only queued there) is run once more
    when the others are done, alone on the cluster, one such rank at a time, and only a rank that
    fails again is reported with that error. A cluster with no worker at the start, or whose workers all
    died, is waited on for ``wait_s`` seconds (default :func:`dask_wait_s`), then a
    :class:`~gpumagic.errors.GpumagicError` names the scheduler and the wait.
    """
    from distributed import as_completed as dask_completed

    wait_s = dask_wait_s() if wait_s is None else wait_s
    address = getattr(getattr(client, "scheduler", None), "address", None) or "the Dask cluster"
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except (TimeoutError, OSError) as exc:
        raise GpumagicError(f"the Dask scheduler at {address} has no worker: waited {wait_s:g} s for one "
                            f"({type(exc).__name__}); start workers (dask worker {address}) or set {DASK_WAIT_ENV}") from None
    targets = [for_workers(p) for p in paths]
    results: dict[int, RankSummary] = {}
    suspects: list[int] = []  # ranks that came back KilledWorker: run again, one at a time

    def drain(futures: list, index: dict, retry: bool) -> None:
        pending = dask_completed(futures)
        no_worker_since: float | None = None
        try:
            while not pending.is_empty():
                batch = pending.next_batch(block=False) if pending.has_ready() else []
                if not batch:
                    no_worker_since = _still_no_worker(client, no_worker_since, wait_s, address, len(paths) - len(results))
                    time.sleep(_POLL_S)
                    continue
                no_worker_since = None
                for fut in batch:
                    i = index[fut.key]
                    error = fut.exception() if fut.status == "error" else None
                    if error is not None and type(error).__name__ == "KilledWorker" and retry:
                        # a rank only queued on a worker that another rank killed is charged with that
                        # death too (the scheduler counts every task the worker held)
                        suspects.append(i)
                    elif error is not None:  # the worker raised or died: say so for this rank, keep the others
                        results[i] = crashed(paths[i], error)
                    else:
                        results[i] = fut.result()
                    fut.release()
                    _tick(progress, len(results), len(paths))
        except BaseException:
            with contextlib.suppress(Exception):
                client.cancel(futures)
            raise

    order = largest_first(paths, list(range(len(paths))))
    mapped = client.map(summarize, [targets[i] for i in order], pure=False)
    futures = [None] * len(paths)
    for i, fut in zip(order, mapped):
        futures[i] = fut
    drain(futures, {f.key: i for i, f in enumerate(futures)}, retry=True)
    # each suspect alone on the cluster: only a rank that kills its worker by itself is reported
    for i in sorted(suspects):
        again = client.submit(summarize, targets[i], pure=False)
        drain([again], {again.key: i}, retry=False)
    return [results[i] for i in range(len(paths))]


def _still_no_worker(client, since: float | None, wait_s: float, address: str, left: int) -> float | None:
    """None while the cluster has workers; else when it lost its last one. GpumagicError past ``wait_s``."""
    try:
        workers = client.scheduler_info().get("workers") or {}
    except Exception:  # the scheduler itself went away: the same as no worker
        workers = {}
    if workers:
        return None
    now = time.monotonic()
    since = now if since is None else since
    if now - since > wait_s:
        raise GpumagicError(f"the Dask scheduler at {address} has had no worker for {wait_s:g} s with {left} rank(s) "
                            f"left; start workers (dask worker {address}) or set {DASK_WAIT_ENV}")
    return since
