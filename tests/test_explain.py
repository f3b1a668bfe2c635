"""``explain(finding_id)`` reads the rule that reports the finding: its docstring, thresholds, texts and links."""

from __future__ import annotations

import os
import re

import pytest
from tracebuilder import DATA

from gpumagic.analysis import analyze
from gpumagic.analysis.explain import ELIDED, UnknownFindingError, explain, finding_ids

TRACES = ("resnet50_v100_workers0.json.gz", "a100_training_rank0.json.gz", "h100_bert_small_inference.json.gz")


def matches(template: str, text: str) -> bool:
    """Whether ``text`` is ``template`` with each :data:`ELIDED` part filled in."""
    pattern = ".*".join(re.escape(part) for part in template.split(ELIDED))
    return re.fullmatch(pattern, text, flags=re.DOTALL) is not None


@pytest.mark.parametrize("finding_id", finding_ids())
def test_every_finding_is_explained_from_its_rule(finding_id):
    e = explain(finding_id)
    assert e["id"] == finding_id and e["rule"].startswith("gpumagic.analysis.rules.")
    assert finding_id in e["summary"]
    assert e["signal"] and e["false_positives"] and e["why"] and e["docstring"].startswith("Signal:")
    assert e["sources"] and all(s.startswith("https://") for s in e["sources"])
    assert e["fixes"] and all(f["flavor"] in ("pytorch", "huggingface") and f["description"] for f in e["fixes"])
    for t in e["thresholds"]:
        module = __import__(t["defined_in"], fromlist=["_"])
        assert getattr(module, t["name"]) == t["value"]


def test_a_rule_without_a_threshold_section_still_names_its_thresholds():
    e = explain("launch-bound")
    assert {"SHORT_KERNEL_SHARE", "BUSY_MAX"} <= {t["name"] for t in e["thresholds"]}


def test_thresholds_imported_from_another_rule_keep_their_source():
    saturation = next(t for t in explain("dataloader-bound")["thresholds"] if t["name"] == "SATURATION")
    assert saturation["defined_in"] == "gpumagic.analysis.rules.cpu" and saturation["source"]


@pytest.mark.parametrize("name", TRACES)
def test_the_explanation_says_what_the_reports_say(name):
    """The ``why`` and the fixes of every finding on real traces are the explained ones, filled in."""
    report = analyze(os.path.join(DATA, name))
    assert report.findings
    for f in report.findings:
        e = explain(f.id)
        assert matches(e["why"], f.why), f.id
        for fix in f.fixes:
            assert any(x["flavor"] == fix.flavor and matches(x["description"], " ".join(fix.description.split()))
                       for x in e["fixes"]), (f.id, fix.description)


def test_an_unknown_id_names_the_known_ones():
    with pytest.raises(UnknownFindingError, match=r"'gpu-too-slow'.*host-sync"):
        explain("gpu-too-slow")
