"""The report as self-contained HTML: no script, no network, charts as inline SVG (PNG data URIs only for a report rebuilt without its trace).

:func:`report_html` gives the fragment used as the ``text/html`` of a notebook output (it
survives nbconvert, GitHub's notebook view, VS Code and Colab); :func:`html_document` wraps it
in a page for ``Report.save_html``. The widget reuses the section functions, so the live and
the static views say the same thing. The page kit that every HTML view shares (the scoped CSS,
:func:`~gpumagic.render.page.wrap`, :func:`~gpumagic.render.page.document`, the live-view swap) is
in :mod:`gpumagic.render.page`.

In a live kernel this report is its own output, replaced by the live widget that follows it
(:func:`~gpumagic.render.page.swap_css`).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from gpumagic.render._format import (
    FIX_FLAVOR_LABEL,
    MISSING,
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
    severity_label,
    short_kernel_name,
    timeline_origin_ns,
    windows_text,
)
from gpumagic.render.breakdown import breakdown_html
from gpumagic.render.compile_notes import compile_html
from gpumagic.render.modules import modules_html
from gpumagic.render.operators import operators_html
from gpumagic.render.page import chart_block, document, png_data_uri, wrap
from gpumagic.render.summary import NO_FINDINGS, header_facts, title_line, top_finding

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.metrics import CopyGroupMetrics
    from gpumagic.report.model import Finding, Report

PAGEABLE_MARK = "\u26a0\ufe0f"


@dataclass(frozen=True)
class Images:
    """PNG figures for a report that holds no trace to draw from (``None`` where there is none):
    whenever the report has its trace, the page draws the timeline, the memory curve and the memory
    by category as inline SVG (:mod:`gpumagic.render.timeline_svg`,
    :func:`gpumagic.render.charts.memory_svg`, :func:`gpumagic.render.memory_categories.categories_svg`)
    instead."""

    timeline_png: bytes | None = None
    memory_png: bytes | None = None


def render_images(report: Report) -> Images:
    """No PNG: every chart is inline SVG, drawn with the page from ``report.trace`` (the matplotlib
    figures stay available: ``Report.timeline``, :func:`gpumagic.render.charts.memory_figure`,
    :func:`gpumagic.render.memory_categories.categories_figure`). Kept so that callers may still pass
    PNGs for a report without its trace."""
    return Images()


def report_html(report: Report, images: Images | None = None, *, live_token: str = "") -> str:
    """The whole report as one ``<div class="gpumagic-report">`` with its scoped style.

    ``live_token`` names the live widget output that follows this one in the notebook (see
    :func:`swap_css`); without it the static report stands alone.
    """
    images = render_images(report) if images is None else images
    sections = [
        header_html(report),
        _section(f"Checklist \u2014 what to change, {checklist_order(report.findings)}", checklist_html(report), "checklist"),
        _section("Timeline", timeline_html(report, images.timeline_png), "timeline"),
        _section("Breakdown", breakdown_html(report), "breakdown"),
        _section("Kernels and copies", kernels_html(report), "kernels"),
        _section("Operators", operators_html(report), "operators"),
        *([_section("Modules", mods, "modules")] if (mods := modules_html(report)) else []),  # --modules only
        _section("Memory", memory_html(report, images.memory_png), "memory"),
        _section("Notes", notes_html(report), "notes"),
    ]
    return wrap("".join(sections), static=True, live_token=live_token)


def html_document(report: Report, images: Images | None = None) -> str:
    """A complete, self-contained HTML page of the report (for ``Report.save_html``)."""
    return document(title_line(report), report_html(report, images))


def render_html(report: Report) -> str:
    """The complete self-contained page (what ``Report.to_html`` returns)."""
    return html_document(report)


def _section(title: str, body: str, key: str) -> str:
    return f'<section class="gm-section gm-{key}"><h3>{escape(title)}</h3>{body}</section>'


# -- header ---------------------------------------------------------------------------------------


def header_html(report: Report) -> str:
    """Title, the four facts as tiles, and the top finding with its estimated gain."""
    tiles = "".join(
        f'<div class="gm-fact" title="{escape(f.hint)}"><div class="gm-fact-label">{escape(f.label)}</div>'
        f'<div class="gm-fact-value">{escape(f.value)}</div></div>'
        for f in header_facts(report)
        if f.value != MISSING  # a tile without information is left out
    )
    top = top_finding(report)
    if top is None:
        callout = f'<div class="gm-top">{escape(NO_FINDINGS)}</div>'
    else:
        callout = (
            f'<div class="gm-top gm-sev-{escape(top.severity)}"><span class="gm-label">Top finding:</span> '
            f"{escape(severity_label(top.severity))} \u00b7 <b>{escape(top.title)}</b> \u2014 "
            f"{escape(fmt_gain(top.est_gain, top.gain_method, gain_basis(report)))}</div>"
        )
    return f"<header><h2>{escape(title_line(report))}</h2><div class=\"gm-facts\">{tiles}</div>{callout}</header>"


# -- checklist ------------------------------------------------------------------------------------


def checklist_html(report: Report) -> str:
    """One ``<details>`` per finding (the first one open), in the report's order; under the open
    first one, how many more findings wait below it."""
    if not report.findings:
        return f'<p class="gm-muted">{escape(NO_FINDINGS)}</p>'
    origin = timeline_origin_ns(report)
    anchor = _chart_anchor(report)
    basis = gain_basis(report)
    items = []
    for i, f in enumerate(report.findings):
        items.append(
            f'<details class="gm-finding gm-sev-{escape(f.severity)}"{" open" if i == 0 else ""}>'
            f"<summary>{finding_summary_html(f, basis)}</summary>"
            f'<div class="gm-finding-body">{finding_body_html(f, origin, anchor, basis)}</div></details>'
        )
        if i == 0 and len(report.findings) > 1:
            n = len(report.findings) - 1
            items.append(f'<p class="gm-more-findings">{more_findings_text(n)}</p>')
    return "".join(items)


def more_findings_text(n: int) -> str:
    """``'3 more findings below'`` (closed: click one to open it)."""
    return f"{n} more finding{'s' if n != 1 else ''} below (click a title to open it)"


def _chart_anchor(report: Report) -> str:
    """The id of the report's timeline chart, or ``''`` when there is none to link to."""
    if report.trace is None:
        return ""
    from gpumagic.render.timeline_svg import chart_id

    return chart_id(report)


