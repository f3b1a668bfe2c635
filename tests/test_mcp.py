"""``gpumagic mcp``, driven by the MCP SDK's own client over stdio: the tools, their JSON, their errors.

One server process answers every call of a module-scoped session (starting one costs seconds);
the run history it reads is a real one, recorded in a temporary GPUMAGIC_HOME before it starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracebuilder import DATA

from gpumagic.analysis.explain import finding_ids
from gpumagic.shells.mcp_server import sdk_available

#: The tests that talk to a server need the SDK; the one for its absence runs everywhere.
needs_sdk = pytest.mark.skipif(not sdk_available(), reason="the MCP SDK 2 (pip install 'gpumagic[mcp]') is not installed")

BERT = os.path.join(DATA, "h100_bert_small_inference.json.gz")
RESNET = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
TOOLS = {"analyze_trace", "analyze_job", "compare_runs", "list_runs", "show_run", "explain_finding"}
#: Seconds any one request may take before the test fails (an analysis of a small trace takes ~1 s).
READ_TIMEOUT_S = 120


def _digest(paths) -> dict[str, str]:
    return {str(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


async def _session(env: dict[str, str], calls: list[tuple[str, dict]]) -> tuple[list, list]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "gpumagic", "mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write, read_timeout_seconds=READ_TIMEOUT_S) as s:
        await s.initialize()
        tools = (await s.list_tools()).tools
        results = [await s.call_tool(name, args) for name, args in calls]
    return tools, results


def serve(home: Path, calls: list[tuple[str, dict]]) -> tuple[list, list]:
    import anyio  # installed with mcp

    env = {**os.environ, "GPUMAGIC_HOME": str(home)}
    return anyio.run(_session, env, calls)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A history with runs 'base' (two: BERT then ResNet, so base@2 is BERT) and 'bert'."""
    from gpumagic.analysis import analyze
    from gpumagic.tuning import runs

    home = tmp_path_factory.mktemp("mcp-home")
    before = os.environ.get("GPUMAGIC_HOME")
    os.environ["GPUMAGIC_HOME"] = str(home)
    try:
        runs.record(analyze(BERT), label="base")
        runs.record(analyze(RESNET), label="base")
        runs.record(analyze(BERT), label="bert")
    finally:
        if before is None:
            os.environ.pop("GPUMAGIC_HOME", None)
        else:
            os.environ["GPUMAGIC_HOME"] = before
    return home


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from jobbuilder import build_job

    folder = tmp_path_factory.mktemp("mcp-job")
    build_job(folder, ranks=2)
    return folder


CALLS = {
    "trace": ("analyze_trace", {"path": BERT, "label": "from-mcp"}),
    "example": ("analyze_trace", {"path": "example"}),
    "job": ("analyze_job", {"folder": "JOB", "jobs": 1}),
    "job_glob": ("analyze_job", {"paths": ["JOB/rank*.json.gz"], "jobs": 1}),
    "compare_labels": ("compare_runs", {"before": "base@2", "after": "base"}),
    "compare_paths": ("compare_runs", {"before": BERT, "after": RESNET}),
    "list": ("list_runs", {}),
    "list_label": ("list_runs", {"label": "base", "last": 1}),
    "show": ("show_run", {"run": "bert"}),
    "explain": ("explain_finding", {"id": "host-sync"}),
    # errors: each one a tool error, after which the server goes on answering
    "missing_file": ("analyze_trace", {"path": "/no/such/trace.json"}),
    "stdin": ("analyze_trace", {"path": "-"}),
    "extra_argument": ("analyze_trace", {"path": BERT, "steps": "1:3"}),
    "no_path": ("analyze_trace", {}),
    "bad_label": ("show_run", {"run": "nope"}),
    "bad_nth": ("show_run", {"run": "base@9"}),
    "bad_compare": ("compare_runs", {"before": "nope", "after": "base"}),
    "unknown_id": ("explain_finding", {"id": "gpu-too-slow"}),
    "job_both": ("analyze_job", {"folder": "JOB", "paths": [BERT]}),
    "empty_job": ("analyze_job", {"folder": "EMPTY"}),
    "unknown_tool": ("rm_runs", {"run": "base"}),
    "after_errors": ("show_run", {"run": "r1"}),
}


@pytest.fixture(scope="module")
def session(history, job, tmp_path_factory):
    """The tools listed and every call of :data:`CALLS` answered, in one server session."""
    empty = tmp_path_factory.mktemp("mcp-empty-job")
    watched = [BERT, RESNET, *(Path(job).iterdir()), history / "history.sqlite3"]
    before = _digest(watched)
    mtime = (history / "history.sqlite3").stat().st_mtime_ns
    def placed(v):
        if isinstance(v, list):
            return [placed(x) for x in v]
        return v.replace("JOB", str(job)).replace("EMPTY", str(empty)) if isinstance(v, str) else v

    calls = [(name, {k: placed(v) for k, v in args.items()}) for name, args in CALLS.values()]
    tools, results = serve(history, calls)
    return {"tools": tools, "results": dict(zip(CALLS, results)), "unchanged": _digest(watched) == before,
            "history_mtime_same": (history / "history.sqlite3").stat().st_mtime_ns == mtime}


def ok(session, key) -> dict:
    result = session["results"][key]
    assert not result.is_error, result.content[0].text
    assert json.loads(result.content[0].text) == result.structured_content  # the same JSON as text, for text-only clients
    return result.structured_content


