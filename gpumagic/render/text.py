"""The report as plain text at a fixed width: terminals, logs, ``text/plain`` outputs.

Same header facts and the same order as the HTML and widget renders; severity as an ASCII badge
(``[HIGH]``) so that logs without colour or Unicode fonts still show it. Every name and sentence
taken from the trace goes through :func:`~gpumagic.render.terminal.printable`, and the whole
layout through :func:`~gpumagic.render.terminal.printable_lines`: no escape sequence reaches a terminal.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from gpumagic.render import palette
from gpumagic.render._format import (
    SEVERITY_BADGE,
    evidence_items,
    fmt_bytes,
    fmt_gain,
    fmt_gain_detail,
    fmt_ms,
    fmt_number,
    fmt_pct,
    fmt_us,
    short_kernel_name,
)
from gpumagic.render.html import FIX_FLAVOR_LABEL, timeline_origin_ns, windows_text
from gpumagic.render.summary import NO_FINDINGS, header_facts, metric, title_line, top_finding
from gpumagic.render.terminal import printable, printable_lines

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Finding, Report

#: Kernels listed in the text render (the HTML lists all of ``metrics["kernels"]["top"]``).
TEXT_TOP_KERNELS = 8
#: Width of the share bars in the breakdown, in characters.
BAR_CHARS = 24
INDENT = "   "
NOTHING_MEASURED = "Nothing was measured: see the notes below."


def render_text(report: Report, width: int = 100) -> str:
    """The whole report as text lines no wider than ``width`` (code lines excepted)."""
    if not report.metrics:  # nothing was measured (e.g. another profiler took over): the notes say why
        return printable_lines("\n\n".join([_header(report), _notes(report, width)]) + "\n")
    blocks = [
        _header(report, width),
        _checklist(report, width),
        _breakdown(report),
        _kernels(report, width),
        _memory(report),
        _notes(report, width),
    ]
    return printable_lines("\n\n".join(b for b in blocks if b) + "\n")


def _header(report: Report, width: int = 100) -> str:
    if not report.metrics:
        return "\n".join([printable(title_line(report)), NOTHING_MEASURED])
    facts = [""]
    for f in header_facts(report):  # facts joined by " · ", a new line where the width would overflow
        item = f"{f.label} {f.value}"
        if facts[-1] and len(facts[-1]) + 3 + len(item) > width:
            facts.append("")
        facts[-1] = f"{facts[-1]} \u00b7 {item}" if facts[-1] else item
    top = top_finding(report)
    line = NO_FINDINGS if top is None else (
        f"Top finding: {SEVERITY_BADGE[top.severity].strip()} {printable(top.title)} \u2014 {fmt_gain(top.est_gain, top.gain_method)}")
    return "\n".join([printable(title_line(report)), *(printable(f) for f in facts), line])


def _checklist(report: Report, width: int) -> str:
    if not report.findings:
        return ""
    origin = timeline_origin_ns(report)
    lines = ["CHECKLIST (biggest estimated gain first)"]
    for i, f in enumerate(report.findings, 1):
        lines.append("")
        lines += _finding(i, f, width, origin)
    return "\n".join(lines)


def _finding(i: int, f: Finding, width: int, origin_ns: int) -> list[str]:
    out = [f"{i}. {SEVERITY_BADGE[f.severity]} {printable(f.title)}  ({printable(f.id)})"]
    out += _para("Gain:", "{} ({})".format(*fmt_gain_detail(f.est_gain, f.gain_method)), width)
    out += _para("Evidence:", f.evidence.summary, width)
    if f.evidence.numbers:
        out += _para("Numbers:", " \u00b7 ".join(f"{label}: {value}" for label, value in evidence_items(f.evidence.numbers)), width)
    where = windows_text(f, origin_ns)
    if where:
        out += _para("Where:", where, width)
    out += _para("Why:", f.why, width)
    for fix in f.fixes:
        out += _para(f"Fix ({FIX_FLAVOR_LABEL.get(fix.flavor, fix.flavor)}):", fix.description, width)
        out += [INDENT * 2 + line if line.strip() else "" for line in fix.code.splitlines()]
    if f.doc_url:
        out.append(f"{INDENT}Docs: {f.doc_url}")
    return out


def _para(label: str, text: str, width: int) -> list[str]:
    return textwrap.wrap(
        f"{label} {printable(text)}", width=width, initial_indent=INDENT, subsequent_indent=INDENT + "  ", break_on_hyphens=False
    )


def _breakdown(report: Report) -> str:
    m = report.metrics
    order = metric(m, "breakdown", "order") or []
    totals = metric(m, "breakdown", "total_ms") or {}
    fracs = metric(m, "breakdown", "frac") or {}
    lines = ["WHERE THE TIME WENT (share of wall time, each moment counted once)"]
    for c in order:
        frac = fracs.get(c) or 0.0
        if frac <= 0:
            continue
        bar = "\u2588" * round(frac * BAR_CHARS) or "\u258f"
        lines.append(f"  {palette.CATEGORY_LABEL.get(c, c):<22}{fmt_ms(totals.get(c)):>9} {fmt_pct(frac, 1):>7}  {bar}")
    if metric(m, "trace", "cpu_only"):
        return "\n".join([*lines, "  GPU idle: no GPU activity was recorded"])
    idle = metric(m, "idle", "total_ms")
    if idle:
        parts = " \u00b7 ".join(
            f"{palette.IDLE_LABEL[c].removeprefix('GPU idle: ')} {fmt_ms(metric(m, 'idle', f'{c}_ms'))}"
            for c in ("host_wait", "launch_latency", "other")
        )
        lines.append(f"  GPU idle {fmt_ms(idle)}: {parts}")
    return "\n".join(lines)


def _kernels(report: Report, width: int) -> str:
    m = report.metrics
    lines = []
    top = metric(m, "kernels", "top") or []
    total = metric(m, "kernels", "total_ms") or 0.0
    if top:
        lines.append(
            f"TOP KERNELS ({fmt_number(metric(m, 'kernels', 'count'))} kernels, {fmt_ms(total)}; "
            f"median {fmt_us(metric(m, 'kernels', 'median_us'))})"
        )
        lines.append(f"  {'total':>9} {'share':>7} {'count':>7} {'mean':>9}  TC   kernel")
        name_width = max(20, width - 48)
        for k in top[:TEXT_TOP_KERNELS]:
            share = (k.get("total_ms") or 0) / total if total else None
            tc = "yes" if k.get("tensor_core") else "no"
            lines.append(
                f"  {fmt_ms(k.get('total_ms')):>9} {fmt_pct(share, 1):>7} {fmt_number(k.get('count')):>7} "
                f"{fmt_us(k.get('mean_us')):>9}  {tc:<4} {short_kernel_name(printable(k['name']), name_width)}"
            )
    for g in metric(m, "copies", "groups") or []:
        gbps = "n/a" if g.get("gbps") is None else f"{g['gbps']:.1f} GB/s"
        lines.append(
            f"COPIES {printable(g.get('direction'))} {printable(g.get('memory'))}: {fmt_number(g.get('count'))} copies, "
            f"{fmt_bytes(g.get('bytes'))} in {fmt_ms(g.get('ms'))}, {gbps}"
        )
    return "\n".join(lines)


def _memory(report: Report) -> str:
    m = report.metrics
    peak = metric(m, "memory", "peak_reserved_bytes") or metric(m, "memory", "peak_allocated_bytes")
    peak = peak or metric(m, "memory", "nvml_peak_used_bytes")
    if peak is None:
        return "MEMORY not recorded (no allocator records, no NVML samples)"
    return (
        f"MEMORY peak {fmt_bytes(peak)} of {fmt_bytes(metric(m, 'memory', 'capacity_bytes'))} "
        f"({fmt_pct(metric(m, 'memory', 'peak_frac'))}; source: {metric(m, 'memory', 'source')})"
    )


def _notes(report: Report, width: int) -> str:
    if not report.notes:
        return ""
    lines = ["NOTES"]
    for n in report.notes:
        lines += textwrap.wrap(printable(n), width=width, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(lines)
