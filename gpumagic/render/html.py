"""The report as self-contained HTML: no script, no network, figures embedded as PNG data URIs.

:func:`report_html` gives the fragment used as the ``text/html`` of a notebook output (it
survives nbconvert, GitHub's notebook view, VS Code and Colab); :func:`html_document` wraps it
in a page for ``Report.save_html``. The widget reuses the section functions, so the live and
the static views say the same thing.

The CSS is scoped under ``.gpumagic-report`` so that it cannot restyle the notebook around it,
and the markup is plain headings, tables, ``<details>`` and ``<pre>``: readable even where a
sanitiser strips the ``<style>`` element (and its classes). Colours are custom properties that
follow JupyterLab's theme (light or dark) and, in a saved page, the reader's colour scheme; wide
content (code, tables) scrolls inside its own box, so nothing is cut at 360 px. In a live kernel
this report is its own output, replaced by the live widget that follows it (:func:`swap_css`).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from gpumagic.render._format import (
    MISSING,
    evidence_items,
    fmt_bytes,
    fmt_gain,
    fmt_gain_detail,
    fmt_ms,
    fmt_number,
    fmt_pct,
    fmt_span_ms,
    fmt_us,
    severity_label,
    short_kernel_name,
)
from gpumagic.render.breakdown import breakdown_html
from gpumagic.render.summary import NO_FINDINGS, header_facts, metric, title_line, top_finding

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Finding, Report, Window

#: Evidence windows listed as text under a finding (the timeline shows them all).
MAX_LISTED_WINDOWS = 5
PAGEABLE_MARK = "\u26a0\ufe0f"
FIX_FLAVOR_LABEL = {"pytorch": "PyTorch", "huggingface": "Hugging Face Trainer"}

#: Colours as custom properties: light values first (JupyterLab's ``--jp-*`` variables where they
#: exist, so a theme's own text and background win), then the dark set, applied under JupyterLab's
#: dark themes (``body[data-jp-theme-light="false"]``) and, in a saved page, under the browser's
#: ``prefers-color-scheme: dark``. Every text colour keeps a contrast of at least 4.5:1 (WCAG AA)
#: on both backgrounds it is drawn on (``tests/render/test_browser.py`` measures it).
LIGHT_VARS = (
    "--gm-fg:var(--jp-content-font-color1,#1f2328);--gm-bg:var(--jp-layout-color0,#fff);--gm-muted:#57606a;"
    "--gm-card:#f6f8fa;--gm-border:#d0d7de;--gm-link:#0969da;--gm-good:#1a7f37;--gm-bad:#cf222e;--gm-top:#fff8c5;"
    "--gm-high:#cf222e;--gm-medium:#bf8700;--gm-low:#0969da;--gm-meter:#8250df"
)
DARK_VARS = (
    "--gm-fg:var(--jp-content-font-color1,#e6edf3);--gm-bg:var(--jp-layout-color0,#0d1117);--gm-muted:#9da7b3;"
    "--gm-card:#161b22;--gm-border:#3d444d;--gm-link:#58a6ff;--gm-good:#3fb950;--gm-bad:#ff7b72;--gm-top:#2b2611;"
    "--gm-high:#f85149;--gm-medium:#d29922;--gm-low:#58a6ff;--gm-meter:#a371f7"
)

CSS = (
    ".gpumagic-report{" + LIGHT_VARS + "}"
    'body[data-jp-theme-light="false"] .gpumagic-report{' + DARK_VARS + "}"
    + """
.gpumagic-report{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
 font-size:14px;line-height:1.45;color:var(--gm-fg);background:var(--gm-bg);max-width:1340px;box-sizing:border-box;
 padding:14px 18px;border:1px solid var(--gm-border);border-radius:8px;text-align:left;overflow-wrap:break-word;min-width:0}
.gpumagic-report *{box-sizing:border-box}
.gpumagic-report.gm-plain{border:0;padding:2px 4px;max-width:none}
.gpumagic-report h2{font-size:19px;margin:0 0 10px;border:0;color:var(--gm-fg)}
.gpumagic-report h3{font-size:16px;margin:22px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--gm-border);color:var(--gm-fg)}
.gpumagic-report h4{font-size:14px;margin:14px 0 6px;color:var(--gm-fg)}
.gpumagic-report p{margin:4px 0}
.gpumagic-report a{color:var(--gm-link)}
.gpumagic-report .gm-muted{color:var(--gm-muted)}
.gpumagic-report .gm-facts{display:flex;flex-wrap:wrap;gap:10px;margin:6px 0 10px}
.gpumagic-report .gm-fact{flex:1 1 120px;min-width:0;border:1px solid var(--gm-border);border-radius:6px;padding:6px 12px;
 background:var(--gm-card)}
