"""The ipywidgets tree, its interactions, and the MIME bundle a notebook receives."""

import re

import ipywidgets as w
import pytest

from gpumagic.render import display as mb
from gpumagic.render.html import Images
from gpumagic.render.widget import ALL_STEPS, NO_HIGHLIGHT, TAB_TITLES, build_widget
from gpumagic.report.model import Report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def view(loader_report):
    return build_widget(loader_report)


def test_tree_is_header_then_six_tabs(view, loader_report):
    root = view.root
    assert isinstance(root, w.VBox) and root.children == (view.header, view.tabs)
    assert tuple(view.tabs.titles) == TAB_TITLES
    assert len(view.tabs.children) == len(TAB_TITLES)
    assert "Median step" in view.header.value and loader_report.findings[0].title in view.header.value


def test_checklist_has_one_item_per_finding_with_severity_word_and_gain(view, loader_report):
    acc = view.checklist
    assert isinstance(acc, w.Accordion) and acc.selected_index == 0
    assert len(acc.children) == len(loader_report.findings)
    for title, f, body in zip(acc.titles, loader_report.findings, acc.children):
        assert f.title in title and f.severity.title() in title and "% of step time" in title
        html = body.children[0].value if isinstance(body, w.VBox) else body.value
        assert "Why it matters" in html and "<pre" in html


def test_timeline_tab_has_controls_and_an_svg(view, loader_report):
    assert '<svg class="gm-tl"' in view.timeline_image.value and "<img" not in view.timeline_image.value
    steps = [value for _, value in view.step_select.options]
    assert steps == [ALL_STEPS, *range(loader_report.metrics["steps"]["count"])]
    findings = [value for _, value in view.finding_select.options]
    assert findings == [NO_HIGHLIGHT, *loader_report.finding_ids]
    assert set(view.zoom_buttons) == {"in", "out", "left", "right", "reset"}


def test_choosing_a_step_and_a_finding_redraws_the_timeline(view):
    full = view.chart.view
    view.step_select.value = 1
    zoomed = view.chart.view
    assert zoomed.end_ns - zoomed.start_ns < full.end_ns - full.start_ns
    view.finding_select.value = "dataloader-bound"
    assert "gm-hl gm-hl-on" in view.timeline_image.value and view.timeline_image.value.count("<svg class=\"gm-tl\"") == 1
    assert "outlined" in view.timeline_status.value and view.window_buttons.children
    n = len(view.report.finding("dataloader-bound").evidence.windows)
    shown = len(view.window_buttons.children)  # as many buttons as windows drawn, and the note says so
    assert view.timeline_status.value.startswith(f"<i>{shown} of {n} windows" if shown < n else f"<i>{n} window")
    view.finding_select.value = "mixed-precision-off"  # a finding without time windows
    assert "no time windows" in view.timeline_status.value and not view.window_buttons.children
    view.step_select.value = ALL_STEPS
    view.finding_select.value = NO_HIGHLIGHT
    assert view.timeline_status.value == "" and view.chart.view == full


def test_zoom_pan_and_window_buttons_change_the_range_in_view(view, loader_report):
    full = view.chart.view
    view.zoom("in")
    half = view.chart.view
    assert abs((half.end_ns - half.start_ns) * 2 - (full.end_ns - full.start_ns)) <= 2
    view.zoom("right")
    assert view.chart.view.start_ns > half.start_ns
    view.zoom("out")
    view.zoom("out")
    assert (view.chart.view.start_ns, view.chart.view.end_ns) == (full.start_ns, full.end_ns)  # clamped to the window
    view.show_finding("dataloader-bound")  # the checklist's "Show on the timeline"
    win = loader_report.finding("dataloader-bound").evidence.windows[0]
    shown = view.chart.view
    assert shown.start_ns <= win.start_ns and win.end_ns <= shown.end_ns and shown.end_ns - shown.start_ns < full.end_ns - full.start_ns
    assert view.tabs.selected_index == 1 and "gm-hl gm-hl-on" in view.timeline_image.value
    view.zoom("reset")
    view.finding_select.value = NO_HIGHLIGHT
    view.tabs.selected_index = 0
    assert view.chart.view == full


def _markup_range(value: str) -> tuple[float, float, int]:
    m = re.search(r'<div class="gm-zoom-chart" data-lo="(-?\d+)" data-hi="(\d+)" data-origin="-?\d+" data-answered="(\d+)">', value)
    assert m, value[:200]
    return float(m[1]), float(m[2]), int(m[3])


