"""The text report fits the reader's terminal: every line but a fix's code at most the width."""

from __future__ import annotations

import dataclasses

import pytest
from render_helpers import DATA, analysed
from tracebuilder import TraceBuilder

from gpumagic.analysis import analyze
from gpumagic.render._width import DEFAULT_WIDTH, MIN_WIDTH, terminal_width
from gpumagic.render.text import render_text

#: Every recorded trace of tests/data, not only those with golden renders.
TRACES = sorted(p.name.removesuffix(".json.gz") for p in DATA.glob("*.json.gz"))
WIDTHS = (60, 80, 100, 120)


def _code_lines(report) -> set[str]:
    return {line.strip() for f in report.findings for fix in f.fixes for line in fix.code.splitlines() if line.strip()}


def _too_wide(report, text: str, width: int) -> list[str]:
    code = _code_lines(report)
    return [line for line in text.splitlines() if len(line) > width and line.strip() not in code]


@pytest.mark.parametrize("name", TRACES)
def test_every_line_fits_every_width_except_code(name):
    report = analysed(name)
    for width in WIDTHS:
        text = render_text(report, width=width)
        assert _too_wide(report, text, width) == [], (name, width)
        for f in report.findings:  # code lines are never wrapped: each appears whole, as written
            for line in f.fixes and (ln for fix in f.fixes for ln in fix.code.splitlines() if ln.strip()):
                assert f"      {line}" in text.splitlines(), (name, width, line)


def test_long_kernel_names_are_shortened_not_wrapped():
    report = analysed("v100_large_216k_events")
    lines = render_text(report, width=60).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("TOP KERNELS"))
    rows = [line for line in lines[start + 2:] if line.startswith("  ") and not line.startswith("COPIES")][:8]
    assert rows and all(len(r) <= 60 for r in rows)
    assert any(r.endswith("\u2026") for r in rows), rows  # at least one name had to be cut


def test_the_width_comes_from_columns_else_the_terminal_else_100(monkeypatch):
    report = analysed("resnet50_v100_workers0")
    monkeypatch.setenv("COLUMNS", "72")
    assert terminal_width() == 72
    text = report.to_text()
    assert _too_wide(report, text, 72) == [] and _too_wide(report, text, 71) != []
    monkeypatch.setenv("COLUMNS", "20")  # narrower than the tables allow: the narrowest layout
    assert terminal_width() == MIN_WIDTH
    monkeypatch.delenv("COLUMNS")
    import shutil

    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(DEFAULT_WIDTH, 24): type("S", (), {"columns": 90})())
    assert terminal_width() == 90
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(DEFAULT_WIDTH, 24): type("S", (), {"columns": fallback[0]})())
    assert terminal_width() == DEFAULT_WIDTH == 100


def test_header_reads_as_phrases_with_and_without_findings():
    with_findings = render_text(analysed("resnet50_v100_workers0"), width=100).splitlines()
    assert "Fixing all could save about 51 % (estimate)" in with_findings[2]  # the loader gain is an estimate (issue 21)
    report = analysed("v100_resnet_ns_timestamps")  # its findings taken away: a run nothing is wrong with
    quiet = dataclasses.replace(report, findings=[], combined_gain=0.0)
    header = render_text(quiet, width=100).split("\n\n")[0]
    assert "Fixing all" not in header and "nothing found" not in header
    assert header.splitlines()[-1].startswith("No findings: nothing in this trace crossed")
    cpu = TraceBuilder(cc=None)
    cpu.op("aten::mm", 0, 100)
    cpu_header = render_text(analyze(cpu.to_dict()), width=100).split("\n\n")[0]
    assert "GPU not recorded" in cpu_header and "no GPU" not in cpu_header and "n/a" not in cpu_header
