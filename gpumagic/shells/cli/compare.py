"""``gpumagic compare BEFORE AFTER [--format text|json|html] [-o FILE]``."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpumagic.shells.cli._output import FORMATS, emit, output_arg, trace_path


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``compare`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); returns it."""
    p = subparsers.add_parser(
        "compare", help="compare two traces: step time, GPU busy, breakdown, findings resolved/new/persisting",
        description="Compare a run before a change (BEFORE) with the run after it (AFTER).")
    p.add_argument("before", help="trace of the run before the change (.json, .json.gz or gpumagic bundle)")
    p.add_argument("after", help="trace of the run after the change")
    p.add_argument("--format", choices=FORMATS, default="text")
    p.add_argument("-o", "--output", type=output_arg, help="write to this file instead of standard output (-: standard output)")
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Analyse both traces, compare them and write the result; 2 with one stderr line on bad input."""
    from gpumagic.tuning.comparison import compare

    # Paths, so that neither is taken for a run label
    before, after = trace_path(args.before), trace_path(args.after)
    return emit(lambda: compare(Path(before), Path(after)), args.format, args.output, "comparison",
                protect=[before, after])