def finding_summary_html(f: Finding, basis: str = STEP_TIME) -> str:
    return (
        f'<span class="gm-badge">{escape(severity_label(f.severity))}</span> {escape(f.title)}'
        f'<span class="gm-gain">\u2014 {escape(fmt_gain(f.est_gain, f.gain_method, basis))}</span>'
    )


#: Evidence numbers shown before the "more" disclosure.
MAX_SHOWN_NUMBERS = 3


def finding_body_html(f: Finding, origin_ns: int = 0, anchor: str = "", basis: str = STEP_TIME) -> str:
    """Evidence (summary, at most :data:`MAX_SHOWN_NUMBERS` numbers and the windows, the rest behind
    a "more" disclosure), why, estimated gain, the fixes as code, diagnostic snippets (labelled,
    after the fixes), and a link. ``anchor``: the id of the timeline chart the windows link into
    (:func:`gpumagic.render.timeline_svg.chart_id`); without it they are plain text."""
    items = evidence_items(f.evidence.numbers)
    chips = [f'<span class="gm-chip">{escape(label)}: <b>{escape(value)}</b></span>' for label, value in items]
    shown, rest = chips[:MAX_SHOWN_NUMBERS], chips[MAX_SHOWN_NUMBERS:]
    more = (f'<details class="gm-more"><summary>{len(rest)} more number{"s" if len(rest) != 1 else ""}</summary>'
            f'<div class="gm-chips">{"".join(rest)}</div></details>') if rest else ""
    fixes = [fix for fix in f.fixes if not fix.diagnostic]
    diagnostics = [fix for fix in f.fixes if fix.diagnostic]
    parts = [
        f'<p><span class="gm-label">Evidence:</span> {escape(f.evidence.summary)}</p>',
        f'<div class="gm-chips">{"".join(shown)}</div>' if shown else "",
        _windows_html(f, origin_ns, anchor),
        more,
        f'<p><span class="gm-label">Why it matters:</span> {escape(f.why)}</p>',
        f'<p><span class="gm-label">Estimated gain:</span> {escape(fmt_gain_detail(f.est_gain, f.gain_method, basis)[0])}'
        f' <span class="gm-muted">({escape(f.gain_method)})</span></p>',
        "".join(_fix_html(fix) for fix in fixes),
        "".join(_fix_html(fix, "Diagnostic") for fix in diagnostics),
        _doc_link(f.doc_url),
    ]
    return "".join(parts)


def _windows_html(f: Finding, origin_ns: int, anchor: str = "") -> str:
    if not f.evidence.windows:
        return ""
    if anchor:
        from gpumagic.render.timeline_svg import windows_links_html

        return f'<p class="gm-windows"><span class="gm-label">Where on the timeline:</span> {windows_links_html(f, anchor, origin_ns)}</p>'
    text = windows_text(f, origin_ns)
    return f'<p class="gm-muted">Where on the timeline: {escape(text)}</p>' if text else ""


