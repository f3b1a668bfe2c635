"""``gpumagic compare BEFORE AFTER [--format text|json|html] [-o FILE]``.

:func:`add_compare_parser` adds the subcommand to the ``gpumagic`` parser; :func:`run_compare`
runs it. Exit status: 0 on success, 2 on bad input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
from pathlib import Path

FORMATS = ("text", "json", "html")


def add_compare_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``compare`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); returns it."""
    p = subparsers.add_parser(
        "compare", help="compare two traces: step time, GPU busy, breakdown, findings resolved/new/persisting",
        description="Compare a run before a change (BEFORE) with the run after it (AFTER).")
    p.add_argument("before", help="trace of the run before the change (.json, .json.gz or gpumagic bundle)")
    p.add_argument("after", help="trace of the run after the change")
    p.add_argument("--format", choices=FORMATS, default="text")
    p.add_argument("-o", "--output", help="write to this file instead of standard output")
    p.set_defaults(handler=run_compare)
    return p


def run_compare(args: argparse.Namespace) -> int:
    """Analyse both traces, compare them and write the result; 2 with one stderr line on bad input."""
    from gpumagic.cli import emit
    from gpumagic.comparison import compare

    return emit(lambda: compare(_path(args.before), _path(args.after)), args.format, args.output, "comparison")


def _path(arg: str) -> Path:
    """A file path as given (a Path, so never taken for a run label); ``example`` is the bundled
    example trace, as for ``analyze``."""
    from gpumagic.cli import EXAMPLE, example_trace_path

    return Path(example_trace_path() if arg == EXAMPLE else arg)