def test_the_chart_zooms_on_a_front_end_request_and_stays_in_sync_with_the_buttons(view, loader_report):
    from gpumagic.render.timeline_zoom import ESM, zoomable_timeline_class

    chart = view.timeline_image
    assert view.zoomable and isinstance(chart, zoomable_timeline_class()) and chart._esm == ESM
    lo, hi = view.full_ns
    assert chart.full_span == hi - lo and _markup_range(chart.value)[:2] == (0, hi - lo)
    assert "Wheel over the chart" in view.zoom_hint.value and view.zoom_hint in view.tabs.children[1].children[1].children
    a, b = (hi - lo) * 0.25, (hi - lo) * 0.375
    chart.request = [a, b, 1]  # what the module sets after a wheel or drag
    shown = view.chart.view
    assert (shown.start_ns, shown.end_ns) == (lo + int(a), lo + int(a) + int(b - a)) and view.view_ns == (shown.start_ns, shown.end_ns)
    assert _markup_range(chart.value) == (shown.start_ns - lo, shown.end_ns - lo, 1)
    ticks_full = re.findall(r'class="gm-tl-ticklabel[^"]*"[^>]*>([^<]*)<', timeline_svg_text(view, None))
    ticks_zoomed = re.findall(r'class="gm-tl-ticklabel[^"]*"[^>]*>([^<]*)<', chart.value)
    assert ticks_zoomed != ticks_full  # re-drawn for the new range, not stretched
    view.zoom("in")  # the buttons go on from the range the wheel left
    assert view.chart.view.end_ns - view.chart.view.start_ns == (shown.end_ns - shown.start_ns) // 2
    chart.request = [-(hi - lo), 2.0 * (hi - lo), 2]  # past both ends: the whole window
    assert view.view_ns is None and _markup_range(chart.value) == (0, hi - lo, 2)
    chart.request = [10.0, 10.0, 3]  # a zero-length range: the narrowest allowed
    assert view.chart.view.end_ns - view.chart.view.start_ns == 1000
    view.zoom("reset")
    assert _markup_range(chart.value)[2] == 3  # a kernel-side redraw answers no new request


def timeline_svg_text(view, window):
    from gpumagic.render.timeline_svg import timeline_svg

    return timeline_svg(view.report, window_ns=window).svg


def test_a_findings_window_zooms_to_it_and_highlights_it_in_the_zoomable_chart(loader_report):
    v = build_widget(loader_report)
    try:
        v.show_finding("dataloader-bound")
        win = loader_report.finding("dataloader-bound").evidence.windows[0]
        lo = v.full_ns[0]
        a, b, _ = _markup_range(v.timeline_image.value)
        assert a <= win.start_ns - lo and win.end_ns - lo <= b and b - a < v.full_ns[1] - v.full_ns[0]
        assert "gm-hl gm-hl-on" in v.timeline_image.value
        v.window_buttons.children[-1].click()
        last = loader_report.finding("dataloader-bound").evidence.windows[len(v.window_buttons.children) - 1]
        a, b, _ = _markup_range(v.timeline_image.value)
        assert a <= last.start_ns - lo and last.end_ns - lo <= b
    finally:
        v.close()


def test_without_anywidget_the_timeline_falls_back_to_an_html_widget_and_buttons(monkeypatch, small_report):
    import sys

    from gpumagic.render import timeline_zoom

    monkeypatch.setitem(sys.modules, "anywidget", None)  # `import anywidget` raises ImportError
    timeline_zoom.zoomable_timeline_class.cache_clear()
    try:
        v = build_widget(small_report)
        assert not v.zoomable and type(v.timeline_image) is w.HTML
        assert '<svg class="gm-tl"' in v.timeline_image.value and "gm-zoom-chart" not in v.timeline_image.value
        assert v.zoom_hint is None
        full = v.chart.view
        v.zoom("in")
        assert v.chart.view.end_ns - v.chart.view.start_ns < full.end_ns - full.start_ns
        v.close()
    finally:
        monkeypatch.delitem(sys.modules, "anywidget")
        timeline_zoom.zoomable_timeline_class.cache_clear()
    assert timeline_zoom.zoomable_timeline_class() is not None


def test_closing_closes_every_child_widget_the_zoomable_chart_included(small_report):
    v = build_widget(small_report)
    chart = v.timeline_image
    models = _all_models(v.root)
    assert chart in models and chart.comm is not None
    v.close()
    assert chart.comm is None and all(m.comm is None for m in models) and v.report is None
    assert not chart._trait_notifiers.get("request")  # no callback into the closed widget


def _all_models(widget) -> list:
    out = [widget]
    for part in ("layout", "style"):
        if getattr(widget, part, None) is not None:
            out.append(getattr(widget, part))
    for child in getattr(widget, "children", ()) or ():
        out += _all_models(child)
    return out


def test_other_tabs_hold_the_html_sections(view):
    breakdown, kernels, memory, notes = view.tabs.children[2:]
    assert "Step time by category" in breakdown.value and "GPU idle time" in breakdown.value
    assert "Top kernels by total time" in kernels.value and "pageable" in kernels.value
    assert "Memory" in memory.value or "memory" in memory.value
    assert "Source:" in notes.value


def test_a_report_without_trace_or_findings_builds_a_widget():
    view = build_widget(Report(metrics=None, findings=[], notes=[]), Images())
    assert view.timeline_image is None and view.step_select is None
    assert "No findings" in view.checklist.value
    assert "No timeline" in view.timeline_status.value


