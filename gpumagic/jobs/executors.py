"""Where the per-rank analyses run: in this process, in a local process pool, or on a Dask cluster.

Each runs :func:`~gpumagic.jobs.summary.summarize` once per rank file and returns the summaries in
the order of the paths; ``progress(done, total)`` is called after each one. A rank whose analysis
fails — a bad file, an unexpected error in its analysis, or the process analysing it dying — comes
back as a summary with ``error`` set (naming the file and the exception), and the others go on: one
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

import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

from gpumagic.jobs.summary import RankSummary, failed, summarize

Progress = Callable[[int, int], None]


def _tick(progress: Progress | None, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)


def crashed(path: str, exc: BaseException) -> RankSummary:
    """The summary of a rank whose analysis raised something other than a bad-input error."""
    return failed(path, f"{path}: its analysis failed ({type(exc).__name__}: {exc})")


def _summarize_here(path: str) -> RankSummary:
    try:
        return summarize(path)
    except Exception as exc:  # reported in the job as this rank's error (see the module docstring)
        return crashed(path, exc)


def run_local(paths: Sequence[str], processes: int, progress: Progress | None = None) -> list[RankSummary]:
    """Analyse ``paths`` with ``processes`` processes (1: in this process)."""
    total = len(paths)
    if processes <= 1 or total <= 1:
        out = []
        for i, p in enumerate(paths):
            out.append(_summarize_here(p))
            _tick(progress, i + 1, total)
        return out
    # fork on Linux, as gpumagic.trace.pieces does: the workers start at once and never re-import the
    # caller's __main__ (a script without an ``if __name__ == "__main__":`` guard would otherwise
    # run again in every worker under spawn or forkserver)
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    results: dict[int, RankSummary] = {}
    with ProcessPoolExecutor(max_workers=min(processes, total), mp_context=multiprocessing.get_context(method)) as pool:
        futures = {pool.submit(summarize, p): i for i, p in enumerate(paths)}
        try:
            for fut in as_completed(futures):
                i = futures[fut]
                exc = fut.exception()
                if isinstance(exc, BrokenProcessPool):
                    results[i] = failed(paths[i], f"{paths[i]}: the process analysing it died (out of memory?)")
                elif exc is not None:
                    results[i] = crashed(paths[i], exc)
                else:
                    results[i] = fut.result()
                _tick(progress, len(results), total)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [results[i] for i in range(total)]


def for_workers(path: str) -> str:
    """A path as Dask workers should see it: URLs as they are, local paths absolute (the workers
    must share the file system, with the same mount point)."""
    return path if "://" in path else os.path.abspath(path)


def run_dask(paths: Sequence[str], client, progress: Progress | None = None) -> list[RankSummary]:
    """Analyse ``paths`` on the workers of ``client`` (a ``distributed.Client``)."""
    from distributed import as_completed as dask_completed

    targets = [for_workers(p) for p in paths]
    futures = client.map(summarize, targets, pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    results: dict[int, RankSummary] = {}
    for fut in dask_completed(futures):
        i = index[fut.key]
        if fut.status == "error":  # the worker raised or died: say so for this rank, keep the others
            results[i] = crashed(paths[i], fut.exception())
        else:
            results[i] = fut.result()
        fut.release()
        _tick(progress, len(results), len(paths))
    return [results[i] for i in range(len(paths))]
