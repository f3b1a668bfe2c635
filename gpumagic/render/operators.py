"""The Operators table (``metrics.operators``): per operator and input shapes, the GPU time of the
kernels it launched, achieved TFLOP/s and TB/s, and where it sits on the device's roofline."""

from __future__ import annotations

import textwrap
from html import escape
from typing import TYPE_CHECKING

from gpumagic.render._format import fmt_ms, fmt_number, fmt_pct
from gpumagic.render._width import shorten
from gpumagic.render.terminal import printable

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.metrics import Metrics, OperatorRow, OperatorsMetrics
    from gpumagic.report.model import Report

#: Operators listed in the text render (the HTML lists all of ``metrics.operators.top``).
TEXT_TOP_OPERATORS = 8


def _rate(x: float | None, unit: str) -> str:
    return "n/a" if x is None else f"{x:.3g} {unit}"


def _bound(row: OperatorRow) -> str:
    if row.bound is None:
        return "n/a"
    if row.above_peak:  # the formula counts more FLOPs than the kernels did (Winograd, TF32)
        return f"{row.bound} (above peak)"
    roof = row.frac_of_roof
    return f"{row.bound}" + ("" if roof is None else f" ({fmt_pct(roof, 0)} of roof)")


def _operators(m: Metrics | None) -> OperatorsMetrics | None:
    return None if m is None else m.operators


def _caption(o: OperatorsMetrics) -> str:
    parts = [f"{fmt_ms(o.attributed_ms)} of {fmt_ms(o.kernel_ms)} GPU time attributed to the operators "
             "that launched it"]
    if o.uncovered_ms:
        graph = f", {fmt_ms(o.graph_uncovered_ms)} of it in graph replays" if o.graph_uncovered_ms else ""
        parts.append(f"{fmt_ms(o.uncovered_ms)} uncovered{graph}")
    if not o.shapes:
        parts.append("no shapes recorded (--shapes or --flops): no FLOPs or bytes")
    return "; ".join(parts)


def operators_html(report: Report) -> str:
    o = _operators(report.metrics)
    rows = [] if o is None else o.top
    if o is None or not rows:
        return '<p class="gm-muted">No GPU work was attributed to operators.</p>'
    body = "".join(
        f'<tr><td class="gm-kname">{escape(r.name)}</td><td class="gm-kname">{escape(r.shapes or "")}</td>'
        f'<td class="gm-num">{fmt_number(r.count)}</td><td class="gm-num">{fmt_ms(r.gpu_ms)}</td>'
        f'<td class="gm-num">{_rate(r.tflops, "TFLOP/s")}</td><td class="gm-num">{_rate(r.tbps, "TB/s")}</td>'
        f'<td class="gm-num">{fmt_pct(r.frac_of_peak, 1) if r.frac_of_peak is not None else "n/a"}</td>'
        f"<td>{escape(_bound(r))}</td></tr>"
        for r in rows
    )
    return (
        f'<p class="gm-muted">{escape(_caption(o))}.</p>'
        '<div class="gm-scroll"><table class="gm-table"><thead><tr><th>operator</th><th>input shapes</th><th>count</th><th>GPU time</th>'
        "<th>achieved</th><th>bytes/s (at least)</th><th>of peak</th><th>roofline</th></tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


def operators_text(report: Report, width: int) -> str:
    o = _operators(report.metrics)
    rows = [] if o is None else o.top
    if o is None or not rows:
        return ""
    lines = textwrap.wrap(f"OPERATORS ({printable(_caption(o))})", width, subsequent_indent="  ")
    for r in rows[:TEXT_TOP_OPERATORS]:
        name = printable(r.name) + (f" [{printable(r.shapes)}]" if r.shapes else "")
        lines.append(f"  {shorten(name, width - 2)}")
        facts = [f"{fmt_ms(r.gpu_ms)} GPU time", f"\u00d7{fmt_number(r.count)}"]
        if r.tflops is not None:
            facts.append(_rate(r.tflops, "TFLOP/s"))
        if r.frac_of_peak is not None:
            facts.append(f"{fmt_pct(r.frac_of_peak, 1)} of the {r.dtype} peak")
        if r.tbps is not None:
            facts.append(f"\u2265 {_rate(r.tbps, 'TB/s')}")
        if r.bound:
            facts.append(f"{_bound(r)}-bound" if "(" not in _bound(r) else _bound(r).replace(" (", "-bound (", 1))
        lines += textwrap.wrap(" \u00b7 ".join(facts), width, initial_indent="      ", subsequent_indent="      ", break_on_hyphens=False)
    return "\n".join(lines)
