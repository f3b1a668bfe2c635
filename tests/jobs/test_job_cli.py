"""``gpumagic analyze`` on a folder, a glob, several files, and a Dask scheduler."""

import json
import os
import sys

import pytest

from gpumagic.shells.cli import analyze as analyze_cli
from gpumagic.shells.cli import main


def test_folder_gives_the_job_report(straggler_job, capsys):
    assert main(["analyze", os.path.dirname(straggler_job[0]), "-j", "2"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("gpumagic job: 4 ranks (world size 4)")
    assert "Stragglers: rank 2 " in out and "straggler-rank" not in err
    assert err == ""  # no progress bar when standard error is not a terminal


def test_glob_and_json(straggler_job, capsys):
    pattern = os.path.join(os.path.dirname(straggler_job[0]), "rank[23].json.gz")
    assert main(["analyze", pattern, "--format", "json", "-j", "1"]) == 0
    d = json.loads(capsys.readouterr().out)["job"]
    assert [r["rank"] for r in d["ranks"]] == [2, 3]
    assert d["stragglers"] == [2]


def test_several_files_to_an_html_file(straggler_job, tmp_path, capsys):
    out = tmp_path / "job.html"
    assert main(["analyze", *map(str, straggler_job[:2]), "--format", "html", "-o", str(out), "-j", "1"]) == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and 'class="gm-rank-chart"' in page
    assert "wrote html job report" in capsys.readouterr().err


def test_a_single_file_keeps_its_single_report(straggler_job, capsys):
    assert main(["analyze", str(straggler_job[0]), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "job" not in d and {"metrics", "findings", "notes"} <= set(d)


def test_progress_bar_on_a_terminal(clean_job, capsys, monkeypatch):
    monkeypatch.setattr(analyze_cli.sys, "stderr", _Tty())
    assert main(["analyze", *map(str, clean_job), "-j", "1"]) == 0
    drawn = analyze_cli.sys.stderr.getvalue()
    assert drawn.count("\r") == 3 and "analysed 3/3 ranks [" in drawn and drawn.endswith("]\n")


class _Tty:
    """A standard error that says it is a terminal."""

    def __init__(self):
        self.parts = []

    def isatty(self):
        return True

    def write(self, s):
        self.parts.append(s)

    def flush(self):
        pass

    def getvalue(self):
        return "".join(self.parts)


@pytest.mark.parametrize("make, message", [
    (lambda d: str(d), "holds no .json or .json.gz trace file"),
    (lambda d: str(d / "rank*.json.gz"), "no file matches"),
])
def test_nothing_to_analyse_exits_2_with_one_line(tmp_path, capsys, make, message):
    assert main(["analyze", make(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpumagic: error: ") and message in err and err.count("\n") == 1


def test_scheduler_runs_the_ranks_on_a_dask_cluster(clean_job, capsys):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        assert main(["analyze", *map(str, clean_job), "--scheduler", cluster.scheduler_address, "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)["job"]
    assert [r["rank"] for r in d["ranks"]] == [0, 1, 2] and d["stragglers"] == []


def test_unreachable_scheduler_exits_2_with_one_line(clean_job, capsys, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(analyze_cli, "CONNECT_TIMEOUT_S", 1)
    assert main(["analyze", str(clean_job[0]), "--scheduler", "tcp://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpumagic: error: cannot reach the Dask scheduler at tcp://127.0.0.1:9") and err.count("\n") == 1


def test_scheduler_without_dask_says_what_to_install(clean_job, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    assert main(["analyze", str(clean_job[0]), "--scheduler", "tcp://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err == ("gpumagic: error: --scheduler needs Dask's distributed package: "
                                       "pip install 'gpumagic[dask]'\n")


def test_output_over_a_rank_file_is_refused_before_any_work(clean_job, capsys):
    before = clean_job[1].read_bytes()
    folder = os.path.dirname(clean_job[0])
    assert main(["analyze", folder, "-o", os.path.join(folder, ".", "rank1.json.gz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpumagic: error: ") and "refusing to write over the input file" in err and err.count("\n") == 1
    assert clean_job[1].read_bytes() == before
