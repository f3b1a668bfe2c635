"""No escape sequence or control character from a trace reaches a terminal through the text views.

Kernel, operator, device and label names here carry a window-title sequence (OSC), a screen
clear (CSI), an 8-bit CSI, a carriage return, a bell and a NUL; the text report, the comparison
and the CLI must print none of them (line breaks of the layout excepted).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tracebuilder import TraceBuilder, busy_steps

from gpumagic import analyze, compare
from gpumagic.render.terminal import printable, printable_lines
from gpumagic.shells.cli import main
from gpumagic.trace.kineto import from_bytes

TITLE = "\x1b]0;owned\x07"
CLEAR = "\x1b[2J\x1b[H"
HOSTILE = [TITLE, CLEAR, "\x9b31m", "\r", "\x07", "\x00", "\x1bc", "\x85", "\t", "\n"]
#: Anything a terminal acts on, except the layout's own line breaks.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def hostile(name: str) -> str:
    return "".join(f"{h}{name}{i}" for i, h in enumerate(HOSTILE))


def hostile_trace(path) -> str:
    tb = TraceBuilder(gpu_name=hostile("GPU"))
    busy_steps(tb, 6, 10_000.0, 2_000.0, kernel_name=hostile("kernel"))
    for i in range(6):  # many short ops between steps: launch-bound and host findings quote names
        tb.op(hostile("aten::op"), i * 10_000.0 + 50.0, 30.0)
        tb.runtime(hostile("cudaStreamSynchronize"), i * 10_000.0 + 100.0, 5_000.0)
    return tb.write(path)


def assert_terminal_safe(text: str) -> None:
    assert "\x1b" not in text
    assert CONTROL.search(text) is None, repr(CONTROL.search(text))


@pytest.mark.parametrize("raw, expected", [
    (TITLE + "name", "name"), (CLEAR + "name", "name"), ("a\nb\tc", "a b c"), ("\x9b2Jx\x9d0;t\x9cy", "xy"),
    ("ünï → ✓", "ünï → ✓"), ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),
])
def test_printable(raw, expected):
    assert printable(raw) == expected


def test_printable_lines_keeps_the_layouts_line_breaks():
    assert printable_lines("a\x1b[31m\nb\x07\n") == "a\nb\n"


def test_the_text_report_prints_no_control_characters(tmp_path):
    report = analyze(from_bytes(Path(hostile_trace(tmp_path / "t.json")).read_bytes(), hostile("label")),
                     label=hostile("label"))
    text = report.to_text()
    assert_terminal_safe(text)
    assert "kernel" in text and "label" in text  # the names are still there, without the sequences


def test_the_cli_prints_no_control_characters(tmp_path, capsys):
    assert main(["analyze", hostile_trace(tmp_path / "t.json"), "--label", hostile("cli")]) == 0
    assert_terminal_safe(capsys.readouterr().out)


def test_the_comparison_prints_no_control_characters(tmp_path, capsys):
    path = hostile_trace(tmp_path / "t.json")
    other = TraceBuilder(gpu_name=hostile("GPU2"))
    busy_steps(other, 6, 8_000.0, 2_000.0, kernel_name=hostile("k2"))
    other_path = other.write(tmp_path / "u.json")
    a = analyze(from_bytes(Path(path).read_bytes(), "a"), label=hostile("before"))
    b = analyze(from_bytes(Path(other_path).read_bytes(), "b"), label=hostile("after"))
    assert_terminal_safe(compare(a, b).to_text())
    assert main(["compare", path, other_path]) == 0
    assert_terminal_safe(capsys.readouterr().out)


def test_the_job_report_prints_no_control_characters_from_file_names_or_devices(tmp_path, capsys):
    """Rank file names are the user's (any byte but "/" and NUL), device names the trace's: neither
    reaches the terminal raw in the job's text, nor its HTML (issue 24, class 9)."""
    from gpumagic.jobs import analyze_job

    names = [tmp_path / f"rank{i}{TITLE}{CLEAR}\r\x07\x1bc\n.json" for i in range(2)]
    for name in names:
        hostile_trace(name)
    (tmp_path / "broken\x1b]0;x\x07\n.json").write_text("{")  # a failed rank's error quotes its name
    job = analyze_job([str(p) for p in names] + [str(tmp_path / "broken\x1b]0;x\x07\n.json")], jobs=1)
    assert_terminal_safe(job.to_text())
    assert main(["analyze", str(tmp_path), "-j", "1"]) == 0
    assert_terminal_safe(capsys.readouterr().out)
    html = job.to_html()
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", html)
    assert "GPU" in html