# -- the MIME bundle ------------------------------------------------------------------------------


class _Formatter:
    def __init__(self, active):
        self.active_types = active


class _Shell:
    """Stands in for IPython's shell: ``kernel`` is set only in a Jupyter kernel."""

    def __init__(self, kernel, active):
        self.kernel = kernel
        self.display_formatter = _Formatter(active)


#: What ipykernel's display formatter lists: its formatters' types (the widget type is not one).
KERNEL_TYPES = ("text/plain", "text/html", "text/markdown", "image/svg+xml", "image/png", "application/json")


def _in_shell(monkeypatch, kernel, active=KERNEL_TYPES):
    monkeypatch.setattr(mb, "_ipython_shell", lambda: _Shell(kernel, list(active)))


@pytest.fixture
def published(monkeypatch):
    """The bundles ``show()`` hands to IPython's display (raw MIME bundles, in order)."""
    import IPython.display

    seen = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: seen.append((obj, raw)))
    yield seen
    mb.close_live_views()  # leave no live view open for later tests


def test_a_live_kernel_gets_the_static_report_then_the_live_view(monkeypatch, small_report, published):
    _in_shell(monkeypatch, kernel=object())
    mb.show(small_report)
    (static, raw1), (live, raw2) = published
    assert raw1 and raw2
    assert set(static) == {mb.HTML_MIME, mb.TEXT_MIME} and static[mb.TEXT_MIME] == small_report.to_text()
    assert set(live) == {mb.WIDGET_MIME, mb.TEXT_MIME} and live[mb.TEXT_MIME] == mb.LIVE_NOTE
    view = mb.live_views()[-1]
    assert live[mb.WIDGET_MIME]["model_id"] == view.root.model_id
    token = next(c for c in view.root._dom_classes if c.startswith("gm-live-")).removeprefix("gm-live-")
    html = static[mb.HTML_MIME]
    assert f'class="gpumagic-report gpumagic-static gm-static-{token}"' in html
    # the swap rules: hide the widget's output until its view is drawn, then hide the static report
    assert f".jp-OutputArea-child:has(.gm-static-{token})+.jp-OutputArea-child:not(:has(.gm-live-{token})){{display:none}}" in html
    assert f".jp-OutputArea-child:has(.gm-static-{token}):has(+.jp-OutputArea-child .gm-live-{token}){{display:none}}" in html


def test_each_display_gets_its_own_token(monkeypatch, small_report, published):
    _in_shell(monkeypatch, kernel=object())
    mb.show(small_report)
    mb.show(small_report)
    tokens = {c for v in mb.live_views()[-2:] for c in v.root._dom_classes if c.startswith("gm-live-")}
    assert len(tokens) == 2


def test_without_a_kernel_show_publishes_one_static_output(monkeypatch, small_report, published):
    _in_shell(monkeypatch, kernel=None)
    mb.show(small_report)
    [(bundle, raw)] = published
    assert raw and set(bundle) == {mb.HTML_MIME, mb.TEXT_MIME}
    assert "gm-static-" not in bundle[mb.HTML_MIME] and ":has(" not in bundle[mb.HTML_MIME]


def test_the_report_mimebundle_is_static(monkeypatch, small_report):
    _in_shell(monkeypatch, kernel=object())
    bundle = small_report._repr_mimebundle_()
    assert set(bundle) == {mb.HTML_MIME, mb.TEXT_MIME}
    assert 'class="gpumagic-report gpumagic-static"' in bundle[mb.HTML_MIME]
    assert bundle[mb.TEXT_MIME] == small_report.to_text()


def test_widgets_can_be_switched_off(monkeypatch, small_report, published):
    _in_shell(monkeypatch, kernel=object())
    monkeypatch.setenv(mb.WIDGETS_ENV, "0")
    mb.show(small_report)
    [(bundle, _)] = published
    assert set(bundle) == {mb.HTML_MIME, mb.TEXT_MIME}


def test_outside_a_kernel_there_is_no_widget(monkeypatch, small_report):
    _in_shell(monkeypatch, kernel=None)
    assert set(mb.mimebundle(small_report)) == {mb.HTML_MIME, mb.TEXT_MIME}


def test_a_terminal_shell_gets_only_text(monkeypatch, small_report, published):
    _in_shell(monkeypatch, kernel=None, active=("text/plain",))
    assert set(mb.mimebundle(small_report)) == {mb.TEXT_MIME}
    mb.show(small_report)
    assert [set(b) for b, _ in published] == [{mb.TEXT_MIME}]


def test_include_and_exclude_are_honoured(monkeypatch, small_report):
    _in_shell(monkeypatch, kernel=object())
    assert set(mb.mimebundle(small_report, include={"text/html"})) == {mb.HTML_MIME}
    assert set(mb.mimebundle(small_report, exclude={"text/plain"})) == {mb.HTML_MIME}
