"""The live report: ipywidgets 8 (header, then tabs Checklist · Timeline · Breakdown · Kernels ·
Memory · Notes).

The sections are the HTML renderer's own fragments, so the live and the static views agree.
The Timeline tab is the static report's inline SVG (:mod:`gpumagic.render.timeline_svg`), redrawn
in the kernel for the range in view. With anywidget installed (a dependency) it sits in
:mod:`gpumagic.render.timeline_zoom`'s widget: the wheel over the chart zooms around the cursor,
a drag pans, a double click shows the whole window, at once in the browser and then re-drawn by
the kernel for the new range, so detail appears as you zoom in. Buttons do the same (zoom in/out,
pan, whole window), a dropdown zooms to a step, and picking a finding highlights it: its time
windows become buttons that zoom to each window (Nsight-style). Hovering a bar shows its name,
duration, stream and category (SVG titles). Without anywidget the chart is a plain HTML widget
and the buttons are the only zoom. ipywidgets is imported here only; nothing else in gpumagic
needs it.

A widget holds its report (the timeline is redrawn from the trace) until :meth:`ReportWidget.close`,
which closes every ipywidgets model of the tree (layouts and styles included) and lets the report
go; :mod:`gpumagic.render.display` closes all but the most recent live reports.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from gpumagic.render import html as h
from gpumagic.render._format import STEP_TIME, fmt_gain, fmt_ms, gain_basis, severity_label
from gpumagic.render.breakdown import breakdown_html
from gpumagic.render.conditions import conditions_html
from gpumagic.render.layout import step_label
from gpumagic.render.modules import modules_html
from gpumagic.render.timeline_zoom import MIN_SPAN_NS

if TYPE_CHECKING:  # pragma: no cover
    import ipywidgets

    from gpumagic.report.model import Report

TAB_TITLES = ("Checklist", "Timeline", "Breakdown", "Kernels", "Memory", "Notes")
#: Dropdown values meaning "no zoom" and "no highlight".
ALL_STEPS = -1
NO_HIGHLIGHT = ""
#: Widest the timeline image is shown (its natural width at 100 dpi).
TIMELINE_MAX_WIDTH = "1300px"
#: One zoom step (the range in view shrinks or grows by this factor) and one pan step (share of it).
ZOOM_FACTOR = 2.0
PAN_SHARE = 0.5
#: A window is shown with this share of its length as margin on each side.
WINDOW_MARGIN = 0.5
#: Styles for the ipywidgets parts, scoped to the report's root: tab names never truncated (they
#: wrap onto a second row in a narrow output instead), panels that may shrink below their
#: content's width (code blocks and tables scroll inside their own boxes), a severity stripe on
#: each checklist item, and the timeline image at most its natural width.
WIDGET_CSS = (
    ".gpumagic-widget{min-width:0;max-width:100%}"
    ".gpumagic-widget .widget-html,.gpumagic-widget .widget-html-content,.gpumagic-widget .widget-box"
    "{min-width:0;max-width:100%}"
    ".gpumagic-widget .lm-TabBar,.gpumagic-widget .lm-TabBar-content{height:auto;min-height:0;flex-wrap:wrap;overflow:visible}"
    ".gpumagic-widget .lm-TabBar-tab{flex:0 0 auto !important;min-width:max-content !important;max-width:none !important}"
    ".gpumagic-widget .lm-TabBar-tabLabel{overflow:visible;text-overflow:clip}"
    # ipywidgets draws unselected tabs and closed accordion titles in a dimmed grey (4.2:1 in
    # JupyterLab Dark): the theme's strongest text colour keeps them above 4.5:1 in every theme
    ".gpumagic-widget .lm-TabBar-tab,.gpumagic-widget .lm-TabBar-tabLabel,.gpumagic-widget .jupyter-widget-Collapse-header"
    "{color:var(--jp-ui-font-color0,#000) !important}"
    ".gpumagic-widget .widget-dropdown{max-width:100%}"
    ".gpumagic-widget img.gm-figure{max-width:" + TIMELINE_MAX_WIDTH + "}"
    ".gpumagic-widget .gm-zoom-hint{display:inline-block;line-height:1.4;font-size:12.5px;color:var(--jp-ui-font-color0,#000)}"
)
#: What the chart's own gestures do (shown with the zoomable chart only).
ZOOM_HINT = "Wheel over the chart: zoom around the pointer \u00b7 drag: pan \u00b7 double click: the whole window"


def _ipywidgets():
    try:
        import ipywidgets
    except ImportError as exc:  # pragma: no cover - exercised only without ipywidgets
        raise ImportError("the interactive report needs ipywidgets 8: pip install 'ipywidgets>=8'") from exc
    return ipywidgets


class ReportWidget:
    """The widget tree of one report; ``root`` is what a notebook displays.

    Named parts (``header``, ``tabs``, ``checklist``, ``step_select``, ``finding_select``,
    ``zoom_buttons``, ``window_buttons``, ``timeline_image`` (the chart's widget: its ``value`` is
    the SVG chart's HTML; a :mod:`~gpumagic.render.timeline_zoom` widget when anywidget is
    installed, else an ``HTML`` widget), ``chart`` (the last
    :class:`~gpumagic.render.timeline_svg.SvgTimeline` drawn), ``timeline_status``) are kept for
    tests and for callers that embed pieces.
    """

    def __init__(self, report: Report | None, images: h.Images | None = None, *, live_token: str = "") -> None:
        w = _ipywidgets()
        self.report = report
        images = h.render_images(report) if images is None else images
        self.header = w.HTML(value=h.wrap(f"<style>{WIDGET_CSS}</style>" + h.header_html(report)))
        self.checklist = _checklist(w, report, self.show_finding)
        timeline = self._timeline_tab(w, images.timeline_png)
        panels = [
            self.checklist,
            timeline,
            w.HTML(value=h.wrap(breakdown_html(report), style=False, framed=False)),
            w.HTML(value=h.wrap(h.kernels_html(report), style=False, framed=False)),
            w.HTML(value=h.wrap(h.memory_html(report, images.memory_png), style=False, framed=False)),
            w.HTML(value=h.wrap(h.notes_html(report) + conditions_html(report), style=False, framed=False)),
        ]
        titles = list(TAB_TITLES)
        if mods := modules_html(report):  # the Modules tab, with --modules only
            panels.insert(4, w.HTML(value=h.wrap(mods, style=False, framed=False)))
            titles.insert(4, "Modules")
        self.tabs = w.Tab(children=panels, titles=titles, selected_index=0)
        self.root = w.VBox([self.header, self.tabs], layout=w.Layout(width="100%"))
        self.root.add_class("gpumagic-widget")
        if live_token:
            self.root.add_class(f"gm-live-{live_token}")

    def _repr_mimebundle_(self, **kwargs):
        return self.root._repr_mimebundle_(**kwargs)

    @property
    def closed(self) -> bool:
        return self.root.comm is None

    def close(self) -> None:
        """Close every model of the tree (the frontend removes the view) and drop the report."""
        for dd in (self.step_select, self.finding_select):
            if dd is not None:
                dd.unobserve_all()
        for button in getattr(self, "zoom_buttons", {}).values():
            button._click_handlers.callbacks.clear()
        if self.zoomable:
            self.timeline_image.unobserve_all()
        _close_tree(self.root)
        self.report = None

    # -- timeline tab -----------------------------------------------------------------------------

    def _timeline_tab(self, w, png: bytes | None = None):
        self.window_buttons = w.HBox([], layout=w.Layout(flex_flow="row wrap"))
        self.view_ns: tuple[int, int] | None = None
        self.zoomable = False
        self.zoom_hint = None
        self._answered = 0  # the zoomable chart's last request drawn
        if self.report is None or self.report.trace is None:
            self.step_select = self.finding_select = self.timeline_image = None
            self.timeline_status = w.HTML(value=h.wrap(h.timeline_html(self.report, png), style=False, framed=False))
            return w.VBox([self.timeline_status])
        from gpumagic.render.layout import plan_view

        full = plan_view(self.report, None)
        self.full_ns = (full.start_ns, full.end_ns)
        # layout and style given at construction: replacing them later would orphan open models
        self.step_select = w.Dropdown(options=step_options(self.report), value=ALL_STEPS, description="Zoom to",
                                      layout=_dropdown_layout(w), style={"description_width": "70px"})
        self.finding_select = w.Dropdown(options=finding_options(self.report), value=NO_HIGHLIGHT, description="Highlight",
                                         layout=_dropdown_layout(w), style={"description_width": "70px"})
        self.zoom_buttons = {
            name: w.Button(description=text, tooltip=tip, layout=w.Layout(width="auto"))
            for name, text, tip in (("in", "+ zoom in", "Zoom in (half the range)"),
                                    ("out", "\u2212 zoom out", "Zoom out (twice the range)"),
                                    ("left", "\u25c0 earlier", "Pan to earlier times"),
                                    ("right", "later \u25b6", "Pan to later times"),
                                    ("reset", "whole window", "Show the whole analysis window"))
        }
        for name, button in self.zoom_buttons.items():
            button.on_click(lambda _b, name=name: self.zoom(name))
        from gpumagic.render.timeline_zoom import zoomable_timeline_class

        zoomable = zoomable_timeline_class()
        self.zoomable = zoomable is not None
        if zoomable is None:  # no anywidget: the buttons zoom
            self.timeline_image = w.HTML(value="")
        else:
            self.timeline_image = zoomable(full_span=float(max(self.full_ns[1] - self.full_ns[0], 1)),
                                           min_span=float(MIN_SPAN_NS), layout=w.Layout(width="100%"))
            self.timeline_image.observe(self._on_request, names="request")
        self.timeline_status = w.HTML(value="", layout=w.Layout(flex="1 1 220px"))
        self.step_select.observe(self._on_step, names="value")
        self.finding_select.observe(self._on_finding, names="value")
        self.caption = w.HTML(value="")
        controls = w.HBox([self.step_select, self.finding_select, self.timeline_status], layout=w.Layout(flex_flow="row wrap"))
        zoom_parts = list(self.zoom_buttons.values())
        self.zoom_hint = w.HTML(value=f'<span class="gm-zoom-hint">{escape(ZOOM_HINT)}</span>') if self.zoomable else None
        if self.zoom_hint is not None:
            zoom_parts.append(self.zoom_hint)
        zoom = w.HBox(zoom_parts, layout=w.Layout(flex_flow="row wrap", align_items="center"))
        self._redraw()
        return w.VBox([controls, zoom, self.window_buttons, self.timeline_image, self.caption])

    # -- interactions (each redraws the SVG in the kernel) ------------------------------------------

    def zoom(self, action: str) -> None:
        """``'in'``, ``'out'``, ``'left'``, ``'right'`` or ``'reset'`` the range in view."""
        lo, hi = self.full_ns
        s, e = self.view_ns or self.full_ns
        span = max(e - s, 1)
        mid = (s + e) / 2
        if action == "reset":
            self.view_ns = None
        else:
            if action == "in":
                span = max(span / ZOOM_FACTOR, MIN_SPAN_NS)
            elif action == "out":
                span = min(span * ZOOM_FACTOR, hi - lo)
            elif action in ("left", "right"):
                mid += (-1 if action == "left" else 1) * span * PAN_SHARE
            else:
                raise ValueError(f"unknown zoom action {action!r}: in, out, left, right or reset")
            self.view_ns = _clamp(mid - span / 2, mid + span / 2, lo, hi)
        self._redraw()

    def zoom_to(self, start_ns: float, end_ns: float) -> None:
        """Show the range ``start_ns``..``end_ns`` (trace clock), kept inside the analysis window and
        at least :data:`~gpumagic.render.timeline_zoom.MIN_SPAN_NS` long (the whole window when
        it covers it)."""
        lo, hi = self.full_ns
        span = max(end_ns - start_ns, MIN_SPAN_NS)
        mid = (start_ns + end_ns) / 2
        view = _clamp(mid - span / 2, mid + span / 2, lo, hi)
        self.view_ns = None if view == (lo, hi) else view
        self._redraw()

    def _on_request(self, change) -> None:
        """The zoomable chart's wheel or drag: ``[lo, hi, n]``, ns after the window's start."""
        req = change["new"]
        if self.report is None or len(req) != 3:
            return
        lo, hi, n = req
        self._answered = max(self._answered, int(n))
        self.zoom_to(self.full_ns[0] + lo, self.full_ns[0] + hi)

    def show_finding(self, finding_id: str) -> None:
        """Open the Timeline tab with ``finding_id`` highlighted and zoomed to its first window."""
        if self.finding_select is None:
            return
        self.finding_select.value = finding_id
        self.zoom_to_window(0)
        self.tabs.selected_index = TAB_TITLES.index("Timeline")

    def zoom_to_window(self, index: int) -> None:
        """Zoom to the ``index``-th time window of the highlighted finding."""
        f = self.report.finding(self.finding_select.value) if self.report is not None and self.finding_select.value else None
        if f is None or not 0 <= index < len(f.evidence.windows):
            return
        win = f.evidence.windows[index]
        margin = max((win.end_ns - win.start_ns) * WINDOW_MARGIN, 1000)
        self.view_ns = _clamp(win.start_ns - margin, win.end_ns + margin, *self.full_ns)
        self._redraw()

    def _on_step(self, _change=None) -> None:
        step = self.step_select.value
        if step == ALL_STEPS:
            self.view_ns = None
        else:
            from gpumagic.render.layout import plan_view

            v = plan_view(self.report, step)
            self.view_ns = (v.start_ns, v.end_ns)
        self._redraw()

    def _on_finding(self, _change=None) -> None:
        self._window_buttons()
        self._redraw()

    def _window_buttons(self) -> None:
        from gpumagic.render._format import window_text
        from gpumagic.render.timeline_svg import MAX_WINDOWS_PER_FINDING

        w = _ipywidgets()
        for old in self.window_buttons.children:
            _close_tree(old)
        f = self.report.finding(self.finding_select.value) if self.report is not None and self.finding_select.value else None
        buttons = []
        origin = h.timeline_origin_ns(self.report) if self.report is not None else 0
        for k, win in enumerate([] if f is None else f.evidence.windows[:MAX_WINDOWS_PER_FINDING]):
            b = w.Button(description=window_text(win, origin), tooltip="Zoom to this window", layout=w.Layout(width="auto"))
            b.on_click(lambda _b, k=k: self.zoom_to_window(k))
            buttons.append(b)
        self.window_buttons.children = buttons

    def _redraw(self, _change=None) -> None:
        """Re-draw the timeline for the range in view and the selected finding (runs in the kernel)."""
        from gpumagic.render.timeline_svg import timeline_svg

        report = self.report
        if report is None:  # closed: the view is gone, nothing to draw for
            return
        finding = self.finding_select.value
        self.timeline_status.value = "drawing\u2026"
        chart = timeline_svg(report, window_ns=self.view_ns, highlight=finding or None)
        self.chart = chart
        markup = h.wrap(h.chart_html(chart), style=False, framed=False)
        if self.zoomable:
            from gpumagic.render.timeline_zoom import chart_markup

            base = self.full_ns[0]
            markup = chart_markup(markup, lo=chart.view.start_ns - base, hi=chart.view.end_ns - base,
                                  origin=chart.view.origin_ns - base, answered=self._answered)
        self.timeline_image.value = markup
        self.caption.value = h.wrap(h.timeline_caption(chart.caption()), style=False, framed=False)
        self.timeline_status.value = _highlight_note(report, finding)


def _clamp(s: float, e: float, lo: int, hi: int) -> tuple[int, int]:
    """``(s, e)`` moved inside ``[lo, hi]``, keeping its length where it fits."""
    span = min(e - s, hi - lo)
    s = min(max(s, lo), hi - span)
    return int(s), int(s + span)


def build_widget(report: Report, images: h.Images | None = None, *, live_token: str = "") -> ReportWidget:
    """The live report for ``report`` (needs ipywidgets 8)."""
    return ReportWidget(report, images, live_token=live_token)


def _dropdown_layout(w):
    return w.Layout(width="auto", min_width="min(260px, 100%)")


def _close_tree(widget) -> None:
    """Close ``widget``, its children and their layout and style models."""
    for child in getattr(widget, "children", ()) or ():
        _close_tree(child)
    for part in ("layout", "style"):
        sub = getattr(widget, part, None)
        if sub is not None and hasattr(sub, "close"):
            sub.close()
    widget.close()


def _checklist(w, report: Report, show=None) -> ipywidgets.Widget:
    """An accordion of the findings; ``show(finding_id)`` (the widget's), when given, backs a
    "Show on the timeline" button under each finding that has time windows."""
    if not report.findings:
        return w.HTML(value=h.wrap(h.checklist_html(report), style=False, framed=False))
    origin = h.timeline_origin_ns(report)
    items = []
    for f in report.findings:
        body = w.HTML(value=h.wrap(f'<div class="gm-finding-body gm-finding gm-sev-{escape(f.severity)}">'
                                   f"{h.finding_body_html(f, origin, basis=gain_basis(report))}</div>", style=False, framed=False))
        if show is None or not f.evidence.windows or report.trace is None:
            items.append(body)
            continue
        button = w.Button(description="Show on the timeline", tooltip="Open the Timeline tab with this finding highlighted",
                          layout=w.Layout(width="auto"))
        button.on_click(lambda _b, fid=f.id: show(fid))
        items.append(w.VBox([body, button]))
    titles = [finding_title(f, gain_basis(report)) for f in report.findings]
    return w.Accordion(children=items, titles=titles, selected_index=0)


def finding_title(f, basis: str = STEP_TIME) -> str:
    """Accordion title: ``'✖ High · The training loop waits for the data loader — up to 33 % …'``."""
    return f"{severity_label(f.severity)} \u00b7 {f.title} \u2014 {fmt_gain(f.est_gain, f.gain_method, basis)}"


def step_options(report: Report) -> list[tuple[str, int]]:
    """Dropdown options: the whole window, then each recorded step with its duration."""
    steps = None if report.metrics is None else report.metrics.steps
    names = [] if steps is None else steps.names
    durations = [] if steps is None else steps.durations_ms
    bounds = [] if steps is None else steps.bounds_ns
    options = [("all steps", ALL_STEPS)]
    for i in range(len(bounds)):
        dur = durations[i] if i < len(durations) else None
        options.append((f"{step_label(i, names)} \u00b7 {fmt_ms(dur)}", i))
    return options


def finding_options(report: Report) -> list[tuple[str, str]]:
    """Dropdown options: no highlight, then each finding (saying when it has no time windows)."""
    options = [("nothing", NO_HIGHLIGHT)]
    for f in report.findings:
        suffix = "" if f.evidence.windows else " (no time windows)"
        options.append((f"{severity_label(f.severity)} \u00b7 {f.title}{suffix}", f.id))
    return options


def _highlight_note(report: Report, finding_id: str) -> str:
    f = report.finding(finding_id) if finding_id else None
    if f is None:
        return ""
    if not f.evidence.windows:
        return "<i>this finding has no time windows to show</i>"
    from gpumagic.render.timeline_svg import MAX_WINDOWS_PER_FINDING

    n = len(f.evidence.windows)
    shown = min(n, MAX_WINDOWS_PER_FINDING)
    of = f" of {n}" if shown < n else ""
    return f"<i>{shown}{of} window{'s' if n != 1 else ''} outlined; the buttons below zoom to each</i>"


def _caption() -> str:
    return h.timeline_caption()
