"""``gpumagic mcp``: the reports, comparisons and run history as Model Context Protocol tools.

A coding agent (an editor's, or JupyterLab's) starts ``gpumagic mcp`` and talks to it over the
process's standard input and output; nothing else is opened — no socket, no network. Tools:

- ``analyze_trace``: one trace file → its report;
- ``analyze_job``: one trace per rank (files, folders, glob patterns) → the job report;
- ``compare_runs``: two runs of the history (``LABEL``, ``LABEL@N``, ``r<id>``) or trace files → the comparison;
- ``list_runs``: the run history's rows (``gpumagic runs list``);
- ``show_run``: one run's report (``gpumagic runs show RUN``);
- ``explain_finding``: a finding id → what it means, its signal, thresholds, fixes and sources.

Every tool declares a JSON Schema for its input, and answers with structured content: the same
JSON that ``--format json`` prints (``Report.to_dict()``, the job report's and the comparison's
``to_dict()``), also given as text for clients that read only text. A bad input (a missing file,
an unknown run, a wrong argument) is a tool error (``isError``) with one line saying why; the
server goes on. Paths are only read, never written (the history is read too: these tools record
no run). Relative paths are relative to the folder the server was started in.

The tools themselves (:data:`TOOLS`, :func:`call`) need only ``jsonschema`` (to check inputs);
:func:`serve` needs the official MCP Python SDK, version 2 (``pip install 'gpumagic[mcp]'``, which
brings ``jsonschema`` too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpumagic import __version__
from gpumagic.errors import GpumagicError

SERVER_NAME = "gpumagic"
MCP_INSTALL_HINT = "gpumagic mcp needs the MCP Python SDK: pip install 'gpumagic[mcp]'"
INSTRUCTIONS = (
    "gpumagic analyses PyTorch profiler (Kineto) traces: why the GPU waits, and what to change. "
    "analyze_trace gives a report whose findings are sorted by estimated gain (est_gain, a fraction of step time), "
    "mistakes in what the code computes (no speed gain: a new optimizer each step, gradients never reset) first; "
    "each finding has evidence, fixes (code) and a doc_url. explain_finding tells what a finding id means. "
    "Runs recorded with %%gpuprofile --label NAME are in the history: list_runs, show_run, compare_runs."
)
#: The path that names the bundled example trace, as on the command line.
EXAMPLE = "example"
#: How many runs ``list_runs`` gives when not told (the newest ones).
DEFAULT_LAST_RUNS = 50


class ToolInputError(GpumagicError):
    """A tool's arguments do not fit its input schema."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, what it does, its input schema, the kind of JSON it returns, and its code."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    output_kind: str
    run: Callable[[dict[str, Any]], dict[str, Any]]


def _output_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of a tool's structured output of ``kind`` (``report``, ``job``, ``comparison``,
    ``history``, ``finding``): the published schema (``gpumagic schema KIND``, generated from the
    typed records) for the kinds that have one; a described JSON object for the others."""
    from gpumagic.shells.cli.schema import SCHEMAS, schema

    if kind in SCHEMAS:
        published = dict(schema(kind))
        published.setdefault("type", "object")  # MCP wants an object at the root (beside the $ref)
        return published
    return {"type": "object", "description": f"gpumagic {kind} (the JSON of --format json)"}


# -- the tools ----------------------------------------------------------------------------------


def _readable_path(path: str) -> str:
    """A trace path an agent gave: ``~`` expanded, ``example`` the bundled trace; standard input refused."""
    if path == "-":
        raise ToolInputError("'-' (standard input) cannot be read here: standard input carries the MCP messages")
    if path == EXAMPLE and not os.path.exists(path):
        from gpumagic import examples

        return str(examples.trace_path())
    return os.path.expanduser(path)


def _as_json(obj: Any) -> dict[str, Any]:
    """The object's JSON exactly as ``--format json`` prints it (NaN refused, as there)."""
    return json.loads(obj.to_json(indent=None))


def analyze_trace(args: dict[str, Any]) -> dict[str, Any]:
    from gpumagic.analysis import analyze

    return _as_json(analyze(_readable_path(args["path"]), label=args.get("label", "")))


