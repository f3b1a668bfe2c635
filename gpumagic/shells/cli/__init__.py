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
    """
    if "numpy" not in sys.modules:  # too late once numpy is loaded
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
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


__all__ = ["main", "parser", "run"]
