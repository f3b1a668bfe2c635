"""``gpumagic analyze PATH... [--format text|json|html] [-o FILE] [--label NAME] [--top-ops N] [-j N] [--scheduler ADDRESS]``.

One trace file gives its report. Several files, a folder or a glob pattern give the job report of a
distributed job, one trace per rank (:mod:`gpumagic.jobs`): ``-j`` processes analyse the ranks side
by side, or a Dask cluster's workers do with ``--scheduler tcp://HOST:8786``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

from gpumagic.errors import GpumagicError
from gpumagic.shells.cli._output import EXAMPLE, FORMATS, STDIN, emit, output_arg, trace_path


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return n


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``analyze`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); returns it."""
    a = subparsers.add_parser("analyze", help="analyse a Kineto trace (.json, .json.gz) or a gpumagic bundle; "
                                              "several, a folder or a glob: a distributed job, one trace per rank")
    a.add_argument("paths", nargs="+", metavar="PATH",
                   help=f"trace file, '{STDIN}' for standard input, or '{EXAMPLE}' for the bundled example; "
                        "several files, a folder of rank traces, "
                        "or a quoted glob pattern for a job")
    a.add_argument("--format", choices=FORMATS, default="text")
    a.add_argument("-o", "--output", type=output_arg, help="write to this file instead of standard output (-: standard output)")
    a.add_argument("--label", default="", help="name this run in the report")
    a.add_argument("--top-ops", type=_jobs, default=20, metavar="N",
                   help="one trace: operators listed in the report's Operators table, by GPU time (default 20)")
    a.add_argument("-j", "--jobs", type=_jobs, default=0, metavar="N",
                   help="one trace: processes that decode it side by side; a job: processes that analyse its ranks "
                        "side by side (default: one per core; 1: none)")
    a.add_argument("--scheduler", metavar="ADDRESS",
                   help="analyse the ranks on this Dask scheduler's workers (tcp://HOST:8786; needs gpumagic[dask]); "
                        "the workers must see the trace files")
    a.set_defaults(handler=run)
    return a


class _ReadAhead(threading.Thread):
    """Read (and gunzip) a trace file on a helper thread; :meth:`result` returns its bytes or
    raises its error (a :class:`~gpumagic.errors.TraceError`, or anything unforeseen such as a
    MemoryError) on the calling thread."""

    def __init__(self, path: str, mutable: bool) -> None:
        from gpumagic.trace.files import Progress

        super().__init__(name="gpumagic-read", daemon=True)
        self.path = path
        self.mutable = mutable
        #: how far the gunzip has got (a large trace's first pieces are decoded before the end)
        self.progress = Progress()
        self._raw: bytearray | None = None
        self._error: Exception | None = None
        self.start()

    def run(self) -> None:
        from gpumagic.trace.files import read_bytes

        try:  # "-" reads standard input, bounded like any file (gpumagic.trace.files)
            self._raw = read_bytes(self.path, mutable=self.mutable, progress=self.progress)
        except Exception as exc:  # raised on the calling thread by result(), never printed here
            self._error = exc
        finally:  # whatever happened, nobody waits for more (pieces.start_early)
            self.progress.ended = True

    def result(self) -> bytearray:
        self.join()
        if self._error is not None:
            raise self._error
        raw, self._raw = self._raw, None
        return raw


def is_job(args: argparse.Namespace) -> bool:
    """Whether the command names a job (several files, a folder, a glob, or a cluster) rather than one trace."""
    from gpumagic.jobs import is_pattern

    if len(args.paths) > 1 or args.scheduler:
        return True
    (only,) = args.paths
    return only != STDIN and (os.path.isdir(only) or (is_pattern(only) and not os.path.exists(only)))


def run(args: argparse.Namespace) -> int:
    """Analyse one trace, or a job's rank traces, and write the report; 2 with one stderr line on bad input."""
    if is_job(args):
        return emit(lambda: analyze_job(args), args.format, args.output, "job report", protect=_named_files(args))
    path = trace_path(args.paths[0])
    from gpumagic.trace.files import gzip_size
    from gpumagic.trace.pieces import available_workers

    workers = args.jobs or available_workers()
    size = gzip_size(path)
    _keep_freed_memory(path, size)
    # gunzip (which releases the GIL) while numpy & co. are imported
    reading = _ReadAhead(path, mutable=_in_place(size, workers))
    from gpumagic.analysis import analyze
    from gpumagic.trace import pieces
    from gpumagic.trace.files import display_name
    from gpumagic.trace.kineto import from_bytes

    def report():
        # a large gzip still inflating: a child decodes the first pieces meanwhile
        early = pieces.start_early(reading.progress, workers)
        try:
            raw = reading.result()
        except BaseException:
            pieces.stop_early(early)
            raise
        trace = from_bytes(raw, display_name(path), workers=workers, consume=True, early=early)
        return analyze(trace, label=args.label, top_ops=args.top_ops, workers=workers)

    return emit(report, args.format, args.output, "report", protect=[path])