def error(session, key) -> str:
    result = session["results"][key]
    assert result.is_error and result.structured_content is None
    (text,) = [c.text for c in result.content]
    assert text.startswith("gpumagic: error: ") and "\n" not in text and "Traceback" not in text
    return text


def cli_json(*argv: str, home: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "gpumagic", *argv, "--format", "json"], capture_output=True, text=True,
                         check=True, env={**os.environ, "GPUMAGIC_HOME": str(home)})
    return json.loads(out.stdout)


@needs_sdk
def test_lists_the_six_tools_each_with_an_input_and_an_output_schema(session):
    tools = {t.name: t for t in session["tools"]}
    assert set(tools) == TOOLS
    for t in tools.values():
        assert t.input_schema["type"] == "object" and t.input_schema["additionalProperties"] is False
        assert t.output_schema is not None and t.output_schema["type"] == "object"
        assert t.description and t.annotations.read_only_hint and not t.annotations.open_world_hint
    assert tools["analyze_trace"].input_schema["required"] == ["path"]
    assert set(tools["explain_finding"].input_schema["properties"]["id"]["enum"]) == set(finding_ids())


@needs_sdk
def test_analyze_trace_gives_the_json_of_the_command_line(session, history):
    report = ok(session, "trace")
    assert report == cli_json("analyze", BERT, "--label", "from-mcp", home=history)
    assert report["label"] == "from-mcp" and report["schema_version"] >= 2
    assert ok(session, "example")["findings"], "the bundled example has findings"


@needs_sdk
def test_analyze_job_gives_the_job_report(session, job, history):
    data = ok(session, "job")
    assert data == cli_json("analyze", str(job), "-j", "1", home=history)
    assert data["job"]["world_size"] == 2 and data["job"]["analysed"] == 2
    assert ok(session, "job_glob") == data


@needs_sdk
def test_compare_runs_by_label_and_by_path(session, history):
    by_label = ok(session, "compare_labels")
    assert by_label == cli_json("runs", "compare", "base@2", "base", home=history)
    by_path = ok(session, "compare_paths")
    assert by_path == cli_json("compare", BERT, RESNET, home=history)
    # base@2 is the BERT run, base the ResNet one: the same pair either way
    assert by_label["step_time_ratio"] == pytest.approx(by_path["step_time_ratio"])


@needs_sdk
def test_list_runs_and_show_run_read_the_history(session, history):
    listed = ok(session, "list")
    assert [(r["ref"], r["label"]) for r in listed["runs"]] == [("r1", "base"), ("r2", "base"), ("r3", "bert")]
    assert listed["where"] == str(history / "history.sqlite3")
    assert [r["ref"] for r in ok(session, "list_label")["runs"]] == ["r2"]
    assert ok(session, "show") == cli_json("runs", "show", "bert", home=history)


@needs_sdk
def test_explain_finding_reads_the_rule(session):
    from gpumagic.analysis.rules.sync import BLOCKED_FRAC, DOC

    e = ok(session, "explain")
    assert e["id"] == "host-sync" and e["rule"] == "gpumagic.analysis.rules.sync.host_sync"
    assert e["signal"] and e["threshold"] and e["gain"] and e["false_positives"] and e["why"]
    assert {k: e["thresholds"][0][k] for k in ("name", "value")} == {"name": "BLOCKED_FRAC", "value": BLOCKED_FRAC}
    assert "run-to-run noise" in e["thresholds"][0]["source"]
    assert DOC in e["sources"] and e["fixes"][0]["flavor"] == "pytorch"


@needs_sdk
def test_bad_inputs_are_tool_errors_and_the_server_goes_on(session, history):
    assert "/no/such/trace.json" in error(session, "missing_file")
    assert "standard input" in error(session, "stdin")
    assert "steps" in error(session, "extra_argument")
    assert "'path' is a required property" in error(session, "no_path")
    assert "'nope'" in error(session, "bad_label")
    assert "base@9" in error(session, "bad_nth")
    assert "'nope'" in error(session, "bad_compare")
    assert "gpu-too-slow" in error(session, "unknown_id")
    assert "not both" in error(session, "job_both")
    assert error(session, "empty_job")
    assert "rm_runs" in error(session, "unknown_tool")
    assert ok(session, "after_errors") == cli_json("runs", "show", "r1", home=history)


@needs_sdk
def test_nothing_is_written(session):
    """Trace files, rank files and the history are read, never written (no run is recorded)."""
    assert session["unchanged"] and session["history_mtime_same"]


@needs_sdk
def test_an_empty_home_stays_empty(tmp_path):
    """Reading the history of a home that has none creates nothing."""
    _, (listed, shown) = serve(tmp_path, [("list_runs", {}), ("show_run", {"run": "r1"})])
    assert not listed.is_error and listed.structured_content["runs"] == []
    assert shown.is_error and "empty" in shown.content[0].text
    assert list(tmp_path.iterdir()) == []


def test_without_the_sdk_one_line_and_exit_2():
    code = ("import sys; sys.modules['mcp'] = sys.modules['mcp_types'] = None\n"
            "from gpumagic.shells.cli import main\nsys.exit(main(['mcp']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == ["gpumagic: error: gpumagic mcp needs the MCP Python SDK: pip install 'gpumagic[mcp]'"]
