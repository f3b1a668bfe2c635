"""Which runs go into the run history, with what, and what a broken history costs a run."""

from __future__ import annotations

import re

import pytest
from IPython.utils.capture import capture_output

import gpumagic
from gpumagic.tuning import history, runs

CELL = "%%gpuprofile --quiet --no-nvml {options}\nimport torch\ntorch.ones(4).sum()\n"


def run_cell(shell, options=""):
    with capture_output() as out:
        result = shell.run_cell(CELL.format(options=options))
    return result, out


def test_every_completed_cell_is_recorded_labelled_or_not(shell, tmp_path, monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", "/work/tuning.ipynb")
    bundle = tmp_path / "b.json.gz"
    run_cell(shell)
    run_cell(shell, f"--label base --steps 3 --save {bundle}")
    run_cell(shell, "--label failing\nraise ValueError('no')")  # a failing cell is not a run to compare with
    rows = runs.store().runs()[::-1]
    assert [(r.ref, r.label, r.source) for r in rows] == [("r1", "", "magic"), ("r2", "base", "magic")]
    assert rows[1].options["steps"] == 3 and rows[1].options["label"] == "base" and rows[1].options["nvml"] is False
    assert rows[1].bundle == str(bundle) and rows[1].notebook == "/work/tuning.ipynb"
    assert rows[0].bundle == "" and rows[1].workdir


def test_vscode_names_the_notebook_in_the_namespace(shell, monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    shell.user_ns["__vsc_ipynb_file__"] = "/work/vs.ipynb"
    try:
        run_cell(shell, "--label vs")
    finally:
        del shell.user_ns["__vsc_ipynb_file__"]
    assert runs.find("vs").notebook == "/work/vs.ipynb"


def test_profile_records_labelled_runs_only(train):
    with gpumagic.profile(steps=2, nvml=False):
        train(4)
    assert runs.store().runs() == []
    with gpumagic.profile(label="api", steps=2, nvml=False) as run:
        train(4)
    (row,) = runs.store().runs()
    assert (row.label, row.source) == ("api", "api") and runs.get("api") is run.report
    with pytest.raises(RuntimeError), gpumagic.profile(label="broken", steps=2, nvml=False):
        raise RuntimeError("stop")
    assert runs.labels() == ["api"]


def test_a_broken_history_warns_and_the_cell_still_works(shell, gpumagic_home):
    db = gpumagic_home / history.DB_NAME
    db.write_bytes(b"not sqlite" * 50)
    result, out = run_cell(shell, "--label x -o rep")  # one warning line, the report kept
    assert re.search(r"gpumagic: warning: this run was not stored in the run history: the run history .* is unreadable",
                     out.stderr), out.stderr
    assert result.success and shell.user_ns["rep"].label == "x"
    result, _ = run_cell(shell, "--compare x")
    assert not result.success and "%gpuprofile --compare: the run history" in str(result.error_in_exec)
    assert db.read_bytes() == b"not sqlite" * 50


def test_compare_names_a_run_of_an_earlier_label_use(shell):
    run_cell(shell, "--label lr -o first")
    run_cell(shell, "--label lr -o second")
    import gpumagic.render.display as display

    shown = []
    original = display.show_comparison
    display.show_comparison = lambda comparison, report: shown.append((comparison, report))
    try:
        shell.run_cell(CELL.format(options="--compare lr@2").replace(" --quiet", ""))
    finally:
        display.show_comparison = original
    [(comparison, _)] = shown
    assert comparison.before is shell.user_ns["first"] and comparison.label_before == "lr"
    result, _ = run_cell(shell, "--compare lr@3")
    assert "'lr' has 2 run(s), so 'lr@3'" in str(result.error_in_exec)
    assert runs.get("lr@2") is shell.user_ns["first"] and runs.get("lr") is shell.user_ns["second"]


def test_storage_off_keeps_runs_in_memory_only(shell, monkeypatch, tmp_path):
    monkeypatch.setenv(history.HOME_ENV, "")
    monkeypatch.chdir(tmp_path)
    run_cell(shell, "--label mem -o rep")
    assert runs.get("mem") is shell.user_ns["rep"] and runs.store().path is None
    assert list(tmp_path.iterdir()) == []
    runs.forget()
