"""Small charts as inline SVG, in the page's theme: lines (the memory curve, the run history) and
stacked areas (memory by category, :func:`stacked_chart_svg`).

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
    ticks, yy = _y_scale(top)

    def xx(v: np.ndarray | float) -> np.ndarray:
        return (np.asarray(v, dtype=np.float64) - x0) / span * VB_W

    inner = _grid(ticks, yy)
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
    keys = [_key(ln.cls, ln.label, ln.dashed) for ln in lines] + [_key(cls, label, True) for _, label, cls in hlines]
    return _frame("gm-tl gm-chart", title, y_unit, inner,
                  _y_labels(ticks, yy, y_fmt) + "".join(dots) + _x_labels(x_ticks, x0, span), x_label,
                  '<ul class="gm-tl-legend">', "".join(keys))


def _y_scale(top: float) -> tuple[list[float], Callable[[np.ndarray | float], np.ndarray]]:
    """The y axis's ticks (:func:`nice_ticks` up to ``top``) and the value → plot-pixel map."""
    ticks = nice_ticks(top or 1.0)
    ymax = ticks[-1] or 1.0

    def yy(v: np.ndarray | float) -> np.ndarray:
        return PLOT_PX - np.clip(np.asarray(v, dtype=np.float64) / ymax, 0, 1) * (PLOT_PX - 2)

    return ticks, yy


def _grid(ticks: Sequence[float], yy: Callable[[np.ndarray | float], np.ndarray]) -> list[str]:
    return [f'<line class="gm-tl-grid" x1="0" x2="{VB_W}" y1="{_f(float(yy(t)))}" y2="{_f(float(yy(t)))}"/>' for t in ticks]


def _y_labels(ticks: Sequence[float], yy: Callable[[np.ndarray | float], np.ndarray], y_fmt: Callable[[float], str]) -> str:
    """The y ticks' labels, above their grid lines (none at zero)."""
    return "".join(f'<text class="gm-tl-ticklabel" x="2" y="{_f(TOP_PX + float(yy(t)) - 3)}">{escape(y_fmt(t))}</text>'
                   for t in ticks[1:])


def _x_labels(x_ticks: Sequence[tuple[float, str]], x0: float, span: float) -> str:
    """The x ticks' labels under the plot, anchored inward at the edges, every other one ``gm-odd``."""
    xt = []
    for k, (x, text) in enumerate(x_ticks):
        frac = (x - x0) / span
        anchor = "start" if frac < 0.04 else ("end" if frac > 0.96 else "middle")
        odd = " gm-odd" if k % 2 else ""
        xt.append(f'<text class="gm-tl-ticklabel{odd}" x="{_pct(frac)}" y="{TOP_PX + PLOT_PX + 16}" text-anchor="{anchor}">'
                  f"{escape(text)}</text>")
    return "".join(xt)


def _frame(cls: str, title: str, y_unit: str, inner: Sequence[str], overlay: str, x_label: str, legend_open: str,
           keys: str) -> str:
    """The outer chart: the y unit, the stretched plot holding ``inner``, the ``overlay`` text
    (tick labels, points) at its own 12 px, the x axis and its label, then the key as a list."""
    height = TOP_PX + PLOT_PX + AXIS_PX
    return (
        f'<svg class="{cls}" xmlns="http://www.w3.org/2000/svg" width="100%" height="{height}" role="img" '
        f'aria-label="{escape(title)}">'
        f'<text class="gm-tl-lane" x="2" y="14">{escape(y_unit)}</text>'
        f'<svg x="0" y="{TOP_PX}" width="100%" height="{PLOT_PX}" viewBox="0 0 {VB_W} {PLOT_PX}" preserveAspectRatio="none">'
        f'{"".join(inner)}</svg>{overlay}'
        f'<line class="gm-tl-axis" x1="0" x2="100%" y1="{TOP_PX + PLOT_PX}" y2="{TOP_PX + PLOT_PX}"/>'
        f'<text class="gm-tl-axislabel" x="100%" y="{TOP_PX + PLOT_PX + 32}" text-anchor="end">{escape(x_label)}</text></svg>'
        f'{legend_open}{keys}</ul>'
    )


def _key(cls: str, label: str, dashed: bool) -> str:
    """A legend entry: a short line in the curve's colour (dashed when the curve is) and its label."""
    dash = ' stroke-dasharray="4 3"' if dashed else ""
    return (f'<li><svg class="gm-tl-key" width="18" height="14" aria-hidden="true"><line class="gm-l-{cls}" x1="0" x2="18" '
            f'y1="7" y2="7" stroke-width="2.5"{dash}/></svg>{escape(label)}</li>')


# -- stacked areas (memory by category) ------------------------------------------------------------

#: A band's direct label is drawn where it is at least this tall (pixels): 12 px text and a margin.
LABEL_MIN_PX = 15
#: The stripes that every other band is overlaid with, so that neighbours differ in texture as
#: well as in colour. Horizontal lines only: the plot is stretched sideways, not up or down, so
#: horizontal stripes keep their pitch at any width (any other pattern would be distorted).
STRIPES_ID = "gm-stripes"
_STRIPES = (f'<defs><pattern id="{STRIPES_ID}" patternUnits="userSpaceOnUse" width="8" height="5">'
            '<rect class="gm-stripe" x="0" y="0" width="8" height="2"/></pattern></defs>')


