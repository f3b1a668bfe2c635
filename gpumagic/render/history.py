"""Views of the run history (:class:`~gpumagic.tuning.history.History`, ``gpumagic.history()``):
a table (text or HTML) and charts of median step time and GPU busy over the runs (inline SVG in
the HTML, one chart per unit; :func:`figure` keeps the matplotlib version).

The chart is the tuning session at a glance: one point per run, in the order they ran, the
median step on the left axis (lower is better) and GPU busy on the right (higher is better).
Runs without steps (no optimizer step was recorded) have no median step and leave a gap.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from gpumagic.render._format import MISSING, fmt_ms, fmt_pct
from gpumagic.render.page import chart_block, document, wrap
from gpumagic.render.palette import BLUE, ORANGE
from gpumagic.render.terminal import printable, printable_lines

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from gpumagic.tuning.history import History, StoredRun

TABLE_HEADER = ("id", "label", "when", "device", "median step", "steps p10–p90", "GPU busy", "top finding")
#: Widest label and device shown in the text table (longer ones are cut with "…").
LABEL_CHARS = 24
DEVICE_CHARS = 24


def table(history: History) -> list[tuple[str, ...]]:
    """One row of strings per run, oldest first."""
    return [_row(r) for r in history.runs]


def _row(r: StoredRun) -> tuple[str, ...]:
    """Labels and device names come from users and trace files: cleaned for a terminal (and HTML)."""
    return (r.ref, printable(r.label) or "-", r.when, printable(r.device) or MISSING, fmt_ms(r.median_step_ms), _spread(r),
            fmt_pct(r.gpu_busy_frac), printable(r.top_finding) or "-")


def _spread(r: StoredRun) -> str:
    """``'92.1–131 ms (6)'``: the 10th-90th percentile of the run's steps, and how many."""
    s = r.step_spread
    if not s or not s.get("count"):
        return MISSING
    return f"{fmt_ms(s['p10_ms'])}\u2013{fmt_ms(s['p90_ms'])} ({s['count']})"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render_text(history: History) -> str:
    """The table as aligned plain text (label and device cut to a readable width)."""
    where = printable(history.where or "memory (GPUMAGIC_HOME is empty: storage is off)")
    if not history.runs:
        return f"gpumagic run history ({where}): no runs yet. Profile a cell with %%gpuprofile [--label NAME].\n"
    rows = [TABLE_HEADER] + [(a, _cut(b, LABEL_CHARS), c, _cut(d, DEVICE_CHARS), *rest)
                             for a, b, c, d, *rest in table(history)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    right = {4, 5, 6}
    lines = [f"gpumagic run history: {len(history.runs)} run(s) in {where}"]
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    return printable_lines("\n".join(lines)) + "\n"


def render_html(history: History) -> str:
    """The chart (when any run has steps) above the table, as one static HTML fragment."""
    if not history.runs:
        return wrap(f"<p>{escape(render_text(history).strip())}</p>", static=True)
    head = "".join(f"<th>{escape(h)}</th>" for h in TABLE_HEADER)
    body = "".join("<tr>" + "".join(f'<td{" class=gm-num" if i in (4, 5) else ""}>{escape(c)}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in table(history))
    plot = charts_svg(history)
    where = escape(printable(history.where or "memory"))
    inner = (f"<h2>Run history</h2><p>{len(history.runs)} run(s) in <code>{where}</code>. Name a run by label, "
             f"<code>LABEL@N</code> or id in <code>--compare</code> and <code>gpumagic.compare()</code>.</p>{plot}"
             f'<div class="gm-scroll"><table class="gm-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>')
    return wrap(inner, static=True)


def charts_svg(history: History) -> str:
    """Median step per run and, when any run recorded it, GPU busy per run: two inline SVG charts
    in the page's theme, each with one unit on its axis (no empty GPU axis for CPU runs). Runs are
    named by their id and label, so two runs sharing a label stay apart."""
    import numpy as np

    from gpumagic.render.svg_chart import Line, line_chart_svg

    runs = history.runs
    steps = np.array([np.nan if r.median_step_ms is None else r.median_step_ms for r in runs], np.float64)
    busy = np.array([np.nan if r.gpu_busy_frac is None else 100 * r.gpu_busy_frac for r in runs], np.float64)
    xs = np.arange(len(runs), dtype=np.float64)
    every = len(runs) // 12 + 1  # too many to name each: every n-th one
    ticks = [(float(i), f"{r.ref} {_cut(printable(r.label), 12)}".strip()) for i, r in enumerate(runs) if i % every == 0]
    x_range = (-0.5, len(runs) - 0.5)
    out = []
    if np.isfinite(steps).any():
        out.append(chart_block(line_chart_svg(
            "median step time per run", [Line("median step", xs, steps, "k", marker=True)], x_range=x_range,
            y_unit="median step, ms (lower is better)", y_fmt=lambda v: f"{v:,g} ms", x_ticks=ticks, x_label="runs, oldest first"),
            "median step time per run"))
    if np.isfinite(busy).any():
        out.append(chart_block(line_chart_svg(
            "GPU busy per run", [Line("GPU busy", xs, busy, "d", marker=True, dashed=True)], x_range=x_range,
            y_unit="GPU busy, % of the window (higher is better)", y_fmt=lambda v: f"{v:g} %", x_ticks=ticks,
            x_label="runs, oldest first", y_top=100.0), "GPU busy per run"))
    return "".join(out)


def html_document(history: History) -> str:
    """:func:`render_html` as a self-contained page (``History.to_html``, ``save_html``)."""
    return document("gpumagic run history", render_html(history))


def figure(history: History, theme: str = "light") -> Figure | None:
    """Median step time (left axis) and GPU busy (right axis, only when a run recorded it) per
    run, as a matplotlib Figure drawn for ``theme`` (``'light'`` or ``'dark'``,
    :func:`gpumagic.render.figure_colors.apply_theme`); None when no run recorded a median step
    or GPU busy."""
    from gpumagic.render.figure_colors import apply_theme
    from gpumagic.render.palette import figure_theme

    figure_theme(theme)  # an unknown theme fails before anything is drawn
    runs = history.runs
    steps = [r.median_step_ms for r in runs]
    busy = [None if r.gpu_busy_frac is None else 100 * r.gpu_busy_frac for r in runs]
    if all(v is None for v in steps) and all(v is None for v in busy):
        return None
    from matplotlib.figure import Figure

    xs = list(range(len(runs)))
    fig = Figure(figsize=(7.2, 2.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.plot(xs, [float("nan") if v is None else v for v in steps], marker="o", color=BLUE, label="median step (ms)")
    ax.set_ylabel("median step (ms), lower is better", fontsize=8)
    ax.set_ylim(bottom=0)
    axes = [ax]
    if any(v is not None for v in busy):  # no GPU-busy axis without a GPU run to put on it
        ax2 = ax.twinx()
        ax2.plot(xs, [float("nan") if v is None else v for v in busy], marker="s", linestyle="--", color=ORANGE,
                 label="GPU busy (%)")
        ax2.set_ylabel("GPU busy (%), higher is better", fontsize=8)
        ax2.set_ylim(0, 105)
        axes.append(ax2)
    ax.set_xticks(xs, [f"{r.ref}\n{_cut(r.label, 12)}" if r.label else r.ref for r in runs], fontsize=7)
    if len(xs) > 20:  # too many to name each: every n-th one
        for i, label in enumerate(ax.get_xticklabels()):
            label.set_visible(i % (len(xs) // 20 + 1) == 0)
    ax.set_title("Runs of the tuning session", fontsize=10)
    handles = [h for a in axes for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper right", frameon=False)
    for a in axes:
        a.tick_params(labelsize=7)
        a.spines["top"].set_visible(False)
    return apply_theme(fig, theme)
