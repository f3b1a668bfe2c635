"""``explain(finding_id)`` reads the rule that reports the finding: its docstring, thresholds, texts and links."""

from __future__ import annotations

import os
import re

import pytest
from tracebuilder import DATA

from gpumagic.analysis import analyze
from gpumagic.analysis.explain import ELIDED, LATE_FINDINGS, UnknownFindingError, explain, finding_ids

TRACES = ("resnet50_v100_workers0.json.gz", "a100_training_rank0.json.gz", "h100_bert_small_inference.json.gz")


def matches(template: str, text: str) -> bool:
    """Whether ``text`` is ``template`` with each :data:`ELIDED` part filled in."""
    pattern = ".*".join(re.escape(part) for part in template.split(ELIDED))
    return re.fullmatch(pattern, text, flags=re.DOTALL) is not None


@pytest.mark.parametrize("finding_id", finding_ids())
def test_every_finding_is_explained_from_its_rule(finding_id):
    e = explain(finding_id)
    home = LATE_FINDINGS[finding_id].replace(":", ".") if finding_id in LATE_FINDINGS else "gpumagic.analysis.rules."
    assert e["id"] == finding_id and e["rule"].startswith(home)
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
                       and x["diagnostic"] == fix.diagnostic for x in e["fixes"]), (f.id, fix.description)


def test_an_unknown_id_names_the_known_ones():
    with pytest.raises(UnknownFindingError, match=r"'gpu-too-slow'.*host-sync"):
        explain("gpu-too-slow")


def test_out_of_memory_is_explained_from_the_function_that_adds_it():
    """``out-of-memory`` is no rule (it is added after the analysis, from the code's error): it is
    explained from ``analysis.oom``, and what it says is what a report of an out-of-memory error says."""
    import gzip
    import json

    from test_memory_categories import CUDA_MESSAGE

    from gpumagic.trace.kineto import from_bytes

    assert "out-of-memory" in finding_ids()
    e = explain("out-of-memory")
    assert e["rule"] == "gpumagic.analysis.oom.out_of_memory" and "FIT_MARGIN" in {t["name"] for t in e["thresholds"]}
    assert "no speed gain" in e["gain"] and "estimate" in e["false_positives"]
    # a cache that holds more than was asked, so that every fix applies (expandable segments too)
    fragmented = CUDA_MESSAGE.replace("11.41 MiB is reserved by PyTorch but unallocated",
                                      "2.00 GiB is reserved by PyTorch but unallocated")
    with gzip.open(os.path.join(DATA, "resnet50_v100_workers0.json.gz")) as f:
        doc = json.load(f)
    doc["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {"batch_size": 32},
                       "error": {"type": "OutOfMemoryError", "types": ["OutOfMemoryError", "RuntimeError"],
                                 "message": fragmented}}
    report = analyze(from_bytes(json.dumps(doc).encode(), "oom"))
    f = report.finding("out-of-memory")
    assert f is not None and matches(e["why"], f.why) and len(f.fixes) == len(e["fixes"])
    for fix in f.fixes:
        assert any(x["flavor"] == fix.flavor and matches(x["description"], " ".join(fix.description.split()))
                   and matches(x["code"], fix.code.strip("\n")) for x in e["fixes"]), fix.description


def test_diagnostic_snippets_are_marked_where_they_are_made_and_shown_after_the_changes():
    """A fix that finds the cause (a profile to record, a measurement) is marked ``diagnostic``
    where the rule makes it, not guessed from its wording: explain() reads the mark from the rule's
    source, and the text and HTML views put such snippets after the changes, labelled."""
    from gpumagic.render.html import finding_body_html
    from gpumagic.render.text import render_text

    graph = {x["description"]: x["diagnostic"] for x in explain("graph-breaks")["fixes"]}
    assert graph["Find each break with fullgraph=True: compilation then fails at the first one, naming it"] is True
    assert any(d.startswith("Move the call that breaks the graph") and not v for d, v in graph.items())
    memory = explain("memory-pressure")["fixes"]
    assert memory[0]["diagnostic"] and not any(x["diagnostic"] for x in memory[1:])  # "Confirm it" vs the changes
    import dataclasses

    from gpumagic.report.model import Fix

    report = analyze(os.path.join(DATA, TRACES[0]))
    f = report.findings[0]
    probe = Fix("pytorch", "Confirm the cause with a probe", "print('probe')", diagnostic=True)
    mixed = dataclasses.replace(f, fixes=(probe, *f.fixes))  # the diagnostic first: the views reorder it
    body = finding_body_html(mixed)
    assert max(body.index(escape_html(x.description)) for x in f.fixes) < body.index("Confirm the cause")
    assert "Diagnostic (PyTorch):</span> Confirm the cause" in body
    text = render_text(dataclasses.replace(report, findings=[mixed, *report.findings[1:]]), width=100)
    assert text.index("Diagnostic (PyTorch): Confirm the cause") > max(text.index(x.description[:40]) for x in f.fixes)


def escape_html(text: str) -> str:
    from html import escape

    return escape(text)
