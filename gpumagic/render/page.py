"""The HTML page kit every view shares: the scoped CSS, the container, the page, embedded PNGs.

The report (:mod:`gpumagic.render.html`), the widget, comparisons, job reports, the tuner and the
run history all put their HTML inside :func:`wrap` and save it with :func:`document`.

The CSS is scoped under ``.gpumagic-report`` so that it cannot restyle the notebook around it,
and the markup is plain headings, tables, ``<details>`` and ``<pre>``: readable even where a
sanitiser strips the ``<style>`` element (and its classes). Colours are custom properties that
follow JupyterLab's theme (light or dark) and, in a saved page, the reader's colour scheme; wide
content (code, tables) scrolls inside its own box, so nothing is cut at 360 px. In a live kernel
a static report is its own output, replaced by the live widget that follows it (:func:`swap_css`).
"""

from __future__ import annotations

import base64
from html import escape

from gpumagic.render.chart_css import SVG_DARK_VARS, SVG_LIGHT_VARS, svg_css

#: Colours as custom properties: light values first (JupyterLab's ``--jp-*`` variables where they
#: exist, so a theme's own text and background win), then the dark set, applied under JupyterLab's
#: dark themes (``body[data-jp-theme-light="false"]``) and, in a saved page, under the browser's
#: ``prefers-color-scheme: dark``. Every text colour keeps a contrast of at least 4.5:1 (WCAG AA)
#: on both backgrounds it is drawn on (``tests/render/test_browser.py`` measures it).
LIGHT_VARS = (
    "--gm-fg:var(--jp-content-font-color1,#1f2328);--gm-bg:var(--jp-layout-color0,#fff);--gm-muted:#57606a;"
    "--gm-card:#f6f8fa;--gm-border:#d0d7de;--gm-link:#0969da;--gm-good:#1a7f37;--gm-bad:#cf222e;--gm-top:#fff8c5;"
    "--gm-high:#cf222e;--gm-medium:#bf8700;--gm-low:#0969da;--gm-meter:#8250df;" + SVG_LIGHT_VARS
)
DARK_VARS = (
    "--gm-fg:var(--jp-content-font-color1,#e6edf3);--gm-bg:var(--jp-layout-color0,#0d1117);--gm-muted:#9da7b3;"
    "--gm-card:#161b22;--gm-border:#3d444d;--gm-link:#58a6ff;--gm-good:#3fb950;--gm-bad:#ff7b72;--gm-top:#2b2611;"
    "--gm-high:#f85149;--gm-medium:#d29922;--gm-low:#58a6ff;--gm-meter:#a371f7;" + SVG_DARK_VARS
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
.gpumagic-report .gm-fact{flex:1 1 120px;min-width:min-content;max-width:100%;border:1px solid var(--gm-border);border-radius:6px;
 padding:6px 12px;
 background:var(--gm-card)}
.gpumagic-report .gm-fact-label{font-size:12px;color:var(--gm-muted);text-transform:uppercase;letter-spacing:.04em}
.gpumagic-report .gm-fact-value{font-size:20px;font-weight:600;overflow-wrap:normal;word-break:normal}
.gpumagic-report .gm-tl-title{font-weight:600;margin:2px 0 0}
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
.gpumagic-report table.gm-table td.gm-kname{min-width:14em}
.gpumagic-report table.gm-table td.gm-sub{padding-left:2.2em;color:var(--gm-muted)}
.gpumagic-report table.gm-table td.gm-kname code{overflow-wrap:normal;word-break:normal}
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
.gpumagic-report .gm-windows a.gm-win{display:inline-block;max-width:100%;margin:0 12px 2px 0}
.gpumagic-report details.gm-more>summary{cursor:pointer;color:var(--gm-link);font-size:13px;margin:2px 0}
.gpumagic-report .gm-more-findings{color:var(--gm-muted);font-size:13px;margin:2px 0 8px 4px}
.gpumagic-report pre.gm-code.gm-diagnostic{border-style:dashed}
.gpumagic-report .gm-tl-fallback{display:none}
"""
    + svg_css()
).strip()
#: Dark colours for a saved page, from the reader's ``prefers-color-scheme`` (a notebook follows
#: its own theme instead, through ``data-jp-theme-light``).
DOCUMENT_CSS = (
    ":root{color-scheme:light dark}body{margin:0;padding:24px 12px;background:#f6f8fa}"
    "@media (prefers-color-scheme:dark){body{background:#010409}body .gpumagic-report{" + DARK_VARS + "}}"
)


def document(title: str, body: str) -> str:
    """A self-contained page around a fragment, following the reader's light or dark scheme."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{DOCUMENT_CSS}</style>\n</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )


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


def chart_block(svg: str, alt: str, kind: str = "chart") -> str:
    """An SVG chart in its width container (lets CSS thin out labels in a narrow output), and a
    text alternative that the page's CSS hides: where a sanitiser drops ``<svg>`` (and with it
    ``<style>`` and classes, as GitHub's notebook view does), the text is what remains."""
    return (f'<div class="gm-tl-wrap">{svg}</div>'
            f'<p class="gm-tl-fallback">[{escape(kind)}: {escape(alt)}; open the notebook in Jupyter or the '
            "exported HTML to see it]</p>")


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
