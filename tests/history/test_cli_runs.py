"""``gpumagic runs list|show|compare|rm|export`` and ``gpumagic.history()``."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest
from recorded import analysed
from tracebuilder import DATA

import gpumagic
from gpumagic.shells.cli import main
from gpumagic.shells.cli.runs import tilde_paths
from gpumagic.tuning import history, runs

W0 = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
W4 = os.path.join(DATA, "resnet50_v100_workers4.json.gz")
BERT = os.path.join(DATA, "h100_bert_small_inference.json.gz")


@pytest.fixture(scope="module")
def reports():
    return analysed(W0), analysed(W4), analysed(BERT)


@pytest.fixture
def three_runs(reports):
    """r1 'workers' (workers0), r2 'workers' (workers4), r3 unlabelled (BERT inference)."""
    runs.record(reports[0], label="workers")
    runs.record(reports[1], label="workers")
    runs.record(reports[2])


def test_list_is_a_table_oldest_first(three_runs, capsys, gpumagic_home):
    assert main(["runs", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"gpumagic run history: 3 run(s) in {gpumagic_home / history.DB_NAME}"
    assert lines[1].split() == ["id", "label", "when", "device", "median", "step", "steps", "p10–p90", "GPU", "busy", "top",
                                "finding"]
    assert [ln.split()[:2] for ln in lines[2:]] == [["r1", "workers"], ["r2", "workers"], ["r3", "-"]]
    assert lines[2].endswith("Tesla V100-DGXS-32GB        177 ms  175 ms–181 ms (6)      57 %  dataloader-bound")
    assert "NVIDIA H100 80GB HBM3" in lines[4] and lines[4].endswith("launch-bound")
    assert main(["runs", "list", "-n", "1"]) == 0
    assert [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[2:]] == ["r3"]


def test_list_of_an_empty_history(capsys):
    assert main(["runs", "list"]) == 0
    assert "no runs yet" in capsys.readouterr().out


@pytest.mark.parametrize("name, finding", [("workers", "mixed-precision-off"), ("workers@2", "dataloader-bound"),
                                           ("r1", "dataloader-bound"), ("r3", "launch-bound")])
def test_show_by_label_number_or_id(three_runs, capsys, name, finding):
    assert main(["runs", "show", name, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"][0]["id"] == finding


def test_show_text_and_html_to_a_file(three_runs, capsys, tmp_path):
    assert main(["runs", "show", "r1"]) == 0
    assert capsys.readouterr().out.startswith("gpumagic report — Tesla V100-DGXS-32GB")
    out = tmp_path / "r1.html"
    assert main(["runs", "show", "r1", "--format", "html", "-o", str(out)]) == 0
    assert "The training loop waits for the data loader" in out.read_text()


def test_compare_two_runs_of_one_label(three_runs, capsys):
    assert main(["runs", "compare", "workers@2", "workers", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["resolved"] == ["dataloader-bound"] and 0.68 < d["step_time_ratio"] < 0.76
    assert (d["before"]["label"], d["after"]["label"]) == ("workers@2", "workers")


@pytest.mark.parametrize("argv, message", [
    (["runs", "show", "nope"], "gpumagic: error: no run is labelled 'nope'; known labels: 'workers'\n"),
    (["runs", "show", "workers@5"], "gpumagic: error: 'workers' has 2 run(s), so 'workers@5'"),
    (["runs", "compare", "r1", "r9"], "gpumagic: error: 'r9' is neither a trace file nor a remembered run"),
    (["runs", "rm", "nope"], "gpumagic: error: no run is labelled 'nope'"),
    (["runs", "list", "-n", "0"], "gpumagic: error: --last needs a positive number of runs, not 0\n"),
])
def test_bad_names_exit_2_with_one_line(three_runs, capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_rm_one_run_by_id_or_number(three_runs, capsys):
    assert main(["runs", "rm", "r3"]) == 0
    assert main(["runs", "rm", "workers@2"]) == 0
    lines = capsys.readouterr().err.splitlines()  # what will be removed, then that it was
    assert re.fullmatch(r"gpumagic: 'r3' names 1 run: r3 \(unlabelled, [-0-9: ]+\)", lines[0]), lines
    assert lines[1] == "gpumagic: removed 1 run (r3)"
    assert re.fullmatch(r"gpumagic: 'workers@2' names 1 run: r1 \(label 'workers', [-0-9: ]+\)", lines[2]), lines
    assert lines[3:] == ["gpumagic: removed 1 run (r1)"]
    assert [r.ref for r in runs.store().runs()] == ["r2"]


def test_rm_a_label_says_how_many_and_wants_yes_without_a_terminal(three_runs, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal
    assert main(["runs", "rm", "workers"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("gpumagic: 'workers' names 2 runs: r2 (label 'workers', "), err
    assert err[1:] == ["gpumagic: error: 'workers' names 2 runs; pass --yes to remove them all"]
    assert len(runs.store().runs()) == 3  # nothing lost
    assert main(["runs", "rm", "workers", "--yes"]) == 0
    assert capsys.readouterr().err.splitlines()[1:] == ["gpumagic: removed 2 runs (r2, r1)"]
    assert [r.ref for r in runs.store().runs()] == ["r3"]


def test_rm_a_label_asks_on_a_terminal(three_runs, capsys, monkeypatch):
    class Terminal:
        def __init__(self, answer):
            self.answer = answer

        def isatty(self):
            return True

        def readline(self):
            return self.answer

    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    assert main(["runs", "rm", "workers"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[1:] == ["gpumagic: remove these 2 runs? [y/N] gpumagic: nothing removed"], err
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    assert main(["runs", "rm", "workers"]) == 0
    assert len(runs.store().runs()) == 1


def test_export_json_lines_with_home_as_tilde(three_runs, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    bundle = tmp_path / "runs" / "a.json.gz"
    runs.record(gpumagic.Report(metrics=None, findings=[], notes=[f"saved in {tmp_path}/runs"]), label="home",
                bundle=str(bundle))
    out = tmp_path / "history.jsonl"
    assert main(["runs", "export", "-o", str(out)]) == 0
    assert capsys.readouterr().err == f"gpumagic: wrote 4 run(s) as JSON lines to {out}\n"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["ref"] for r in rows] == ["r1", "r2", "r3", "r4"]
    assert rows[0]["report"]["findings"][0]["id"] == "dataloader-bound"
    assert rows[3]["bundle"] == "~/runs/a.json.gz" and rows[3]["report"]["notes"] == ["saved in ~/runs"]
    assert str(tmp_path) not in out.read_text()
    assert main(["runs", "export"]) == 0
    assert capsys.readouterr().out.splitlines() == out.read_text().splitlines()


def test_export_refuses_an_unwritable_target(three_runs, capsys):
    assert main(["runs", "export", "-o", "/nonexistent-dir/h.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpumagic: error: ") and "/nonexistent-dir/h.jsonl" in err and err.count("\n") == 1


def test_tilde_paths_leaves_other_users_alone():
    assert tilde_paths({"a": ["/home/ann/x", "/home/anna/y", "/home/ann"]}, "/home/ann") == {
        "a": ["~/x", "/home/anna/y", "~"]}


def test_a_corrupt_history_is_one_line_and_stays(gpumagic_home, capsys):
    db = gpumagic_home / history.DB_NAME
    db.write_bytes(b"garbage" * 100)
    assert main(["runs", "list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpumagic: error: the run history {db} is unreadable") and err.count("\n") == 1
    assert db.read_bytes() == b"garbage" * 100


def test_analyze_records_nothing(gpumagic_home):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-m", "gpumagic", "analyze", W0, "--format", "json"], capture_output=True, env=env)
    assert done.returncode == 0
    assert list(gpumagic_home.iterdir()) == []
    gpumagic.analyze(W0)  # the Python function neither
    assert list(gpumagic_home.iterdir()) == []


def test_history_displays_a_table_and_a_chart(three_runs):
    h = gpumagic.history()
    assert len(h) == 3 and [r.ref for r in h.runs] == ["r1", "r2", "r3"]
    bundle = h._repr_mimebundle_()
    assert bundle["text/plain"] == h.to_text() and "r2" in bundle["text/plain"]
    html = bundle["text/html"]
    assert html.count('<svg class="gm-tl gm-chart"') == 2 and "mixed-precision-off" in html  # median step, GPU busy
    assert "median step, ms (lower is better)" in html and "GPU busy, % of the window" in html
    assert all(f">{r.ref}" in html for r in h.runs)  # each run is named on the chart's axis by its id
    fig = h.figure()
    ax, ax2 = fig.axes
    assert list(ax.lines[0].get_ydata()) == [176.761, 126.5825, pytest.approx(4.4, abs=0.05)]
    assert [round(v, 2) for v in ax2.lines[0].get_ydata()] == [56.64, 72.58, round(100 * h.runs[2].gpu_busy_frac, 2)]


def test_history_without_runs_has_no_chart():
    h = gpumagic.history()
    assert h.figure() is None and "no runs yet" in h.to_html()
