"""The timeline figure: where the host and each GPU stream spent the recorded steps.

Lanes, top to bottom: the main thread's CPU ops (data-loader waits and host syncs drawn on
top in their own colours), other host threads or data-loader worker processes when the trace
has them, then one lane per GPU stream (kernels, NCCL kernels, copies, memsets). Beneath them,
when samples were recorded: NVML GPU utilisation and memory, and host CPU utilisation (all
cores, the main thread, the data-loader workers).
Dashed lines mark step boundaries; GPU idle gaps (``metrics["idle"]["gaps"]``) are shaded by
cause; a finding's evidence windows can be highlighted.

Downsampling: each layer of a lane is first reduced to the union of its intervals, then
intervals closer than one pixel are merged (the merged rectangle's opacity shows how busy it
was), so no lane draws more than :data:`MAX_RECTS_PER_LANE` rectangles whatever the trace size.

Only matplotlib's object-oriented API is used (``Figure`` + ``FigureCanvasAgg``): no pyplot,
no global state, safe to call from any thread and in tests.

Theme: ``TimelineOptions(theme="dark")`` (``report.timeline(theme="dark")``) draws on the dark
background of :data:`gpumagic.render.palette.FIGURE_THEMES` with the palette's lighter tints;
the default ``"light"`` draws on white. Either way every text colour has a contrast of at least
4.5:1 on the figure's background (tests/render/test_timeline.py measures it).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpumagic.render import palette
from gpumagic.render.layout import LaneRow, TimelineView, plan_rows, plan_view, step_label

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from gpumagic.report.model import Finding, Report
    from gpumagic.trace.model import Trace

#: Most rectangles one lane may draw (issue 4: keeps the 216k-event fixture near one second).
MAX_RECTS_PER_LANE = 2000
#: Figure geometry, inches. 11 in at 110 dpi is a 1210-pixel image; the font sizes below stay
#: legible when a notebook shrinks it to ~850 pixels.
FIG_WIDTH_IN = 11.0
DPI = 110
LEFT_IN, RIGHT_IN = 1.45, 0.2
TOP_IN, BOTTOM_IN = 1.1, 0.55
LANE_HEIGHT_IN = 0.42
MIN_LANES_HEIGHT_IN = 0.9
SAMPLE_HEIGHT_IN = 0.95
FONT_TITLE, FONT_LANE, FONT_TICK, FONT_LEGEND, FONT_STEP = 12.5, 10, 9, 9, 8.5
#: Headroom above the sampled curves, so that their legend does not cover a curve at 100 %.
SAMPLE_HEADROOM = 1.4
#: Room under 0 % (a share of the top), so that an idle 0 % line is not hidden by the x axis.
SAMPLE_FLOOR_FRAC = 0.08
#: Opacity of a merged rectangle: ``MIN_ALPHA`` when nearly empty, 1 when fully busy.
MIN_ALPHA = 0.35
#: Opacity of the idle-gap shading (light enough to see the events through it).
IDLE_ALPHA = 0.2
#: Highlighted windows are widened to at least this many pixels so that they stay visible.
MIN_HIGHLIGHT_PX = 4
#: A step is labelled only when this share of the view shows it (no labels squeezed at an edge).
MIN_LABELLED_STEP_SHARE = 0.1
#: Label at most this many steps; beyond it, every k-th step.
MAX_STEP_LABELS = 16


@dataclass
class Rects:
    """Display-ready intervals of one layer: start/end in ns and busy share (0..1) of each."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    density: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __len__(self) -> int:
        return int(self.start_ns.shape[0])


