"""The live report: ipywidgets 8 (header, then tabs Checklist · Timeline · Breakdown · Kernels ·
Memory · Notes).

The sections are the HTML renderer's own fragments, so the live and the static views agree.
The Timeline tab re-draws its PNG in the kernel when the user picks a step to zoom or a finding
to highlight. ipywidgets is imported here only; nothing else in gpumagic needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render import html as h
from gpumagic.render._format import fmt_gain, fmt_ms, severity_label
from gpumagic.render.breakdown import breakdown_html
from gpumagic.render.layout import step_label
from gpumagic.render.summary import metric

if TYPE_CHECKING:  # pragma: no cover
    import ipywidgets

    from gpumagic.report.model import Report

TAB_TITLES = ("Checklist", "Timeline", "Breakdown", "Kernels", "Memory", "Notes")
#: Dropdown values meaning "no zoom" and "no highlight".
ALL_STEPS = -1
NO_HIGHLIGHT = ""
#: Widest the timeline image is shown (its natural width at 100 dpi).
TIMELINE_MAX_WIDTH = "1300px"


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

    def __init__(self, report: Report, images: h.Images | None = None) -> None:
        w = _ipywidgets()
        self.report = report
        images = h.render_images(report) if images is None else images
        self.header = w.HTML(value=h.wrap(h.header_html(report)))
        self.checklist = _checklist(w, report)
        timeline = self._timeline_tab(w, images.timeline_png)
        panels = [
            self.checklist,
            timeline,
            w.HTML(value=h.wrap(breakdown_html(report), style=False, framed=False)),
            w.HTML(value=h.wrap(h.kernels_html(report), style=False, framed=False)),
            w.HTML(value=h.wrap(h.memory_html(report, images.memory_png), style=False, framed=False)),
            w.HTML(value=h.wrap(h.notes_html(report), style=False, framed=False)),
        ]
        self.tabs = w.Tab(children=panels, titles=list(TAB_TITLES), selected_index=0)
        self.root = w.VBox([self.header, self.tabs], layout=w.Layout(width="100%"))
        self.root.add_class("gpumagic-widget")

    def _repr_mimebundle_(self, **kwargs):
        return self.root._repr_mimebundle_(**kwargs)

    # -- timeline tab -----------------------------------------------------------------------------

    def _timeline_tab(self, w, png: bytes | None):
        if png is None:
            self.step_select = self.finding_select = self.timeline_image = None
            self.timeline_status = w.HTML(value=h.wrap(h.timeline_html(self.report, None), style=False, framed=False))
            return w.VBox([self.timeline_status])
        self.step_select = w.Dropdown(options=step_options(self.report), value=ALL_STEPS, description="Zoom to")
        self.finding_select = w.Dropdown(options=finding_options(self.report), value=NO_HIGHLIGHT, description="Highlight")
        for dd in (self.step_select, self.finding_select):
            dd.layout = w.Layout(width="auto", min_width="260px")
            dd.style = {"description_width": "70px"}
        self.timeline_image = w.Image(value=png, format="png", layout=w.Layout(width="100%", max_width=TIMELINE_MAX_WIDTH))
        self.timeline_status = w.HTML(value="")
        self.step_select.observe(self._redraw, names="value")
        self.finding_select.observe(self._redraw, names="value")
        caption = w.HTML(value=h.wrap(_caption(), style=False, framed=False))
        controls = w.HBox([self.step_select, self.finding_select, self.timeline_status])
        return w.VBox([controls, self.timeline_image, caption])

    def _redraw(self, _change=None) -> None:
        """Re-draw the timeline for the selected step and finding (runs in the kernel)."""
        from gpumagic.render.timeline import TimelineOptions, timeline_png

        step = self.step_select.value
        finding = self.finding_select.value
        options = TimelineOptions(step=None if step == ALL_STEPS else step, finding=finding or None)
        self.timeline_status.value = "drawing\u2026"
        self.timeline_image.value = timeline_png(self.report, options)
        self.timeline_status.value = _highlight_note(self.report, finding)


def build_widget(report: Report, images: h.Images | None = None) -> ReportWidget:
    """The live report for ``report`` (needs ipywidgets 8)."""
    return ReportWidget(report, images)


def _checklist(w, report: Report) -> ipywidgets.Widget:
    if not report.findings:
        return w.HTML(value=h.wrap(h.checklist_html(report), style=False, framed=False))
    origin = h.timeline_origin_ns(report)
    items = [w.HTML(value=h.wrap(h.finding_body_html(f, origin), style=False, framed=False)) for f in report.findings]
    titles = [finding_title(f) for f in report.findings]
    return w.Accordion(children=items, titles=titles, selected_index=0)


def finding_title(f) -> str:
    """Accordion title: ``'✖ High · The training loop waits for the data loader — up to 33 % …'``."""
    return f"{severity_label(f.severity)} \u00b7 {f.title} \u2014 {fmt_gain(f.est_gain)}"


def step_options(report: Report) -> list[tuple[str, int]]:
    """Dropdown options: the whole window, then each recorded step with its duration."""
    names = metric(report.metrics, "steps", "names") or []
    durations = metric(report.metrics, "steps", "durations_ms") or []
    bounds = metric(report.metrics, "steps", "bounds_ns") or []
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
    return f"<i>{len(f.evidence.windows)} window(s) highlighted in yellow</i>"


def _caption() -> str:
    return (
        '<p class="gm-muted">Grey: CPU ops; orange: data-loader waits; red: host syncs that block on the GPU. '
        "One lane per GPU stream. Darker means busier (events closer than a pixel are merged). Shaded "
        "columns: GPU idle gaps by cause. Dashed lines: step boundaries.</p>"
    )
