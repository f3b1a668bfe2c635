"""Finding ids are written once: each rule registers under its id (``@rule``), and everything that
lists ids derives them from that registry."""

import os

import pytest
from tracebuilder import DATA

import gpumagic
from gpumagic.analysis.rules import CAUSE_RULES, FINDING_IDS, RESIDUAL_RULE, RULES
from gpumagic.analysis.rules.base import finding, rule


def test_every_registered_rule_runs_once_and_carries_its_id():
    ran = [r.finding_id for r in (*CAUSE_RULES, RESIDUAL_RULE)]
    assert sorted(ran) == sorted(FINDING_IDS) == sorted(RULES) and len(set(ran)) == len(ran)
    assert RESIDUAL_RULE.finding_id == "low-gpu-utilization"
    assert all(RULES[fid].finding_id == fid for fid in FINDING_IDS)


def test_findings_take_the_id_their_rule_registered():
    report = gpumagic.analyze(os.path.join(DATA, "resnet50_v100_workers0.json.gz"))
    assert report.findings and set(report.finding_ids) <= set(FINDING_IDS)
    for f in report.findings:
        assert RULES[f.id] is not None


def test_a_second_rule_for_an_id_is_refused():
    with pytest.raises(ValueError, match="two rules for the finding id 'host-sync'"):
        rule("host-sync")(lambda ctx, m: None)
    assert "host-sync" in RULES and RULES["host-sync"].__name__ == "host_sync"


def test_the_registered_function_stamps_the_id():
    made = rule("test-only-id")(lambda ctx, m: finding(
        severity="low", title="t", why="w", summary="s", numbers={}, est_gain=0.5, gain_method="g", fixes=(),
        doc_url="https://example.org"))
    try:
        f = made(None, None)
        assert f.id == "test-only-id" and f.est_gain == 0.5
    finally:
        del RULES["test-only-id"]
