"""Golden renders of the real analysis of every recorded fixture trace (see golden/README.md)."""

import pytest
from render_helpers import FIXTURES, analysed, check_golden

from gpumagic.render.charts import memory_series
from gpumagic.render.html import Images, html_document
from gpumagic.render.text import render_text

TEXT_WIDTH = 100
#: Stand-ins for the PNG figures: their bytes depend on the matplotlib and FreeType versions (the
#: timeline is SVG drawn from the trace, not from these: it is in the golden page as drawn).
PLACEHOLDER_TIMELINE = b"timeline placeholder"
PLACEHOLDER_MEMORY = b"memory placeholder"


def _images(report):
    memory = PLACEHOLDER_MEMORY if memory_series(report) is not None else None
    return Images(timeline_png=PLACEHOLDER_TIMELINE, memory_png=memory)


@pytest.mark.parametrize("name", FIXTURES)
def test_text_render_matches_golden(name):
    text = render_text(analysed(name), width=TEXT_WIDTH)
    check_golden(f"{name}.txt", text)


@pytest.mark.parametrize("name", FIXTURES)
def test_text_lines_fit_the_width_except_code(name):
    report = analysed(name)
    code_lines = {line.strip() for f in report.findings for fix in f.fixes for line in fix.code.splitlines()}
    for line in render_text(report, width=TEXT_WIDTH).splitlines():
        assert len(line) <= TEXT_WIDTH or line.strip() in code_lines, line


@pytest.mark.parametrize("name", FIXTURES)
def test_html_render_matches_golden(name):
    html = html_document(analysed(name), _images(analysed(name)))
    check_golden(f"{name}.html", html)


@pytest.mark.parametrize("name", FIXTURES)
def test_every_finding_appears_in_both_renders_in_report_order(name):
    report = analysed(name)
    text = render_text(report)
    html = html_document(report, _images(report))
    positions_text = [text.index(f"({f.id})") for f in report.findings]
    assert positions_text == sorted(positions_text)
    for f in report.findings:
        assert f.title.replace("&", "&amp;").replace("<", "&lt;") in html
        assert f.evidence.summary.split(" ")[0] in text
