"""Where the step time went: one stacked bar per step, and the GPU idle time split by cause.

Plain HTML and inline CSS widths (no image, no script), so the bars survive every frontend
and print. Each bar segment has a tooltip, and the same numbers appear as text in the legend
table, so nothing depends on colour alone.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any

from gpumagic.render import palette
from gpumagic.render._format import fmt_ms, fmt_pct
from gpumagic.render.layout import step_label
from gpumagic.render.summary import metric

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Report

#: Steps drawn as bars; a longer run shows the first and last ones (the middle ones are alike).
MAX_STEP_BARS = 24
#: Idle causes in display order (docs/metrics.md ``idle``).
IDLE_CAUSES = ("host_wait", "launch_latency", "other")


def breakdown_html(report: Report) -> str:
    """Stacked per-step bars, a legend table with totals, and the idle split."""
    m = report.metrics
    order = metric(m, "breakdown", "order") or list(palette.CATEGORY_COLOR)
    rows = _bar_rows(report)
    if not rows:
        return '<p class="gm-muted">No step-time breakdown: the analysis window is empty.</p>'
    longest = max(sum(parts.get(c, 0.0) or 0.0 for c in order) for _, parts in rows) or 1.0
    bars = "".join(_bar(label, parts, order, longest) for label, parts in rows)
    return (
        '<h4>Step time by category</h4>'
        f'<div class="gm-bars">{bars}</div>'
        f"{_legend_table(m, order)}"
        f"{phases_html(report)}"
        f"{critical_path_html(report)}"
        f"{idle_html(report)}"
    )


def _bar_rows(report: Report) -> list[tuple[str, dict[str, float]]]:
    m = report.metrics
    per_step = metric(m, "breakdown", "per_step_ms") or []
    names = metric(m, "steps", "names") or []
    if per_step:
        indexed = list(enumerate(per_step))
        if len(indexed) > MAX_STEP_BARS:
            half = MAX_STEP_BARS // 2
            indexed = indexed[:half] + indexed[-half:]
        return [(step_label(i, names), parts) for i, parts in indexed]
    totals = metric(m, "breakdown", "total_ms")
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


def _legend_table(m: dict[str, Any], order: list[str]) -> str:
    totals = metric(m, "breakdown", "total_ms") or {}
    fracs = metric(m, "breakdown", "frac") or {}
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
    """The median step split into data / forward / backward / optimizer / other
    (``metrics.phases``), as a bar and a table; empty when the trace has no steps."""
    med = metric(report.metrics, "phases", "median_ms")
    if not med:
        return ""
    order = metric(report.metrics, "phases", "order") or list(palette.PHASE_COLOR)
    total = sum(med.get(p) or 0.0 for p in order) or 1.0
    segs = "".join(
        f'<span class="gm-seg" style="width:{100 * (med.get(p) or 0) / total:.3f}%;background:{palette.PHASE_COLOR[p]}" '
        f'title="{escape(palette.PHASE_LABEL[p])}: {fmt_ms(med.get(p))}"></span>'
        for p in order if (med.get(p) or 0) > 0
    )
    gpu = metric(report.metrics, "phases", "gpu_median_ms") or {}
    rows = "".join(
        f'<tr><td><span class="gm-swatch" style="background:{palette.PHASE_COLOR[p]}"></span>{escape(palette.PHASE_LABEL[p])}</td>'
        f'<td class="gm-num">{fmt_ms(med.get(p))}</td><td class="gm-num">{fmt_pct((med.get(p) or 0) / total, 1)}</td>'
        + (f'<td class="gm-num">{fmt_ms(gpu.get(p))}</td>' if gpu else "") + "</tr>"
        for p in order if (med.get(p) or 0) > 0
    )
    return (
        "<h4>Step phases (host, median per step)</h4>"
        f'<div class="gm-bars"><div class="gm-bar-row"><span class="gm-bar-label">median</span>'
        f'<span class="gm-bar">{segs}</span><span class="gm-bar-total">{fmt_ms(total)}</span></div></div>'
        '<table class="gm-table gm-legend"><thead><tr><th>phase</th><th>median</th><th>share</th>'
        + ("<th>GPU time it launched</th>" if gpu else "") + f"</tr></thead><tbody>{rows}</tbody></table>"
    )


def critical_path_html(report: Report) -> str:
    """What bounds the steps: the critical path's share per kind of link, its top links and
    what the trace lacked (``metrics.critical_path``)."""
    cp = metric(report.metrics, "critical_path") or {}
    frac = cp.get("frac") or {}
    if not any(frac.values()):
        return ""
    kinds = [k for k in cp.get("kinds") or palette.PATH_COLOR if (frac.get(k) or 0) > 0]
    segs = "".join(
        f'<span class="gm-seg" style="width:{100 * frac[k]:.3f}%;background:{palette.PATH_COLOR.get(k, palette.PALE_GREY)}" '
        f'title="{escape(palette.PATH_LABEL.get(k, k))}: {fmt_pct(frac[k], 1)}"></span>' for k in kinds
    )
    rows = "".join(
        f'<tr><td><span class="gm-swatch" style="background:{palette.PATH_COLOR.get(k, palette.PALE_GREY)}"></span>'
        f'{escape(palette.PATH_LABEL.get(k, k))}</td><td class="gm-num">{fmt_ms((cp.get("ms") or {}).get(k))}</td>'
        f'<td class="gm-num">{fmt_pct(frac[k], 1)}</td></tr>' for k in kinds
    )
    links = "".join(
        f'<tr><td class="gm-kname">{escape(str(x.get("name", ""))[:120])}</td>'
        f'<td>{escape(palette.PATH_LABEL.get(x.get("kind"), str(x.get("kind"))))}</td>'
        f'<td class="gm-num">{fmt_ms(x.get("ms"))}</td></tr>' for x in cp.get("top") or []
    )
    notes = "".join(f'<p class="gm-muted">{escape(n)}</p>' for n in cp.get("notes") or [])
    b = cp.get("bound") or {}
    head = f": {escape(str(b.get('what')))}, {fmt_pct(b.get('frac'), 0)}" if b else ""
    return (
        f"<h4>What bounds the step{head}</h4>"
        '<p class="gm-muted">The critical path: the chain of host work, launches, GPU work and waits that, made '
        "faster, would make the step shorter (each moment of the step once).</p>"
        f'<div class="gm-bars"><div class="gm-bar-row"><span class="gm-bar-label">critical path</span>'
        f'<span class="gm-bar">{segs}</span><span class="gm-bar-total">{fmt_pct(1.0)}</span></div></div>'
        f'<table class="gm-table gm-legend"><thead><tr><th>link</th><th>time</th><th>share of the path</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
        + (f'<table class="gm-table"><thead><tr><th>top links</th><th>kind</th><th>time</th></tr></thead>'
           f"<tbody>{links}</tbody></table>" if links else "")
        + notes
    )


def idle_html(report: Report) -> str:
    """The GPU's idle time split by cause, as a bar and a table."""
    m = report.metrics
    if metric(m, "trace", "cpu_only"):
        return '<h4>GPU idle time</h4><p class="gm-muted">No GPU activity was recorded.</p>'
    total = metric(m, "idle", "total_ms")
    if not total:
        return '<h4>GPU idle time</h4><p class="gm-muted">The GPU was never idle inside the window.</p>'
    parts = {c: metric(m, "idle", f"{c}_ms") or 0.0 for c in IDLE_CAUSES}
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
    long_count = metric(m, "idle", "long_gap_count")
    long_line = (
        f'<p class="gm-muted">{long_count} gaps of 1 ms or more, {fmt_ms(metric(m, "idle", "long_gap_ms"))} in all.</p>'
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
