"""``gpumagic runs list|show|compare|rm|export``: the run history from the command line.

- ``list [-n N]``: a table (id, label, when, device, median step, GPU busy, top finding), newest last;
- ``show RUN [--format text|json|html] [-o FILE]``: one run's report;
- ``compare A B [--format ...] [-o FILE]``: what changed between two runs (or trace files);
- ``rm RUN [--yes]``: ``r<id>`` or ``LABEL@N`` removes one run, a plain label all of its runs (after
  listing each run it names, and asking when standard input is a terminal; ``--yes`` skips the
  question); an empty RUN is refused, never "every unlabelled run";
- ``export [-o FILE]``: every run as JSON lines, oldest first, the home folder written ``~`` (in
  keys and free text too).

Every ``-o`` is written atomically and never over the history database or a trace it read.

A run is named as everywhere else: ``LABEL`` (its latest run), ``LABEL@N`` (N-th most recent), ``r<id>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from gpumagic.errors import GpumagicError
from gpumagic.shells.cli._output import FORMATS, emit, kept_files, output_arg


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``runs`` and its subcommands to ``subparsers``; returns the ``runs`` parser."""
    p = subparsers.add_parser("runs", help="the run history: list, show, compare, rm, export",
                              description="Runs kept by %%gpuprofile, gpumagic.profile(label=...) and "
                                          "GpuProfileCallback(label=...), across kernel restarts. "
                                          "Name a run by LABEL (its latest run), LABEL@N or r<id>.")
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="a table of the runs, newest last")
    ls.add_argument("-n", "--last", type=int, default=None, metavar="N", help="only the N newest runs")
    ls.set_defaults(handler=_list)
    show = sub.add_parser("show", help="one run's report")
    show.add_argument("run", help="LABEL, LABEL@N or r<id>")
    show.add_argument("--format", choices=FORMATS, default="text")
    show.add_argument("-o", "--output", type=output_arg, help="write to this file instead of standard output (-: standard output)")
    show.set_defaults(handler=_show)
    cmp = sub.add_parser("compare", help="compare two runs (before, after)")
    cmp.add_argument("before", help="LABEL, LABEL@N, r<id> or a trace file")
    cmp.add_argument("after", help="LABEL, LABEL@N, r<id> or a trace file")
    cmp.add_argument("--format", choices=FORMATS, default="text")
    cmp.add_argument("-o", "--output", type=output_arg, help="write to this file instead of standard output (-: standard output)")
    cmp.set_defaults(handler=_compare)
    rm = sub.add_parser("rm", help="remove a run (r<id>, LABEL@N) or every run of a label")
    rm.add_argument("run", help="LABEL (all its runs), LABEL@N or r<id>")
    rm.add_argument("-y", "--yes", action="store_true", help="do not ask before removing several runs")
    rm.set_defaults(handler=_rm)
    export = sub.add_parser("export", help="every run as JSON lines (home folder as ~)")
    export.add_argument("-o", "--output", type=output_arg,
                        help="write to this file (atomically) instead of standard output (-: standard output)")
    export.set_defaults(handler=_export)
    return p


def _fail(message: str) -> int:
    from gpumagic.shells.cli._output import error_line

    print(error_line(GpumagicError(message)), file=sys.stderr)
    return 2


def _list(args: argparse.Namespace) -> int:
    from gpumagic.tuning import runs

    if args.last is not None and not 1 <= args.last <= 10**12:
        return _fail(f"--last needs a positive number of runs, not {args.last}")
    try:
        sys.stdout.write(runs.history(limit=args.last).to_text())
    except GpumagicError as exc:
        return _fail(str(exc))
    return 0


def _show(args: argparse.Namespace) -> int:
    from gpumagic.tuning import runs

    return emit(lambda: runs.get(args.run), args.format, args.output, "report")


def _compare(args: argparse.Namespace) -> int:
    from gpumagic.tuning.comparison import compare

    # A or B may be a trace file: an input, like the history (which emit always protects)
    return emit(lambda: compare(args.before, args.after), args.format, args.output, "comparison",
                protect=[p for p in (args.before, args.after) if os.path.exists(p) or p.startswith("file://")])


def _rm(args: argparse.Namespace) -> int:
    from gpumagic.render.terminal import printable
    from gpumagic.tuning import runs

    try:
        targets = runs.matching(args.run)  # "" and an ambiguous r<id> are refused here
        listed = "; ".join(f"{t.ref} ({'label ' + repr(printable(t.label)) if t.label else 'unlabelled'}, {t.when})"
                           for t in targets)
        print(f"gpumagic: {args.run!r} names {len(targets)} run{'s' if len(targets) != 1 else ''}: {listed}",
              file=sys.stderr)
        if len(targets) > 1 and not args.yes and not _confirm(f"remove these {len(targets)} runs?"):
            if not sys.stdin.isatty():
                return _fail(f"{args.run!r} names {len(targets)} runs; pass --yes to remove them all")
            print("gpumagic: nothing removed", file=sys.stderr)
            return 1
        removed = runs.store().remove(targets)
    except GpumagicError as exc:
        return _fail(str(exc))
    refs = ", ".join(t.ref for t in targets)
    print(f"gpumagic: removed {removed} run{'s' if removed != 1 else ''} ({refs})", file=sys.stderr)
    return 0


def _confirm(question: str) -> bool:
    """Ask on the terminal; False without one (the caller then asks for --yes)."""
    if not sys.stdin.isatty():
        return False
    print(f"gpumagic: {question} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _export(args: argparse.Namespace) -> int:
    from gpumagic._atomic import write_atomic
    from gpumagic.tuning import runs

    home = os.path.expanduser("~")
    try:
        lines = [json.dumps(tilde_paths(row, home), allow_nan=False) + "\n" for row in runs.store().export_rows()]
        if args.output is None:
            sys.stdout.writelines(lines)
        else:
            write_atomic(args.output, "".join(lines), protect=kept_files())
    except GpumagicError as exc:
        return _fail(str(exc))
    if args.output:
        print(f"gpumagic: wrote {len(lines)} run(s) as JSON lines to {args.output}", file=sys.stderr)
    return 0


def tilde_paths(value: Any, home: str) -> Any:
    """``value`` with the home folder (``home``, and its resolved spelling when a link leads there)
    written ``~`` in every string, wherever it appears: values, dictionary keys, free text (notes).

    A home folder is replaced where it ends a path component (followed by a separator, the end, or
    a character no file name continues with), so ``/home/al`` leaves ``/home/alice`` alone."""
    pattern = _home_pattern(home)
    return value if pattern is None else _tilde(value, pattern)


def _home_pattern(home: str) -> re.Pattern | None:
    homes = {h.rstrip("/\\") for h in (home, os.path.realpath(home) if home else "")}
    homes = sorted((h for h in homes if h), key=len, reverse=True)
    if not homes:
        return None
    return re.compile("(?:" + "|".join(map(re.escape, homes)) + r")(?![^\s/\\'\"`:;,)\]}>])")


def _tilde(value: Any, pattern: re.Pattern) -> Any:
    if isinstance(value, str):
        return pattern.sub("~", value)
    if isinstance(value, dict):
        return {_tilde(k, pattern): _tilde(v, pattern) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tilde(v, pattern) for v in value]
    return value