def _in_place(gzip_size: int | None, workers: int) -> bool:
    """Whether to read the trace into a ``bytearray``, which :mod:`gpumagic.trace.pieces` cuts
    into pieces in place and whose inflation an early child follows
    (:func:`~gpumagic.trace.pieces.start_early`), rather than into ``bytes`` inflated in one call,
    whose pieces are copies. ``gzip_size``: what the trace's gzip trailer says it inflates to
    (:func:`~gpumagic.trace.files.gzip_size`; None when it is not a gzip file).

    Only with ``workers`` > 1, and not for a gzip file that says it inflates to less than
    :data:`~gpumagic.trace.pieces.EARLY_MIN_BYTES` (too little for an early child): the
    inflation into a ``bytearray`` goes 2 MB at a time, and each step waits for the GIL, which
    the thread importing numpy and the analysis holds meanwhile: the 54 MB V100 trace's gunzip
    took 0.11 s beside the imports that way (0.02 s of it inside the inflate calls when alone,
    0.10 s beside the imports), against 0.05 s in one call. A copy of each piece costs less
    than that. The size is the gzip trailer's, modulo 2**32: a file that inflates to more than
    it says is still read whole, by the step-by-step fallback of
    :func:`~gpumagic.trace.files.gunzip`."""
    from gpumagic.trace.pieces import EARLY_MIN_BYTES

    return workers > 1 and (gzip_size is None or gzip_size >= EARLY_MIN_BYTES)


#: From this many bytes of JSON, the command keeps the memory it frees for reuse
#: (:func:`_keep_freed_memory`).
KEEP_FREED_MIN_BYTES = 128 << 20
#: How much free memory at the top of the heap glibc may keep, then (``M_TRIM_THRESHOLD``).
TRIM_MIN_BYTES = 256 << 20


def _keep_freed_memory(path: str, gzip_size: int | None) -> bool:
    """For a trace of :data:`KEEP_FREED_MIN_BYTES` of JSON or more (the gzip trailer's size, else
    the file's), have glibc keep the memory this process frees (:mod:`gpumagic._allocator`):
    blocks under 32 MiB come from the heap, and its free top is kept unless more than
    :data:`TRIM_MIN_BYTES` of it is free, so that the columns and temporaries of the analysis
    reuse pages already touched instead of faulting fresh ones in. Whole commands on the V100
    trace ×20 (860 MB), alternated with the code before, 6 rounds: 4.84-4.98 s against
    4.93-5.26 s, 655k page faults against 780k, the summed peak memory of all processes 1.58×
    the JSON against 1.44× (target 2.0×); on the V100 trace ×5 (214 MB) no different. Smaller
    traces are left alone: the command's few large blocks gain nothing there."""
    from gpumagic import _allocator

    size = gzip_size
    if size is None:
        if path == STDIN:
            return False
        try:
            size = os.stat(path).st_size
        except (OSError, ValueError):
            return False
    if size < KEEP_FREED_MIN_BYTES:
        return False
    return _allocator.mallopt({_allocator.M_MMAP_THRESHOLD: _allocator.LARGE_MMAP_THRESHOLD,
                               _allocator.M_TRIM_THRESHOLD: TRIM_MIN_BYTES})


def _named_files(args: argparse.Namespace) -> list[str]:
    """The rank files the arguments name, when that can be told without reading them (the written
    output is checked against them again, through emit, once they are known)."""
    from gpumagic.jobs import rank_files

    try:
        return rank_files(args.paths)
    except GpumagicError:
        return []


#: How long ``--scheduler`` waits to reach the scheduler before giving up.
CONNECT_TIMEOUT_S = 10


def analyze_job(args: argparse.Namespace):
    """The job report for ``args.paths``, on the local cores or the ``--scheduler`` cluster."""
    from gpumagic.jobs import analyze_job as analyze
    from gpumagic.jobs import rank_files

    files = rank_files(args.paths)
    _never_over_an_input(args.output, files)
    progress = _ProgressBar(len(files)) if sys.stderr.isatty() else None
    try:
        if not args.scheduler:
            return analyze(files, jobs=args.jobs or None, label=args.label, progress=progress)
        with _dask_client(args.scheduler) as client:
            return analyze(files, client=client, label=args.label, progress=progress)
    finally:
        if progress is not None:
            progress.close()


def _never_over_an_input(output: str | None, files: list[str]) -> None:
    """Refuse, before any work, an ``-o`` that is one of the rank files (links, other spellings and
    ``file://`` URLs included: gpumagic._atomic resolves them as the readers do)."""
    from gpumagic._atomic import check_target

    if output is not None:
        check_target(output, files)


def _dask_client(address: str):
    try:
        from distributed import Client
    except ImportError:
        raise GpumagicError("--scheduler needs Dask's distributed package: pip install 'gpumagic[dask]'") from None
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        raise GpumagicError(f"cannot reach the Dask scheduler at {address} ({exc})") from None


class _ProgressBar:
    """``analysed 12/32 ranks [#######.........]`` on standard error, redrawn in place (a terminal only)."""

    WIDTH = 30

    def __init__(self, total: int) -> None:
        self.total = total
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        filled = self.WIDTH * done // max(total, 1)
        sys.stderr.write(f"\rgpumagic: analysed {done}/{total} ranks [{'#' * filled}{'.' * (self.WIDTH - filled)}]")
        sys.stderr.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
