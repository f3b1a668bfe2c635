"""What filled memory: the memory profile by category as a stacked chart over the step, a table of
the categories at the peak (``metrics.memory.at_peak``) with each one's own peak (``by_category``),
and of the largest allocations then (``top_allocations``). The Memory tab (HTML, widget) and the text view call these.

The page draws the chart as inline SVG in its theme (:func:`categories_svg`, with
:func:`gpumagic.render.svg_chart.stacked_chart_svg`); :func:`categories_figure` is the same chart as
a matplotlib figure (its object-oriented API only, like :mod:`gpumagic.render.charts`).
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

import numpy as np

from gpumagic.render import palette
from gpumagic.render._format import fmt_bytes, fmt_ms
from gpumagic.render.layout import origin_label
from gpumagic.render.timeline import DPI, FIG_WIDTH_IN, FONT_LANE, FONT_LEGEND, FONT_TICK, FONT_TITLE, LEFT_IN, RIGHT_IN

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from gpumagic.report.model import Report

HEIGHT_IN = 2.8
#: Colour per category, stacked bottom to top in this order (what stays, then what the step makes).
COLORS = {
    "parameter": palette.GREEN, "optimizer_state": palette.ORANGE, "gradient": palette.BLUE,
    "activation": palette.VERMILLION, "temporary": palette.PURPLE, "input": palette.DARK_GREY,
    "autograd_detail": palette.SKY, "unknown": palette.LIGHT_GREY,
}
#: The SVG chart's colour class per category (:mod:`gpumagic.render.chart_css`, light and dark).
SVG_CLASS = {
    "parameter": "mp", "optimizer_state": "mo", "gradient": "mg", "activation": "ma", "temporary": "mt",
    "input": "mi", "autograd_detail": "md", "unknown": "mu",
}
UNITS = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "bytes"))
#: Moments drawn at most (about one per pixel column); a longer profile keeps, per bucket of time,
#: the moment with the most live bytes, so that the peak survives.
MAX_MOMENTS = 1200


def _label(name: str) -> str:
    return name.replace("_", " ")


def categories_series(report: Report) -> tuple[np.ndarray, list[str], np.ndarray] | None:
    """``(t_ns, names, bytes)`` of the memory profile inside the window, or None."""
    if report.trace is None or report.metrics is None or not report.metrics.memory.by_category:
        return None
    from gpumagic.analysis.memcats import categories_in_window

    w = report.metrics.window
    got = categories_in_window(report.trace.meta, w.start_ns, w.end_ns)
    if got is None or not len(got["t_ns"]):
        return None
    return got["t_ns"], got["names"], got["bytes"]


def categories_figure(report: Report, width_in: float = FIG_WIDTH_IN, dpi: int = DPI) -> Figure | None:
    """Live bytes by category over the window, stacked, with the peak marked; None without them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = categories_series(report)
    if series is None or report.metrics is None:
        return None
    t_ns, names, rows = series
    order = _order(names)
    cols = [names.index(n) for n in order]
    top = float(rows.sum(axis=1).max()) or 1.0
    scale, unit = next(u for u in UNITS if top >= u[0])
    origin = report.metrics.window.start_ns
    fig = Figure(figsize=(width_in, HEIGHT_IN), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((LEFT_IN / width_in, 0.22, 1 - (LEFT_IN + RIGHT_IN) / width_in, 0.58))
    x = (t_ns - origin) / 1e6
    ax.stackplot(x, *(rows[:, c] / scale for c in cols), step="post", labels=[_label(n) for n in order],
                 colors=[COLORS.get(n, palette.GREY) for n in order], linewidth=0)
    peak_ms = report.metrics.memory.by_category_peak_ms
    if peak_ms is not None:
        ax.axvline(peak_ms, color=palette.HIGHLIGHT_EDGE, linestyle=":", linewidth=1, label="peak")
    ax.set_ylim(0, top / scale * 1.3)
    ax.set_xlim(float(x.min()), float(max(x.max(), x.min() + 1e-3)))
    ax.set_ylabel(unit, fontsize=FONT_LANE)
    ax.set_xlabel(f"time since {origin_label(report)} (ms)", fontsize=FONT_LANE)
    ax.tick_params(labelsize=FONT_TICK)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(loc="upper left", fontsize=FONT_LEGEND, frameon=False, ncol=5, borderaxespad=0.1)
    device = report.metrics.memory.by_category_device or "device"
    ax.set_title(f"What filled memory ({device}), by category", fontsize=FONT_TITLE - 1, fontweight="bold")
    return fig


def _order(names: list[str]) -> list[str]:
    """Stacking order, bottom to top: what stays (parameters, optimizer state), then what the step makes."""
    return [n for n in COLORS if n in names] + [n for n in names if n not in COLORS]


def thin(t_ns: np.ndarray, rows: np.ndarray, max_moments: int = MAX_MOMENTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_moments`` rows: per bucket of time, the one with the most live bytes."""
    if len(t_ns) <= max_moments:
        return t_ns, rows
    edges = np.linspace(float(t_ns[0]), float(t_ns[-1]), max_moments + 1)
    bucket = np.clip(np.searchsorted(edges, t_ns, side="right") - 1, 0, max_moments - 1)
    totals = rows.sum(axis=1)
    best = np.full(max_moments, -1)
    for i in np.argsort(totals, kind="stable"):  # the largest total of each bucket is written last
        best[bucket[i]] = i
    keep = np.sort(best[best >= 0])
    return t_ns[keep], rows[keep]


def categories_svg(report: Report) -> str | None:
    """Live bytes by category over the window, stacked (bottom to top: :data:`COLORS`' order),
    with the peak marked, as inline SVG in the page's theme; None without a memory profile. One
    unit on the y axis (GiB, MiB, KiB or bytes, whichever the peak reads in), ms on the x axis."""
    from gpumagic.render.svg_chart import Band, stacked_chart_svg
    from gpumagic.render.timeline_svg import axis_ticks

    series = categories_series(report)
    if series is None or report.metrics is None:
        return None
    t_ns, names, rows = series
    t_ns, rows = thin(np.asarray(t_ns), np.asarray(rows))
    order = _order(names)
    total = float(rows.sum(axis=1).max()) or 1.0
    scale, unit = next(u for u in UNITS if total >= u[0])
    w = report.metrics.window
    x = (np.asarray(t_ns, np.float64) - w.start_ns) / 1e6
    x_range = (0.0, max(float(w.dur_ms), float(x.max()), 1e-3))
    bands = [Band(_label(n), SVG_CLASS.get(n, "mu"), rows[:, names.index(n)] / scale) for n in order]
    peak_ms = report.metrics.memory.by_category_peak_ms
    marks = [] if peak_ms is None else [(peak_ms, f"peak of live bytes, {fmt_ms(peak_ms)} into the window")]
    device = report.metrics.memory.by_category_device or "device"
    return stacked_chart_svg(
        f"What filled memory ({device}), by category, over the window", x, bands, x_range=x_range,
        y_unit=f"live memory ({device}), {unit}", y_fmt=lambda v: f"{v:,g} {unit}", x_ticks=axis_ticks(*x_range),
        x_label=f"ms since {origin_label(report)}", marks=marks,
    )


def categories_html(report: Report) -> str:
    """The categories at the peak, the largest allocations then, and the chart; or why missing."""
    mem = None if report.metrics is None else report.metrics.memory
    if mem is None:
        return ""
    if not mem.by_category:
        why = mem.categories_missing or "not recorded"
        return f'<h4>What filled memory</h4><p class="gm-muted">Memory by category: {escape(why)}.</p>'
    at = mem.at_peak or {}
    total = sum(v for k, v in at.items() if k != "allocator_cache") or 1
    rows = "".join(f"<tr><td>{escape(_label(k))}</td><td>{fmt_bytes(at.get(k))}</td><td>{100 * at.get(k, 0) / total:.0f} %</td>"
                   f"<td>{fmt_bytes(v)}</td></tr>"
                   for k, v in sorted(mem.by_category.items(), key=lambda kv: -at.get(kv[0], 0)) if v)
    out = [f"<h4>What filled memory</h4><p>At the peak of live bytes, {fmt_ms(mem.by_category_peak_ms)} into the "
           f"window ({escape(mem.by_category_device or '')}; torch.profiler's memory profile), and each category's own "
           "peak over the window:</p>"
           '<div class="gm-scroll"><table class="gm-table"><thead><tr><th>category</th><th>at the peak</th>'
           f"<th>share</th><th>own peak</th></tr></thead><tbody>{rows}</tbody></table></div>"]
    if mem.top_allocations:
        items = "".join(
            f"<tr><td>{fmt_bytes(a.bytes)}</td><td>{escape(_label(a.category))}</td>"
            f"<td><code>{escape(a.frame or 'before the recording')}</code></td><td>{escape(a.module or '')}</td>"
            f"<td><code>{escape(a.op or '')}</code></td></tr>" for a in mem.top_allocations)
        out.append('<p>Largest allocations live at the peak:</p><div class="gm-scroll"><table class="gm-table"><thead>'
                   "<tr><th>bytes</th><th>category</th><th>made by</th><th>module</th><th>operator</th></tr></thead>"
                   f"<tbody>{items}</tbody></table></div>")
    svg = categories_svg(report)
    if svg is not None:
        from gpumagic.render.page import chart_block

        out.append('<div class="gm-memory-categories">' + chart_block(svg, CHART_ALT, "chart") + "</div>"
                   f'<p class="gm-muted">{escape(CHART_CAPTION)}</p>')
    return "".join(out)


#: How to read the chart (under it).
CHART_CAPTION = ("Live bytes by category, stacked with parameters at the bottom; the key lists the bands from the "
                 "top down, every other band is striped, and a band is named inside itself where it is tall enough. "
                 "Dashed line: the peak of live bytes. Hover a band for its own peak.")
#: The chart's text alternative.
CHART_ALT = ("Live memory by category over the window, stacked with parameters at the bottom, with the peak "
             "marked; the table above gives the numbers")


def categories_text(report: Report) -> list[str]:
    """Lines for the text view: the categories at the peak and the largest allocation."""
    mem = None if report.metrics is None else report.metrics.memory
    if mem is None:
        return []
    if not mem.by_category:  # why is in the JSON and the Memory tab; the text stays short
        return []
    at = mem.at_peak or {}
    parts = ", ".join(f"{_label(k)} {fmt_bytes(at.get(k))} (own peak {fmt_bytes(v)})"
                      for k, v in sorted(mem.by_category.items(), key=lambda kv: -at.get(kv[0], 0)) if v)
    lines = [f"BY CATEGORY at the peak ({fmt_ms(mem.by_category_peak_ms)} into the window): {parts}"]
    for a in (mem.top_allocations or [])[:3]:
        lines.append(f"  {fmt_bytes(a.bytes)} {_label(a.category)} from {a.frame or 'before the recording'}"
                     + (f" ({a.op})" if a.op else ""))
    return lines
