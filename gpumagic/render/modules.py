"""The Modules view (``metrics.modules``, recorded with ``--modules``): every ``nn.Module`` instance
as a tree, its children under it, heaviest first, with forward and backward time (host and GPU)
and calls. The tree comes from the dotted paths: a row's parent is the longest path that is a
prefix of its own (``model.encoder`` above ``model.encoder.layer.3``)."""

from __future__ import annotations

import textwrap
from html import escape
from typing import TYPE_CHECKING

from gpumagic.render._format import fmt_ms, fmt_number
from gpumagic.render._width import shorten
from gpumagic.render.terminal import printable

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.metrics import ModuleRow
    from gpumagic.report.model import Report

#: Rows the text view lists (the HTML lists them all).
TEXT_ROWS = 12
CAPTION = ("Times are totals over the recorded steps, each module's children included. Backward time is "
           "that of the backward nodes its forward operators made (the trace's forward→backward links); "
           "gradient accumulation (AccumulateGrad) is not attributed.")


def tree_rows(rows: list[ModuleRow]) -> list[tuple[ModuleRow, int, str]]:
    """``(row, depth, prefix)`` in tree order (depth first, heaviest child first); ``prefix`` draws
    the branches (``├─ ``, ``└─ ``, ``│  ``)."""
    by_path = {r.path: r for r in rows}
    children: dict[str | None, list[ModuleRow]] = {}
    for r in rows:
        parent = _parent(r.path, by_path)
        children.setdefault(parent, []).append(r)
    for kids in children.values():
        kids.sort(key=lambda r: (-_total(r), r.path))
    out: list[tuple[ModuleRow, int, str]] = []

    def walk(parent: str | None, depth: int, lead: str) -> None:
        kids = children.get(parent, [])
        for i, r in enumerate(kids):
            last = i == len(kids) - 1
            out.append((r, depth, lead + ("" if depth == 0 else "\u2514\u2500 " if last else "\u251c\u2500 ")))
            walk(r.path, depth + 1, lead + ("" if depth == 0 else "   " if last else "\u2502  "))

    walk(None, 0, "")
    return out


def _parent(path: str, by_path: dict) -> str | None:
    head = path
    while "." in head:
        head = head.rsplit(".", 1)[0]
        if head in by_path:
            return head
    return None


def _total(r: ModuleRow) -> float:
    return r.forward_ms + (r.backward_ms or 0.0)


def _label(r: ModuleRow, parent_known: bool) -> str:
    """The path's last part under a parent shown above it, else the whole path; then the class."""
    name = r.path.rsplit(".", 1)[-1] if parent_known else r.path
    return f"{name} ({r.type})"


def _opt_ms(x: float | None) -> str:
    return "n/a" if x is None else fmt_ms(x)


def _rows(report: Report) -> list[ModuleRow]:
    m = report.metrics
    return [] if m is None or m.modules is None else list(m.modules)


def modules_html(report: Report) -> str:
    """The Modules table as a tree; ``""`` when the report has no module times."""
    rows = _rows(report)
    if not rows:
        return ""
    gpu = any(r.forward_gpu_ms is not None for r in rows)
    head = "<th>module</th><th>calls</th><th>forward</th><th>backward</th>" + (
        "<th>forward GPU</th><th>backward GPU</th>" if gpu else "")
    body = []
    for r, depth, prefix in tree_rows(rows):
        cells = (f'<td class="gm-kname" title="{escape(r.path)}"><span class="gm-muted">{escape(prefix)}</span>'
                 f"{escape(_label(r, depth > 0))}</td>"
                 f'<td class="gm-num">{fmt_number(r.calls)}</td><td class="gm-num">{fmt_ms(r.forward_ms)}</td>'
                 f'<td class="gm-num">{_opt_ms(r.backward_ms)}</td>')
        if gpu:
            cells += f'<td class="gm-num">{_opt_ms(r.forward_gpu_ms)}</td><td class="gm-num">{_opt_ms(r.backward_gpu_ms)}</td>'
        body.append(f"<tr>{cells}</tr>")
    return (f'<p class="gm-muted">{escape(CAPTION)}</p>'
            f'<div class="gm-scroll"><table class="gm-table gm-modules"><thead><tr>{head}</tr></thead>'
            f'<tbody style="white-space:pre">{"".join(body)}</tbody></table></div>')


def modules_text(report: Report, width: int) -> str:
    """The first :data:`TEXT_ROWS` rows of the tree; ``""`` without module times."""
    rows = _rows(report)
    if not rows:
        return ""
    lines = textwrap.wrap("MODULES (forward / backward host time over the recorded steps, children included)",
                          width, subsequent_indent="  ")
    shown = tree_rows(rows)
    for r, depth, prefix in shown[:TEXT_ROWS]:
        facts = f"{fmt_ms(r.forward_ms)} / {_opt_ms(r.backward_ms)}  \u00d7{fmt_number(r.calls)}"
        name = printable(prefix + _label(r, depth > 0))
        room = max(width - 2 - len(facts) - 2, 12)
        lines.append(f"  {shorten(name, room):<{room}}  {facts}")
    if len(shown) > TEXT_ROWS:
        lines.append(f"  … {len(shown) - TEXT_ROWS} more in the JSON (metrics.modules) and the HTML report")
    return "\n".join(lines)