def union_intervals(start_ns: np.ndarray, end_ns: np.ndarray, gap_ns: float = 0) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals that overlap or lie within ``gap_ns`` of each other; sorted output."""
    if start_ns.size == 0:
        return start_ns.astype(np.int64), end_ns.astype(np.int64)
    order = np.argsort(start_ns, kind="stable")
    s, e = start_ns[order], np.maximum.accumulate(end_ns[order])
    new = np.empty(s.shape, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1] + gap_ns
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], e[last]


def downsample(start_ns: np.ndarray, end_ns: np.ndarray, res_ns: float, max_rects: int = MAX_RECTS_PER_LANE) -> Rects:
    """Reduce intervals to at most ``max_rects`` rectangles at a resolution of ``res_ns``.

    The exact union is merged across gaps shorter than ``res_ns`` (one pixel), doubling the
    gap until the count fits. Each rectangle's ``density`` is the union time it covers over
    its length; rectangles shorter than a pixel are widened to one pixel.
    """
    us, ue = union_intervals(start_ns, end_ns)
    if us.size == 0:
        return Rects(us, ue, np.zeros(0))
    gap = max(float(res_ns), 1.0)
    while True:
        ms, me = union_intervals(us, ue, gap)
        if ms.size <= max_rects:
            break
        gap *= 2
    group = np.searchsorted(ms, us, side="right") - 1
    busy = np.bincount(group, weights=(ue - us).astype(np.float64), minlength=ms.size)
    span = np.maximum(me - ms, 1).astype(np.float64)
    density = np.clip(busy / span, 0.0, 1.0)
    return Rects(ms, np.maximum(me, ms + int(res_ns)), density)


@dataclass(frozen=True)
class TimelineOptions:
    """What to draw: ``step`` zooms to one step (index into ``metrics["steps"]``), ``finding``
    highlights that finding's evidence windows, ``theme`` is ``"light"`` (white background) or
    ``"dark"``."""

    step: int | None = None
    finding: str | None = None
    width_in: float = FIG_WIDTH_IN
    dpi: int = DPI
    theme: str = "light"


def timeline_figure(report: Report, options: TimelineOptions | None = None) -> Figure:
    """Draw the timeline of ``report.trace`` on a new Agg-backed figure.

    Raises ValueError when the report holds no trace (e.g. one rebuilt from JSON).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    options = options or TimelineOptions()
    th = palette.figure_theme(options.theme)
    trace = _require_trace(report)
    view = plan_view(report, options.step)
    rows = plan_rows(report, trace, view)
    series = _sample_series(trace, view)
    height = TOP_IN + BOTTOM_IN + _lanes_height(rows) + SAMPLE_HEIGHT_IN * len(series)
    fig = Figure(figsize=(options.width_in, height), dpi=options.dpi, facecolor=th.background)
    FigureCanvasAgg(fig)
    axes = _make_axes(fig, rows, series, options.width_in, height)
    plot_px = (options.width_in - LEFT_IN - RIGHT_IN) * options.dpi
    res_ns = (view.end_ns - view.start_ns) / max(plot_px, 1.0)
    finding = report.finding(options.finding) if options.finding else None
    _draw_lanes(axes[0], trace, rows, view, res_ns, th)
    _draw_phases(axes[0], report, rows, view, th)
    _draw_idle_gaps(axes[0], report, rows, view, th)
    for ax, s in zip(axes[1:], series):
        _draw_series(ax, s, view, th)
    _draw_steps(axes, report, view, th)
    if finding is not None:
        _draw_highlight(axes, finding, rows, view, res_ns, th)
    _decorate(fig, axes, rows, view, finding, th)
    return fig


def timeline_png(report: Report, options: TimelineOptions | None = None) -> bytes:
    """The timeline as PNG bytes (see :func:`timeline_figure`)."""
    return figure_png(timeline_figure(report, options))


