"""The timeline as inline SVG: text labels that stay readable at any width, in the page's theme.

The same lanes, layers, idle gaps, step marks and finding windows as the matplotlib figure
(:mod:`gpumagic.render.timeline`, kept for users who want a ``Figure``), drawn for an HTML page:

- **Readable at any width.** The outer ``<svg>`` is ``width="100%"`` with a height in pixels and
  *no* viewBox, so its ``<text>`` keeps its CSS font size (12 px) whether the output is 360 or
  1400 px wide; positions along time are percentages. The bars sit in a nested ``<svg>`` whose
  viewBox is stretched to the width (``preserveAspectRatio="none"``): rectangles may be stretched,
  text never is. Each lane's label is written *above* its bar, from the left edge, so no label is
  ever cut by a margin. Step and tick labels are placed by :func:`place_labels`: each is shifted
  (``dx`` in pixels beside its ``x`` in percent) so that it lies inside the chart at any width
  from :data:`MIN_CHART_PX`, and each carries the width below which it gives way to its
  neighbours (CSS container queries, ``gm-wN``), so labels never overlap; a lane label too long
  for the narrowest chart has a shortened twin there (``gm-nN``), its full text on hover.
- **Theme.** Every colour is a CSS custom property of the page (:mod:`gpumagic.render.page`):
  JupyterLab's light or dark theme, or the reader's ``prefers-color-scheme`` in a saved page.
- **Not by colour alone.** Each category has its own band shape in a lane (kernels fill the
  lane, copies its lower half, memsets a thin strip at the bottom, NCCL its upper half, ...), the
  legend draws the same shapes, and hovering a bar names it.
- **Fast and small whatever the trace.** Events closer than a pixel (at :data:`PLOT_PX`) are
  merged (darker = busier, in :data:`OPACITY_LEVELS` steps), no lane layer draws more than
  :data:`MAX_RECTS_PER_LAYER` rectangles and the whole chart at most :data:`MAX_RECTS`; the
  caption says how many events were drawn as how many rectangles. While a chart draws at most
  :data:`MAX_TITLED` rectangles (a zoomed view), each carries a hover title: its longest event's
  name, duration, lane (stream) and category, and how many more events it merges.
- **Findings.** Every finding's windows (at most :data:`MAX_WINDOWS_PER_FINDING`) are drawn as
  outlined, hatched bands with an ``id``: a link to ``#<id>`` (the checklist's window links)
  scrolls to the timeline and shows that band (CSS ``:target``); ``highlight`` shows one
  finding's bands from the start (the live widget).

Pure Python and numpy: no matplotlib, so the output is byte-for-byte the same everywhere.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from html import escape
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from gpumagic.render import palette
from gpumagic.render._format import fmt_ms, fmt_number, fmt_us, window_text
from gpumagic.render.chart_css import LABEL_BREAKPOINTS
from gpumagic.render.layout import LaneRow, TimelineView, plan_rows, plan_view, step_label
from gpumagic.render.timeline import MIN_LABELLED_STEP_SHARE, downsample

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Finding, Report
    from gpumagic.trace.model import Trace

#: Width, in pixels, at which "below a pixel" is judged (about the widest notebook output).
PLOT_PX = 1400
#: The nested bars' viewBox width (user units along time).
VB_W = 10000
#: Most rectangles per layer of a lane, and per chart (keeps the largest trace's page small).
MAX_RECTS_PER_LAYER = 1400
MAX_RECTS = 14000
#: Single-event rectangles that get a hover title (each costs ~120 bytes).
MAX_TITLED = 600
#: Opacity steps of merged rectangles (by busy share), lightest first.
OPACITY_LEVELS = (0.45, 0.65, 0.82, 1.0)
#: Windows drawn (and linked) per finding.
MAX_WINDOWS_PER_FINDING = 5
#: Highlighted windows are widened to at least this share of the view, so they stay visible.
MIN_HIGHLIGHT_FRAC = 0.004
#: Step marks labelled at most (every k-th beyond it); at narrow widths every other is hidden.
MAX_STEP_LABELS = 12
#: The narrowest chart the labels are laid out for, px: from this width on, every step, tick and
#: lane label lies inside the chart and no two labels of a row overlap (a narrower chart hides
#: the step and tick labels). 200 px: the chart in a 244 px output (JupyterLab's narrowest in practice) is
#: about 230 px wide.
MIN_CHART_PX = LABEL_BREAKPOINTS[0]
#: Font size of the chart's text (chart_css.py) and the least space between two labels, px.
FONT_PX = 12
LABEL_GAP_PX = 6
#: Vertical geometry, pixels.
TOP_PX = 8
LANE_LABEL_PX = 16
LANE_BAR_PX = 18
LANE_GAP_PX = 6
STEP_LABEL_PX = 16
AXIS_PX = 34
SERIES_PX = 64

#: Band of each layer within its lane, as (top, height) shares of the bar: the shape that tells
#: categories apart without colour. Keys are the layers' labels (palette.CATEGORY_LABEL etc.).
_BANDS = {
    palette.CATEGORY_LABEL["kernel"]: (0.0, 1.0),
    palette.CATEGORY_LABEL["communication"]: (0.0, 0.5),
    palette.CATEGORY_LABEL["memcpy"]: (0.5, 0.5),
    palette.CATEGORY_LABEL["memset"]: (0.78, 0.22),
    palette.CATEGORY_LABEL["cpu_exec"]: (0.0, 1.0),
    palette.CATEGORY_LABEL["dataloader"]: (0.35, 0.65),
    "host sync (blocks on the GPU)": (0.0, 0.65),
}
#: CSS class of each layer (colours come from the page's custom properties, per theme).
_CLASSES = {
    palette.CATEGORY_LABEL["kernel"]: "k",
    palette.CATEGORY_LABEL["communication"]: "n",
    palette.CATEGORY_LABEL["memcpy"]: "c",
    palette.CATEGORY_LABEL["memset"]: "s",
    palette.CATEGORY_LABEL["cpu_exec"]: "o",
    palette.CATEGORY_LABEL["dataloader"]: "d",
    "host sync (blocks on the GPU)": "y",
}
_PHASE_CLASS = {"data": "pd", "forward": "pf", "backward": "pb", "optimizer": "po", "evaluation": "pe", "other": "px"}
_PHASE_BAND = {"data": (0.0, 1.0), "forward": (0.0, 1.0), "backward": (0.25, 0.75), "optimizer": (0.0, 0.5),
               "evaluation": (0.0, 1.0), "other": (0.0, 1.0)}
_IDLE_CLASS = {"host_wait": "iw", "launch_latency": "il", "other": "io"}


@dataclass(frozen=True)
class SvgTimeline:
    """The chart's markup and what it took to draw it."""

    svg: str
    legend: str  #: the key, as an HTML list of swatches (wraps at any width)
    events: int  #: events in view
    rects: int  #: rectangles drawn
    pixel_ns: float  #: one pixel at :data:`PLOT_PX`, in ns
    anchor: str  #: id of the chart (window ids start with it)
    view: TimelineView

    def caption(self) -> str:
        """What was aggregated, in words."""
        return (f"{fmt_number(self.events)} events drawn as {fmt_number(self.rects)} rectangles: events closer than "
                f"one pixel ({_fmt_ns(self.pixel_ns)} at {PLOT_PX} px) are merged, and a merged bar is darker the busier it was.")