def _fix_html(fix, kind: str = "Fix") -> str:
    flavor = FIX_FLAVOR_LABEL.get(fix.flavor, fix.flavor)
    cls = "gm-code" + (" gm-diagnostic" if kind != "Fix" else "")
    return (
        f'<p><span class="gm-label">{kind} ({escape(flavor)}):</span> {escape(fix.description)}</p>'
        f'<pre class="{cls}"><code>{escape(fix.code)}</code></pre>'
    )


def _doc_link(url: str) -> str:
    if not url.startswith(("https://", "http://")):
        return ""
    return f'<p><a href="{escape(url, quote=True)}" target="_blank" rel="noopener">Read more</a></p>'


# -- timeline -------------------------------------------------------------------------------------


def timeline_html(report: Report, png: bytes | None = None) -> str:
    """The timeline as inline SVG with its caption (``png``, if given, is only used when the report
    holds no trace to draw from)."""
    if report.trace is None:
        if png is None:
            return '<p class="gm-muted">No timeline: this report holds no trace (it was rebuilt from JSON).</p>'
        return f'<img class="gm-figure gm-timeline" alt="{escape(TIMELINE_ALT)}" src="{png_data_uri(png)}">' + timeline_caption()
    from gpumagic.render.timeline_svg import timeline_svg

    chart = timeline_svg(report)
    return chart_html(chart) + timeline_caption(chart.caption())


def chart_html(chart) -> str:
    """The chart of a :class:`~gpumagic.render.timeline_svg.SvgTimeline`: its title (what is in
    view), the SVG and its key."""
    return f'<p class="gm-tl-title">{escape(chart.view.title)}</p>' + svg_block(chart.svg) + chart.legend


def svg_block(svg: str, alt: str = "") -> str:
    """:func:`gpumagic.render.page.chart_block` with the timeline's text alternative by default."""
    return chart_block(svg, alt or TIMELINE_ALT, "chart" if alt else "timeline")


#: The timeline image's text alternative (static page and widget alike).
TIMELINE_ALT = ("Timeline of the recorded steps: a lane per host thread and per GPU stream, step boundaries as "
                "dashed lines, GPU idle gaps shaded by cause")


def timeline_caption(aggregated: str = "") -> str:
    """How to read the timeline (``aggregated``: what was merged, from the chart)."""
    return (
        '<p class="gm-muted">Lanes from the top: the step phases, the main thread, other host threads and DataLoader '
        "workers, then one lane per GPU stream, each named above its bar. Categories differ in colour and in band: "
        "kernels fill a lane, copies its lower half, memsets a thin strip at the bottom, NCCL its upper half, a "
        "data-loader wait the lower two thirds. Shaded columns: GPU idle gaps, by cause. Dashed lines: step "
        "boundaries. A finding's window, when its link is followed, is outlined. Hover a bar for its name. "
        f"{escape(aggregated)}</p>"
    )


# -- kernels and copies ---------------------------------------------------------------------------