.gpumagic-report .gm-fact-label{font-size:12px;color:var(--gm-muted);text-transform:uppercase;letter-spacing:.04em}
.gpumagic-report .gm-fact-value{font-size:20px;font-weight:600}
.gpumagic-report .gm-top{border:1px solid var(--gm-border);border-left:6px solid var(--gm-muted);border-radius:6px;padding:8px 12px;
 background:var(--gm-top);font-size:15px}
.gpumagic-report .gm-finding.gm-sev-high,.gpumagic-report .gm-top.gm-sev-high{border-left-color:var(--gm-high)}
.gpumagic-report .gm-finding.gm-sev-medium,.gpumagic-report .gm-top.gm-sev-medium{border-left-color:var(--gm-medium)}
.gpumagic-report .gm-finding.gm-sev-low,.gpumagic-report .gm-top.gm-sev-low{border-left-color:var(--gm-low)}
.gpumagic-report details.gm-finding{border:1px solid var(--gm-border);border-left:6px solid var(--gm-muted);border-radius:6px;margin:8px 0;
 background:var(--gm-bg)}
.gpumagic-report details.gm-finding>summary{cursor:pointer;padding:8px 12px;font-weight:600;font-size:15px}
.gpumagic-report .gm-finding-body{padding:0 14px 10px 16px;min-width:0}
.gpumagic-report .gm-finding-body.gm-finding{border-left-style:solid;border-left-width:6px;padding-left:12px;margin:2px 0}
.gpumagic-report .gm-badge{display:inline-block;min-width:82px;font-weight:700}
.gpumagic-report .gm-gain{font-weight:400;color:var(--gm-muted);margin-left:6px}
.gpumagic-report .gm-label{font-weight:600}
.gpumagic-report .gm-chips{display:flex;flex-wrap:wrap;gap:6px;margin:4px 0}
.gpumagic-report .gm-chip{background:var(--gm-card);border:1px solid var(--gm-border);border-radius:12px;padding:0 9px;font-size:12.5px;
 color:var(--gm-fg)}
.gpumagic-report pre.gm-code{background:var(--gm-card);color:var(--gm-fg);border:1px solid var(--gm-border);border-radius:6px;
 padding:8px 10px;margin:4px 0 8px;overflow-x:auto;max-width:100%;font-size:12.5px;line-height:1.4;text-align:left;white-space:pre;
 overflow-wrap:normal}
.gpumagic-report code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;color:inherit;background:none}
.gpumagic-report.gpumagic-report pre.gm-code,.gpumagic-report.gpumagic-report pre.gm-code code{white-space:pre;word-break:normal;
 overflow-wrap:normal}
