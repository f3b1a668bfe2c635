"""Text and HTML renders of a comparison, and the notebook MIME bundle."""

from __future__ import annotations

import os
import re

import pytest
from recorded import analysed
from tracebuilder import DATA

import gpumagic
from gpumagic.tuning.comparison import compare

W0 = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
W4 = os.path.join(DATA, "resnet50_v100_workers4.json.gz")


@pytest.fixture(scope="module")
def pair():
    a, b = analysed(W0), analysed(W4)
    a.label, b.label = "workers=0", "workers=4 <b>"
    return compare(a, b)


def test_text_shows_headline_breakdown_and_findings(pair):
    text = pair.to_text()
    lines = text.splitlines()
    assert lines[0] == "gpumagic comparison: workers=0 → workers=4 <b>"
    assert lines[1] == pair.to_dict()["verdict"]
    ratio = pair.to_dict()["step_time_ratio"]
    assert re.search(rf"median step\s+177 ms\s+127 ms\s+−28 % \({1 / ratio:.2f}× faster\)", text)
    assert re.search(r"data-loader wait\s+59\.3 ms\s+1\.2 ms\s+−58\.1 ms", text)
    assert "  resolved    dataloader-bound: The training loop waits for the data loader (est. gain was 33 %)" in lines
    assert any(line.startswith("  new         gpu-idle-gaps:") for line in lines)  # see test_compare_fixtures
    assert "communication" not in text  # zero in both runs: not shown
    assert max(len(line) for line in lines if not line.startswith("  ")) <= 100


def test_html_is_self_contained_and_escaped(pair):
    html = pair.to_html()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert "workers=4 &lt;b&gt;" in html and "workers=4 <b>" not in html
    ratio = pair.to_dict()["step_time_ratio"]
    assert f'class="gm-num gm-better">−28 % ({1 / ratio:.2f}× faster) · ▲ better' in html  # not colour alone
    assert f"{1 / ratio:.2f}× faster" in pair.to_dict()["verdict"]  # one notation: the verdict's
    assert "dataloader-bound" in html
    assert len(html) < 32_000


def test_mimebundle_has_text_and_html_and_honours_include(pair):
    bundle = pair._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"] == pair.to_text()
    assert bundle["text/html"].startswith('<div class="gpumagic-report')
    assert set(pair._repr_mimebundle_(include=["text/plain"])) == {"text/plain"}
    assert set(pair._repr_mimebundle_(exclude=["text/html"])) == {"text/plain"}


def test_save_html(pair, tmp_path):
    out = pair.save_html(tmp_path / "cmp.html")
    assert out.read_text(encoding="utf-8") == pair.to_html()


def test_a_noisy_after_run_does_not_hide_a_large_speedup():
    """−56 % on the median with a noisy 5-step after-run is a real speed-up, not "about the same"."""
    from types import SimpleNamespace

    from gpumagic.tuning.comparison import same_tolerance, verdict

    before = SimpleNamespace(metrics=SimpleNamespace(steps=SimpleNamespace(durations_ms=[100, 101, 99, 100, 102], median_ms=100)))
    after = SimpleNamespace(metrics=SimpleNamespace(steps=SimpleNamespace(durations_ms=[44, 30, 70, 44, 60], median_ms=44)))
    tol = same_tolerance(before, after)
    assert 0.03 < tol < 0.56
    assert verdict({"step_time_ratio": 0.44}, tol).startswith("2.27× faster")
    steady = SimpleNamespace(metrics=SimpleNamespace(steps=SimpleNamespace(durations_ms=[100, 100, 101, 99], median_ms=100)))
    assert same_tolerance(steady, steady) == 0.03


def test_the_answer_comes_first_and_the_full_report_follows_collapsed(pair):
    from gpumagic.render.comparison import render_fragment
    from gpumagic.render.html import report_html

    after = gpumagic.analyze(W4)
    html = render_fragment(pair.to_dict(), full_report_html=report_html(after))
    speed, findings, table = html.index("Speed-up"), html.index("<h3>Findings"), html.index("<h3>Step time")
    full = html.index('<details class="gm-full"><summary>Full report of')
    assert speed < findings < table < full  # comparison first, report last
    assert "open" not in html[full:full + 40]  # collapsed
    assert after.findings[0].title in html[full:]