def analyze_job(args: dict[str, Any]) -> dict[str, Any]:
    from gpumagic.jobs import analyze_job as analyze
    from gpumagic.jobs import rank_files

    given = args.get("paths") or ([args["folder"]] if args.get("folder") else [])
    if not given or ("paths" in args and "folder" in args):
        raise ToolInputError("give either paths (trace files, folders or glob patterns) or folder, not both")
    files = rank_files([_readable_path(p) for p in given])
    return _as_json(analyze(files, jobs=args.get("jobs"), label=args.get("label", "")))


def compare_runs(args: dict[str, Any]) -> dict[str, Any]:
    from gpumagic.tuning.comparison import compare

    before, after = (_run_or_path(args[k]) for k in ("before", "after"))
    for name in (before, after):
        if not os.path.exists(name) and not _history_exists():
            raise GpumagicError(f"{name!r} is neither a trace file nor a run: the run history is empty")
    return _as_json(compare(before, after))


def _history_exists() -> bool:
    """Whether there is a run history to read (these tools never create one)."""
    from gpumagic.tuning import runs

    path = runs.store().path
    return path is None or path.exists()


def _run_or_path(name: str) -> str:
    """A run name stays a string (compare() tells runs from files); a path gets ``~`` expanded."""
    if name == "-":
        return _readable_path(name)
    expanded = os.path.expanduser(name)
    return expanded if expanded != name and os.path.exists(expanded) else name


def list_runs(args: dict[str, Any]) -> dict[str, Any]:
    from gpumagic.tuning import runs
    from gpumagic.tuning.history import History

    store = runs.store()
    if not _history_exists():
        return History(runs=[], where=str(store.path)).to_dict()
    rows = store.runs(label=args.get("label"), limit=args.get("last", DEFAULT_LAST_RUNS))
    history = History(runs=rows[::-1], where=str(store.path) if store.path is not None else "")
    return history.to_dict()


def show_run(args: dict[str, Any]) -> dict[str, Any]:
    from gpumagic.tuning import runs

    if not _history_exists():
        raise GpumagicError(f"no run is called {args['run']!r}: the run history is empty")
    return _as_json(runs.get(args["run"]))


def explain_finding(args: dict[str, Any]) -> dict[str, Any]:
    from gpumagic.analysis.explain import explain

    return explain(args["id"])


def _finding_ids() -> list[str]:
    from gpumagic.analysis.explain import finding_ids

    return sorted(finding_ids())


_LABEL = {"type": "string", "description": "name the run in the report (as --label)"}
_RUN = ("a run of the history — LABEL (its latest run), LABEL@N (its N-th most recent), r<id> — "
        "or a trace file")


def _tools() -> dict[str, ToolSpec]:
    specs = (
        ToolSpec("analyze_trace", "Analyse a trace",
                 "Analyse one PyTorch profiler trace (Kineto .json / .json.gz, or a gpumagic bundle) into a report: "
                 "metrics, and findings sorted by estimated gain (mistakes in what the code computes first), "
                 "each with evidence, fixes and a link. "
                 "'example' is the bundled example trace. Same JSON as `gpumagic analyze PATH --format json`.",
                 {"type": "object", "properties": {
                     "path": {"type": "string", "minLength": 1, "description": "trace file (relative to the server's folder, ~ allowed)"},
                     "label": _LABEL},
                  "required": ["path"], "additionalProperties": False},
                 "report", analyze_trace),
        ToolSpec("analyze_job", "Analyse a distributed job",
                 "Analyse a distributed job, one trace per rank: per-rank summaries, stragglers and the findings "
                 "shared by ranks. Same JSON as `gpumagic analyze DIR --format json`.",
                 {"type": "object", "properties": {
                     "paths": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1},
                               "description": "rank trace files, folders of them, or glob patterns"},
                     "folder": {"type": "string", "minLength": 1, "description": "a folder of rank traces"},
                     "jobs": {"type": "integer", "minimum": 1, "description": "processes analysing ranks side by side "
                                                                             "(default: one per core)"},
                     "label": _LABEL},
                  "additionalProperties": False},
                 "job", analyze_job),
        ToolSpec("compare_runs", "Compare two runs",
                 "What changed between a run before a change and the run after it: step time, GPU busy, breakdown, "
                 "findings resolved / new / persisting. Same JSON as `gpumagic runs compare A B --format json`.",
                 {"type": "object", "properties": {
                     "before": {"type": "string", "minLength": 1, "description": _RUN},
                     "after": {"type": "string", "minLength": 1, "description": _RUN}},
                  "required": ["before", "after"], "additionalProperties": False},
                 "comparison", compare_runs),
        ToolSpec("list_runs", "List the run history",
                 "The runs kept in the run history (by %%gpuprofile --label, gpumagic.profile(label=...), "
                 "GpuProfileCallback(label=...)), oldest first: id (ref r<id>), label, when, device, median step "
                 "time, GPU busy share, top finding.",
                 {"type": "object", "properties": {
                     "label": {"type": "string", "description": "only the runs with this label"},
                     "last": {"type": "integer", "minimum": 1, "description": f"only the N newest runs (default {DEFAULT_LAST_RUNS})"}},
                  "additionalProperties": False},
                 "history", list_runs),
        ToolSpec("show_run", "Show a run's report",
                 "The report of one run of the history. Same JSON as `gpumagic runs show RUN --format json`.",
                 {"type": "object", "properties": {
                     "run": {"type": "string", "minLength": 1, "description": "LABEL, LABEL@N or r<id>"}},
                  "required": ["run"], "additionalProperties": False},
                 "report", show_run),
        ToolSpec("explain_finding", "Explain a finding",
                 "What a finding id means, read from the rule that reports it: its signal, threshold, how the gain "
                 "is estimated, known false positives, the named thresholds with their sources, the fixes it can "
                 "suggest, and documentation links.",
                 {"type": "object", "properties": {
                     "id": {"type": "string", "enum": _finding_ids(), "description": "a finding id, e.g. host-sync"}},
                  "required": ["id"], "additionalProperties": False},
                 "finding", explain_finding),
    )
    return {s.name: s for s in specs}