.gpumagic-report.gpumagic-report :not(pre)>code{background:var(--gm-card);color:inherit;padding:0 3px;border-radius:3px}
.gpumagic-report img.gm-figure{width:100%;height:auto;max-width:1300px;display:block;border:1px solid var(--gm-border);background:#fff}
.gpumagic-report .gm-scroll{overflow-x:auto;max-width:100%}
.gpumagic-report table.gm-table{border-collapse:collapse;margin:6px 0 10px;font-size:13px;width:auto;color:var(--gm-fg)}
.gpumagic-report table.gm-table th,.gpumagic-report table.gm-table td{border:1px solid var(--gm-border);padding:3px 8px;text-align:left;
 vertical-align:top;color:var(--gm-fg);background:var(--gm-bg)}
.gpumagic-report table.gm-table th{background:var(--gm-card);font-weight:600}
.gpumagic-report table.gm-table td.gm-num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
.gpumagic-report table.gm-table td code{overflow-wrap:anywhere}
.gpumagic-report .gm-bars{margin:6px 0}
.gpumagic-report .gm-bar-row{display:flex;align-items:center;gap:8px;margin:2px 0}
.gpumagic-report .gm-bar-label{flex:0 0 64px;font-size:12.5px;color:var(--gm-muted);text-align:right}
.gpumagic-report .gm-bar{flex:1 1 auto;min-width:0;display:flex;height:16px;background:var(--gm-card);border-radius:3px;overflow:hidden}
.gpumagic-report .gm-seg{display:block;height:100%}
.gpumagic-report .gm-bar-total{flex:0 0 62px;font-size:12.5px;font-variant-numeric:tabular-nums}
.gpumagic-report .gm-swatch{display:inline-block;width:11px;height:11px;margin-right:6px;border-radius:2px;vertical-align:-1px}
.gpumagic-report .gm-meter{height:14px;background:var(--gm-card);border:1px solid var(--gm-border);border-radius:3px;overflow:hidden;
 max-width:600px}
.gpumagic-report .gm-meter>span{display:block;height:100%;background:var(--gm-meter)}
.gpumagic-report ul{margin:4px 0;padding-left:22px}
.gpumagic-report details.gm-full>summary{cursor:pointer;font-weight:600;font-size:15px;padding:6px 0}
.gpumagic-report .gm-better,.gpumagic-report table.gm-table td.gm-better{color:var(--gm-good);font-weight:600}
.gpumagic-report .gm-worse,.gpumagic-report table.gm-table td.gm-worse{color:var(--gm-bad);font-weight:600}
.gpumagic-report .gm-group{font-weight:600;padding-right:10px;white-space:nowrap}
"""
).strip()
#: Dark colours for a saved page, from the reader's ``prefers-color-scheme`` (a notebook follows
#: its own theme instead, through ``data-jp-theme-light``).
DOCUMENT_CSS = (
    ":root{color-scheme:light dark}body{margin:0;padding:24px 12px;background:#f6f8fa}"
    "@media (prefers-color-scheme:dark){body{background:#010409}body .gpumagic-report{" + DARK_VARS + "}}"
)


@dataclass(frozen=True)
class Images:
    """The figures embedded in the HTML, as PNG bytes (``None`` where there is none to draw)."""

    timeline_png: bytes | None = None
    memory_png: bytes | None = None


def render_images(report: Report) -> Images:
    """Draw the overview timeline and the memory curve (both need ``report.trace``)."""
    if report.trace is None:
        return Images()
    from gpumagic.render.charts import memory_figure
    from gpumagic.render.timeline import figure_png, timeline_png

    mem = memory_figure(report)
    return Images(timeline_png=timeline_png(report), memory_png=figure_png(mem) if mem is not None else None)


def report_html(report: Report, images: Images | None = None, *, live_token: str = "") -> str:
    """The whole report as one ``<div class="gpumagic-report">`` with its scoped style.

    ``live_token`` names the live widget output that follows this one in the notebook (see
    :func:`swap_css`); without it the static report stands alone.
    """
    images = render_images(report) if images is None else images
    sections = [
        header_html(report),
        _section("Checklist \u2014 what to change, biggest gain first", checklist_html(report), "checklist"),
        _section("Timeline", timeline_html(report, images.timeline_png), "timeline"),
        _section("Breakdown", breakdown_html(report), "breakdown"),
        _section("Kernels and copies", kernels_html(report), "kernels"),
        _section("Memory", memory_html(report, images.memory_png), "memory"),
        _section("Notes", notes_html(report), "notes"),
    ]
    return wrap("".join(sections), static=True, live_token=live_token)


def html_document(report: Report, images: Images | None = None) -> str:
    """A complete, self-contained HTML page of the report (for ``Report.save_html``)."""
    return document(title_line(report), report_html(report, images))


def document(title: str, body: str) -> str:
    """A self-contained page around a fragment, following the reader's light or dark scheme."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{DOCUMENT_CSS}</style>\n</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )


def render_html(report: Report) -> str:
    """The complete self-contained page (what ``Report.to_html`` returns)."""
    return html_document(report)


def wrap(inner: str, *, static: bool = False, style: bool = True, framed: bool = True, live_token: str = "") -> str:
    """Put HTML inside the scoped container (``static`` marks the non-widget render; an unframed
    container has no border, for the widget's tab panels; ``live_token``: see :func:`swap_css`)."""
    cls = "gpumagic-report" + (" gpumagic-static" if static else "") + ("" if framed else " gm-plain")
    if live_token:
        cls += f" gm-static-{live_token}"
    css = f"<style>{CSS}{swap_css(live_token)}</style>" if style else ""
    return f'<div class="{cls}">{css}{inner}</div>'


#: Output-area classes of the frontends whose DOM the swap rules know: JupyterLab, Notebook 7 and
#: nbconvert's ``lab`` template (``jp-OutputArea-child``), classic Notebook and nbconvert's
#: ``classic`` template (``output_area``).
OUTPUT_CHILD_CLASSES = ("jp-OutputArea-child", "output_area")


def swap_css(token: str) -> str:
    """CSS that lets the live widget *replace* the static report, and never leaves a hole.

    A report with a live view is displayed as two outputs in a row: this static report (class
    ``gm-static-TOKEN``), then the widget view, whose root carries ``gm-live-TOKEN`` once it has
    rendered. Two rules, using CSS ``:has()`` (Chromium 105, Safari 15.4, Firefox 121):

    1. the widget's output is hidden while it holds no rendered view: "Loading widget...",
       and "Error displaying widget: model not found" after the kernel is gone, never show;
    2. the static report is hidden once the rendered view sits in the next output.

    Where the rules do not apply (a browser without ``:has()``, a frontend with another DOM,
    a sanitiser that drops ``<style>``), the static report stays visible: the failure mode is
    "static report plus a widget line", never "no report".
    """
    if not token:
        return ""
    rules = []
    for child in OUTPUT_CHILD_CLASSES:
        static, live = f".{child}:has(.gm-static-{token})", f".gm-live-{token}"
        rules.append(f"{static}+.{child}:not(:has({live})){{display:none}}")
        rules.append(f"{static}:has(+.{child} {live}){{display:none}}")
    return "".join(rules)


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
            f"{escape(fmt_gain(top.est_gain, top.gain_method))}</div>"
        )
    return f"<header><h2>{escape(title_line(report))}</h2><div class=\"gm-facts\">{tiles}</div>{callout}</header>"


