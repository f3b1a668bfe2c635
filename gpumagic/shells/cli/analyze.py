"""``gpumagic analyze PATH [--format text|json|html] [-o FILE] [--label NAME] [-j N]``."""

from __future__ import annotations

import argparse
import threading

from gpumagic.shells.cli._output import EXAMPLE, FORMATS, STDIN, emit, trace_path


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
    a = subparsers.add_parser("analyze", help="analyse a Kineto trace (.json, .json.gz) or a gpumagic bundle")
    a.add_argument("path", help=f"trace file, '{STDIN}' for standard input, or '{EXAMPLE}' for the bundled example")
    a.add_argument("--format", choices=FORMATS, default="text")
    a.add_argument("-o", "--output", help="write to this file instead of standard output")
    a.add_argument("--label", default="", help="name this run in the report")
    a.add_argument("-j", "--jobs", type=_jobs, default=0, metavar="N",
                   help="processes that decode a large trace side by side (default: one per core; 1: none)")
    a.set_defaults(handler=run)
    return a


class _ReadAhead(threading.Thread):
    """Read (and gunzip) a trace file on a helper thread; :meth:`result` returns its bytes or
    raises its error (a :class:`~gpumagic.errors.TraceError`, or anything unforeseen such as a
    MemoryError) on the calling thread."""

    def __init__(self, path: str, mutable: bool) -> None:
        super().__init__(name="gpumagic-read", daemon=True)
        self.path = path
        self.mutable = mutable
        self._raw: bytearray | None = None
        self._error: Exception | None = None
        self.start()

    def run(self) -> None:
        from gpumagic.trace.files import read_bytes

        try:  # "-" reads standard input, bounded like any file (gpumagic.trace.files)
            self._raw = read_bytes(self.path, mutable=self.mutable)
        except Exception as exc:  # raised on the calling thread by result(), never printed here
            self._error = exc

    def result(self) -> bytearray:
        self.join()
        if self._error is not None:
            raise self._error
        raw, self._raw = self._raw, None
        return raw


def run(args: argparse.Namespace) -> int:
    """Analyse one trace and write the report; 2 with one stderr line on bad input."""
    path = trace_path(args.path)
    from gpumagic.trace.pieces import available_workers

    workers = args.jobs or available_workers()
    # gunzip (which releases the GIL) while numpy & co. are imported; into a bytearray when the
    # text may be cut into pieces in place
    reading = _ReadAhead(path, mutable=workers > 1)
    from gpumagic.analysis import analyze
    from gpumagic.trace.files import display_name
    from gpumagic.trace.kineto import from_bytes

    return emit(lambda: analyze(from_bytes(reading.result(), display_name(path), workers=workers), label=args.label),
                args.format, args.output, "report", protect=[path])
