"""The live report: ipywidgets 8 (header, then tabs Checklist · Timeline · Breakdown · Kernels ·
Memory · Notes).

The sections are the HTML renderer's own fragments, so the live and the static views agree.
The Timeline tab re-draws its PNG in the kernel when the user picks a step to zoom or a finding
to highlight. ipywidgets is imported here only; nothing else in gpumagic needs it.

A widget holds its report (the timeline is redrawn from the trace) until :meth:`ReportWidget.close`,
which closes every ipywidgets model of the tree (layouts and styles included) and lets the report
go; :mod:`gpumagic.render.display` closes all but the most recent live reports.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from gpumagic.render import html as h
from gpumagic.render._format import fmt_gain, fmt_ms, severity_label
from gpumagic.render.breakdown import breakdown_html
from gpumagic.render.conditions import conditions_html
from gpumagic.render.layout import step_label

if TYPE_CHECKING:  # pragma: no cover
    import ipywidgets

    from gpumagic.report.model import Report

TAB_TITLES = ("Checklist", "Timeline", "Breakdown", "Kernels", "Memory", "Notes")
#: Dropdown values meaning "no zoom" and "no highlight".
ALL_STEPS = -1
NO_HIGHLIGHT = ""
#: Widest the timeline image is shown (its natural width at 100 dpi).
TIMELINE_MAX_WIDTH = "1300px"
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
)


def _ipywidgets():
    try:
        import ipywidgets
    except ImportError as exc:  # pragma: no cover - exercised only without ipywidgets
        raise ImportError("the interactive report needs ipywidgets 8: pip install 'ipywidgets>=8'") from exc
    return ipywidgets


class ReportWidget:
    """The widget tree of one report; ``root`` is what a notebook displays.

    Named parts (``header``, ``tabs``, ``checklist``, ``step_select``, ``finding_select``,
    ``timeline_image``, ``timeline_status``) are kept for tests and for callers that embed pieces.
    """

    def __init__(self, report: Report | None, images: h.Images | None = None, *, live_token: str = "") -> None:
        w = _ipywidgets()
        self.report = report
        images = h.render_images(report) if images is None else images
        self.header = w.HTML(value=h.wrap(f"<style>{WIDGET_CSS}</style>" + h.header_html(report)))
        self.checklist = _checklist(w, report)
        timeline = self._timeline_tab(w, images.timeline_png)
        panels = [
            self.checklist,
            timeline,
            w.HTML(value=h.wrap(breakdown_html(report), style=False, framed=False)),
            w.HTML(value=h.wrap(h.kernels_html(report), style=False, framed=False)),
            w.HTML(value=h.wrap(h.memory_html(report, images.memory_png), style=False, framed=False)),
            w.HTML(value=h.wrap(h.notes_html(report) + conditions_html(report), style=False, framed=False)),
        ]
        self.tabs = w.Tab(children=panels, titles=list(TAB_TITLES), selected_index=0)
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
        _close_tree(self.root)
        self.report = None

    # -- timeline tab -----------------------------------------------------------------------------

    def _timeline_tab(self, w, png: bytes | None):
        if png is None:
            self.step_select = self.finding_select = self.timeline_image = None
            self.timeline_status = w.HTML(value=h.wrap(h.timeline_html(self.report, None), style=False, framed=False))
            return w.VBox([self.timeline_status])
        # layout and style given at construction: replacing them later would orphan open models
        self.step_select = w.Dropdown(options=step_options(self.report), value=ALL_STEPS, description="Zoom to",
                                      layout=_dropdown_layout(w), style={"description_width": "70px"})
        self.finding_select = w.Dropdown(options=finding_options(self.report), value=NO_HIGHLIGHT, description="Highlight",
                                         layout=_dropdown_layout(w), style={"description_width": "70px"})
        self.timeline_png = png
        self.timeline_image = w.HTML(value=_image_html(png))
        self.timeline_status = w.HTML(value="", layout=w.Layout(flex="1 1 220px"))
        self.step_select.observe(self._redraw, names="value")
        self.finding_select.observe(self._redraw, names="value")
        caption = w.HTML(value=h.wrap(_caption(), style=False, framed=False))
        controls = w.HBox([self.step_select, self.finding_select, self.timeline_status], layout=w.Layout(flex_flow="row wrap"))
        return w.VBox([controls, self.timeline_image, caption])

    def _redraw(self, _change=None) -> None:
        """Re-draw the timeline for the selected step and finding (runs in the kernel)."""
        from gpumagic.render.timeline import TimelineOptions, timeline_png

        report = self.report
        if report is None:  # closed: the view is gone, nothing to draw for
            return
        step = self.step_select.value
        finding = self.finding_select.value
        options = TimelineOptions(step=None if step == ALL_STEPS else step, finding=finding or None)
        self.timeline_status.value = "drawing\u2026"
        self.timeline_png = timeline_png(report, options)
        self.timeline_image.value = _image_html(self.timeline_png)
        self.timeline_status.value = _highlight_note(report, finding)


def build_widget(report: Report, images: h.Images | None = None, *, live_token: str = "") -> ReportWidget:
    """The live report for ``report`` (needs ipywidgets 8)."""
    return ReportWidget(report, images, live_token=live_token)


def _dropdown_layout(w):
    return w.Layout(width="auto", min_width="min(260px, 100%)")


def _image_html(png: bytes) -> str:
    """The timeline as an ``<img>`` with its text alternative (ipywidgets' Image has no alt)."""
    return h.wrap(f'<img class="gm-figure gm-timeline" alt="{escape(h.TIMELINE_ALT)}" src="{h.png_data_uri(png)}">',
                  style=False, framed=False)


def _close_tree(widget) -> None:
    """Close ``widget``, its children and their layout and style models."""
    for child in getattr(widget, "children", ()) or ():
        _close_tree(child)
    for part in ("layout", "style"):
        sub = getattr(widget, part, None)
        if sub is not None and hasattr(sub, "close"):
            sub.close()
    widget.close()


def _checklist(w, report: Report) -> ipywidgets.Widget:
    if not report.findings:
        return w.HTML(value=h.wrap(h.checklist_html(report), style=False, framed=False))
    origin = h.timeline_origin_ns(report)
    items = [w.HTML(value=h.wrap(f'<div class="gm-finding-body gm-finding gm-sev-{escape(f.severity)}">'
                                 f"{h.finding_body_html(f, origin)}</div>", style=False, framed=False))
             for f in report.findings]
    titles = [finding_title(f) for f in report.findings]
    return w.Accordion(children=items, titles=titles, selected_index=0)


def finding_title(f) -> str:
    """Accordion title: ``'✖ High · The training loop waits for the data loader — up to 33 % …'``."""
    return f"{severity_label(f.severity)} \u00b7 {f.title} \u2014 {fmt_gain(f.est_gain, f.gain_method)}"


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
    n = len(f.evidence.windows)
    return f"<i>{n} window{'s' if n != 1 else ''} outlined and hatched</i>"


def _caption() -> str:
    return h.timeline_caption()