# -- checklist ------------------------------------------------------------------------------------


def checklist_html(report: Report) -> str:
    """One ``<details>`` per finding (the first one open), in the report's order."""
    if not report.findings:
        return f'<p class="gm-muted">{escape(NO_FINDINGS)}</p>'
    origin = timeline_origin_ns(report)
    return "".join(
        f'<details class="gm-finding gm-sev-{escape(f.severity)}"{" open" if i == 0 else ""}>'
        f"<summary>{finding_summary_html(f)}</summary>"
        f'<div class="gm-finding-body">{finding_body_html(f, origin)}</div></details>'
        for i, f in enumerate(report.findings)
    )


def timeline_origin_ns(report: Report) -> int:
    """Where the timeline's x axis puts zero: the start of the analysis window."""
    return int(metric(report.metrics, "window", "start_ns") or 0)


def finding_summary_html(f: Finding) -> str:
    return (
        f'<span class="gm-badge">{escape(severity_label(f.severity))}</span> {escape(f.title)}'
        f'<span class="gm-gain">\u2014 {escape(fmt_gain(f.est_gain, f.gain_method))}</span>'
    )


def finding_body_html(f: Finding, origin_ns: int = 0) -> str:
    """Evidence (summary, numbers, windows), why, estimated gain, fixes as code, and a link."""
    chips = "".join(
        f'<span class="gm-chip">{escape(label)}: <b>{escape(value)}</b></span>' for label, value in evidence_items(f.evidence.numbers)
    )
    parts = [
        f'<p><span class="gm-label">Evidence:</span> {escape(f.evidence.summary)}</p>',
        f'<div class="gm-chips">{chips}</div>' if chips else "",
        _windows_html(f, origin_ns),
        f'<p><span class="gm-label">Why it matters:</span> {escape(f.why)}</p>',
        f'<p><span class="gm-label">Estimated gain:</span> {escape(fmt_gain_detail(f.est_gain, f.gain_method)[0])}'
        f' <span class="gm-muted">({escape(f.gain_method)})</span></p>',
        "".join(_fix_html(fix) for fix in f.fixes),
        _doc_link(f.doc_url),
    ]
    return "".join(parts)


