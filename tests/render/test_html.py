"""The static HTML: self-contained, escaped, header facts present, and the exported file."""

import re

import msgspec
import pytest
from render_helpers import analysed

from gpumagic.render.display import save_html
from gpumagic.render.html import Images, html_document, report_html
from gpumagic.report.model import Evidence, Finding, Fix, Report

#: Issue 4: the exported HTML of the 216k-event fixture must stay under 2 MB.
MAX_EXPORT_BYTES = 2 * 1024 * 1024


def test_header_gives_the_five_facts(loader_report):
    html = report_html(loader_report, Images())
    m = loader_report.metrics
    for label in ("Wall time", "Steps recorded", "Median step", "GPU busy", "Top finding:"):
        assert label in html
    assert f">{m['steps']['count']}<" in html
    assert loader_report.findings[0].title in html
    assert "about 33 % of step time (estimate)" in html  # dataloader-bound's estimated gain, rounded, said to be an estimate


def test_first_finding_is_open_and_fixes_are_code_blocks(loader_report):
    html = report_html(loader_report, Images())
    details = re.findall(r'<details class="gm-finding[^>]*>', html)
    assert len(details) == len(loader_report.findings)
    assert details[0].endswith(" open>") and not any(d.endswith(" open>") for d in details[1:])
    assert html.count('<pre class="gm-code') == sum(len(f.fixes) for f in loader_report.findings)
    assert "Fix (Hugging Face Trainer):" in html and "Fix (PyTorch):" in html


def test_the_export_is_self_contained_and_small_enough(tmp_path):
    report = analysed("v100_large_216k_events")
    path = save_html(report, tmp_path / "report.html")
    html = path.read_text(encoding="utf-8")
    assert path.stat().st_size <= MAX_EXPORT_BYTES
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html and "<link" not in html and "@import" not in html
    sources = re.findall(r'src="([^"]*)"', html)
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert '<svg class="gm-tl"' in html and "events drawn as" in html  # the vector timeline says what it merged


def test_user_text_is_escaped():
    finding = Finding(
        id="x", severity="low", title="<b>bold</b> & co", why="a < b", evidence=Evidence(summary="<script>"),
        est_gain=0.1, gain_method="m", fixes=(Fix("pytorch", "d", "if a < b:\n    pass"),), doc_url="javascript:alert(1)",
    )
    report = Report(metrics=None, findings=[finding], notes=["<i>note</i>"])
    html = report_html(report, Images())
    assert "<b>bold</b>" not in html and "&lt;b&gt;bold&lt;/b&gt; &amp; co" in html
    assert "<script>" not in html and "if a &lt; b:" in html
    assert "javascript:" not in html  # only http(s) links are rendered
    assert "&lt;i&gt;note&lt;/i&gt;" in html


def test_a_report_without_trace_or_metrics_still_renders():
    html = html_document(Report(metrics=None, findings=[], notes=[]))
    assert "No findings" in html
    assert "No timeline" in html
    assert "n/a" in html


def test_save_html_refuses_a_missing_directory(tmp_path, loader_report):
    with pytest.raises(OSError, match="does not exist"):  # WriteError, an OSError
        save_html(loader_report, tmp_path / "nope" / "r.html")


