"""Distributed jobs: every rank's trace at once, stragglers named.

::

    job = gpumagic.analyze_job("traces/")                 # a folder, a glob, or a list of files
    job = gpumagic.analyze_job(paths, jobs=8)            # 8 local processes
    job = gpumagic.analyze_job(paths, client=client)     # a dask.distributed Client

Each rank is analysed on its own (:mod:`.summary`) into a small summary, in this process, a local
process pool or on Dask workers (:mod:`.executors`); the job view is built from the summaries
(:mod:`.model`, :mod:`.stragglers`, :mod:`.findings`). Never imports torch.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable

from gpumagic.errors import GpumagicError

#: File names that rank traces end with (torch's ``tensorboard_trace_handler`` writes
#: ``*.pt.trace.json[.gz]``; ``export_chrome_trace`` whatever the user names, usually ``.json``).
TRACE_ENDINGS = (".json", ".json.gz")
_GLOB_CHARS = frozenset("*?[")


def is_pattern(arg: str) -> bool:
    return any(c in _GLOB_CHARS for c in arg)


def rank_files(args: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """The trace files that ``args`` name: files as given, the ``.json``/``.json.gz`` files of a
    folder (sorted), and the matches of a glob pattern (sorted); URLs (``s3://…``) as given.
    Raises :class:`~gpumagic.errors.GpumagicError` when something names no trace file."""
    items = [args] if isinstance(args, (str, os.PathLike)) else list(args)
    out: list[str] = []
    for item in map(os.fspath, items):
        if "://" in item:
            out.append(item)
        elif os.path.isdir(item):
            found = sorted(os.path.join(item, n) for n in os.listdir(item)
                           if n.endswith(TRACE_ENDINGS) and os.path.isfile(os.path.join(item, n)))
            if not found:
                raise GpumagicError(f"{item}: the folder holds no .json or .json.gz trace file")
            out += found
        elif is_pattern(item) and not os.path.exists(item):
            found = sorted(p for p in glob.glob(item) if os.path.isfile(p))
            if not found:
                raise GpumagicError(f"{item}: no file matches")
            out += found
        else:
            out.append(item)  # a missing file becomes that rank's error, not the job's
    seen: set[str] = set()
    return [p for p in out if not (p in seen or seen.add(p))]


def analyze_job(paths: str | os.PathLike | Iterable[str | os.PathLike], *, client=None, jobs: int | None = None,
                label: str = "", progress: Callable[[int, int], None] | None = None):
    """Analyse a distributed job, one trace per rank, into a :class:`~gpumagic.jobs.model.Job`.

    ``paths``: a folder of rank traces, a glob pattern, or a list of files (fsspec URLs allowed
    with ``client``). ``jobs``: local processes (default: one per usable core, at most one per
    file; 1 analyses here). ``client``: a ``dask.distributed.Client`` whose workers run the
    per-rank analyses instead (they must see the files). ``progress(done, total)`` is called as
    ranks finish. A rank file that is missing or corrupt is reported in the job, not raised.
    """
    from gpumagic.jobs import executors
    from gpumagic.jobs.model import build

    files = rank_files(paths)
    if not files:
        raise GpumagicError("no trace files given")
    if client is not None:
        return build(executors.run_dask(files, client, progress), label=label)
    return build(executors.run_local(files, jobs or _cores(), progress), label=label)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


__all__ = ["analyze_job", "rank_files"]