@dataclass(frozen=True)
class Band:
    """One stacked layer: its label, colour class and values (one per ``x``, in the y unit)."""

    label: str
    cls: str
    y: np.ndarray


def stacked_chart_svg(title: str, x: np.ndarray, bands: Sequence[Band], *, x_range: tuple[float, float],
                      y_unit: str, y_fmt: Callable[[float], str], x_ticks: Sequence[tuple[float, str]],
                      x_label: str, marks: Sequence[tuple[float, str]] = ()) -> str:
    """Areas stacked bottom to top in the order of ``bands``, each value held until the next ``x``
    (a step function, as memory is), drawn like :func:`line_chart_svg` (one unit per axis, 12 px
    text at any width, the page's colours). Bands are told apart without colour: every other one is
    striped, each band's top edge is a line in the text colour, each band is named inside itself
    where it is tall enough, and the key lists them top to bottom as they are stacked. ``marks``:
    ``(x, label)`` dashed vertical lines (the peak), named in the key (a label above the plot would
    collide with the top tick's at a narrow width)."""
    x0, x1 = x_range
    span = (x1 - x0) or 1.0
    xs = np.asarray(x, np.float64)
    bands = [b for b in bands if np.any(np.asarray(b.y) > 0)]  # an empty band has nothing to show or key
    tops = np.cumsum(np.vstack([np.asarray(b.y, np.float64) for b in bands]), axis=0) if bands else np.zeros((0, xs.size))
    top = float(tops[-1].max()) * 1.1 if tops.size else 0.0
    ticks, yy = _y_scale(top)

    # each value is held until the next x, and the last one to the end of the range
    ends = np.append(xs[1:], max(x1, float(xs[-1]) if xs.size else x1))
    vx = (np.column_stack([xs, ends]).ravel() - x0) / span * VB_W

    def path(values: np.ndarray) -> list[str]:
        vy = np.repeat(yy(values), 2)
        return [f"{_f(float(a))},{_f(float(b))}" for a, b in zip(vx, vy)]

    inner = [_STRIPES, *_grid(ticks, yy)]
    labels = []
    below = np.zeros(xs.size)
    for k, (band, upper) in enumerate(zip(bands, tops)):
        if xs.size:
            up, down = path(upper), path(below)
            peak = float(np.max(upper - below))
            tip = f"{band.label}: its peak {y_fmt(peak)}"
            points = " ".join(up + down[::-1])
            inner.append(f'<polygon class="gm-f-{band.cls}" points="{points}"><title>{escape(tip)}</title></polygon>')
            if k % 2:
                inner.append(f'<polygon fill="url(#{STRIPES_ID})" points="{points}"><title>{escape(tip)}</title></polygon>')
            inner.append(f'<polyline class="gm-stack-edge" points="{" ".join(up)}"/>')
            tall = np.flatnonzero(yy(below) - yy(upper) >= LABEL_MIN_PX)
            if tall.size:  # named where it is tall enough for the longest time
                i = int(tall[np.argmax((ends - xs)[tall])])
                mid = (ends[i] + xs[i]) / 2
                frac = (mid - x0) / span
                anchor = "start" if frac < 0.1 else ("end" if frac > 0.9 else "middle")
                ty = TOP_PX + float(yy(below[i]) + yy(upper[i])) / 2 + 4
                labels.append(f'<text class="gm-stack-label" x="{_pct(frac)}" y="{_f(ty)}" text-anchor="{anchor}">'
                              f"{escape(band.label)}</text>")
        below = upper
    for mx, text in marks:
        frac = (mx - x0) / span
        inner.append(f'<line class="gm-tl-step" x1="{_f(frac * VB_W)}" x2="{_f(frac * VB_W)}" y1="0" y2="{PLOT_PX}">'
                     f"<title>{escape(text)}</title></line>")
    keys = "".join(_band_key(b.cls, b.label, k % 2 == 1) for k, b in reversed(list(enumerate(bands))))
    keys += "".join(f'<li><svg class="gm-tl-key" width="14" height="12" aria-hidden="true"><line x1="7" x2="7" y1="0" '
                    f'y2="12" stroke="currentColor" stroke-width="1.5" stroke-dasharray="3 2"/></svg>{escape(text)}</li>' for _, text in marks)
    return _frame("gm-tl gm-chart gm-stacked", title, y_unit, inner,
                  _y_labels(ticks, yy, y_fmt) + "".join(labels) + _x_labels(x_ticks, x0, span), x_label,
                  '<ul class="gm-tl-legend" aria-label="key: the bands from the top of the stack down, then the marks">', keys)


def _band_key(cls: str, label: str, striped: bool) -> str:
    """A legend entry: a swatch of the band's fill (striped when the band is) and its label."""
    stripes = f'<rect width="14" height="12" fill="url(#{STRIPES_ID})"/>' if striped else ""
    return (f'<li><svg class="gm-tl-key" width="14" height="12" aria-hidden="true"><rect class="gm-f-{cls} gm-stack-key" '
            f'width="14" height="12"/>{stripes}</svg>{escape(label)}</li>')