def _windows_html(f: Finding, origin_ns: int) -> str:
    text = windows_text(f, origin_ns)
    return f'<p class="gm-muted">Where on the timeline: {escape(text)}</p>' if text else ""


def windows_text(f: Finding, origin_ns: int = 0) -> str:
    """The first evidence windows as text, e.g. ``'120.3–131.0 ms (GPU0: gap) and 4 more'``."""
    windows = f.evidence.windows
    items = ", ".join(window_text(w, origin_ns) for w in windows[:MAX_LISTED_WINDOWS])
    more = f" and {len(windows) - MAX_LISTED_WINDOWS} more" if len(windows) > MAX_LISTED_WINDOWS else ""
    return items + more


def window_text(w: Window, origin_ns: int = 0) -> str:
    """``'120.3–131.0 ms (GPU0: gap)'``: a window in ms from ``origin_ns``."""
    where = {"gpu": f"GPU{w.device}" if w.device >= 0 else "GPU", "cpu": "main thread"}.get(w.lane, "")
    tag = ": ".join(x for x in (where, w.label) if x)
    span = fmt_span_ms((w.start_ns - origin_ns) / 1e6, (w.end_ns - origin_ns) / 1e6)
    return span + (f" ({tag})" if tag else "")


def _fix_html(fix) -> str:
    flavor = FIX_FLAVOR_LABEL.get(fix.flavor, fix.flavor)
    return (
        f'<p><span class="gm-label">Fix ({escape(flavor)}):</span> {escape(fix.description)}</p>'
        f'<pre class="gm-code"><code>{escape(fix.code)}</code></pre>'
    )


def _doc_link(url: str) -> str:
    if not url.startswith(("https://", "http://")):
        return ""
    return f'<p><a href="{escape(url, quote=True)}" target="_blank" rel="noopener">Read more</a></p>'


# -- timeline -------------------------------------------------------------------------------------


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def timeline_html(report: Report, png: bytes | None) -> str:
    if png is None:
        return '<p class="gm-muted">No timeline: this report holds no trace (it was rebuilt from JSON).</p>'
    return f'<img class="gm-figure gm-timeline" alt="{escape(TIMELINE_ALT)}" src="{png_data_uri(png)}">' + timeline_caption()


#: The timeline image's text alternative (static page and widget alike).
TIMELINE_ALT = ("Timeline of the recorded steps: a lane per host thread and per GPU stream, step boundaries as "
                "dashed lines, GPU idle gaps shaded by cause")


def timeline_caption() -> str:
    """How to read the timeline; the colours are named by the legend above the figure, which
    lists only what this trace holds."""
    return (
        '<p class="gm-muted">Lanes from the top: the main thread, other host threads and DataLoader workers, then one '
        "lane per GPU stream; colours as in the legend above the figure. Darker means busier: events closer than a "
        "pixel are merged. Shaded columns: GPU idle gaps, by cause. Dashed lines: step boundaries. A highlighted "
        "finding is outlined and hatched.</p>"
    )


# -- kernels and copies ---------------------------------------------------------------------------


