"""The report as plain text: terminals, logs, ``text/plain`` outputs.

Every line fits the width (``COLUMNS``, else the terminal's, else 100: see
:mod:`gpumagic.render._width`): prose and evidence wrap, tables shorten their last column (kernel
names) and bars; only the lines of a fix's code may run longer, and they are never wrapped, so
that they paste as written.

Same header facts and the same order as the HTML and widget renders; severity as an ASCII badge
(``[HIGH]``) so that logs without colour or Unicode fonts still show it. Every name and sentence
taken from the trace goes through :func:`~gpumagic.render.terminal.printable`, and the whole
layout through :func:`~gpumagic.render.terminal.printable_lines`: no escape sequence reaches a terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render import palette
from gpumagic.render._format import (
    FIX_FLAVOR_LABEL,
    MISSING,
    SEVERITY_BADGE,
    STAGES_NOTE,
    STEP_TIME,
    checklist_order,
    evidence_items,
    fmt_bytes,
    fmt_gain,
    fmt_gain_detail,
    fmt_ms,
    fmt_number,
    fmt_pct,
    fmt_us,
    gain_basis,
    loader_stage_rows,
    path_shares,
    phase_medians,
    short_kernel_name,
    timeline_origin_ns,
    windows_text,
)
from gpumagic.render._width import resolve_width, shorten, wrap
from gpumagic.render.compile_notes import compile_text
from gpumagic.render.modules import modules_text
from gpumagic.render.operators import operators_text
from gpumagic.render.summary import NO_FINDINGS, header_facts, title_line, top_finding
from gpumagic.render.terminal import printable, printable_lines

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Finding, Report

#: Kernels listed in the text render (the HTML lists all of ``metrics["kernels"]["top"]``).
TEXT_TOP_KERNELS = 8
#: Width of the share bars in the breakdown, in characters.
BAR_CHARS = 24
INDENT = "   "
NOTHING_MEASURED = "Nothing was measured: see the notes below."


def render_text(report: Report, width: int | None = None) -> str:
    """The whole report as text lines no wider than ``width`` (code lines excepted); ``None``:
    the terminal's width (:func:`~gpumagic.render._width.terminal_width`)."""
    width = resolve_width(width)
    if report.metrics is None:  # nothing was measured (e.g. another profiler took over): the notes say why
        return printable_lines("\n\n".join([_header(report, width), _notes(report, width)]) + "\n")
    blocks = [
        _header(report, width),
        _checklist(report, width),
        _breakdown(report, width),
        _phases(report, width),
        _loader_stages(report, width),
        _critical_path(report, width),
        _kernels(report, width),
        operators_text(report, width),
        modules_text(report, width),
        _memory(report, width),
        _notes(report, width),
    ]
    return printable_lines("\n\n".join(b for b in blocks if b) + "\n")


def _header(report: Report, width: int = 100) -> str:
    title = wrap(printable(title_line(report)), width, subsequent="  ")
    if report.metrics is None:
        return "\n".join([*title, *wrap(NOTHING_MEASURED, width)])
    facts = [""]
    for f in header_facts(report):  # facts joined by " · ", a new line where the width would overflow
        if f.value == MISSING:  # nothing to say (no step markers): left out, as in the HTML header
            continue
        item = f"{f.label} {f.value}"
        if facts[-1] and len(facts[-1]) + 3 + len(item) > width:
            facts.append("")
        facts[-1] = f"{facts[-1]} \u00b7 {item}" if facts[-1] else item
    top = top_finding(report)
    line = NO_FINDINGS if top is None else (
        f"Top finding: {SEVERITY_BADGE[top.severity].strip()} {printable(top.title)} \u2014 "
        f"{fmt_gain(top.est_gain, top.gain_method, gain_basis(report))}")
    return "\n".join([*title, *(wrapped for f in facts for wrapped in wrap(printable(f), width)), *wrap(line, width, subsequent="  ")])


def _checklist(report: Report, width: int) -> str:
    if not report.findings:
        return ""
    origin = timeline_origin_ns(report)
    order = checklist_order(report.findings)
    lines = [f"CHECKLIST ({order.replace('biggest gain', 'biggest estimated gain')})"]
    for i, f in enumerate(report.findings, 1):
        lines.append("")
        lines += _finding(i, f, width, origin, gain_basis(report))
    return "\n".join(lines)