def figure_png(fig: Figure) -> bytes:
    """Render a figure with Agg and return the PNG bytes (no timestamp metadata)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    buf = io.BytesIO()
    canvas.print_png(buf, metadata={"Software": None})
    return buf.getvalue()


def _require_trace(report: Report) -> Trace:
    if report.trace is None:
        raise ValueError("this report holds no trace (it was rebuilt from JSON?), so there is no timeline to draw")
    return report.trace


# -- layout of the axes ---------------------------------------------------------------------------


def _make_axes(fig: Figure, rows: list[LaneRow], series: list[_Series], width_in: float, height_in: float) -> list[Axes]:
    left, right = LEFT_IN / width_in, 1 - RIGHT_IN / width_in
    top = 1 - TOP_IN / height_in
    heights = [_lanes_height(rows)] + [SAMPLE_HEIGHT_IN] * len(series)
    gs = fig.add_gridspec(
        len(heights), 1, height_ratios=heights, left=left, right=right, top=top, bottom=BOTTOM_IN / height_in, hspace=0.12
    )
    first = fig.add_subplot(gs[0])
    return [first] + [fig.add_subplot(gs[i], sharex=first) for i in range(1, len(heights))]


def _lanes_height(rows: list[LaneRow]) -> float:
    return max(LANE_HEIGHT_IN * len(rows), MIN_LANES_HEIGHT_IN)


def _decorate(fig: Figure, axes: list[Axes], rows: list[LaneRow], view: TimelineView, finding: Finding | None,
              th: palette.FigureTheme = palette.FIGURE_THEMES["light"]) -> None:
    lanes_ax = axes[0]
    lanes_ax.set_yticks(range(len(rows)), [r.label for r in rows], fontsize=FONT_LANE)
    lanes_ax.set_ylim(len(rows) - 0.5, -0.5)
    start_ms, end_ms = _ms(view.start_ns, view), _ms(view.end_ns, view)
    # a window of zero length (every event lasts 0 µs) still gets an axis, without matplotlib's warning
    lanes_ax.set_xlim(start_ms, max(end_ms, start_ms + 1e-3))
    lanes_ax.tick_params(axis="y", length=0)
    for ax in axes:
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        for side in ("left", "bottom"):
            ax.spines[side].set_color(th.line)
        ax.set_facecolor(th.background)
        ax.tick_params(axis="x", labelsize=FONT_TICK)
        ax.tick_params(colors=th.line, labelcolor=th.text)
    for ax in axes[:-1]:
        ax.tick_params(axis="x", labelbottom=False)
    axes[-1].set_xlabel(f"time since {view.origin_label} (ms)", fontsize=FONT_LANE, color=th.text)
    title = view.title if finding is None else f"{view.title} \u00b7 highlighted: {finding.title}"
    fig.text(0.5, 1 - 0.12 / fig.get_figheight(), title, ha="center", va="top", fontsize=FONT_TITLE, fontweight="bold",
             color=th.text)
    handles = _legend_handles(lanes_ax)
    if handles:
        fig.legend(
            handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.38 / fig.get_figheight()),
            ncol=min(len(handles), 5), fontsize=FONT_LEGEND, frameon=False, handlelength=1.2, columnspacing=1.2,
            labelcolor=th.text,
        )


def _legend_handles(ax: Axes) -> list:
    """One legend entry per labelled collection, in full colour (rectangles carry density alpha)."""
    from matplotlib.patches import Patch

    seen: dict[str, Patch] = {}
    for coll in ax.collections:
        label = coll.get_label()
        if label and not label.startswith("_") and label not in seen:
            face, edge = getattr(coll, "legend_style", ("#000000", "none"))
            hatch = coll.get_hatch() if face == "none" else None
            seen[label] = Patch(facecolor=face, edgecolor=edge, hatch=hatch, label=label)
    return list(seen.values())


def _ms(t_ns: float | np.ndarray, view: TimelineView) -> float | np.ndarray:
    return (np.asarray(t_ns, dtype=np.float64) - view.origin_ns) / 1e6


# -- lanes ----------------------------------------------------------------------------------------


def _draw_lanes(ax: Axes, trace: Trace, rows: list[LaneRow], view: TimelineView, res_ns: float, th: palette.FigureTheme) -> None:
    ev = trace.events
    in_view = (ev.ts_ns < view.end_ns) & (ev.ts_ns + ev.dur_ns > view.start_ns)
    for y, row in enumerate(rows):
        budget = MAX_RECTS_PER_LANE // max(len(row.layers), 1)
        for layer in row.layers:
            idx = np.flatnonzero(in_view & layer.mask)
            if idx.size == 0:
                continue
            start = np.maximum(ev.ts_ns[idx], view.start_ns)
            end = np.minimum(ev.ts_ns[idx] + ev.dur_ns[idx], view.end_ns)
            rects = downsample(start, end, res_ns, budget)
            _add_rects(ax, rects, y, view, th.color(layer.color), layer.label)


def _add_rects(ax: Axes, rects: Rects, y: float, view: TimelineView, color: str, label: str, half: float = 0.38) -> None:
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba

    x0, x1 = _ms(rects.start_ns, view), _ms(rects.end_ns, view)
    verts = np.empty((len(rects), 4, 2))
    verts[:, :, 0] = np.stack([x0, x0, x1, x1], axis=1)
    verts[:, :, 1] = [y - half, y + half, y + half, y - half]
    colors = np.tile(to_rgba(color), (len(rects), 1))
    colors[:, 3] = MIN_ALPHA + (1 - MIN_ALPHA) * rects.density
    coll = PolyCollection(verts, facecolors=colors, edgecolors="none", label=label, zorder=2)
    coll.legend_style = (color, "none")
    ax.add_collection(coll, autolim=False)


def _draw_phases(ax: Axes, report: Report, rows: list[LaneRow], view: TimelineView, th: palette.FigureTheme) -> None:
    """The ``step phases`` lane: each step's data / forward / backward / optimizer / evaluation spans
    (``metrics.phases.spans_ns``); the rest of the step is ``other``, left blank."""
    from matplotlib.collections import PolyCollection

    ys = [i for i, r in enumerate(rows) if r.kind == "phases"]
    if not ys:
        return
    y, half = ys[0], 0.38
    by_phase: dict[str, list] = {}
    phases = None if report.metrics is None else report.metrics.phases
    for step in [] if phases is None else phases.spans_ns:
        for phase, spans in step.items():
            for s, e in spans:
                if e <= view.start_ns or s >= view.end_ns:
                    continue
                x0, x1 = _ms(max(s, view.start_ns), view), _ms(min(e, view.end_ns), view)
                by_phase.setdefault(phase, []).append([(x0, y - half), (x0, y + half), (x1, y + half), (x1, y - half)])
    for phase, verts in by_phase.items():
        color = th.color(palette.PHASE_COLOR.get(phase, palette.PALE_GREY))
        coll = PolyCollection(verts, facecolors=color, edgecolors="none", label=f"phase: {palette.PHASE_LABEL.get(phase, phase)}",
                              zorder=2)
        coll.legend_style = (color, "none")
        ax.add_collection(coll, autolim=False)


def _draw_idle_gaps(ax: Axes, report: Report, rows: list[LaneRow], view: TimelineView, th: palette.FigureTheme) -> None:
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba

    gpu_rows = [i for i, r in enumerate(rows) if r.kind == "gpu"]
    gaps = [] if report.metrics is None else report.metrics.idle.gaps
    if not gpu_rows or not gaps:
        return
    y0, y1 = min(gpu_rows) - 0.5, max(gpu_rows) + 0.5
    by_cause: dict[str, list] = {}
    for g in gaps:
        if g.end_ns <= view.start_ns or g.start_ns >= view.end_ns:
            continue
        cause = g.cause if g.cause in palette.IDLE_COLOR else "other"
        x0, x1 = _ms(max(g.start_ns, view.start_ns), view), _ms(min(g.end_ns, view.end_ns), view)
        by_cause.setdefault(cause, []).append([(x0, y0), (x0, y1), (x1, y1), (x1, y0)])
    for cause, verts in by_cause.items():
        color = th.color(palette.IDLE_COLOR[cause])
        coll = PolyCollection(verts, facecolors=color, edgecolors="none", alpha=IDLE_ALPHA, label=palette.IDLE_LABEL[cause], zorder=1)
        coll.legend_style = (to_rgba(color, IDLE_ALPHA), "none")
        ax.add_collection(coll, autolim=False)


def _draw_steps(axes: list[Axes], report: Report, view: TimelineView, th: palette.FigureTheme) -> None:
    bounds = [] if report.metrics is None else report.metrics.steps.bounds_ns
    names = [] if report.metrics is None else report.metrics.steps.names
    visible = [(i, b) for i, b in enumerate(bounds) if b[1] > view.start_ns and b[0] < view.end_ns]
    edges = sorted({b[0] for _, b in visible} | {b[1] for _, b in visible})
    for ax in axes:
        for t in edges:
            if view.start_ns <= t <= view.end_ns:
                ax.axvline(_ms(t, view), color=th.line, linestyle=(0, (4, 3)), linewidth=0.8, zorder=4)
    every = max(1, -(-len(visible) // MAX_STEP_LABELS))
    span = view.end_ns - view.start_ns
    for k, (i, (s, e)) in enumerate(visible):
        shown = min(e, view.end_ns) - max(s, view.start_ns)
        if k % every or shown < MIN_LABELLED_STEP_SHARE * span:
            continue
        mid = _ms((max(s, view.start_ns) + min(e, view.end_ns)) / 2, view)
        label = step_label(i, names)
        axes[0].annotate(label, (mid, 1), xycoords=("data", "axes fraction"), xytext=(0, 2), textcoords="offset points",
                         ha="center", va="bottom", fontsize=FONT_STEP, color=th.muted, annotation_clip=False, zorder=6)


def _draw_highlight(axes: list[Axes], finding: Finding, rows: list[LaneRow], view: TimelineView, res_ns: float,
                    th: palette.FigureTheme) -> None:
    from matplotlib.collections import PolyCollection

    verts, spans = [], []
    min_ns = res_ns * MIN_HIGHLIGHT_PX
    for w in finding.evidence.windows:
        if w.end_ns <= view.start_ns or w.start_ns >= view.end_ns:
            continue
        mid, half = (w.start_ns + w.end_ns) / 2, max(w.end_ns - w.start_ns, min_ns) / 2
        x0, x1 = _ms(mid - half, view), _ms(mid + half, view)
        ys = _window_rows(w.lane, w.device, rows)
        verts += [[(x0, lo - 0.5), (x0, hi + 0.5), (x1, hi + 0.5), (x1, lo - 0.5)] for lo, hi in ys]
        if not w.lane:
            spans.append((x0, x1))
    if verts:  # outline and hatch, no fill: visible over any colour, and the events stay readable
        coll = PolyCollection(verts, facecolors="none", edgecolors=th.edge, hatch=palette.HIGHLIGHT_HATCH,
                              linewidths=1.6, label=f"evidence: {finding.id}", zorder=5)
        coll.legend_style = ("none", th.edge)
        axes[0].add_collection(coll, autolim=False)
    for ax in axes[1:]:
        for x0, x1 in spans:
            ax.axvspan(x0, x1, facecolor="none", edgecolor=th.edge, hatch=palette.HIGHLIGHT_HATCH,
                       linewidth=1.0, zorder=0)


def _window_rows(lane: str, device: int, rows: list[LaneRow]) -> list[tuple[int, int]]:
    """Contiguous row ranges a window covers: GPU rows of ``device``, the main thread, or all."""
    if lane == "gpu":
        picked = [i for i, r in enumerate(rows) if r.kind == "gpu" and (device < 0 or r.device == device)]
    elif lane == "cpu":
        picked = [i for i, r in enumerate(rows) if r.kind == "cpu_main"]
    else:
        picked = list(range(len(rows)))
    ranges: list[tuple[int, int]] = []
    for i in picked:
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1] = (ranges[-1][0], i)
        else:
            ranges.append((i, i))
    return ranges


# -- sampled series (NVML, host CPU) --------------------------------------------------------------


@dataclass(frozen=True)
class _Series:
    title: str
    t_ns: np.ndarray
    lines: tuple[tuple[str, np.ndarray, str], ...]  # (label, values in %, colour)


def _sample_series(trace: Trace, view: TimelineView) -> list[_Series]:
    s = trace.samples
    if s is None:
        return []
    out = []
    gpu, cpu = s.gpu or {}, s.cpu or {}
    if "t_ns" in gpu and ("gpu_util" in gpu or "mem_used_bytes" in gpu):
        t, keep = _gpu_rows(gpu, trace)
        lines = []
        if "gpu_util" in gpu:
            lines.append(("GPU utilisation", np.asarray(gpu["gpu_util"], float)[keep], palette.BLUE))
        if "mem_used_bytes" in gpu and "mem_total_bytes" in gpu:
            used, total = np.asarray(gpu["mem_used_bytes"], float)[keep], np.asarray(gpu["mem_total_bytes"], float)[keep]
            lines.append(("GPU memory used", 100 * used / np.maximum(total, 1), palette.PURPLE))
        if lines:
            out.append(_Series("GPU (NVML) %", t, tuple(lines)))
    if "t_ns" in cpu and "total" in cpu:
        lines = [("host CPU, all cores", np.asarray(cpu["total"], float), palette.GREY)]
        if "main" in cpu:
            lines.append(("this process, all threads (% of one core)", np.asarray(cpu["main"], float), palette.BLUE))
        if "workers" in cpu:
            lines.append(("data-loader workers (% of one core)", np.asarray(cpu["workers"], float), palette.ORANGE))
        out.append(_Series("host CPU %", np.asarray(cpu["t_ns"], np.int64), tuple(lines)))
    return [x for x in out if x.t_ns.size]


def _gpu_rows(gpu: dict[str, np.ndarray], trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Samples of the GPU the trace ran on (the first device seen) when several were sampled."""
    t = np.asarray(gpu["t_ns"], np.int64)
    keep = np.ones(t.shape, dtype=bool)
    if "device" in gpu and len(gpu["device"]):
        dev = np.asarray(gpu["device"])
        gpu_devs = trace.events.device[trace.events.device >= 0]
        wanted = int(gpu_devs[0]) if gpu_devs.size else int(dev[0])
        keep = dev == wanted if (dev == wanted).any() else keep
    return t[keep], keep


def _draw_series(ax: Axes, s: _Series, view: TimelineView, th: palette.FigureTheme) -> None:
    x = _ms(s.t_ns, view)
    top = 100.0
    for label, values, color in s.lines:
        ax.plot(x, values, color=th.color(color), linewidth=1.6, label=label, drawstyle="steps-post", zorder=3)
        if values.size:
            top = max(top, float(np.nanmax(values)))
    # a margin under 0 % and headroom over 100 %, so that a flat line at either end stays off the axes
    ax.set_ylim(-SAMPLE_FLOOR_FRAC * top, top * SAMPLE_HEADROOM)
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
    ax.set_ylabel(s.title, fontsize=FONT_TICK, color=th.text)
    ax.tick_params(axis="y", labelsize=FONT_TICK - 1)
    ax.grid(axis="y", color=th.grid, linewidth=0.6)
    ax.legend(loc="upper right", fontsize=FONT_LEGEND - 0.5, frameon=False, ncol=len(s.lines), borderaxespad=0.1,
              labelcolor=th.text)
