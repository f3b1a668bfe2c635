"""``gpumagic`` command line: ``gpumagic analyze PATH [--format text|json|html] [-o FILE]``.

Exit status: 0 on success, 2 on bad input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gpumagic.errors import GpumagicError

EXAMPLE = "example"


def example_trace_path() -> str:
    """The bundled example trace (ResNet-50 on a V100 with ``num_workers=0``)."""
    return os.path.join(os.path.dirname(__file__), "examples", "resnet50_v100_workers0.json.gz")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpumagic", description="Why is my GPU waiting? Analyse PyTorch profiler traces.")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="analyse a Kineto trace (.json, .json.gz) or a gpumagic bundle")
    a.add_argument("path", help=f"trace file, or '{EXAMPLE}' for the bundled example")
    a.add_argument("--format", choices=("text", "json", "html"), default="text")
    a.add_argument("-o", "--output", help="write to this file instead of standard output")
    a.add_argument("--label", default="", help="name this run in the report")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "compare":
        from gpumagic.compare_cli import run_compare

        return run_compare(args)
    from gpumagic.analysis import analyze

    path = example_trace_path() if args.path == EXAMPLE else args.path
    try:
        report = analyze(path, label=args.label)
        write_output(render_as(report, args.format), args.output)
    except GpumagicError as exc:
        print(f"gpumagic: error: {exc}", file=sys.stderr)
        return 2
    if args.output:
        print(f"gpumagic: wrote {args.format} report to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