def chart_id(report: Report) -> str:
    """A stable id for the chart of this report (window links point into it)."""
    m = report.metrics
    key = "" if m is None else f"{m.trace.source}|{m.trace.events}|{m.window.start_ns}|{m.window.end_ns}"
    return "gm-tl-" + hashlib.sha1(key.encode()).hexdigest()[:8]


def window_id(anchor: str, finding_id: str, k: int) -> str:
    """The id of a finding's ``k``-th window band inside the chart ``anchor``."""
    safe = "".join(ch if ch.isalnum() else "-" for ch in finding_id)
    return f"{anchor}-{safe}-{k}"


def timeline_svg(report: Report, *, step: int | None = None, window_ns: tuple[int, int] | None = None,
                 highlight: str | None = None) -> SvgTimeline:
    """Draw the timeline of ``report.trace`` as SVG markup.

    ``step`` zooms to one step, ``window_ns`` to a range of trace time (ns, the trace's clock;
    wins over ``step``); ``highlight`` shows that finding's windows. Raises ValueError when the
    report holds no trace.
    """
    trace = report.trace
    if trace is None:
        raise ValueError("this report holds no trace (it was rebuilt from JSON?), so there is no timeline to draw")
    view = plan_view(report, step)
    if window_ns is not None:
        s, e = int(window_ns[0]), int(window_ns[1])
        view = TimelineView(s, max(e, s + 1), view.origin_ns, view.origin_label, f"Timeline \u2014 {_span_title(s, e, view)}")
    rows = plan_rows(report, trace, view)
    anchor = chart_id(report)
    return _Drawer(report, trace, view, rows, anchor, highlight).draw()


