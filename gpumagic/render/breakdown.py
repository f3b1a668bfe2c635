"""Where the step time went: one stacked bar per step, and the GPU idle time split by cause.

Plain HTML and inline CSS widths (no image, no script), so the bars survive every frontend
and print. Each bar segment has a tooltip, and the same numbers appear as text in the legend
table, so nothing depends on colour alone.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from gpumagic.render import palette
from gpumagic.render._format import STAGES_NOTE, fmt_ms, fmt_pct, loader_stage_rows, path_shares, phase_medians
from gpumagic.render.layout import step_label

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.metrics import Metrics
    from gpumagic.report.model import Report

#: Steps drawn as bars; a longer run shows the first and last ones (the middle ones are alike).
MAX_STEP_BARS = 24
#: Idle causes in display order (docs/metrics.md ``idle``).
IDLE_CAUSES = ("host_wait", "launch_latency", "other")


def breakdown_html(report: Report) -> str:
    """Stacked per-step bars, a legend table with totals, and the idle split."""
    m = report.metrics
    order = (None if m is None else m.breakdown.order) or list(palette.CATEGORY_COLOR)
    rows = _bar_rows(report)
    if m is None or not rows:
        return '<p class="gm-muted">No step-time breakdown: the analysis window is empty.</p>'
    longest = max(sum(parts.get(c, 0.0) or 0.0 for c in order) for _, parts in rows) or 1.0
    bars = "".join(_bar(label, parts, order, longest) for label, parts in rows)
    return (
        '<h4>Step time by category</h4>'
        f'<div class="gm-bars">{bars}</div>'
        f"{_legend_table(m, order)}"
        f"{phases_html(report)}"
        f"{loader_stages_html(report)}"
        f"{critical_path_html(report)}"
        f"{idle_html(report)}"
    )


def _bar_rows(report: Report) -> list[tuple[str, dict[str, float]]]:
    m = report.metrics
    if m is None:
        return []
    per_step = m.breakdown.per_step_ms
    names = m.steps.names
    if per_step:
        indexed = list(enumerate(per_step))
        if len(indexed) > MAX_STEP_BARS:
            half = MAX_STEP_BARS // 2
            indexed = indexed[:half] + indexed[-half:]
        return [(step_label(i, names), parts) for i, parts in indexed]
    totals = m.breakdown.total_ms
    return [("whole trace", totals)] if totals else []


def _bar(label: str, parts: dict[str, float], order: list[str], longest_ms: float) -> str:
    total = sum(parts.get(c, 0.0) or 0.0 for c in order)
    segments = []
    for c in order:
        ms = parts.get(c, 0.0) or 0.0
        if ms <= 0:
            continue
        tip = f"{palette.CATEGORY_LABEL.get(c, c)}: {fmt_ms(ms)} ({fmt_pct(ms / total if total else None)})"
        segments.append(
            f'<span class="gm-seg" style="width:{100 * ms / longest_ms:.3f}%;'
            f'background:{palette.CATEGORY_COLOR.get(c, palette.PALE_GREY)}" title="{escape(tip)}"></span>'
        )
    return (
        f'<div class="gm-bar-row"><span class="gm-bar-label">{escape(label)}</span>'
        f'<span class="gm-bar">{"".join(segments)}</span>'
        f'<span class="gm-bar-total">{fmt_ms(total)}</span></div>'
    )


def _legend_table(m: Metrics, order: list[str]) -> str:
    totals = m.breakdown.total_ms
    fracs = m.breakdown.frac
    rows = "".join(
        f'<tr><td><span class="gm-swatch" style="background:{palette.CATEGORY_COLOR.get(c, palette.PALE_GREY)}"></span>'
        f"{escape(palette.CATEGORY_LABEL.get(c, c))}</td>"
        f'<td class="gm-num">{fmt_ms(totals.get(c))}</td><td class="gm-num">{fmt_pct(fracs.get(c), 1)}</td></tr>'
        for c in order
        if (totals.get(c) or 0) > 0
    )
    return (
        '<table class="gm-table gm-legend"><thead><tr><th>category (each moment counted once, '
        'highest priority first)</th><th>total</th><th>share of wall time</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


def phases_html(report: Report) -> str:
    """The median step split into data / forward / backward / optimizer / evaluation / other
    (``metrics.phases``), as a bar and a table; empty when the trace has no steps."""
    found = phase_medians(report)
    if found is None:
        return ""
    ph, med, gpu = found
    order = ph.order
    total = sum(med.get(p) or 0.0 for p in order) or 1.0
    segs = "".join(
        f'<span class="gm-seg" style="width:{100 * (med.get(p) or 0) / total:.3f}%;background:{palette.PHASE_COLOR[p]}" '
        f'title="{escape(palette.PHASE_LABEL[p])}: {fmt_ms(med.get(p))}"></span>'
        for p in order if (med.get(p) or 0) > 0
    )
    redo = ph.recompute_median_ms  # activation checkpointing: part of the backward ran the forward again
    rows = "".join(
        f'<tr><td><span class="gm-swatch" style="background:{palette.PHASE_COLOR[p]}"></span>{escape(palette.PHASE_LABEL[p])}</td>'
        f'<td class="gm-num">{fmt_ms(med.get(p))}</td><td class="gm-num">{fmt_pct((med.get(p) or 0) / total, 1)}</td>'
        + (f'<td class="gm-num">{fmt_ms(gpu.get(p))}</td>' if gpu else "") + "</tr>"
        + (f'<tr><td class="gm-sub">of which the forward again</td><td class="gm-num">{fmt_ms(redo)}</td>'
           f'<td class="gm-num">{fmt_pct(redo / total, 1)}</td>' + ("<td></td>" if gpu else "") + "</tr>"
           if p == "backward" and redo else "")
        for p in order if (med.get(p) or 0) > 0
    )
    return (
        "<h4>Step phases (host, median per step)</h4>"
        f'<div class="gm-bars"><div class="gm-bar-row"><span class="gm-bar-label">median</span>'
        f'<span class="gm-bar">{segs}</span><span class="gm-bar-total">{fmt_ms(total)}</span></div></div>'
        '<div class="gm-scroll"><table class="gm-table gm-legend"><thead><tr><th>phase</th><th>median</th><th>share</th>'
        + ("<th>GPU time it launched</th>" if gpu else "") + f"</tr></thead><tbody>{rows}</tbody></table></div>"
    )


def loader_stages_html(report: Report) -> str:
    """Where a batch's loading time goes (``metrics.host.loader_stages``): one row per stage, largest
    first, with a bar of its share; empty when the capture timed no stage."""
    rows = loader_stage_rows(report)
    if not rows:
        return ""
    body = "".join(
        f'<tr><td class="gm-kname"><code>{escape(name)}</code></td><td>{escape(where)}</td>'
        f'<td class="gm-num">{ms}</td><td class="gm-num">{pct}</td>'
        f'<td style="min-width:8em;width:30%"><span class="gm-bar"><span class="gm-seg" style="width:{100 * min(max(frac, 0.0), 1.0):.3f}%;'
        f'background:{palette.PHASE_COLOR["data"]}"></span></span></td></tr>'
        for name, ms, pct, frac, where in rows
    )
    return (
        "<h4>Data pipeline stages (where a batch's loading time goes)</h4>"
        f'<p class="gm-muted">{escape(STAGES_NOTE)}</p>'
        '<div class="gm-scroll"><table class="gm-table gm-legend gm-stages"><thead><tr><th>stage</th><th>where</th>'
        '<th>time per batch</th><th>share of the stages</th><th aria-hidden="true"></th></tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def critical_path_html(report: Report) -> str:
    """What bounds the steps: the critical path's share per kind of link, its top links and
    what the trace lacked (``metrics.critical_path``)."""
    found = path_shares(report)
    if found is None:
        return ""
    cp, frac, ms = found
    kinds = [k for k in cp.kinds if (frac.get(k) or 0) > 0]
    segs = "".join(
        f'<span class="gm-seg" style="width:{100 * frac[k]:.3f}%;background:{palette.PATH_COLOR.get(k, palette.PALE_GREY)}" '
        f'title="{escape(palette.PATH_LABEL.get(k, k))}: {fmt_pct(frac[k], 1)}"></span>' for k in kinds
    )
    rows = "".join(
        f'<tr><td><span class="gm-swatch" style="background:{palette.PATH_COLOR.get(k, palette.PALE_GREY)}"></span>'
        f'{escape(palette.PATH_LABEL.get(k, k))}</td><td class="gm-num">{fmt_ms(ms.get(k))}</td>'
        f'<td class="gm-num">{fmt_pct(frac[k], 1)}</td></tr>' for k in kinds
    )
    links = "".join(
        f'<tr><td class="gm-kname">{escape(x.name[:120])}</td>'
        f'<td>{escape(palette.PATH_LABEL.get(x.kind, x.kind))}</td>'
        f'<td class="gm-num">{fmt_ms(x.ms)}</td></tr>' for x in cp.top
    )
    notes = "".join(f'<p class="gm-muted">{escape(n)}</p>' for n in cp.notes)
    b = cp.bound
    head = f": {escape(b.what)}, {fmt_pct(b.frac, 0)}"
    return (
        f"<h4>What bounds the step{head}</h4>"
        '<p class="gm-muted">The critical path: the chain of host work, launches, GPU work and waits that, made '
        "faster, would make the step shorter (each moment of the step once).</p>"
        f'<div class="gm-bars"><div class="gm-bar-row"><span class="gm-bar-label">critical path</span>'
        f'<span class="gm-bar">{segs}</span><span class="gm-bar-total">{fmt_pct(1.0)}</span></div></div>'
        f'<div class="gm-scroll"><table class="gm-table gm-legend"><thead><tr><th>link</th><th>time</th>'
        f"<th>share of the path</th></tr></thead><tbody>{rows}</tbody></table></div>"
        + (f'<div class="gm-scroll"><table class="gm-table"><thead><tr><th>top links</th><th>kind</th><th>time</th></tr>'
           f"</thead><tbody>{links}</tbody></table></div>" if links else "")
        + notes
    )


def idle_html(report: Report) -> str:
    """The GPU's idle time split by cause, as a bar and a table."""
    m = report.metrics
    if m is None or m.trace.cpu_only:
        return '<h4>GPU idle time</h4><p class="gm-muted">No GPU activity was recorded.</p>'
    idle = m.idle
    total = idle.total_ms
    if not total:
        return '<h4>GPU idle time</h4><p class="gm-muted">The GPU was never idle inside the window.</p>'
    parts = {"host_wait": idle.host_wait_ms, "launch_latency": idle.launch_latency_ms, "other": idle.other_ms}
    segs = "".join(
        f'<span class="gm-seg" style="width:{100 * ms / total:.3f}%;background:{palette.IDLE_COLOR[c]}" '
        f'title="{escape(palette.IDLE_LABEL[c])}: {fmt_ms(ms)}"></span>'
        for c, ms in parts.items()
        if ms > 0
    )
    rows = "".join(
        f'<tr><td><span class="gm-swatch" style="background:{palette.IDLE_COLOR[c]}"></span>{escape(palette.IDLE_LABEL[c])}</td>'
        f'<td class="gm-num">{fmt_ms(ms)}</td><td class="gm-num">{fmt_pct(ms / total, 1)}</td></tr>'
        for c, ms in parts.items()
        if ms > 0  # only the causes present, as in the bar
    )
    long_count = idle.long_gap_count
    long_line = (
        f'<p class="gm-muted">{long_count} gaps of 1 ms or more, {fmt_ms(idle.long_gap_ms)} in all.</p>'
        if long_count
        else ""
    )
    return (
        f"<h4>GPU idle time: {fmt_ms(total)}</h4>"
        f'<div class="gm-bars"><div class="gm-bar-row"><span class="gm-bar-label">idle</span>'
        f'<span class="gm-bar">{segs}</span><span class="gm-bar-total">{fmt_ms(total)}</span></div></div>'
        f'<table class="gm-table gm-legend"><thead><tr><th>cause</th><th>time</th><th>share of idle</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>{long_line}"
    )
