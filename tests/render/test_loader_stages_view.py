"""The data pipeline's stages (``metrics.host.loader_stages``) in the text, HTML and widget views."""

from __future__ import annotations

import copy
import re

import msgspec
import pytest
from render_helpers import analysed

from gpumagic.render.html import Images, report_html
from gpumagic.render.text import render_text
from gpumagic.report.metrics import LoaderStage

STAGES = [
    LoaderStage(name="SlowResize", ms_per_batch=12.5, share=0.625, where="worker"),
    LoaderStage(name="ImageFolder.__getitem__", ms_per_batch=5.0, share=0.25, where="worker"),
    LoaderStage(name="default_collate", ms_per_batch=2.0, share=0.1, where="main"),
    LoaderStage(name="other", ms_per_batch=0.5, share=0.025, where="main"),
]


@pytest.fixture(scope="module")
def staged():
    """The workers=0 fixture with stage timings, as a gpumagic capture would have added them."""
    base = analysed("resnet50_v100_workers0")
    report = copy.copy(base)
    host = msgspec.structs.replace(base.metrics.host, loader_stages=STAGES)
    report.metrics = msgspec.structs.replace(base.metrics, host=host)
    return report


def test_text_lists_the_stages_largest_first_with_units_within_the_width(staged):
    for width in (100, 60):
        text = render_text(staged, width=width)
        block = text.split("DATA PIPELINE STAGES", 1)[1].split("\n\n", 1)[0]
        rows = [line for line in block.splitlines() if re.search(r"\d %$|\d %  ", line)]
        names = [r.split()[0].rstrip("\u2026") for r in rows]  # a long name is shortened, with an ellipsis
        assert len(names) == len(STAGES) and all(s.name.startswith(n) for s, n in zip(STAGES, names))
        assert "12.5 ms" in rows[0] and "62.5 %" in rows[0] and "DataLoader workers" in rows[0]
        assert "main process" in rows[2] and "2.0 ms" in rows[2]
        assert rows[0].count("\u2588") > rows[1].count("\u2588") > rows[2].count("\u2588")
        assert all(len(line) <= width for line in block.splitlines())
    # under the step phases, before what bounds the step
    assert text.index("STEP PHASES") < text.index("DATA PIPELINE STAGES") < text.index("WHAT BOUNDS THE STEP")


def test_html_and_widget_show_the_stages_in_the_breakdown(staged):
    html = report_html(staged, Images())
    breakdown = html.split('id="gm-breakdown"', 1)[-1] if 'id="gm-breakdown"' in html else html
    assert "Data pipeline stages" in breakdown
    rows = re.findall(r"<tr><td class=\"gm-kname\"><code>([^<]+)</code></td><td>([^<]+)</td>"
                      r"<td class=\"gm-num\">([^<]+)</td><td class=\"gm-num\">([^<]+)</td>", html)
    assert rows[:4] == [("SlowResize", "DataLoader workers", "12.5 ms", "62.5 %"),
                        ("ImageFolder.__getitem__", "DataLoader workers", "5.0 ms", "25.0 %"),
                        ("default_collate", "main process", "2.0 ms", "10.0 %"),
                        ("other", "main process", "500 \u00b5s", "2.5 %")]
    assert "time per batch" in html and "summed over the processes" in html
    assert html.index("Step phases") < html.index("Data pipeline stages") < html.index("What bounds the step")
    pytest.importorskip("ipywidgets")
    from gpumagic.render.widget import TAB_TITLES, build_widget

    view = build_widget(staged, Images())
    tab = view.tabs.children[list(view.tabs.titles).index("Breakdown")]
    assert "Breakdown" in TAB_TITLES and "Data pipeline stages" in tab.value and "SlowResize" in tab.value
    view.close()


def test_without_stages_no_view_is_drawn():
    report = analysed("resnet50_v100_workers0")
    assert report.metrics.host.loader_stages is None
    assert "DATA PIPELINE STAGES" not in render_text(report)
    assert "Data pipeline stages" not in report_html(report, Images())