def _span_title(s: int, e: int, view: TimelineView) -> str:
    return f"{(s - view.origin_ns) / 1e6:,.2f}\u2013{(e - view.origin_ns) / 1e6:,.2f} ms, {fmt_ms((e - s) / 1e6)}"


def _fmt_ns(ns: float) -> str:
    return fmt_us(ns / 1e3) if ns < 1e6 else fmt_ms(ns / 1e6)


def _f(x: float) -> str:
    """A coordinate with at most one decimal, no trailing zeros (compact and deterministic)."""
    text = f"{x:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _pct(frac: float) -> str:
    return f"{min(max(frac, 0.0), 1.0) * 100:.2f}".rstrip("0").rstrip(".") + "%"


class _Drawer:
    def __init__(self, report: Report, trace: Trace, view: TimelineView, rows: list[LaneRow], anchor: str,
                 highlight: str | None) -> None:
        self.report, self.trace, self.view, self.rows, self.anchor = report, trace, view, rows, anchor
        self.highlight = highlight
        self.span = max(view.end_ns - view.start_ns, 1)
        self.pixel_ns = self.span / PLOT_PX
        self.rects = 0
        self.events = 0
        self.titled = 0
        self.used_classes: dict[str, str] = {}
        self.series_keys: dict[str, str] = {}  # sampled curves' key: label -> colour class
        self.lane_top = TOP_PX + STEP_LABEL_PX
        self.bars_h = len(rows) * (LANE_LABEL_PX + LANE_BAR_PX + LANE_GAP_PX)

    def x(self, t_ns: float | np.ndarray) -> np.ndarray:
        return (np.asarray(t_ns, dtype=np.float64) - self.view.start_ns) / self.span * VB_W

    def bar_y(self, row: int) -> float:
        """Top of the bar of ``row`` inside the bars' svg."""
        return row * (LANE_LABEL_PX + LANE_BAR_PX + LANE_GAP_PX) + LANE_LABEL_PX

    # -- the whole chart ----------------------------------------------------------------------------

    def draw(self) -> SvgTimeline:
        series = _series(self.trace)
        bars = self._lanes() + self._phases() + self._idle()
        hl = self._windows()
        steps_lines, steps_text = self._steps()
        series_parts, series_h = self._series(series, self.lane_top + self.bars_h)
        plot_bottom = self.lane_top + self.bars_h + series_h
        axis = self._axis(plot_bottom)
        height = plot_bottom + AXIS_PX + 4
        labels = "".join(lane_label(r.label, self.lane_top + self.bar_y(i) - 4) for i, r in enumerate(self.rows))
        inner = (f'<svg class="gm-tl-bars" x="0" y="{self.lane_top}" width="100%" height="{self.bars_h}" '
                 f'viewBox="0 0 {VB_W} {self.bars_h}" preserveAspectRatio="none">{bars}{steps_lines}{hl}</svg>')
        label = escape(f"{self.view.title}: {len(self.rows)} lanes ({', '.join(r.label for r in self.rows)})")
        svg = (f'<svg class="gm-tl" id="{self.anchor}" xmlns="http://www.w3.org/2000/svg" width="100%" height="{height}" '
               f'role="img" aria-label="{label}">{inner}{labels}{steps_text}{series_parts}{axis}</svg>')
        return SvgTimeline(svg, self._legend(), self.events, self.rects, self.pixel_ns, self.anchor, self.view)

    # -- lanes --------------------------------------------------------------------------------------

    def _lanes(self) -> str:
        ev = self.trace.events
        view = self.view
        in_view = (ev.ts_ns < view.end_ns) & (ev.ts_ns + ev.dur_ns > view.start_ns)
        n_layers = sum(len(r.layers) for r in self.rows) or 1
        budget = max(50, min(MAX_RECTS_PER_LAYER, MAX_RECTS // n_layers))
        out = []
        for i, row in enumerate(self.rows):
            for layer in row.layers:
                idx = np.flatnonzero(in_view & layer.mask)
                if idx.size == 0:
                    continue
                self.events += int(idx.size)
                start = np.maximum(ev.ts_ns[idx], view.start_ns)
                end = np.minimum(ev.ts_ns[idx] + ev.dur_ns[idx], view.end_ns)
                rects = downsample(start, end, self.pixel_ns, budget)
                top, h = _BANDS.get(layer.label, (0.0, 1.0))
                cls = _CLASSES.get(layer.label, "o")
                self.used_classes.setdefault(layer.label, cls)
                y0 = self.bar_y(i) + top * LANE_BAR_PX
                out.append(self._paths(rects.start_ns, rects.end_ns, rects.density, y0, h * LANE_BAR_PX, cls, layer.label))
                out.append(self._titles(idx, rects.start_ns, rects.end_ns, row, layer.label, y0, h * LANE_BAR_PX, cls))
        return "".join(out)

    def _paths(self, s: np.ndarray, e: np.ndarray, density: np.ndarray, y: float, h: float, cls: str, title: str) -> str:
        """One ``<path>`` per opacity step: ``M x y h w v h h -w z`` per rectangle."""
        if s.size == 0:
            return ""
        self.rects += int(s.size)
        x0, x1 = self.x(s), self.x(e)
        level = np.clip(np.searchsorted(np.linspace(0, 1, len(OPACITY_LEVELS) + 1)[1:-1], density, side="right"),
                        0, len(OPACITY_LEVELS) - 1)
        out = []
        for k, alpha in enumerate(OPACITY_LEVELS):
            sel = np.flatnonzero(level == k)
            if sel.size == 0:
                continue
            d = "".join(f"M{_f(a)} {_f(y)}h{_f(max(b - a, 0.2))}v{_f(h)}H{_f(a)}z" for a, b in zip(x0[sel], x1[sel]))
            op = "" if alpha == 1.0 else f' fill-opacity="{alpha}"'
            out.append(f'<path class="gm-f-{cls}"{op} d="{d}"><title>{escape(title)}</title></path>')
        return "".join(out)

    def _titles(self, idx: np.ndarray, s: np.ndarray, e: np.ndarray, row: LaneRow, category: str, y: float, h: float,
                cls: str) -> str:
        """Transparent hover targets over the rectangles (while at most :data:`MAX_TITLED` in all):
        each names its longest event (for host ops, the outermost), with its duration, lane and
        category, and how many more events it merges."""
        if self.titled + s.size > MAX_TITLED:
            return ""
        ev = self.trace.events
        starts = ev.ts_ns[idx]
        order = np.argsort(starts, kind="stable")
        idx, starts = idx[order], starts[order]
        first = np.searchsorted(starts, s, side="left")
        first[:1] = 0  # events that began before the view (clipped to its start) are in the first rectangle
        last = np.searchsorted(starts, e, side="left")
        out = []
        for a, b, lo, hi in zip(s, e, first, last):
            group = idx[int(lo):max(int(hi), int(lo) + 1)]
            j = int(group[np.argmax(ev.dur_ns[group])])
            name = self.trace.names[int(ev.name[j])]
            more = f" (+{group.size - 1} more event{'s' if group.size > 2 else ''} merged)" if group.size > 1 else ""
            text = f"{name} \u00b7 {_fmt_ns(float(ev.dur_ns[j]))} \u00b7 {row.label} \u00b7 {category}{more}"
            x0, x1 = self.x(a), self.x(b)
            out.append(f'<rect class="gm-hit" x="{_f(float(x0))}" y="{_f(y)}" width="{_f(max(float(x1 - x0), 0.2))}" '
                       f'height="{_f(h)}"><title>{escape(text)}</title></rect>')
        self.titled += len(out)
        return "".join(out)

    def _phases(self) -> str:
        ys = [i for i, r in enumerate(self.rows) if r.kind == "phases"]
        phases = None if self.report.metrics is None else self.report.metrics.phases
        if not ys or phases is None:
            return ""
        by_phase: dict[str, tuple[list[int], list[int]]] = {}
        for step in phases.spans_ns:
            for phase, spans in step.items():
                for s, e in spans:
                    if e <= self.view.start_ns or s >= self.view.end_ns:
                        continue
                    lists = by_phase.setdefault(phase, ([], []))
                    lists[0].append(max(int(s), self.view.start_ns))
                    lists[1].append(min(int(e), self.view.end_ns))
        out = []
        for phase, (s, e) in by_phase.items():
            label = f"phase: {palette.PHASE_LABEL.get(phase, phase)}"
            cls = _PHASE_CLASS.get(phase, "px")
            self.used_classes.setdefault(label, cls)
            top, h = _PHASE_BAND.get(phase, (0.0, 1.0))
            rects = downsample(np.asarray(s, np.int64), np.asarray(e, np.int64), self.pixel_ns, MAX_RECTS_PER_LAYER)
            out.append(self._paths(rects.start_ns, rects.end_ns, np.ones(len(rects)), self.bar_y(ys[0]) + top * LANE_BAR_PX,
                                   h * LANE_BAR_PX, cls, label))
        return "".join(out)

    def _idle(self) -> str:
        gpu_rows = [i for i, r in enumerate(self.rows) if r.kind == "gpu"]
        gaps = [] if self.report.metrics is None else self.report.metrics.idle.gaps
        if not gpu_rows or not gaps:
            return ""
        y0 = self.bar_y(min(gpu_rows)) - LANE_LABEL_PX
        y1 = self.bar_y(max(gpu_rows)) + LANE_BAR_PX + 2
        by_cause: dict[str, tuple[list[int], list[int]]] = {}
        for g in gaps:
            if g.end_ns <= self.view.start_ns or g.start_ns >= self.view.end_ns:
                continue
            cause = g.cause if g.cause in _IDLE_CLASS else "other"
            lists = by_cause.setdefault(cause, ([], []))
            lists[0].append(max(int(g.start_ns), self.view.start_ns))
            lists[1].append(min(int(g.end_ns), self.view.end_ns))
        out = []
        for cause, (s, e) in by_cause.items():
            label = palette.IDLE_LABEL[cause]
            self.used_classes.setdefault(label, _IDLE_CLASS[cause])
            rects = downsample(np.asarray(s, np.int64), np.asarray(e, np.int64), self.pixel_ns, MAX_RECTS_PER_LAYER)
            x0, x1 = self.x(rects.start_ns), self.x(rects.end_ns)
            self.rects += len(rects)
            d = "".join(f"M{_f(a)} {_f(y0)}h{_f(max(b - a, 0.2))}V{_f(y1)}H{_f(a)}z" for a, b in zip(x0, x1))
            out.append(f'<path class="gm-f-{_IDLE_CLASS[cause]} gm-idle" d="{d}"><title>{escape(label)}</title></path>')
        return "".join(out)

    # -- findings' windows --------------------------------------------------------------------------

    def _windows(self) -> str:
        out = []
        min_ns = self.span * MIN_HIGHLIGHT_FRAC
        origin = self.view.origin_ns
        for f in self.report.findings:
            shown = " gm-hl-on" if f.id == self.highlight else ""
            for k, w in enumerate(f.evidence.windows[:MAX_WINDOWS_PER_FINDING]):
                if w.end_ns <= self.view.start_ns or w.start_ns >= self.view.end_ns:
                    continue
                mid, half = (w.start_ns + w.end_ns) / 2, max(w.end_ns - w.start_ns, min_ns) / 2
                a = max(float(self.x(mid - half)), 0.0)
                b = min(float(self.x(mid + half)), float(VB_W))
                rows = _window_rows(w.lane, w.device, self.rows)
                lo, hi = (rows[0][0], rows[-1][1]) if rows else (0, len(self.rows) - 1)
                y0 = self.bar_y(lo) - LANE_LABEL_PX + 2
                y1 = self.bar_y(hi) + LANE_BAR_PX + 2
                text = f"{f.title}: {window_text(w, origin)}"
                out.append(f'<rect id="{window_id(self.anchor, f.id, k)}" class="gm-hl{shown}" x="{_f(a)}" y="{_f(y0)}" '
                           f'width="{_f(max(b - a, 1.0))}" height="{_f(y1 - y0)}"><title>{escape(text)}</title></rect>')
        return "".join(out)

    # -- steps, axis, series, legend ----------------------------------------------------------------

    def _steps(self) -> tuple[str, str]:
        m = self.report.metrics
        bounds = [] if m is None else m.steps.bounds_ns
        names = [] if m is None else m.steps.names
        view = self.view
        visible = [(i, b) for i, b in enumerate(bounds) if b[1] > view.start_ns and b[0] < view.end_ns]
        edges = sorted({int(b[0]) for _, b in visible} | {int(b[1]) for _, b in visible})
        lines = "".join(
            f'<line class="gm-tl-step" x1="{_f(float(self.x(t)))}" x2="{_f(float(self.x(t)))}" y1="0" y2="{self.bars_h}"/>'
            for t in edges if view.start_ns <= t <= view.end_ns
        )
        every = max(1, -(-len(visible) // MAX_STEP_LABELS))
        marks = []
        for k, (i, (s, e)) in enumerate(visible):
            shown = min(e, view.end_ns) - max(s, view.start_ns)
            if k % every or shown < MIN_LABELLED_STEP_SHARE * self.span / 2:
                continue
            mid = ((max(s, view.start_ns) + min(e, view.end_ns)) / 2 - view.start_ns) / self.span
            marks.append((mid, step_label(i, names)))
        return lines, _label_row(marks, "gm-tl-steplabel", TOP_PX + STEP_LABEL_PX - 4)

    def _axis(self, y: float) -> str:
        view = self.view
        start_ms, span_ms = (view.start_ns - view.origin_ns) / 1e6, self.span / 1e6
        step = _nice_step(span_ms / 5)
        first = np.ceil(start_ms / step) * step
        ticks = []
        marks = []
        t = first
        k = 0
        while t <= start_ms + span_ms + 1e-9:
            frac = (t - start_ms) / span_ms if span_ms else 0.0
            ticks.append(f'<line class="gm-tl-tick" x1="{_pct(frac)}" x2="{_pct(frac)}" y1="{_f(y)}" y2="{_f(y + 5)}"/>')
            marks.append((frac, _tick_text(t, step)))
            t = first + (k + 1) * step
            k += 1
        ticks.append(_label_row(marks, "gm-tl-ticklabel", y + 18))
        return (f'<line class="gm-tl-axis" x1="0" x2="100%" y1="{_f(y)}" y2="{_f(y)}"/>' + "".join(ticks)
                + f'<text class="gm-tl-axislabel" x="100%" y="{_f(y + 32)}" text-anchor="end">ms since '
                f"{escape(view.origin_label)}</text>")

    def _series(self, series: list[_Series], top: float) -> tuple[str, int]:
        out = []
        y = top
        for s in series:
            keep = (s.t_ns >= self.view.start_ns - self.span) & (s.t_ns <= self.view.end_ns + self.span)
            if not keep.any():
                continue
            y += 6
            vmax = s.vmax
            paths = []
            for label, values, cls in s.lines:
                t, v = s.t_ns[keep], values[keep]
                ok = np.isfinite(v)
                if not ok.any():
                    continue
                xs = np.clip(self.x(t[ok]), 0, VB_W)  # a sample just outside the view holds the line to its edge
                ys = SERIES_PX - np.clip(v[ok] / vmax, 0, 1) * (SERIES_PX - 4)
                pts = " ".join(f"{_f(a)},{_f(b)}" for a, b in zip(xs, ys))
                paths.append(f'<polyline class="gm-l-{cls}" points="{pts}"><title>{escape(label)}</title></polyline>')
            if not paths:
                continue
            inner = (f'<svg x="0" y="{_f(y + 16)}" width="100%" height="{SERIES_PX}" viewBox="{_f(0)} 0 {VB_W} {SERIES_PX}" '
                     f'preserveAspectRatio="none">'
                     f'<line class="gm-tl-grid" x1="0" x2="{VB_W}" y1="{SERIES_PX}" y2="{SERIES_PX}"/>'
                     f'<line class="gm-tl-grid" x1="0" x2="{VB_W}" y1="4" y2="4"/>{"".join(paths)}</svg>')
            for label, _, cls in s.lines:
                self.series_keys.setdefault(f"{label} ({s.unit})", cls)
            out.append(lane_label(f"{s.title} (0\u2013{s.vmax_text})", y + 12) + inner)
            y += 16 + SERIES_PX
        return "".join(out), int(y - top)

    def _legend(self) -> str:
        """One key per category drawn, in the band shape it has in a lane (HTML, so it wraps)."""
        items = list(self.used_classes.items())
        if any(f.id == self.highlight for f in self.report.findings):
            items.append(("evidence of the highlighted finding", "hl"))
        out = []
        for label, cls in items:
            top, h = _BANDS.get(label, (0.0, 1.0))
            if cls == "hl":
                swatch = '<rect class="gm-hl gm-hl-on" x="1" y="1" width="14" height="12"/>'
            else:
                swatch = f'<rect class="gm-f-{cls}" x="0" y="{_f(1 + top * 12)}" width="16" height="{_f(h * 12)}"/>'
            out.append(f'<li><svg class="gm-tl-key" width="16" height="14" aria-hidden="true">{swatch}</svg>{escape(label)}</li>')
        for label, cls in self.series_keys.items():
            out.append(f'<li><svg class="gm-tl-key" width="18" height="14" aria-hidden="true"><line class="gm-l-{cls}" x1="0" '
                       f'x2="18" y1="7" y2="7" stroke-width="2.5"/></svg>{escape(label)}</li>')
        return f'<ul class="gm-tl-legend">{"".join(out)}</ul>' if out else ""


# -- labels that fit at any width -------------------------------------------------------------------

#: Widths of characters in em, rounded up from DejaVu Sans (the widest of the fonts a page's
#: ``system-ui`` resolves to on Linux, macOS and Windows), so that an estimate is never short.
_NARROW = frozenset("ijlrtf.,:;'|!()[] \u00b7")
_WIDE = frozenset("mwMW%\u2014@")


def text_px(text: str, font_px: float = FONT_PX) -> float:
    """An upper estimate of ``text``'s width in pixels at ``font_px``."""
    em = 0.0
    for ch in text:
        if ch in _NARROW:
            em += 0.42
        elif ch in _WIDE:
            em += 1.0
        elif ch.isupper():
            em += 0.78
        else:
            em += 0.66
    return em * font_px


@dataclass(frozen=True)
class PlacedLabel:
    """A label of a row: ``frac`` (its point, a share of the chart's width), ``dx`` (pixels from
    that point to the label's left end), ``width`` (estimated, px) and ``min_px`` (the narrowest
    chart that shows it, one of :data:`~gpumagic.render.chart_css.LABEL_BREAKPOINTS`)."""

    frac: float
    text: str
    dx: float
    width: float
    min_px: int

    def left(self, chart_px: float) -> float:
        return self.frac * chart_px + self.dx


def place_labels(marks: list[tuple[float, str]], min_chart_px: float = MIN_CHART_PX) -> list[PlacedLabel]:
    """Labels centred on their points where they fit, for every chart width from ``min_chart_px``.

    Each label is shifted to lie inside the chart at ``min_chart_px`` (and so at any wider
    width: its left end moves right and its right end keeps its distance to the chart's right edge
    or more). Labels give way in levels (every 4th kept longest, then every 2nd, then the rest):
    a level's labels show from the narrowest breakpoint at which no two shown labels come closer
    than :data:`LABEL_GAP_PX`; a label that would need a chart wider than the widest breakpoint is
    dropped."""
    placed = []
    for frac, text in sorted(marks):
        w = text_px(text) + 1  # a pixel more: the coordinates are written rounded
        if w > min_chart_px:
            continue
        half = w / 2  # px left of the point: centred, unless that would cross an edge at the narrowest width
        # (half a pixel inside the left edge: the coordinates are written rounded)
        dx = -min(max(half, w - (1 - frac) * min_chart_px), max(frac * min_chart_px - 0.5, 0.0)) or 0.0  # never "-0"
        placed.append((frac, text, dx, w))
    need = 0.0
    out: list[PlacedLabel] = []
    for level in range(3):
        shown = [(k, p) for k, p in enumerate(placed) if _level(k) <= level]
        for (_, a), (_, b) in pairwise(shown):
            room = b[0] - a[0]
            # b's left end minus a's right end at width W: room * W + b.dx - (a.dx + a.w) >= gap
            need = max(need, (a[2] + a[3] - b[2] + LABEL_GAP_PX) / room if room > 0 else float("inf"))
        bp = next((b for b in LABEL_BREAKPOINTS if b >= need), None)
        if bp is None:
            break
        out += [PlacedLabel(p[0], p[1], p[2], p[3], bp) for k, p in shown if _level(k) == level]
    return sorted(out, key=lambda p: p.frac)


def _level(k: int) -> int:
    return 0 if k % 4 == 0 else (1 if k % 2 == 0 else 2)


def _label_row(marks: list[tuple[float, str]], cls: str, y: float) -> str:
    """The ``<text>`` elements of one row of labels (see :func:`place_labels`)."""
    return "".join(f'<text class="{cls} gm-w{p.min_px}" x="{_pct(p.frac)}" dx="{_f(p.dx)}" y="{_f(y)}">{escape(p.text)}</text>'
                   for p in place_labels(marks))


def lane_label(text: str, y: float) -> str:
    """A lane's (or a sampled panel's) label at the chart's left edge; when it would not fit the
    narrowest chart, a shortened twin (full text on hover) stands in below its own width."""
    full = f'<text class="gm-tl-lane" x="2" y="{_f(y)}">{escape(text)}</text>'
    width = text_px(text) + 4
    if width <= MIN_CHART_PX:
        return full
    bp = next((b for b in LABEL_BREAKPOINTS if b >= width), LABEL_BREAKPOINTS[-1])
    short = text
    while short and text_px(short + "\u2026") + 4 > MIN_CHART_PX:
        short = short[:-1]
    return (f'<text class="gm-tl-lane gm-w{bp}" x="2" y="{_f(y)}">{escape(text)}</text>'
            f'<text class="gm-tl-lane gm-n{bp}" x="2" y="{_f(y)}">{escape(short.rstrip())}\u2026<title>{escape(text)}</title></text>')


def axis_ticks(start: float, end: float, n: int = 5) -> list[tuple[float, str]]:
    """Round ticks between ``start`` and ``end`` with their text (``'1,500'``, ``'0.25'``)."""
    step = _nice_step((end - start) / n)
    first = float(np.ceil(start / step) * step)
    out = []
    k = 0
    while first + k * step <= end + 1e-9 * max(abs(end), 1):
        t = first + k * step
        out.append((t, _tick_text(t, step)))
        k += 1
    return out


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    mag = 10 ** np.floor(np.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return float(m * mag)
    return float(10 * mag)


def _tick_text(t: float, step: float) -> str:
    digits = max(0, int(-np.floor(np.log10(step)))) if step < 1 else 0
    return f"{t:,.{digits}f}"


def _window_rows(lane: str, device: int, rows: list[LaneRow]) -> list[tuple[int, int]]:
    from gpumagic.render.timeline import _window_rows as rows_of

    return rows_of(lane, device, rows)


@dataclass(frozen=True)
class _Series:
    title: str
    t_ns: np.ndarray
    lines: tuple[tuple[str, np.ndarray, str], ...]  # (label, values in the panel's unit, class)
    vmax: float
    vmax_text: str
    unit: str = "%"


def _series(trace: Trace) -> list[_Series]:
    """Sampled panels, one unit each: GPU % (utilisation and memory used), host CPU in cores busy."""
    from gpumagic.render.timeline import _gpu_rows

    s = trace.samples
    if s is None:
        return []
    out = []
    gpu, cpu = s.gpu or {}, s.cpu or {}
    if "t_ns" in gpu and ("gpu_util" in gpu or "mem_used_bytes" in gpu):
        t, keep = _gpu_rows(gpu, trace)
        lines = []
        if "gpu_util" in gpu:
            lines.append(("GPU utilisation", np.asarray(gpu["gpu_util"], float)[keep], "k"))
        if "mem_used_bytes" in gpu and "mem_total_bytes" in gpu:
            used, total = np.asarray(gpu["mem_used_bytes"], float)[keep], np.asarray(gpu["mem_total_bytes"], float)[keep]
            lines.append(("GPU memory used, of capacity", 100 * used / np.maximum(total, 1), "m"))
        if lines and t.size:
            out.append(_Series("GPU (NVML), %", t, tuple(lines), 100.0, "100 %", "%"))
    if "t_ns" in cpu and "total" in cpu and len(cpu["t_ns"]):
        per_core = np.asarray(cpu.get("per_core", np.zeros((0, 0))))
        n = int(per_core.shape[1]) if per_core.ndim == 2 and per_core.shape[1] else 0
        t = np.asarray(cpu["t_ns"], np.int64)
        if n:  # one unit for all three: cores busy (100 % of one core = 1 core)
            lines = [(f"host, all {n} cores", np.asarray(cpu["total"], float) * n / 100, "o")]
            if "main" in cpu:
                lines.append(("this process", np.asarray(cpu["main"], float) / 100, "k"))
            if "workers" in cpu:
                lines.append(("data-loader workers", np.asarray(cpu["workers"], float) / 100, "d"))
            out.append(_Series(f"host CPU, cores busy of {n}", t, tuple(lines), float(n), f"{n} cores", "cores busy"))
        else:  # cores unknown: only the share of all cores, on its own axis
            out.append(_Series("host CPU, % of all cores", t, (("host, all cores", np.asarray(cpu["total"], float), "o"),),
                               100.0, "100 %", "% of all cores"))
    return out


def windows_links_html(f: Finding, anchor: str, origin: int) -> str:
    """A finding's windows as links into the timeline chart ``anchor`` (the first
    :data:`MAX_WINDOWS_PER_FINDING`; ``origin``: where the x axis puts zero, ns)."""
    windows = f.evidence.windows
    links = [f'<a class="gm-win" href="#{window_id(anchor, f.id, k)}">{escape(window_text(w, origin))}</a>'
             for k, w in enumerate(windows[:MAX_WINDOWS_PER_FINDING])]
    more = len(windows) - MAX_WINDOWS_PER_FINDING
    tail = f' <span class="gm-muted">and {more} more</span>' if more > 0 else ""
    return " ".join(links) + tail
