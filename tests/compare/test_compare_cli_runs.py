"""``gpumagic compare`` (through gpumagic.shells.cli.compare) and the labelled-run registry."""

from __future__ import annotations

import argparse
import json
import os

import pytest
from tracebuilder import DATA

import gpumagic
from gpumagic.shells.cli.compare import add_parser as add_compare_parser
from gpumagic.tuning import runs

W0 = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
W4 = os.path.join(DATA, "resnet50_v100_workers4.json.gz")


@pytest.fixture(autouse=True)
def registry():
    """Labelled runs left by other tests must not change what the CLI reads."""
    runs.forget()
    runs.remember("missing.json", gpumagic.Report(metrics=None, findings=[], notes=[]))  # a label like a path
    yield runs
    runs.forget()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpumagic")
    add_compare_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_cli_json_to_file(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    assert main(["compare", W0, W4, "--format", "json", "-o", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["resolved"] == ["dataloader-bound"]
    assert 0.68 < d["step_time_ratio"] < 0.76
    assert capsys.readouterr().err == f"gpumagic: wrote json comparison to {out}\n"


def test_cli_text_to_stdout(capsys):
    assert main(["compare", W0, W4]) == 0
    assert capsys.readouterr().out.startswith("gpumagic comparison: resnet50_v100_workers0 → resnet50_v100_workers4\n")


def test_cli_html(tmp_path):
    out = tmp_path / "cmp.html"
    assert main(["compare", "example", W4, "--format", "html", "-o", str(out)]) == 0
    assert "dataloader-bound" in out.read_text()


@pytest.mark.parametrize("argv, message", [
    (["compare", "missing.json", W4], "gpumagic: error: missing.json: no such file\n"),
    (["compare", W0, W4, "-o", "/nonexistent-dir/x.txt"], "gpumagic: error: cannot write /nonexistent-dir/x.txt: the folder"),
])
def test_cli_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_cli_not_a_trace(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text("{not json")
    assert main(["compare", str(bad), W4]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpumagic: error: {bad}") and err.count("\n") == 1


def test_registry_remember_get_keep_every_run_forget(registry):
    registry.forget()
    r1 = gpumagic.analyze(W0)
    r2 = gpumagic.analyze(W4)
    first = registry.remember("before", r1)
    registry.remember("after", r2)
    assert registry.get("before") is r1
    assert registry.labels() == ["before", "after"]
    registry.remember("before", r2)  # a label used again: its latest run, the earlier one kept
    assert registry.get("before") is r2 and registry.get("before@1") is r2
    assert registry.get("before@2") is r1 and registry.get(first.ref) is r1
    assert registry.forget("before") == 2
    assert registry.forget("never-there") == 0
    assert registry.labels() == ["after"]


def test_registry_unknown_label_names_the_known_ones(registry):
    registry.forget()
    with pytest.raises(runs.UnknownRunError, match=r"no run is labelled 'x'; known labels: none yet"):
        registry.get("x")
    registry.remember("baseline", gpumagic.analyze(W0))
    with pytest.raises(LookupError) as info:
        registry.get("basline")
    assert str(info.value) == "no run is labelled 'basline'; known labels: 'baseline'"
    assert isinstance(info.value, gpumagic.GpumagicError)


def test_registry_rejects_bad_labels_and_values(registry):
    registry.forget()
    with pytest.raises(ValueError, match="non-empty string"):
        registry.remember("  ", gpumagic.analyze(W0))
    with pytest.raises(TypeError, match="not dict"):
        registry.remember("x", {"metrics": 1})