def kernels_html(report: Report) -> str:
    m = report.metrics
    count = metric(m, "kernels", "count")
    if not count:
        return '<p class="gm-muted">No GPU kernels were recorded.</p>' + copies_html(report)
    total = metric(m, "kernels", "total_ms") or 0.0
    line = (
        f"<p>{fmt_number(count)} kernels, {fmt_ms(total)} in all; median {fmt_us(metric(m, 'kernels', 'median_us'))}; "
        f"{fmt_pct(metric(m, 'kernels', 'short_frac'))} run under 10 \u00b5s. Tensor cores ran "
        f"{fmt_ms(metric(m, 'kernels', 'matmul_tensor_core_ms'))} of {fmt_ms(metric(m, 'kernels', 'matmul_ms'))} "
        "of matmul/convolution time.</p>"
    )
    rows = "".join(
        f"<tr><td class=\"gm-num\">{i}</td><td title=\"{escape(k['name'])}\"><code>{escape(short_kernel_name(k['name']))}</code></td>"
        f"<td class=\"gm-num\">{fmt_number(k.get('count'))}</td><td class=\"gm-num\">{fmt_ms(k.get('total_ms'))}</td>"
        f"<td class=\"gm-num\">{fmt_pct((k.get('total_ms') or 0) / total if total else None, 1)}</td>"
        f"<td class=\"gm-num\">{fmt_us(k.get('mean_us'))}</td><td>{_yes_no(k.get('tensor_core'))}</td></tr>"
        for i, k in enumerate(metric(m, "kernels", "top") or [], 1)
    )
    table = (
        '<h4>Top kernels by total time</h4><div class="gm-scroll"><table class="gm-table"><thead><tr><th>#</th><th>kernel</th><th>count</th>'
        "<th>total</th><th>share</th><th>mean</th><th>tensor cores</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )
    return line + table + copies_html(report)


def _yes_no(flag: object) -> str:
    return MISSING if flag is None else ("yes" if flag else "no")


def copies_html(report: Report) -> str:
    groups = metric(report.metrics, "copies", "groups") or []
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


def _copy_row(g: dict) -> str:
    memory = escape(str(g.get("memory")))
    if g.get("memory") == "pageable":
        memory += " " + PAGEABLE_MARK
    gbps = g.get("gbps")
    return (
        f"<tr><td>{escape(str(g.get('direction')))}</td><td>{memory}</td>"
        f'<td class="gm-num">{fmt_number(g.get("count"))}</td><td class="gm-num">{fmt_bytes(g.get("bytes"))}</td>'
        f'<td class="gm-num">{fmt_ms(g.get("ms"))}</td>'
        f'<td class="gm-num">{MISSING if gbps is None else f"{gbps:.1f}"}</td></tr>'
    )


# -- memory and notes -----------------------------------------------------------------------------


def memory_html(report: Report, png: bytes | None) -> str:
    m = report.metrics
    cap = metric(m, "memory", "capacity_bytes")
    peak = metric(m, "memory", "peak_reserved_bytes") or metric(m, "memory", "peak_allocated_bytes")
    peak = peak or metric(m, "memory", "nvml_peak_used_bytes")
    frac = metric(m, "memory", "peak_frac")
    lines = []
    if peak is None:
        lines.append(
            '<p class="gm-muted">GPU memory was not recorded: the trace has no allocator records '
            "(profile_memory was off) and no NVML samples.</p>"
        )
    if not metric(m, "memory", "peak_allocated_bytes"):
        lines.append(MEMORY_HINT)
    else:
        nvml = metric(m, "memory", "nvml_peak_used_bytes")
        nvml_text = f", NVML peak used {fmt_bytes(nvml)}" if nvml else ""
        lines.append(
            f"<p>Peak allocated {fmt_bytes(metric(m, 'memory', 'peak_allocated_bytes'))}, "
            f"peak reserved {fmt_bytes(metric(m, 'memory', 'peak_reserved_bytes'))}{nvml_text}"
            f" \u2014 capacity {fmt_bytes(cap)} (peak is {fmt_pct(frac)} of it; "
            f"source: {escape(str(metric(m, 'memory', 'source')))}).</p>"
        )
        if frac is not None:
            lines.append(f'<div class="gm-meter" title="peak / capacity"><span style="width:{min(frac, 1) * 100:.1f}%"></span></div>')
    if png is not None:
        lines.append(f'<img class="gm-figure gm-memory" alt="GPU memory over time" src="{png_data_uri(png)}">')
    return "".join(lines)


#: How to get allocator data when a report has none.
MEMORY_HINT = (
    '<p class="gm-muted">For allocations over time, profile with <code>%%gpuprofile --memory</code> '
    "(<code>gpumagic.profile(memory=True)</code>, or <code>profile_memory=True</code> in torch.profiler); "
    "it adds overhead, so it is off by default.</p>"
)


def notes_html(report: Report) -> str:
    t = metric(report.metrics, "trace") or {}
    devices = ", ".join(f"GPU{d.get('id')} {d.get('name', '')}".strip() for d in t.get("devices") or []) or "none described"
    facts = (
        f"<p class=\"gm-muted\">Source: {escape(str(t.get('source') or MISSING))} \u00b7 {fmt_number(t.get('events'))} events"
        f" \u00b7 devices: {escape(devices)}</p>"
    )
    if not report.notes:
        return "<p>Nothing to note: the capture was complete and the trace well formed.</p>" + facts
    items = "".join(f"<li>{escape(n)}</li>" for n in report.notes)
    return f"<ul>{items}</ul>{facts}"
