"""The ``gpumagic`` command line: one parser, a module per subcommand.

- ``gpumagic analyze PATH`` (:mod:`.analyze`): a report on one trace;
- ``gpumagic compare BEFORE AFTER`` (:mod:`.compare`): what changed between two runs;
- ``gpumagic runs list|show|compare|rm|export`` (:mod:`.runs`): the run history;
- ``gpumagic schema [KIND]`` (:mod:`.schema`): the JSON Schema of a JSON output.
- ``gpumagic --version``: the installed version (the package metadata, from pyproject.toml).
- ``gpumagic mcp`` (:mod:`.mcp`): the analyses as Model Context Protocol tools, over stdio.

Each subcommand module has ``add_parser(subparsers)`` and ``run(args) -> int``; :mod:`._output`
holds what they share (writing the result, the exit statuses). Exit status: 0 on success, 2 on
bad input (one line on stderr, never a traceback), 130 after Ctrl-C, 141 when the reader of
standard output went away.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gpumagic.errors import GpumagicError
from gpumagic.shells.cli import analyze, compare, mcp, runs, schema
from gpumagic.shells.cli._output import INTERRUPTED_STATUS, PIPE_CLOSED_STATUS, error_line

SUBCOMMANDS = (analyze, compare, runs, schema, mcp)


class _Version(argparse.Action):
    """``--version``: the installed version, looked up only when asked for (reading the package
    metadata costs every other command tens of milliseconds)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        import gpumagic

        sys.stdout.write(f"gpumagic {gpumagic.__version__}\n")
        parser.exit()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpumagic", description="Why is my GPU waiting? Analyse PyTorch profiler traces.")
    p.add_argument("--version", action=_Version, nargs=0, help="show program's version number and exit")
    sub = p.add_subparsers(dest="command", required=True)
    for command in SUBCOMMANDS:
        command.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; any error becomes exit status 2 and one line on stderr."""
    args = parser().parse_args(argv)
    try:
        return args.handler(args)
    except (BrokenPipeError, KeyboardInterrupt):
        raise  # 141 and 130, in run()
    except Exception as exc:  # a bug or an input no check foresaw: one line, never a traceback
        print(error_line(exc), file=sys.stderr)
        return 2


def run() -> None:
    """The console script: :func:`main`, then leave without tearing the interpreter down.

    Freeing every object of a large analysis one by one at exit takes longer than the output
    needs; everything is written and flushed by then, so the process ends at once.

    numpy's OpenBLAS starts one thread per core when numpy is imported; gpumagic calls no BLAS
    routine, and those threads cost every command about 40 ms of CPU (about half of a small
    trace's whole run on two cores), so the command asks for one unless the user chose a number.
    Where the kernel stalls to compact memory for the huge pages that numpy asks for, the
    command asks numpy not to (:func:`numpy_huge_pages_stall`).
    """
    if "numpy" not in sys.modules:  # too late once numpy is loaded
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        if numpy_huge_pages_stall():
            os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    try:
        try:
            code = main()
        except SystemExit as exc:  # argparse's --help (0) and usage errors (2)
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (``gpumagic analyze t | head``): stop quietly
        code = PIPE_CLOSED_STATUS
    except KeyboardInterrupt:  # Ctrl-C: any decoding children were stopped on the way out
        code = INTERRUPTED_STATUS
    except OSError as exc:  # the last flush of standard output failed (a full device)
        print(error_line(GpumagicError(f"cannot write to standard output ({exc.strerror or exc})")), file=sys.stderr)
        code = 2
    sys.stderr.flush()
    os._exit(code)


#: Linux's transparent huge page settings (Documentation/admin-guide/mm/transhuge.rst).
THP_SETTINGS = "/sys/kernel/mm/transparent_hugepage"


def numpy_huge_pages_stall(settings: str = THP_SETTINGS) -> bool:
    """Whether numpy's request for huge pages makes page faults on this machine stall.

    numpy marks every array of 4 MiB or more ``madvise(MADV_HUGEPAGE)`` on Linux (its
    ``NUMPY_MADVISE_HUGEPAGE`` switch, "Global State" in numpy's documentation). A page fault in
    a region so marked that finds no free huge page waits while the kernel reclaims and compacts
    memory, instead of taking a small page, when the kernel's ``defrag`` setting is ``madvise`` or
    ``defer+madvise``, or ``always`` where ``enabled`` is ``madvise`` (so that only marked regions
    get huge pages at all): Linux's Documentation/admin-guide/mm/transhuge.rst; numpy issue
    31590. A busy or long-running machine has few free huge pages, and a virtual machine's fresh
    ones are slow to provide: on this project's 2-core machine, assembling the columns of an
    860 MB trace took 1.3 s with the advice and 0.5 s without. Elsewhere (``enabled`` at
    ``never``, ``defrag`` at ``defer`` or ``never``, or ``always`` for every region alike) the advice
    adds no stall and is left alone; so it is where the settings cannot be read.
    """
    try:
        with open(os.path.join(settings, "enabled")) as fh:
            enabled = _chosen(fh.read())
        with open(os.path.join(settings, "defrag")) as fh:
            defrag = _chosen(fh.read())
    except OSError:
        return False
    if enabled == "madvise":
        return defrag in ("always", "madvise", "defer+madvise")
    return enabled == "always" and defrag in ("madvise", "defer+madvise")


def _chosen(setting: str) -> str:
    """The bracketed word of a sysfs choice (``always [madvise] never`` gives ``madvise``)."""
    start, end = setting.find("["), setting.find("]")
    return setting[start + 1:end] if 0 <= start < end else ""


__all__ = ["main", "numpy_huge_pages_stall", "parser", "run"]
