"""``gpumagic schema [report|job|comparison|run] [-o FILE]``: the JSON Schema of a JSON output.

``report`` (the default) is what ``gpumagic analyze TRACE --format json`` prints, ``job`` what
``gpumagic analyze DIR --format json`` prints, ``comparison`` what ``gpumagic compare A B --format
json`` prints and ``run`` one line of ``gpumagic runs export``. Each is JSON Schema draft 2020-12,
generated from the typed records (docs/schema.md); the committed copies are docs/schema/KIND.schema.json.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from importlib import import_module
from typing import Any

from gpumagic.shells.cli._output import output_arg, write_output

#: kind -> "module:function" returning its schema (imported on use: each lives in its own layer).
SCHEMAS = {
    "report": "gpumagic.report.schema:report_schema",
    "job": "gpumagic.jobs.records:job_schema",
    "comparison": "gpumagic.tuning.records:comparison_schema",
    "run": "gpumagic.tuning.records:run_schema",
}


def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of ``kind`` (a key of :data:`SCHEMAS`)."""
    module, name = SCHEMAS[kind].split(":")
    make: Callable[[], dict[str, Any]] = getattr(import_module(module), name)
    return make()


def schema_text(kind: str) -> str:
    """:func:`schema` as the text ``gpumagic schema KIND`` prints (and docs/schema/ holds)."""
    return json.dumps(schema(kind), indent=2, ensure_ascii=False) + "\n"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``schema`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); returns it."""
    p = subparsers.add_parser(
        "schema", help="print the JSON Schema of a JSON output (report, job, comparison, run)",
        description="Print the JSON Schema (draft 2020-12) of one kind of gpumagic JSON output: report "
                    "(analyze TRACE), job (analyze DIR), comparison (compare A B) or run (a line of runs export).")
    p.add_argument("kind", nargs="?", choices=tuple(SCHEMAS), default="report")
    p.add_argument("-o", "--output", type=output_arg, help="write to this file instead of standard output (-: standard output)")
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print (or write) the schema; 0."""
    write_output(schema_text(args.kind), args.output)
    return 0
