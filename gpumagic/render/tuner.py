"""Text, HTML and a bar chart for a :class:`~gpumagic.tuning.tuner.TuneResult` (``tune_dataloader``)."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from gpumagic.render.page import document, wrap
from gpumagic.render.palette import BLUE, GREY, ORANGE
from gpumagic.render.terminal import printable, printable_lines

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.tuning.tuner import TuneResult

# -- text ------------------------------------------------------------------------------------

TABLE_HEADER = ("setting", "batches/s", "samples/s", "vs 0 workers", "first batch", "new epoch", "status")


def table(result: TuneResult) -> list[tuple[str, ...]]:
    """One tuple of strings per setting, in :data:`TABLE_HEADER` order."""
    base = result.baseline
    best = result.best
    out = []
    for r in result.rows:
        rel = "" if not (base and r.batches_per_s) else f"{r.batches_per_s / base.batches_per_s:.2f}×"
        if rel and r.speedup_ci and r is not base:
            rel += f" ({r.speedup_ci[0]:.2f}–{r.speedup_ci[1]:.2f})"
        status = r.status if not r.error else f"{r.status}: {r.error}"
        mark = " ◀ best" if r is best else ""
        out.append((r.config.label + mark, _num(r.batches_per_s), _num(r.samples_per_s), rel,
                    _secs(r.startup_s), _secs(r.restart_s), status))
    return out


def _num(x: float | None) -> str:
    return "" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:,.1f}")


def _secs(x: float | None) -> str:
    return "" if x is None else (f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s")


def _summary(result: TuneResult) -> str:
    best = result.best
    if best is None:
        return "No setting could be measured."
    speed = f" — {result.speedup:.2f}× the single-process loader" if result.speedup else ""
    fastest = max((r for r in result.rows if r.batches_per_s), key=lambda r: r.batches_per_s)
    if best is result.baseline and fastest is not best:
        return (f"No change: {fastest.config.label} read {_num(fastest.batches_per_s)} batches/s against "
                f"{_num(best.batches_per_s)}, but its 95 % interval includes no change; keep the single-process loader "
                f"({len(result.rows)} settings measured in {result.elapsed_s:.1f} s, interleaved).")
    return (f"Best: {best.config.label} at {_num(best.batches_per_s)} batches/s{speed} "
            f"({len(result.rows)} settings measured in {result.elapsed_s:.1f} s).")


def render_text(result: TuneResult) -> str:
    """The result as a plain-text table, the recommendation, warnings and notes."""
    rows = [TABLE_HEADER, *table(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER) - 1)]
    lines = ["gpumagic DataLoader tuning", _summary(result), ""]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in range(1, len(widths))]
        lines.append("  ".join(cells) + "  " + r[-1])
    if result.code:
        lines += ["", "Recommended:", *("  " + line for line in result.code.splitlines())]
    lines += [f"Warning: {printable(w)}" for w in result.warnings] + [f"Note: {printable(n)}" for n in result.notes]
    return printable_lines("\n".join(lines) + "\n")  # no escape sequence from a dataset's error text


def render_html(result: TuneResult) -> str:
    """The result as one static HTML fragment (table, bar chart, recommended code)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in TABLE_HEADER)
    body = "".join("<tr>" + "".join(f'<td{" class=gm-num" if 0 < i < 6 else ""}>{escape(c)}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in table(result))
    warn = "".join(f'<div class="gm-top gm-sev-medium">{escape(w)}</div>' for w in result.warnings)
    notes = "".join(f"<li>{escape(n)}</li>" for n in result.notes)
    plot = bars_html(result) if result.best is not None else ""
    code = f'<h4>Recommended</h4><pre class="gm-code"><code>{escape(result.code)}</code></pre>' if result.code else ""
    inner = (f"<h2>DataLoader tuning</h2><p>{escape(_summary(result))}</p>{warn}"
             f'<div class="gm-scroll"><table class="gm-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
             f"{plot}{code}" + (f"<ul>{notes}</ul>" if notes else ""))
    return wrap(inner, static=True)


def bars_html(result: TuneResult) -> str:
    """Batches per second by setting as HTML bars in the theme (text at its size at any width; the
    best setting marked "best" as well as coloured, a failed one says why); :func:`figure` and
    :func:`png` keep the matplotlib version."""
    top = max((r.batches_per_s or 0 for r in result.rows), default=0) or 1
    rows = []
    for r in result.rows:
        best = r is result.best
        value = r.batches_per_s or 0
        colour = ORANGE if best else (BLUE if value else GREY)
        text = f"{value:,.1f} batches/s" + (" \u00b7 best" if best else "") if value else str(r.status)
        rows.append(f'<div class="gm-bar-row"><span class="gm-bar-label gm-tune-label">{escape(r.config.label)}</span>'
                    f'<span class="gm-bar"><span class="gm-seg" style="width:{100 * value / top:.1f}%;background:{colour}"></span>'
                    f'</span><span class="gm-bar-total gm-tune-total">{escape(text)}</span></div>')
    return ('<h4>Batches per second by setting (higher is better)</h4>'
            '<style>.gpumagic-report .gm-tune-label{flex-basis:110px}.gpumagic-report .gm-tune-total{flex-basis:auto;'
            f'min-width:80px}}</style><div class="gm-bars" role="img" aria-label="batches per second by setting">{"".join(rows)}</div>')


def html_document(result: TuneResult) -> str:
    """:func:`render_html` as a self-contained page (``TuneResult.to_html``, ``save_html``)."""
    return document("gpumagic DataLoader tuning", render_html(result))


def figure(result: TuneResult, theme: str = "light"):
    """Batches per second by setting, as a matplotlib Figure (Agg; no pyplot) drawn for
    ``theme`` (``'light'`` or ``'dark'``, :func:`gpumagic.render.figure_colors.apply_theme`)."""
    from matplotlib.figure import Figure

    from gpumagic.render.figure_colors import apply_theme
    from gpumagic.render.palette import figure_theme

    figure_theme(theme)  # an unknown theme fails before anything is drawn

    rows = result.rows
    best = result.best
    fig = Figure(figsize=(6.4, 0.8 + 0.32 * len(rows)), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ys = list(range(len(rows)))[::-1]
    values = [r.batches_per_s or 0 for r in rows]
    colors = [ORANGE if r is best else (BLUE if r.batches_per_s else GREY) for r in rows]
    ax.barh(ys, values, color=colors)
    ax.set_yticks(ys, [r.config.label for r in rows], fontsize=8)
    for y, r in zip(ys, rows):
        if not r.batches_per_s:
            ax.text(0, y, f" {r.status}", va="center", fontsize=8, color=GREY)
    ax.set_xlabel("batches per second (higher is better)")
    ax.set_title("DataLoader settings", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    return apply_theme(fig, theme)



def png(result: TuneResult, theme: str = "light") -> bytes:
    """:func:`figure` as PNG bytes."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buf = io.BytesIO()
    FigureCanvasAgg(figure(result, theme)).print_png(buf)
    return buf.getvalue()