def _finding(i: int, f: Finding, width: int, origin_ns: int, basis: str = STEP_TIME) -> list[str]:
    out = wrap(f"{i}. {SEVERITY_BADGE[f.severity]} {printable(f.title)}  ({printable(f.id)})", width, subsequent=INDENT)
    out += _para("Gain:", "{} ({})".format(*fmt_gain_detail(f.est_gain, f.gain_method, basis)), width)
    out += _para("Evidence:", f.evidence.summary, width)
    if f.evidence.numbers:
        out += _para("Numbers:", " \u00b7 ".join(f"{label}: {value}" for label, value in evidence_items(f.evidence.numbers)), width)
    where = windows_text(f, origin_ns)
    if where:
        out += _para("Where:", where, width)
    out += _para("Why:", f.why, width)
    for fix in sorted(f.fixes, key=lambda x: x.diagnostic):  # the changes, then the diagnostic snippets
        kind = "Diagnostic" if fix.diagnostic else "Fix"
        out += _para(f"{kind} ({FIX_FLAVOR_LABEL.get(fix.flavor, fix.flavor)}):", fix.description, width)
        out += [INDENT * 2 + line if line.strip() else "" for line in fix.code.splitlines()]
    if f.doc_url:
        out += wrap(f"Docs: {f.doc_url}", width, INDENT, INDENT + "  ")
    return out


def _para(label: str, text: str, width: int) -> list[str]:
    return wrap(f"{label} {printable(text)}", width, INDENT, INDENT + "  ")


def _breakdown(report: Report, width: int) -> str:
    m = report.metrics
    if m is None:
        return ""
    order = m.breakdown.order
    totals = m.breakdown.total_ms
    fracs = m.breakdown.frac
    lines = wrap("WHERE THE TIME WENT (share of wall time, each moment counted once)", width, subsequent="  ")
    bar_chars = max(4, min(BAR_CHARS, width - 43))  # 2 + 22 + 9 + 1 + 7 + 2 characters before the bar
    for c in order:
        frac = fracs.get(c) or 0.0
        if frac <= 0:
            continue
        bar = "\u2588" * round(frac * bar_chars) or "\u258f"
        label = shorten(palette.CATEGORY_LABEL.get(c, c), 21)
        lines.append(f"  {label:<22}{fmt_ms(totals.get(c)):>9} {fmt_pct(frac, 1):>7}  {bar}")
    if m.trace.cpu_only:
        return "\n".join([*lines, "  GPU idle: no GPU activity was recorded"])
    idle = m.idle.total_ms
    if idle:
        causes = {"host_wait": m.idle.host_wait_ms, "launch_latency": m.idle.launch_latency_ms, "other": m.idle.other_ms}
        parts = " \u00b7 ".join(
            f"{palette.IDLE_LABEL[c].removeprefix('GPU idle: ')} {fmt_ms(ms)}" for c, ms in causes.items()
        )
        lines += wrap(f"GPU idle {fmt_ms(idle)}: {parts}", width, "  ", "    ")
    return "\n".join(lines)


#: Characters of a bar row besides its label and bar: indent, time, share and the gaps.
ROW_FIXED = 2 + 9 + 1 + 7 + 2


def _phases(report: Report, width: int) -> str:
    """The median step's phases (``metrics.phases``), when the trace has steps."""
    found = phase_medians(report)
    if found is None:
        return ""
    ph, med, gpu = found
    total = sum(v or 0.0 for v in med.values()) or 1.0
    lines = wrap("STEP PHASES (host, median per step" + ("; GPU: time of the work launched in it)" if gpu else ")"),
                 width, subsequent="  ")
    gpu_w = 15 if gpu else 0  # "  GPU 1,234 ms"
    label_w = max(12, min(30, width - ROW_FIXED - 4 - gpu_w))
    bar_chars = max(1, min(BAR_CHARS, width - ROW_FIXED - label_w - gpu_w))
    for p in ph.order:
        ms = med.get(p) or 0.0
        if ms > 0:
            bar = "\u2588" * round(ms / total * bar_chars) or "\u258f"
            on_gpu = f"  GPU {fmt_ms(gpu.get(p))}" if gpu else ""
            label = shorten(palette.PHASE_LABEL.get(p, p), label_w - 1)
            lines.append(f"  {label:<{label_w}}{fmt_ms(ms):>9} {fmt_pct(ms / total, 1):>7}  {bar:<{bar_chars}}{on_gpu}")
            redo = ph.recompute_median_ms if p == "backward" else None
            if redo:  # activation checkpointing: part of the backward ran the forward again
                sub = shorten("of which the forward again", label_w - 3)
                lines.append(f"    {sub:<{label_w - 2}}{fmt_ms(redo):>9} {fmt_pct(redo / total, 1):>7}")
    return "\n".join(lines)