def kernels_html(report: Report) -> str:
    k = None if report.metrics is None else report.metrics.kernels
    if k is None or not k.count:
        return '<p class="gm-muted">No GPU kernels were recorded.</p>' + copies_html(report)
    total = k.total_ms
    line = (
        f"<p>{fmt_number(k.count)} kernels, {fmt_ms(total)} in all; median {fmt_us(k.median_us)}; "
        f"{fmt_pct(k.short_frac)} run under 10 \u00b5s. Tensor cores ran "
        f"{fmt_ms(k.matmul_tensor_core_ms)} of {fmt_ms(k.matmul_ms)} "
        "of matmul/convolution time.</p>"
    )
    rows = "".join(
        f"<tr><td class=\"gm-num\">{i}</td><td class=\"gm-kname\" title=\"{escape(t.name)}\"><code>{kernel_name_html(t.name)}</code></td>"
        f"<td class=\"gm-num\">{fmt_number(t.count)}</td><td class=\"gm-num\">{fmt_ms(t.total_ms)}</td>"
        f"<td class=\"gm-num\">{fmt_pct(t.total_ms / total if total else None, 1)}</td>"
        f"<td class=\"gm-num\">{fmt_us(t.mean_us)}</td><td>{_yes_no(t.tensor_core)}</td></tr>"
        for i, t in enumerate(k.top, 1)
    )
    table = (
        '<h4>Top kernels by total time</h4><div class="gm-scroll"><table class="gm-table"><thead><tr><th>#</th><th>kernel</th><th>count</th>'
        "<th>total</th><th>share</th><th>mean</th><th>tensor cores</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )
    return line + table + copies_html(report)


#: Where a shortened kernel name may break: after a scope, a comma, an opening bracket or an underscore.
_BREAK_AFTER = ("::", ",", "<", "(", "_")


def kernel_name_html(name: str) -> str:
    """The shortened name (the full one is the cell's title), escaped, with ``<wbr>`` break points
    after scopes, commas, brackets and underscores, so a narrow table wraps it at those points
    instead of every few letters."""
    text = escape(short_kernel_name(name))
    for token in _BREAK_AFTER:
        text = text.replace(escape(token), escape(token) + "<wbr>")
    return text


def _yes_no(flag: object) -> str:
    return MISSING if flag is None else ("yes" if flag else "no")


def copies_html(report: Report) -> str:
    groups = [] if report.metrics is None else report.metrics.copies.groups
    if not groups:
        return '<h4>Memory copies</h4><p class="gm-muted">No memory copies were recorded.</p>'
    rows = "".join(_copy_row(g) for g in groups)
    return (
        '<h4>Memory copies</h4><div class="gm-scroll"><table class="gm-table"><thead><tr><th>direction</th><th>host memory</th>'
        "<th>count</th><th>bytes</th><th>time</th><th>GB/s</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
        f'<p class="gm-muted">{PAGEABLE_MARK} pageable: copied through a staging buffer and synchronous with the host; '
        "pinned memory (<code>pin_memory=True</code>) is faster and can overlap compute.</p>"
    )


def _copy_row(g: CopyGroupMetrics) -> str:
    memory = escape(str(g.memory))
    if g.memory == "pageable":
        memory += " " + PAGEABLE_MARK
    gbps = g.gbps
    return (
        f"<tr><td>{escape(str(g.direction))}</td><td>{memory}</td>"
        f'<td class="gm-num">{fmt_number(g.count)}</td><td class="gm-num">{fmt_bytes(g.bytes)}</td>'
        f'<td class="gm-num">{fmt_ms(g.ms)}</td>'
        f'<td class="gm-num">{MISSING if gbps is None else f"{gbps:.1f}"}</td></tr>'
    )


# -- memory and notes -----------------------------------------------------------------------------


def memory_html(report: Report, png: bytes | None) -> str:
    mem = None if report.metrics is None else report.metrics.memory
    cap = None if mem is None else mem.capacity_bytes
    peak = None if mem is None else (mem.peak_reserved_bytes or mem.peak_allocated_bytes or mem.nvml_peak_used_bytes)
    frac = None if mem is None else mem.peak_frac
    lines = []
    if peak is None:
        lines.append(
            '<p class="gm-muted">GPU memory was not recorded: the trace has no allocator records '
            "(profile_memory was off) and no NVML samples.</p>"
        )
    if mem is None or not mem.peak_allocated_bytes:
        lines.append(MEMORY_HINT)
    else:
        nvml = mem.nvml_peak_used_bytes
        nvml_text = f", NVML peak used {fmt_bytes(nvml)}" if nvml else ""
        lines.append(
            f"<p>Peak allocated {fmt_bytes(mem.peak_allocated_bytes)}, "
            f"peak reserved {fmt_bytes(mem.peak_reserved_bytes)}{nvml_text}"
            f" \u2014 capacity {fmt_bytes(cap)} (peak is {fmt_pct(frac)} of it; "
            f"source: {escape(str(mem.source))}).</p>"
        )
        if frac is not None:
            lines.append(f'<div class="gm-meter" title="peak / capacity"><span style="width:{min(frac, 1) * 100:.1f}%"></span></div>')
    svg = _memory_svg(report)
    if svg is not None:
        lines.append(svg_block(svg, "GPU memory over time"))
    elif png is not None:
        lines.append(f'<img class="gm-figure gm-memory" alt="GPU memory over time" src="{png_data_uri(png)}">')
    from gpumagic.render.memory_categories import categories_html

    lines.append(categories_html(report))
    return "".join(lines)


def _memory_svg(report: Report) -> str | None:
    if report.trace is None:
        return None
    from gpumagic.render.charts import memory_svg

    return memory_svg(report)


#: How to get allocator data when a report has none.
MEMORY_HINT = (
    '<p class="gm-muted">For allocations over time, profile with <code>%%gpuprofile --memory</code> '
    "(<code>gpumagic.profile(memory=True)</code>, or <code>profile_memory=True</code> in torch.profiler); "
    "it adds overhead, so it is off by default.</p>"
)


def notes_html(report: Report) -> str:
    t = None if report.metrics is None else report.metrics.trace
    devices = ", ".join(f"GPU{d.id} {d.name}".strip() for d in ([] if t is None else t.devices)) or "none described"
    facts = (
        f"<p class=\"gm-muted\">Source: {escape(str((t and t.source) or MISSING))} \u00b7 "
        f"{fmt_number(None if t is None else t.events)} events"
        f" \u00b7 devices: {escape(devices)}</p>"
    )
    compiled = compile_html(report)
    if not report.notes:
        return "<p>Nothing to note: the capture was complete and the trace well formed.</p>" + compiled + facts
    items = "".join(f"<li>{escape(n)}</li>" for n in report.notes)
    return f"<ul>{items}</ul>{compiled}{facts}"