def test_static_rendering_imports_no_torch_ipython_or_ipywidgets():
    import subprocess
    import sys

    from render_helpers import DATA

    code = (
        "import sys, gpumagic\n"
        "from gpumagic.render.html import html_document\n"
        "from gpumagic.render.text import render_text\n"
        "import gpumagic.render.display as mb\n"
        "r = gpumagic.analyze('tests/data/h100_bert_small_inference.json.gz')\n"
        "html_document(r); render_text(r); mb.mimebundle(r)\n"
        "loaded = {'torch', 'IPython', 'ipywidgets'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=DATA.parents[1])


def test_a_tile_without_a_value_is_left_out(loader_report):
    m = loader_report.metrics
    unknown = msgspec.structs.replace(m, steps=msgspec.structs.replace(m.steps, median_ms=None),
                                      gpu=msgspec.structs.replace(m.gpu, busy_frac=None))
    html = report_html(Report(metrics=unknown, findings=[], notes=[]), Images())
    assert "Steps recorded" in html and "Wall time" in html
    assert "Median step" not in html and "GPU busy" not in html  # no "n/a" tiles


def test_evidence_chips_are_labelled_with_units(loader_report):
    html = report_html(loader_report, Images())
    assert "GPU idle while waiting: <b>33.4 %</b>" in html and "gpu_idle_during_wait_frac" not in html
    assert "Compute capability: <b>7.0</b>" in html


def test_memory_section_says_how_to_record_allocations(loader_report):
    html = report_html(loader_report, Images())
    memory = html[html.index('<section class="gm-section gm-memory">'):]
    assert "%%gpuprofile --memory" in memory


def test_severity_stripe_rules_beat_the_card_border():
    """The stripe colour rule must be more specific than the card's own border rule (the old bug:
    every card grey). Specificity is (ids, classes, elements): compare the two selectors."""
    from gpumagic.render.page import CSS

    card = re.search(r"\.gpumagic-report details\.gm-finding\{[^}]*border-left:6px solid var\(--gm-muted\)", CSS)
    stripe = re.search(r"\.gpumagic-report \.gm-finding\.gm-sev-high[^{]*\{border-left-color:var\(--gm-high\)\}", CSS)
    assert card and stripe  # (0,2,1) for the card, (0,3,0) for the stripe: the stripe wins


def test_the_timeline_is_inline_svg_with_text_labels_and_window_links():
    report = analysed("resnet50_v100_workers0")
    html = report_html(report, Images())
    timeline = html[html.index('<section class="gm-section gm-timeline">'):html.index('<section class="gm-section gm-breakdown">')]
    assert "<img" not in timeline and '<svg class="gm-tl"' in timeline
    labels = re.findall(r'<text class="gm-tl-lane"[^>]*>([^<]*)</text>', timeline)
    assert "main thread" in labels and any(lab.startswith("GPU0 \u00b7 stream") for lab in labels)
    # every window link points at a band drawn in the chart
    targets = re.findall(r'<a class="gm-win" href="#([^"]+)">', html)
    assert targets and all(f'id="{t}"' in timeline for t in targets)


def test_evidence_shows_three_numbers_then_a_more_disclosure_and_says_more_findings_wait(loader_report):
    html = report_html(loader_report, Images())
    first = loader_report.findings[0]
    body = html[html.index(first.title):]
    body = body[:body.index("</details>", body.index('<details class="gm-more">') if '<details class="gm-more">' in body else 0)]
    shown = body[:body.index('<details class="gm-more">')] if '<details class="gm-more">' in body else body
    assert shown.count('class="gm-chip"') <= 3
    if len(first.evidence.numbers) > 3:
        assert f"{len(first.evidence.numbers) - 3} more number" in html
    n = len(loader_report.findings) - 1
    assert f"{n} more finding{'s' if n != 1 else ''} below" in html


def test_thresholds_take_the_unit_of_the_number_they_bound():
    from gpumagic.render._format import evidence_items

    items = dict(evidence_items({"cpu_saturation": 0.97, "busy_cores": 3.5, "samples_count": 4, "threshold": 0.9}))
    assert items["CPU saturation"] == "97.0 %" and items["Threshold (CPU saturation)"] == "90.0 %"
    assert items["Busy cores"] == "3.5 cores"
    assert dict(evidence_items({"mfu": 0.04, "threshold_mfu": 0.1}))["Threshold (MFU)"] == "10.0 %"


def test_diagnostic_snippets_come_after_the_fixes_and_say_so():
    from gpumagic.render.html import finding_body_html

    f = Finding(id="x", severity="low", title="t", why="w", evidence=Evidence(summary="s"), est_gain=0.1, gain_method="m",
                fixes=(Fix("pytorch", "Find what the GPU waited for", "print(1)", diagnostic=True),
                       Fix("pytorch", "Use pinned memory", "x=1"), Fix("pytorch", "Find a larger batch", "bs = 64")),
                doc_url="")
    html = finding_body_html(f)
    assert html.index("Fix (PyTorch):</span> Use pinned") < html.index("Diagnostic (PyTorch):</span> Find what")
    assert "Fix (PyTorch):</span> Find a larger batch" in html  # the rule's mark decides, not the wording
