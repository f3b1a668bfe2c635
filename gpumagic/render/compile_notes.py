"""The torch.compile block of the Notes (``metrics.compile``, present when the cell compiled): time
spent compiling in the window and over the cell, graph breaks and recompilations with their reasons
and source lines, as text and HTML."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from gpumagic.render._format import fmt_ms, fmt_number
from gpumagic.render._width import wrap
from gpumagic.render.terminal import printable

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.metrics import CompileMetrics, CompileReason
    from gpumagic.report.model import Report

#: Reasons listed per kind (the JSON has them all).
SHOWN = 5
TITLE = "torch.compile"


def _compile(report: Report) -> CompileMetrics | None:
    return None if report.metrics is None else report.metrics.compile


def summary_line(c: CompileMetrics) -> str:
    """``compiling 30.0 ms in the window (dynamo's frames 35.0 ms over the cell); 3 graph breaks;
    2 recompiles``. The cell's figure is dynamo's frame compilation only: a backward compiled at its
    first call (AOTAutograd's lazy ``bw_compiler``) is in the window's, not in it."""
    cell = "" if c.cell_compile_ms is None else f" (dynamo's frames {fmt_ms(c.cell_compile_ms)} over the cell)"
    breaks = f"{fmt_number(c.graph_breaks)} graph break{'' if c.graph_breaks == 1 else 's'}"
    recompiles = f"{fmt_number(c.recompiles)} recompile{'' if c.recompiles == 1 else 's'}"
    return f"compiling {fmt_ms(c.compile_ms)} in the window{cell}; {breaks}; {recompiles}"


def _where(r: CompileReason) -> str:
    return f" ({r.place})" if r.place else ""


def _items(c: CompileMetrics) -> list[tuple[str, list[CompileReason]]]:
    return [(kind, rows) for kind, rows in (("graph break", list(c.break_reasons)),
                                            ("recompile", list(c.recompile_reasons))) if rows]


def compile_text(report: Report, width: int) -> list[str]:
    """Lines for the NOTES block; ``[]`` when the cell compiled nothing."""
    c = _compile(report)
    if c is None:
        return []
    lines = wrap(printable(f"{TITLE}: {summary_line(c)}"), width, "  - ", "    ")
    for kind, rows in _items(c):
        for r in rows[:SHOWN]:
            lines += wrap(printable(f"{kind} ×{r.count}: {r.reason}{_where(r)}"), width, "      ", "        ")
        if len(rows) > SHOWN:
            lines.append(f"      … {len(rows) - SHOWN} more {kind} reasons in the JSON (metrics.compile)")
    return lines


def compile_html(report: Report) -> str:
    """A paragraph and a list for the Notes section; ``""`` when the cell compiled nothing."""
    c = _compile(report)
    if c is None:
        return ""
    items = []
    for kind, rows in _items(c):
        for r in rows[:SHOWN]:
            items.append(f"<li>{escape(kind)} ×{r.count}: <code>{escape(r.reason)}</code>{escape(_where(r))}</li>")
        if len(rows) > SHOWN:
            items.append(f'<li class="gm-muted">… {len(rows) - SHOWN} more {escape(kind)} reasons in the JSON '
                         "(metrics.compile)</li>")
    body = f"<ul>{''.join(items)}</ul>" if items else ""
    return f'<div class="gm-compile"><p><b>{TITLE}</b>: {escape(summary_line(c))}</p>{body}</div>'


__all__ = ["compile_html", "compile_text", "summary_line"]
