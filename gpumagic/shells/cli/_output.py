"""What every subcommand shares: the bundled example, writing the result, and the exit-status contract.

Exit status: 0 on success, 2 on bad input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from gpumagic import examples
from gpumagic.errors import GpumagicError

EXAMPLE = "example"
#: Exit status when standard output's reader closed the pipe early: 128 + SIGPIPE (13), what a
#: shell reports for a program that signal ended.
PIPE_CLOSED_STATUS = 141
#: Exit status after Ctrl-C: 128 + SIGINT (2).
INTERRUPTED_STATUS = 130
FORMATS = ("text", "json", "html")


def trace_path(arg: str) -> str:
    """A trace path as given on the command line; ``example`` is the bundled example trace."""
    return str(examples.trace_path()) if arg == EXAMPLE else arg


def render_as(result, fmt: str) -> str:
    """A Report or Comparison as text, JSON or self-contained HTML."""
    if fmt == "json":
        return result.to_json() + "\n"
    if fmt == "html":
        return result.to_html()
    return result.to_text()


def write_output(text: str, output: str | None) -> None:
    """Write to ``output``, or to standard output when it is None; GpumagicError if it cannot."""
    if output is None:
        sys.stdout.write(text)
        return
    try:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise GpumagicError(f"{output}: cannot write ({exc.strerror or exc})") from None


def emit(produce: Callable[[], Any], fmt: str, output: str | None, what: str) -> int:
    """Write what ``produce()`` returns (a Report or Comparison) as ``fmt``: 0, or 2 with one
    line on stderr when the input is bad or the output cannot be written."""
    try:
        write_output(render_as(produce(), fmt), output)
    except GpumagicError as exc:
        print(f"gpumagic: error: {exc}", file=sys.stderr)
        return 2
    if output:
        print(f"gpumagic: wrote {fmt} {what} to {output}", file=sys.stderr)
    return 0
