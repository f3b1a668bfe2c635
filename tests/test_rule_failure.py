"""A rule that raises on a trace nobody foresaw costs its own finding, not the report
(``gpumagic.analysis._judge``); the test suite runs with ``GPUMAGIC_STRICT_RULES=1`` so that such
a failure fails the test instead."""

from __future__ import annotations

import os

import pytest
from tracebuilder import DATA

import gpumagic.analysis.rules.optimizer as optimizer_rule
from gpumagic import analyze

TRACE = os.path.join(DATA, "cpu_adam_forloop.json.gz")  # unfused-optimizer fires on it, among others


def _broken(ctx, classes=None):
    raise IndexError("index 3 is out of bounds for axis 0 with size 3")


def test_a_failing_rule_leaves_a_note_and_the_other_findings(monkeypatch):
    before = analyze(TRACE)
    assert "unfused-optimizer" in before.finding_ids
    monkeypatch.setattr(optimizer_rule, "optimizer_steps", _broken)
    monkeypatch.setenv("GPUMAGIC_STRICT_RULES", "0")
    after = analyze(TRACE)
    assert after.finding_ids == [i for i in before.finding_ids if i != "unfused-optimizer"]
    (note,) = [n for n in after.notes if "was not judged" in n]
    assert note.startswith("unfused-optimizer was not judged: the rule failed on this trace (IndexError: index 3")
    assert "please report it" in note
    assert after.metrics == before.metrics  # the metrics do not depend on the rules


def test_the_test_suite_sees_the_failure(monkeypatch):
    assert os.environ.get("GPUMAGIC_STRICT_RULES") == "1"  # tests/conftest.py
    monkeypatch.setattr(optimizer_rule, "optimizer_steps", _broken)
    with pytest.raises(IndexError):
        analyze(TRACE)


def _analysis_fails(*args, **kwargs):
    raise ValueError("an analysis bug")


def test_a_failed_analysis_keeps_the_codes_result_and_the_recording(monkeypatch, capsys):
    """gpumagic's failure must not turn a cell that ran into one that failed: no exception, no
    report, a warning naming the error, and the recording kept where gpumagic analyze reads it."""
    torch = pytest.importorskip("torch")
    import gpumagic
    import gpumagic.capture.session as session

    monkeypatch.setattr(session, "_analyse", _analysis_fails)
    with gpumagic.profile(display=False) as run:
        total = torch.ones(3).sum().item()
    assert total == 3.0 and run.report is None and run.finished
    assert run.analysis_error == "ValueError: an analysis bug"
    assert run.kept_at is not None and run.kept_at.is_file() and run.kept_at.name == "trace.json.gz"
    err = capsys.readouterr().err
    assert "no report: the analysis failed on this recording (ValueError: an analysis bug)" in err
    assert str(run.kept_at) in err
    monkeypatch.undo()
    assert analyze(str(run.kept_at)).metrics.window.dur_ms > 0  # the kept recording analyses
    run.kept_at.unlink()
    run.kept_at.parent.rmdir()


def test_the_magic_returns_the_cells_value_when_the_analysis_fails(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from ipyshell import ipython_shell
    from IPython.utils.capture import capture_output

    import gpumagic.capture.session as session

    monkeypatch.setattr(session, "_analyse", _analysis_fails)
    target = tmp_path / "kept.json.gz"
    with ipython_shell("gpumagic") as ip, capture_output() as out:
        result = ip.run_cell(f"%%gpuprofile --save {target}\nimport torch\ntorch.ones(2).sum().item() + 40")
    assert result.success and result.result == 42.0
    assert target.is_file()  # --save still writes the recording, and the warning points there
    assert f"The recording is kept in {target}" in out.stderr and "ValueError: an analysis bug" in out.stderr


def test_after_the_codes_own_error_its_error_still_wins(monkeypatch):
    torch = pytest.importorskip("torch")
    import gpumagic
    import gpumagic.capture.session as session

    monkeypatch.setattr(session, "_analyse", _analysis_fails)
    with pytest.raises(ZeroDivisionError), gpumagic.profile(display=False):
        torch.ones(2).sum().item() / 0
