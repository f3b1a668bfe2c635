"""``gpumagic`` command line: ``gpumagic analyze PATH [--format text|json|html] [-o FILE]``.

Exit status: 0 on success, 2 on bad input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from gpumagic.errors import GpumagicError

EXAMPLE = "example"
#: Exit status when standard output's reader closed the pipe early: 128 + SIGPIPE (13), what a
#: shell reports for a program that signal ended.
PIPE_CLOSED_STATUS = 141
#: Exit status after Ctrl-C: 128 + SIGINT (2).
INTERRUPTED_STATUS = 130


def example_trace_path() -> str:
    """The bundled example trace (ResNet-50 on a V100 with ``num_workers=0``)."""
    return os.path.join(os.path.dirname(__file__), "examples", "resnet50_v100_workers0.json.gz")


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return n


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpumagic", description="Why is my GPU waiting? Analyse PyTorch profiler traces.")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="analyse a Kineto trace (.json, .json.gz) or a gpumagic bundle")
    a.add_argument("path", help=f"trace file, or '{EXAMPLE}' for the bundled example")
    a.add_argument("--format", choices=("text", "json", "html"), default="text")
    a.add_argument("-o", "--output", help="write to this file instead of standard output")
    a.add_argument("--label", default="", help="name this run in the report")
    a.add_argument("-j", "--jobs", type=_jobs, default=0, metavar="N",
                   help="processes that decode a large trace side by side (default: one per core; 1: none)")
    from gpumagic.compare_cli import add_compare_parser

    add_compare_parser(sub)
    return p


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


class _ReadAhead(threading.Thread):
    """Read (and gunzip) a trace file on a helper thread; :meth:`result` returns its bytes or
    raises its :class:`~gpumagic.errors.TraceError` on the calling thread."""

    def __init__(self, path: str, mutable: bool) -> None:
        super().__init__(name="gpumagic-read", daemon=True)
        self.path = path
        self.mutable = mutable
        self._raw: bytearray | None = None
        self._error: GpumagicError | None = None
        self.start()

    def run(self) -> None:
        from gpumagic.trace.files import read_bytes

        try:
            self._raw = read_bytes(self.path, mutable=self.mutable)
        except GpumagicError as exc:
            self._error = exc

    def result(self) -> bytearray:
        self.join()
        if self._error is not None:
            raise self._error
        raw, self._raw = self._raw, None
        return raw


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "compare":
        from gpumagic.compare_cli import run_compare

        return run_compare(args)
    path = example_trace_path() if args.path == EXAMPLE else args.path
    from gpumagic.trace.pieces import available_workers

    workers = args.jobs or available_workers()
    # gunzip (which releases the GIL) while numpy & co. are imported; into a bytearray when the
    # text may be cut into pieces in place
    reading = _ReadAhead(path, mutable=workers > 1)
    from gpumagic.analysis import analyze
    from gpumagic.trace.kineto import from_bytes

    return emit(lambda: analyze(from_bytes(reading.result(), path, workers=workers), label=args.label),
                args.format, args.output, "report")


def run() -> None:
    """The console script: :func:`main`, then leave without tearing the interpreter down.

    Freeing every object of a large analysis one by one at exit takes longer than the output
    needs; everything is written and flushed by then, so the process ends at once.
    """
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
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
