"""Run names, the history export and environment values under hostile use (issue 24, classes 3, 8, 9, 12).

- an empty reference is refused everywhere (an empty shell variable never selects every
  unlabelled run); recording with label "" or None is an unlabelled run;
- a label that looks like a run id is refused when recorded, and a history that already holds
  one (written before the rule) resolves ``r<id>`` unambiguously or refuses it;
- ``rm`` says what it will remove before removing it;
- ``runs export`` writes the home folder as ``~`` in values, keys and free text;
- labels reach ``runs list`` cleaned for the terminal;
- every environment value is parsed strictly: one warning and the default (gpumagic._env).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import warnings
from pathlib import Path

import msgspec
import pytest
from tracebuilder import DATA

import gpumagic
from gpumagic import _env
from gpumagic.capture import CaptureOptions
from gpumagic.capture.errors import OptionsError
from gpumagic.shells.cli import main
from gpumagic.trace import files
from gpumagic.tuning import history, runs

BERT = os.path.join(DATA, "h100_bert_small_inference.json.gz")


@pytest.fixture(scope="module")
def report():
    return gpumagic.analyze(BERT)


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(_env, "_warned", set())


def test_an_empty_reference_is_refused_everywhere(report, capsys):
    runs.record(report)  # unlabelled, as "" and None also record
    runs.record(report, label="")
    runs.record(report, label=None)
    assert [r.label for r in runs.store().runs()] == ["", "", ""]
    for ref in ("", "   "):
        assert main(["runs", "rm", ref, "--yes"]) == 2
        assert "a run is named by a label" in capsys.readouterr().err
        for call in (runs.matching, runs.forget, runs.get, runs.find):
            with pytest.raises(runs.RunNameError):
                call(ref)
        assert main(["runs", "show", ref]) == 2
    capsys.readouterr()
    assert len(runs.store().runs()) == 3  # nothing removed


@pytest.mark.parametrize("label", ["r12", " r3 ", "\ud800", "a\udcff"])
def test_a_label_that_cannot_name_a_run_is_refused_before_anything_runs(report, label):
    with pytest.raises(runs.RunNameError):
        runs.record(report, label=label)
    with pytest.raises(OptionsError):
        CaptureOptions(label=label)
    with pytest.raises(OptionsError):
        gpumagic.profile(label=label)
    assert runs.store().runs() == []
    CaptureOptions(label="r12x")  # only the exact shape of an id is refused


def test_a_history_holding_an_id_like_label_resolves_it_unambiguously(report, gpumagic_home, capsys):
    runs.record(report, label="x")  # r1
    runs.record(report, label="y")  # r2
    con = sqlite3.connect(gpumagic_home / history.DB_NAME)  # written by an older gpumagic: a run labelled r1
    con.execute("UPDATE runs SET label = 'r1' WHERE id = 2")
    con.commit()
    con.close()
    assert main(["runs", "rm", "r1", "--yes"]) == 2
    assert "names both run r1 and the runs labelled 'r1'" in capsys.readouterr().err
    with pytest.raises(runs.RunNameError):
        runs.get("r1")
    assert len(runs.store().runs()) == 2  # nothing removed
    assert main(["runs", "rm", "r1@1"]) == 0  # the labelled one, named without ambiguity
    assert [r.ref for r in runs.store().runs()] == ["r1"]
    assert runs.find("r1").label == "x"  # now only an id


def test_rm_lists_what_it_removes_before_removing(report, capsys):
    runs.record(report, label="w")
    runs.record(report, label="w")
    assert main(["runs", "rm", "w", "--yes"]) == 0
    first, second = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"gpumagic: 'w' names 2 runs: r2 \(label 'w', [-0-9: ]+\); r1 \(label 'w', [-0-9: ]+\)", first)
    assert second == "gpumagic: removed 2 runs (r2, r1)"


def test_references_past_what_sqlite_holds_name_no_run(report, capsys):
    runs.record(report, label="a")
    for ref in ("a@99999999999999999999999", "r99999999999999999999999"):
        with pytest.raises(runs.UnknownRunError):
            runs.get(ref)
        assert main(["runs", "show", ref]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    assert main(["runs", "list", "-n", "99999999999999999999999"]) == 2


def test_export_writes_home_as_tilde_in_keys_and_free_text(report, capsys, monkeypatch, tmp_path):
    home = tmp_path / "home" / "ann"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home)
    rep = gpumagic.analyze(BERT)
    rep.notes.append(f"saved to {home}/runs/a.json.gz; cwd was {home}")
    # a dictionary keyed by names from the trace (operator names may hold paths)
    syncs = msgspec.structs.replace(rep.metrics.syncs, sync_ops={f"{home}/train.py": 1, str(home): 2})
    rep.metrics = msgspec.structs.replace(rep.metrics, syncs=syncs)
    runs.record(rep, label="t", bundle=str(home / "b.json.gz"))
    assert main(["runs", "export"]) == 0
    out = capsys.readouterr().out
    assert str(home) not in out
    row = json.loads(out)
    assert row["workdir"] == "~" and row["bundle"] == "~/b.json.gz"
    assert row["report"]["metrics"]["syncs"]["sync_ops"] == {"~/train.py": 1, "~": 2}
    assert "saved to ~/runs/a.json.gz; cwd was ~" in row["report"]["notes"]


def test_labels_reach_runs_list_cleaned(report, capsys):
    runs.record(report, label="\x1b]0;pwned\x07evil\x1b[2J\nsecond line\r")
    assert main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", out)
    assert len(out.splitlines()) == 3  # title, header, one row: the newline did not break the table
    assert "pwned" not in out


KEEP_BAD = ["²", "1e3", "-1", "0", "12 x", "0x10", "99999999999999999999", "nan", "１２"]


@pytest.mark.parametrize("value", KEEP_BAD)
def test_keep_runs_that_cannot_be_used_warns_once_and_keeps_the_default(value, monkeypatch, tmp_path, report):
    monkeypatch.setenv(history.KEEP_ENV, value)
    with pytest.warns(_env.EnvWarning, match=re.escape(history.KEEP_ENV)) as caught:
        assert history.keep_from_env() == history.DEFAULT_KEEP
        assert history.keep_from_env() == history.DEFAULT_KEEP  # one warning, not one per use
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _env.EnvWarning)
        store = history.HistoryStore(tmp_path / "h.sqlite3")
        store.add(report)  # and the history works
    assert len(store.runs()) == 1


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "1e999", "NaN", "ten", "1,000"])
def test_an_inflation_limit_that_cannot_be_used_keeps_the_cap(value, monkeypatch):
    monkeypatch.setenv(files.INFLATE_ENV, value)
    with pytest.warns(_env.EnvWarning, match=files.INFLATE_ENV):
        assert files.inflate_limit() == files.MAX_INFLATE_RATIO


def test_good_environment_values_are_used_without_a_warning(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for value, want in (("0", float("inf")), ("250", 250.0), ("2.5e3", 2500.0), ("", 100.0)):
            monkeypatch.setenv(files.INFLATE_ENV, value)
            assert files.inflate_limit() == want
        monkeypatch.setenv(history.KEEP_ENV, " 7 ")
        assert history.keep_from_env() == 7
        for value, want in (("off", False), ("No", False), ("1", True)):
            monkeypatch.setenv("GPUMAGIC_TEST_FLAG", value)
            assert _env.env_flag("GPUMAGIC_TEST_FLAG", not want) is want
    monkeypatch.setenv("GPUMAGIC_TEST_FLAG", "maybe")
    with pytest.warns(_env.EnvWarning):
        assert _env.env_flag("GPUMAGIC_TEST_FLAG", True) is True


def test_every_environment_read_goes_through_the_one_parser():
    """No module reads a GPUMAGIC_* value itself except through gpumagic._env (the home folder is
    a path, read as one)."""
    root = os.path.join(os.path.dirname(gpumagic.__file__))
    offenders = []
    for folder, _, names in os.walk(root):
        for name in names:
            if not name.endswith(".py") or name == "_env.py":
                continue
            path = os.path.join(folder, name)
            text = Path(path).read_text(encoding="utf-8")
            for m in re.finditer(r"os\.environ\.get\(([^)]*)\)|os\.getenv\(([^)]*)\)", text):
                arg = m.group(1) or m.group(2)
                if "HOME_ENV" not in arg and "JPY_SESSION_NAME" not in arg:
                    offenders.append(f"{os.path.relpath(path, root)}: {m.group(0)}")
    assert offenders == []