def _loader_stages(report: Report, width: int) -> str:
    """Where a batch's loading time goes (``metrics.host.loader_stages``), when the capture timed it."""
    rows = loader_stage_rows(report)
    if not rows:
        return ""
    lines = wrap("DATA PIPELINE STAGES (where a batch's loading time goes)", width, subsequent="  ")
    lines += wrap(STAGES_NOTE, width, "  ", "  ")
    where_w = max(len(r[4]) for r in rows) + 2
    label_w = max(12, min(40, width - ROW_FIXED - where_w - 4))
    bar_chars = max(1, min(BAR_CHARS, width - ROW_FIXED - label_w - where_w))
    for name, ms, pct, frac, where in rows:
        bar = "\u2588" * round(frac * bar_chars) or "\u258f"
        label = shorten(printable(name), label_w - 1)
        lines.append(f"  {label:<{label_w}}{where:<{where_w}}{ms:>9} {pct:>7}  {bar}")
    return "\n".join(lines)


def _critical_path(report: Report, width: int) -> str:
    """What bounds the steps (``metrics.critical_path``): the share per kind and the top links."""
    found = path_shares(report)
    if found is None:
        return ""
    cp, frac, ms = found
    lines = wrap("WHAT BOUNDS THE STEP (critical path: the chain that, made faster, would shorten the step)",
                 width, subsequent="  ")
    label_w = max(12, min(34, width - ROW_FIXED - 4))
    bar_chars = max(1, min(BAR_CHARS, width - ROW_FIXED - label_w))
    for k in cp.kinds:
        f = frac.get(k) or 0.0
        if f > 0:
            bar = "\u2588" * round(f * bar_chars) or "\u258f"
            label = shorten(palette.PATH_LABEL.get(k, k), label_w - 1)
            lines.append(f"  {label:<{label_w}}{fmt_ms(ms.get(k)):>9} {fmt_pct(f, 1):>7}  {bar}")
    if cp.top:
        lines.append("  top links:")
        for x in cp.top[:5]:
            raw = printable(x.name)
            room = max(12, width - 30)
            name = short_kernel_name(raw, room) if x.kind.startswith("gpu") else shorten(raw, room)
            lines.append(f"    {fmt_ms(x.ms):>9}  {printable(x.kind):<13} {name}")
    for n in cp.notes:
        lines += _para("Note:", n, width)
    return "\n".join(lines)


def _kernels(report: Report, width: int) -> str:
    m = report.metrics
    if m is None:
        return ""
    lines = []
    top = m.kernels.top
    total = m.kernels.total_ms
    if top:
        lines += wrap(
            f"TOP KERNELS ({fmt_number(m.kernels.count)} kernels, {fmt_ms(total)}; "
            f"median {fmt_us(m.kernels.median_us)})", width, subsequent="  "
        )
        lines.append(f"  {'total':>9} {'share':>7} {'count':>7} {'mean':>9}  TC   kernel")
        name_width = width - 48  # after 44 characters of columns, with a margin (at least 12: MIN_WIDTH)
        for k in top[:TEXT_TOP_KERNELS]:
            share = k.total_ms / total if total else None
            tc = "yes" if k.tensor_core else "no"
            lines.append(
                f"  {fmt_ms(k.total_ms):>9} {fmt_pct(share, 1):>7} {fmt_number(k.count):>7} "
                f"{fmt_us(k.mean_us):>9}  {tc:<4} {short_kernel_name(printable(k.name), name_width)}"
            )
    for g in m.copies.groups:
        gbps = "n/a" if g.gbps is None else f"{g.gbps:.1f} GB/s"
        lines += wrap(
            f"COPIES {printable(g.direction)} {printable(g.memory)}: {fmt_number(g.count)} copies, "
            f"{fmt_bytes(g.bytes)} in {fmt_ms(g.ms)}, {gbps}", width, subsequent="  "
        )
    return "\n".join(lines)


def _memory(report: Report, width: int) -> str:
    mem = None if report.metrics is None else report.metrics.memory
    peak = None if mem is None else (mem.peak_reserved_bytes or mem.peak_allocated_bytes or mem.nvml_peak_used_bytes)
    from gpumagic.render.memory_categories import categories_text

    extra = [x for line in categories_text(report) for x in wrap(line, width, subsequent="    ")]
    if mem is None or peak is None:
        return "\n".join(wrap("MEMORY not recorded (no allocator records, no NVML samples)", width, subsequent="  ") + extra)
    return "\n".join(wrap(
        f"MEMORY peak {fmt_bytes(peak)} of {fmt_bytes(mem.capacity_bytes)} "
        f"({fmt_pct(mem.peak_frac)}; source: {mem.source})", width, subsequent="  "
    ) + extra)


def _notes(report: Report, width: int) -> str:
    compiled = compile_text(report, width)
    if not report.notes and not compiled:
        return ""
    lines = ["NOTES"]
    for n in report.notes:
        lines += wrap(printable(n), width, "  - ", "    ")
    return "\n".join(lines + compiled)
