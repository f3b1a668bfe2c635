"""Outputs never destroy inputs (issue 24, classes 2 and 10), on a real SQLite history and real files.

One rule in gpumagic._atomic: every writer passes every input it read (traces, rank files, the
history database), each resolved as the readers resolve it (``~``, ``file://`` URLs) and standing
for its SQLite side files too. Every ``-o`` of every subcommand is tried against every input it
could clobber; the input must come out byte for byte as it went in. An existing target keeps its
mode; a character device (``/dev/null``) is a valid output.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat

import pytest
from tracebuilder import DATA

import gpumagic
from gpumagic._atomic import SIDE_SUFFIXES, WriteError, local_path, write_atomic
from gpumagic.shells.cli import main
from gpumagic.tuning import history, runs

BERT = os.path.join(DATA, "h100_bert_small_inference.json.gz")


@pytest.fixture(scope="module")
def report():
    return gpumagic.analyze(BERT)


@pytest.fixture
def db(report, gpumagic_home):
    """A real run history with two runs, in WAL mode, its -wal and -shm side files present."""
    runs.record(report, label="base")
    runs.record(report, label="after")
    path = gpumagic_home / history.DB_NAME
    holder = sqlite3.connect(path)  # an open reader keeps -wal and -shm on disk, as a live kernel does
    holder.execute("SELECT COUNT(*) FROM runs").fetchone()
    assert runs.store().journal_mode == "wal"
    yield path
    holder.close()


def _snapshot(paths):
    return {str(p): p.read_bytes() for p in paths if p.exists()}


def _commands(target: str, trace: str) -> list[list[str]]:
    return [["runs", "export", "-o", target], ["runs", "show", "base", "-o", target],
            ["runs", "compare", "base", "after", "-o", target], ["compare", trace, trace, "-o", target],
            ["analyze", trace, "-o", target], ["runs", "show", "base", "--format", "json", "-o", target]]


@pytest.mark.parametrize("suffix", ["", *SIDE_SUFFIXES])
def test_no_output_replaces_the_history_or_its_side_files(db, suffix, tmp_path, capsys):
    trace = shutil.copy(BERT, tmp_path / "t.json.gz")
    files = [db, *(db.with_name(db.name + s) for s in SIDE_SUFFIXES)]
    before = _snapshot(files)
    assert str(db) in before and str(db) + "-wal" in before
    for argv in _commands(str(db) + suffix, str(trace)):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "refusing to write over the input file" in err and err.count("\n") == 1, (argv, err)
    assert _snapshot(files) == before
    assert [r.label for r in runs.store().runs()] == ["after", "base"]  # every run still there


def test_runs_compare_never_writes_over_a_trace_it_compares(db, tmp_path, capsys):
    a = shutil.copy(BERT, tmp_path / "a.json.gz")
    old = a.read_bytes()
    for argv in (["runs", "compare", str(a), "base", "-o", str(a)], ["runs", "compare", "base", str(a), "-o", str(a)]):
        assert main(argv) == 2
        assert "refusing to write over the input file" in capsys.readouterr().err
    assert a.read_bytes() == old


def test_an_input_spelled_as_a_file_url_is_protected(tmp_path, capsys):
    folder = tmp_path / "job dir"  # a space: %20 in the URL
    folder.mkdir()
    r0, r1 = (shutil.copy(BERT, folder / f"rank{i}.json.gz") for i in range(2))
    old = r0.read_bytes()
    url = "file://" + str(r0).replace(" ", "%20")
    assert local_path(url) == str(r0)
    assert main(["analyze", url, str(r1), "-j", "1", "-o", str(r0)]) == 2
    assert "refusing to write over the input file" in capsys.readouterr().err
    assert r0.read_bytes() == old
    with pytest.raises(WriteError, match="refusing"):
        write_atomic(r0, "x", protect=[url])
    assert local_path("s3://bucket/rank0.json.gz") is None and local_path("-") is None


def test_a_side_file_that_does_not_exist_yet_is_protected_by_name(tmp_path):
    base = tmp_path / "history.sqlite3"
    base.write_bytes(b"")
    for suffix in SIDE_SUFFIXES:
        with pytest.raises(WriteError, match="refusing"):
            write_atomic(str(base) + suffix, "x", protect=[base])
        assert not os.path.exists(str(base) + suffix)


def test_an_existing_target_keeps_its_mode(tmp_path, capsys):
    private = tmp_path / "report.txt"
    private.write_text("old")
    private.chmod(0o600)
    assert main(["analyze", BERT, "-o", str(private)]) == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and private.read_text() != "old"
    fresh = write_atomic(tmp_path / "new.txt", "x")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644


def test_the_null_device_is_an_output(tmp_path, capsys, db):
    for argv in (["analyze", BERT, "-o", os.devnull], ["runs", "export", "-o", os.devnull],
                 ["analyze", BERT, "--format", "html", "-o", os.devnull]):
        assert main(argv) == 0, argv
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # still the device, not a file renamed over it
    capsys.readouterr()
    if os.path.exists("/dev/full"):  # a sink that is full: one line, exit 2
        assert main(["analyze", BERT, "-o", "/dev/full"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "/dev/full" in err


def test_python_writers_never_replace_their_input_or_the_history(db, tmp_path, report):
    trace = shutil.copy(BERT, tmp_path / "t.json.gz")
    old = trace.read_bytes(), db.read_bytes()
    fresh = gpumagic.analyze(trace)
    for write in (lambda p: fresh.save_html(p), lambda p: gpumagic.compare(fresh, report).save_html(p)):
        for target in (trace, db, str(db) + "-wal"):
            with pytest.raises(WriteError, match="refusing to write over the input file"):
                write(target)
    with pytest.raises(Exception, match="refusing to write over the input file"):
        gpumagic.profile(save=str(db) + "-shm")
    assert (trace.read_bytes(), db.read_bytes()) == old
