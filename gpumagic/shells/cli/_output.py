"""What every subcommand shares: the bundled example, writing the result, and the exit-status contract.

Exit status: 0 on success, 2 on bad input (one line on stderr, never a traceback). ``-o FILE`` is
written through :func:`gpumagic._atomic.write_atomic` (whole or not at all, never over an input);
standard output that cannot be written (a full device) is exit 2 as well.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

from gpumagic import examples
from gpumagic._atomic import check_target, is_sink, write_atomic
from gpumagic.errors import GpumagicError, exception_text

EXAMPLE = examples.EXAMPLE
#: Exit status when standard output's reader closed the pipe early: 128 + SIGPIPE (13), what a
#: shell reports for a program that signal ended.
PIPE_CLOSED_STATUS = 141
#: Exit status after Ctrl-C: 128 + SIGINT (2).
INTERRUPTED_STATUS = 130
FORMATS = ("text", "json", "html")
#: A path argument that means standard input.
STDIN = "-"
#: The longest error line printed (a message quoting a huge value is cut there).
MAX_ERROR_CHARS = 400
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def output_arg(arg: str) -> str | None:
    """An ``-o`` argument: ``-`` is standard output (as for every Unix tool), not a file named ``-``."""
    return None if arg == "-" else arg


def trace_path(arg: str) -> str:
    """A trace path as given on the command line; ``example`` is the bundled example trace."""
    return examples.resolve(arg)


def render_as(result, fmt: str) -> str:
    """A Report or Comparison as text, JSON or self-contained HTML."""
    if fmt == "json":
        return result.to_json() + "\n"
    if fmt == "html":
        return result.to_html()
    return result.to_text()


def write_output(text: str, output: str | None, protect: Iterable[str] = ()) -> None:
    """Write to ``output`` (atomically, never over a file in ``protect``), or to standard output
    when it is None; GpumagicError in one sentence if it cannot."""
    if output is None:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            raise  # the reader went away: exit 141 (see gpumagic.shells.cli.run)
        except OSError as exc:  # e.g. /dev/full: ENOSPC
            raise GpumagicError(f"cannot write to standard output ({exc.strerror or exc})") from None
        return
    write_atomic(output, text, protect=protect)


def error_line(exc: BaseException) -> str:
    """``exc`` as one line for stderr: control characters and line breaks become spaces, and a
    very long message is cut."""
    text = _CONTROL.sub(" ", exception_text(exc)).strip() or type(exc).__name__
    if not isinstance(exc, GpumagicError):
        text = f"unexpected {type(exc).__name__}: {text}"
    return "gpumagic: error: " + (text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…")


def kept_files() -> list[str]:
    """What a user keeps that every ``-o`` must leave alone whatever the command read: the run
    history's database (its ``-wal``/``-shm``/``-journal`` side files follow in gpumagic._atomic)."""
    from gpumagic.tuning.home import kept_files as history_files

    return history_files()


def emit(produce: Callable[[], Any], fmt: str, output: str | None, what: str, protect: Iterable[str] = ()) -> int:
    """Write what ``produce()`` returns (a Report or Comparison) as ``fmt``: 0, or 2 with one
    line on stderr when the input is bad or the output cannot be written. ``protect`` lists the
    input files, which ``-o`` may never overwrite (the run history is added, see
    :func:`kept_files`, for an ``-o`` that names a path: standard output and a character device
    such as ``/dev/null`` replace no file); the target is checked before any work."""
    try:
        if output is not None:
            # a character device (/dev/null) is written in place and can be no kept file: the
            # history's folder (platformdirs) is looked up only for a path that may be one
            protect = [p for p in protect if p != STDIN] + ([] if is_sink(output) else kept_files())
            check_target(output, protect)
        write_output(render_as(produce(), fmt), output, protect)
    except GpumagicError as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    if output:
        print(f"gpumagic: wrote {fmt} {what} to {output}", file=sys.stderr)
    return 0