TOOLS = _tools()


def _check_input(spec: ToolSpec, arguments: dict[str, Any]) -> None:
    """Refuse arguments that do not fit the tool's input schema, in one line."""
    try:
        from jsonschema import Draft202012Validator
    except ImportError:
        raise GpumagicError(MCP_INSTALL_HINT) from None

    errors = sorted(Draft202012Validator(spec.input_schema).iter_errors(arguments), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        where = ".".join(str(p) for p in err.path)
        raise ToolInputError(f"{spec.name}: {where + ': ' if where else ''}{err.message}")


def call(name: str, arguments: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """Run tool ``name``: ``(structured result, "")``, or ``(None, one line saying why)`` when it fails.

    Never raises for a bad input or a failing analysis, so that the server outlives every call.
    """
    from gpumagic.shells.cli._output import error_line

    spec = TOOLS.get(name)
    if spec is None:
        return None, f"gpumagic: error: no tool is called {name!r}; the tools are: {', '.join(TOOLS)}"
    arguments = dict(arguments or {})
    try:
        _check_input(spec, arguments)
        return spec.run(arguments), ""
    except Exception as exc:  # any failure is the caller's answer, never the end of the server
        return None, error_line(exc)


# -- the server (the MCP SDK) ---------------------------------------------------------------------


def build_server():
    """The MCP low-level server with the tools of :data:`TOOLS` (needs the ``mcp`` package)."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    annotations = types.ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                                        open_world_hint=False)
    tools = [types.Tool(name=s.name, title=s.title, description=s.description, input_schema=s.input_schema,
                        output_schema=_output_schema(s.output_kind), annotations=annotations)
             for s in TOOLS.values()]

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx, params) -> types.CallToolResult:
        # analyses take seconds: a worker thread keeps the server answering (pings, other calls)
        result, error = await anyio.to_thread.run_sync(call, params.name, params.arguments)
        if result is None:
            return types.CallToolResult(content=[types.TextContent(text=error)], is_error=True)
        text = json.dumps(result, allow_nan=False)
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=result)

    return Server(SERVER_NAME, version=__version__, instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool)


def serve() -> None:
    """Serve the tools over standard input and output until the client closes them."""
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server()

    async def main() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(main)


def sdk_available() -> bool:
    """Whether the MCP SDK this server is written for (``mcp`` 2, with ``mcp_types``) is installed."""
    try:
        import mcp_types  # noqa: F401
        from mcp.server.lowlevel import Server  # noqa: F401
        from mcp.server.stdio import stdio_server  # noqa: F401
    except ImportError:
        return False
    return True


__all__ = ["TOOLS", "ToolSpec", "build_server", "call", "sdk_available", "serve"]
