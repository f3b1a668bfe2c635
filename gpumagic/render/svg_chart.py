"""A small line chart as inline SVG, in the page's theme: the memory curve and the run history.

Drawn like the timeline (:mod:`gpumagic.render.timeline_svg`): the outer ``<svg>`` is
``width="100%"`` with a height in pixels and no viewBox, so its ``<text>`` keeps its 12 px at any
width; the lines sit in a nested ``<svg>`` stretched to the width (``preserveAspectRatio="none"``,
strokes not scaled). One unit per axis: the y axis is labelled with it, grid lines carry their
value, and a chart with no data is not drawn at all (the callers show a sentence instead).
Colours are the page's custom properties (``gm-l-X`` classes of :mod:`gpumagic.render.chart_css`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

#: Nested viewBox size and the plot's height, pixels.
VB_W = 10000
PLOT_PX = 150
TOP_PX = 34
AXIS_PX = 36


@dataclass(frozen=True)
class Line:
    """One curve: ``x`` and ``y`` (NaN breaks it), its legend label, its colour class, and
    ``marker``: draw a dot at each point (a handful of runs) and ``dashed`` (told apart without colour)."""

    label: str
    x: np.ndarray
    y: np.ndarray
    cls: str
    marker: bool = False
    dashed: bool = False
    steps: bool = False


def _f(v: float) -> str:
    text = f"{v:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _pct(frac: float) -> str:
    return f"{min(max(frac, 0.0), 1.0) * 100:.2f}".rstrip("0").rstrip(".") + "%"


def nice_ticks(top: float, n: int = 4) -> list[float]:
    """Round tick values from 0 to at least ``top``."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / n
    mag = 10 ** np.floor(np.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if raw <= m * mag)
    k = int(np.ceil(top / step - 1e-9))
    return [float(i * step) for i in range(k + 1)]


def line_chart_svg(title: str, lines: Sequence[Line], *, x_range: tuple[float, float], y_unit: str,
                   y_fmt: Callable[[float], str], x_ticks: Sequence[tuple[float, str]], x_label: str,
                   hlines: Sequence[tuple[float, str, str]] = (), y_top: float | None = None) -> str:
    """The chart's markup, then its key as an HTML list (it wraps at any width); ``hlines``:
    ``(y, label, class)`` reference lines (a capacity), dashed."""
    x0, x1 = x_range
    span = (x1 - x0) or 1.0
    finite = [float(np.nanmax(ln.y)) for ln in lines if ln.y.size and np.isfinite(ln.y).any()]
    top = y_top if y_top is not None else max(finite + [h[0] for h in hlines] + [0.0]) * 1.1
    ticks = nice_ticks(top or 1.0)
    ymax = ticks[-1] or 1.0

    def yy(v: np.ndarray | float) -> np.ndarray:
        return PLOT_PX - np.clip(np.asarray(v, dtype=np.float64) / ymax, 0, 1) * (PLOT_PX - 2)

    def xx(v: np.ndarray | float) -> np.ndarray:
        return (np.asarray(v, dtype=np.float64) - x0) / span * VB_W

    inner = []
    for t in ticks:
        inner.append(f'<line class="gm-tl-grid" x1="0" x2="{VB_W}" y1="{_f(float(yy(t)))}" y2="{_f(float(yy(t)))}"/>')
    for y, label, cls in hlines:
        inner.append(f'<line class="gm-l-{cls} gm-dashed" x1="0" x2="{VB_W}" y1="{_f(float(yy(y)))}" y2="{_f(float(yy(y)))}">'
                     f"<title>{escape(label)}</title></line>")
    dots = []
    for ln in lines:
        ok = np.isfinite(ln.y)
        xs, ys = xx(ln.x), yy(np.where(ok, ln.y, 0))
        segment: list[str] = []
        segments = []
        for i in range(len(xs)):
            if not ok[i]:
                if segment:
                    segments.append(segment)
                segment = []
                continue
            if ln.steps and segment:
                segment.append(f"{_f(float(xs[i]))},{segment[-1].split(',')[1]}")
            segment.append(f"{_f(float(xs[i]))},{_f(float(ys[i]))}")
        if segment:
            segments.append(segment)
        dash = " gm-dashed" if ln.dashed else ""
        for seg in segments:
            inner.append(f'<polyline class="gm-l-{ln.cls}{dash}" points="{" ".join(seg)}"><title>{escape(ln.label)}</title></polyline>')
        if ln.marker:
            for i in np.flatnonzero(ok):
                dots.append(f'<circle class="gm-f-{ln.cls}" cx="{_pct(float((ln.x[i] - x0) / span))}" '
                            f'cy="{_f(TOP_PX + float(ys[i]))}" r="3.5"><title>{escape(ln.label)}: {escape(y_fmt(float(ln.y[i])))}'
                            f"</title></circle>")
    labels = "".join(f'<text class="gm-tl-ticklabel" x="2" y="{_f(TOP_PX + float(yy(t)) - 3)}">{escape(y_fmt(t))}</text>'
                     for t in ticks[1:])
    xt = []
    for k, (x, text) in enumerate(x_ticks):
        frac = (x - x0) / span
        anchor = "start" if frac < 0.04 else ("end" if frac > 0.96 else "middle")
        odd = " gm-odd" if k % 2 else ""
        xt.append(f'<text class="gm-tl-ticklabel{odd}" x="{_pct(frac)}" y="{TOP_PX + PLOT_PX + 16}" text-anchor="{anchor}">'
                  f"{escape(text)}</text>")
    height = TOP_PX + PLOT_PX + AXIS_PX
    keys = [_key(ln.cls, ln.label, ln.dashed) for ln in lines] + [_key(cls, label, True) for _, label, cls in hlines]
    return (
        f'<svg class="gm-tl gm-chart" xmlns="http://www.w3.org/2000/svg" width="100%" height="{height}" role="img" '
        f'aria-label="{escape(title)}">'
        f'<text class="gm-tl-lane" x="2" y="14">{escape(y_unit)}</text>'
        f'<svg x="0" y="{TOP_PX}" width="100%" height="{PLOT_PX}" viewBox="0 0 {VB_W} {PLOT_PX}" preserveAspectRatio="none">'
        f'{"".join(inner)}</svg>{labels}{"".join(dots)}{"".join(xt)}'
        f'<line class="gm-tl-axis" x1="0" x2="100%" y1="{TOP_PX + PLOT_PX}" y2="{TOP_PX + PLOT_PX}"/>'
        f'<text class="gm-tl-axislabel" x="100%" y="{TOP_PX + PLOT_PX + 32}" text-anchor="end">{escape(x_label)}</text></svg>'
        f'<ul class="gm-tl-legend">{"".join(keys)}</ul>'
    )


def _key(cls: str, label: str, dashed: bool) -> str:
    """A legend entry: a short line in the curve's colour (dashed when the curve is) and its label."""
    dash = ' stroke-dasharray="4 3"' if dashed else ""
    return (f'<li><svg class="gm-tl-key" width="18" height="14" aria-hidden="true"><line class="gm-l-{cls}" x1="0" x2="18" '
            f'y1="7" y2="7" stroke-width="2.5"{dash}/></svg>{escape(label)}</li>')
