"""The command line never destroys data and never shows a traceback.

``-o`` never writes over an input (same path, symlink, hard link), writes whole or not at all
(a file-size limit leaves the old file and no temporary file), standard output on a full device
is exit 2 with one line, ``-`` reads standard input, and any exception that escapes a
subcommand is exit 2 with one line.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tracebuilder import DATA

from gpumagic import analyze, compare, load_trace
from gpumagic._atomic import WriteError
from gpumagic.shells.cli import main

TRACE = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
OTHER = os.path.join(DATA, "resnet50_v100_workers4.json.gz")


def gpumagic(*args: str, stdin=None, stdout=subprocess.PIPE, preexec=None) -> subprocess.CompletedProcess:
    """The console entry point in a real process."""
    return subprocess.run([sys.executable, "-m", "gpumagic", *args], stdin=stdin, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=300, preexec_fn=preexec, check=False)


def assert_one_error_line(stderr: str, *fragments: str) -> None:
    assert stderr.startswith("gpumagic: error: ") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in stderr


@pytest.fixture
def trace_copy(tmp_path):
    path = tmp_path / "run.json.gz"
    shutil.copyfile(TRACE, path)
    return path


def _spellings(path, tmp_path) -> dict[str, str]:
    link = tmp_path / "link.json.gz"
    link.symlink_to(path)
    hard = tmp_path / "hard.json.gz"
    os.link(path, hard)
    return {"same": str(path), "relative": os.path.relpath(path), "symlink": str(link), "hardlink": str(hard)}


@pytest.mark.parametrize("spelling", ["same", "relative", "symlink", "hardlink"])
@pytest.mark.parametrize("command", ["analyze", "compare-before", "compare-after"])
def test_output_onto_an_input_is_refused(spelling, command, trace_copy, tmp_path, capsys):
    before = trace_copy.read_bytes()
    target = _spellings(trace_copy, tmp_path)[spelling]
    argv = {"analyze": ["analyze", str(trace_copy)], "compare-before": ["compare", str(trace_copy), OTHER],
            "compare-after": ["compare", OTHER, str(trace_copy)]}[command]
    assert main([*argv, "-o", target]) == 2
    assert_one_error_line(capsys.readouterr().err, "refusing to write over the input file")
    assert trace_copy.read_bytes() == before


def _limit_file_size(max_bytes: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return preexec


def test_a_write_cut_short_by_a_file_size_limit_leaves_the_old_output(tmp_path):
    out = tmp_path / "report.html"
    out.write_text("the previous report")
    r = gpumagic("analyze", TRACE, "--format", "html", "-o", str(out), preexec=_limit_file_size(64 * 1024))
    assert r.returncode == 2
    assert_one_error_line(r.stderr, "File too large")
    assert out.read_text() == "the previous report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no temporary file left


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("fmt", ["text", "json", "html"])
def test_standard_output_on_a_full_device(fmt):
    with open("/dev/full", "w") as full:
        r = gpumagic("analyze", TRACE, "--format", fmt, stdout=full)
    assert r.returncode == 2
    assert_one_error_line(r.stderr, "cannot write to standard output", "No space left on device")


@pytest.mark.parametrize("gz", [True, False])
def test_dash_reads_standard_input(gz, tmp_path):
    data = Path(TRACE).read_bytes()
    piped = tmp_path / "piped"
    piped.write_bytes(data if gz else gzip.decompress(data))
    with open(piped, "rb") as fh:
        r = gpumagic("analyze", "-", "--format", "json", stdin=fh)
    assert r.returncode == 0, r.stderr
    got, expected = json.loads(r.stdout), analyze(load_trace(TRACE)).to_dict()
    assert got["metrics"]["trace"].pop("source") == "<stdin>"
    expected["metrics"]["trace"].pop("source")
    assert got == json.loads(json.dumps(expected))


def test_empty_standard_input_is_one_line(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    with open(tmp_path / "empty", "rb") as empty:
        r = gpumagic("analyze", "-", stdin=empty)
    assert r.returncode == 2
    assert_one_error_line(r.stderr, "standard input is empty")


def test_any_exception_escaping_a_subcommand_is_exit_2_with_one_line(monkeypatch, capsys):
    import gpumagic.analysis

    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded\nwhile decoding")

    monkeypatch.setattr(gpumagic.analysis, "analyze", broken)
    assert main(["analyze", TRACE]) == 2
    assert_one_error_line(capsys.readouterr().err, "unexpected RecursionError", "maximum recursion depth")


def test_save_html_writes_whole_files_or_nothing(tmp_path, monkeypatch):
    report = analyze(load_trace(TRACE))
    comparison = compare(report, analyze(load_trace(OTHER)))
    for name, obj in (("r.html", report), ("c.html", comparison)):
        target = tmp_path / name
        target.write_text("old")
        with monkeypatch.context() as m:
            m.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
            with pytest.raises(WriteError, match="No space left on device"):
                obj.save_html(target)
        assert target.read_text() == "old"
        assert obj.save_html(target) == target and target.read_text().startswith("<!DOCTYPE html>")
        with pytest.raises(WriteError, match="does not exist"):
            obj.save_html(tmp_path / "missing" / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.html", "r.html"]


def test_an_unforeseen_error_while_reading_is_one_line_too(monkeypatch, capsys):
    import gpumagic.trace.files

    def out_of_memory(path, mutable=False, progress=None):
        raise MemoryError("cannot allocate")

    monkeypatch.setattr(gpumagic.trace.files, "read_bytes", out_of_memory)
    assert main(["analyze", TRACE]) == 2
    err = capsys.readouterr().err
    assert_one_error_line(err, "unexpected MemoryError")
    assert "Exception in thread" not in err
