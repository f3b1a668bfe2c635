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
