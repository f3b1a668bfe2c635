"""The Operators table (``metrics.operators``): per operator and input shapes, the GPU time of the
kernels it launched, achieved TFLOP/s and TB/s, and where it sits on the device's roofline."""

from __future__ import annotations

import textwrap
from html import escape
from typing import TYPE_CHECKING

from gpumagic.render._format import fmt_ms, fmt_number, fmt_pct
from gpumagic.render.summary import metric
from gpumagic.render.terminal import printable

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Report

#: Operators listed in the text render (the HTML lists all of ``metrics.operators.top``).
TEXT_TOP_OPERATORS = 8


def _rate(x: float | None, unit: str) -> str:
    return "n/a" if x is None else f"{x:.3g} {unit}"


def _bound(row: dict) -> str:
    if row.get("bound") is None:
        return "n/a"
    if row.get("above_peak"):  # the formula counts more FLOPs than the kernels did (Winograd, TF32)
        return f"{row['bound']} (above peak)"
    roof = row.get("frac_of_roof")
    return f"{row['bound']}" + ("" if roof is None else f" ({fmt_pct(roof, 0)} of roof)")


def _caption(m) -> str:
    o = metric(m, "operators") or {}
    parts = [f"{fmt_ms(o.get('attributed_ms'))} of {fmt_ms(o.get('kernel_ms'))} GPU time attributed to the operators "
             "that launched it"]
    if o.get("uncovered_ms"):
        graph = f", {fmt_ms(o['graph_uncovered_ms'])} of it in graph replays" if o.get("graph_uncovered_ms") else ""
        parts.append(f"{fmt_ms(o['uncovered_ms'])} uncovered{graph}")
    if not o.get("shapes"):
        parts.append("no shapes recorded (--shapes or --flops): no FLOPs or bytes")
    return "; ".join(parts)


def operators_html(report: Report) -> str:
    m = report.metrics
    rows = metric(m, "operators", "top") or []
    if not rows:
        return '<p class="gm-muted">No GPU work was attributed to operators.</p>'
    body = "".join(
        f'<tr><td class="gm-kname">{escape(r["name"])}</td><td class="gm-kname">{escape(r.get("shapes") or "")}</td>'
        f'<td class="gm-num">{fmt_number(r["count"])}</td><td class="gm-num">{fmt_ms(r["gpu_ms"])}</td>'
        f'<td class="gm-num">{_rate(r.get("tflops"), "TFLOP/s")}</td><td class="gm-num">{_rate(r.get("tbps"), "TB/s")}</td>'
        f'<td class="gm-num">{fmt_pct(r.get("frac_of_peak"), 1) if r.get("frac_of_peak") is not None else "n/a"}</td>'
        f"<td>{escape(_bound(r))}</td></tr>"
        for r in rows
    )
    return (
        f'<p class="gm-muted">{escape(_caption(m))}.</p>'
        '<table class="gm-table"><thead><tr><th>operator</th><th>input shapes</th><th>count</th><th>GPU time</th>'
        "<th>achieved</th><th>bytes/s (at least)</th><th>of peak</th><th>roofline</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def operators_text(report: Report, width: int) -> str:
    m = report.metrics
    rows = metric(m, "operators", "top") or []
    if not rows:
        return ""
    lines = textwrap.wrap(f"OPERATORS ({printable(_caption(m))})", width, subsequent_indent="  ")
    for r in rows[:TEXT_TOP_OPERATORS]:
        name = printable(r["name"]) + (f" [{printable(r['shapes'])}]" if r.get("shapes") else "")
        lines.append(f"  {name[:width - 2]}")
        facts = [f"{fmt_ms(r['gpu_ms'])} GPU time", f"\u00d7{fmt_number(r['count'])}"]
        if r.get("tflops") is not None:
            facts.append(_rate(r["tflops"], "TFLOP/s"))
        if r.get("frac_of_peak") is not None:
            facts.append(f"{fmt_pct(r['frac_of_peak'], 1)} of the {r.get('dtype')} peak")
        if r.get("tbps") is not None:
            facts.append(f"\u2265 {_rate(r['tbps'], 'TB/s')}")
        if r.get("bound"):
            facts.append(f"{_bound(r)}-bound" if "(" not in _bound(r) else _bound(r).replace(" (", "-bound (", 1))
        lines += textwrap.wrap(" \u00b7 ".join(facts), width, initial_indent="      ", subsequent_indent="      ", break_on_hyphens=False)
    return "\n".join(lines)
