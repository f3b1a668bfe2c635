"""The CSS of the SVG charts (the timeline, the memory curve): classes and per-theme colours.

Kept apart from the drawing code so that :mod:`gpumagic.render.page` can put it in every page's
style without importing numpy. Colours are custom properties: :data:`SVG_LIGHT_VARS` by default,
:data:`SVG_DARK_VARS` under JupyterLab's dark theme and a saved page's ``prefers-color-scheme:
dark`` (page.py applies them with the rest of the page's colours).
"""

from __future__ import annotations

from gpumagic.render import palette

#: Chart widths (px) at which the timeline's step and tick labels appear or give way: a label
#: drawn with class ``gm-wN`` is hidden in a chart narrower than N px, one with ``gm-nN`` (a
#: shortened lane label) from N px on (:func:`gpumagic.render.timeline_svg.place_labels` picks N).
LABEL_BREAKPOINTS = (200, 240, 280, 320, 360, 420, 480, 560, 640, 720, 820, 940, 1080, 1240, 1400)


def svg_css() -> str:
    """The charts' CSS: ``gm-f-X`` fills, ``gm-l-X`` lines and ``gm-t-X`` key marks of category ``X``."""
    fills = {
        "k": "--gm-c-kernel", "n": "--gm-c-comm", "c": "--gm-c-copy", "s": "--gm-c-memset", "o": "--gm-c-cpu",
        "d": "--gm-c-loader", "y": "--gm-c-sync", "pd": "--gm-c-loader", "pf": "--gm-c-fwd", "pb": "--gm-c-bwd",
        "po": "--gm-c-opt", "pe": "--gm-c-eval", "px": "--gm-c-other", "iw": "--gm-c-idlewait", "il": "--gm-c-idlelaunch", "io": "--gm-c-other",
        "m": "--gm-c-mem", "cap": "--gm-c-cap",
        # memory by category (gpumagic.render.memory_categories)
        "mp": "--gm-c-mparam", "mo": "--gm-c-mopt", "mg": "--gm-c-mgrad", "ma": "--gm-c-mact", "mt": "--gm-c-mtemp",
        "mi": "--gm-c-minput", "md": "--gm-c-mautograd", "mu": "--gm-c-other",
    }
    rules = "".join(f".gpumagic-report .gm-f-{k}{{fill:var({v})}}.gpumagic-report .gm-l-{k}{{stroke:var({v})}}"
                    f".gpumagic-report .gm-t-{k}{{fill:var({v})}}" for k, v in fills.items())
    return (
        ".gpumagic-report .gm-tl-wrap{container-type:inline-size;width:100%;max-width:1400px;margin:4px 0}"
        ".gpumagic-report svg.gm-tl{display:block;overflow:visible;font-family:inherit}"
        ".gpumagic-report svg.gm-tl text{font-size:12px;fill:var(--gm-fg)}"
        ".gpumagic-report svg.gm-tl .gm-tl-steplabel,.gpumagic-report svg.gm-tl .gm-tl-axislabel{fill:var(--gm-muted)}"
        ".gpumagic-report svg.gm-tl .gm-tl-step{stroke:var(--gm-muted);stroke-dasharray:4 3;vector-effect:non-scaling-stroke}"
        ".gpumagic-report svg.gm-tl .gm-tl-axis,.gpumagic-report svg.gm-tl .gm-tl-tick{stroke:var(--gm-muted)}"
        ".gpumagic-report svg.gm-tl .gm-tl-grid{stroke:var(--gm-border);vector-effect:non-scaling-stroke}"
        ".gpumagic-report svg.gm-tl polyline{fill:none;stroke-width:1.6;vector-effect:non-scaling-stroke}"
        ".gpumagic-report svg.gm-tl .gm-idle{fill-opacity:.28}"
        ".gpumagic-report svg.gm-tl .gm-dashed{stroke-dasharray:6 4}"
        ".gpumagic-report svg.gm-chart line.gm-dashed{stroke-width:1.4;vector-effect:non-scaling-stroke}"
        ".gpumagic-report svg.gm-tl .gm-hit{fill:transparent}"
        ".gpumagic-report svg.gm-tl .gm-hit:hover{stroke:var(--gm-fg);vector-effect:non-scaling-stroke}"
        ".gpumagic-report .gm-hl{fill:var(--gm-hl-fill);stroke:var(--gm-fg);stroke-width:2;"
        "vector-effect:non-scaling-stroke;opacity:0}"
        ".gpumagic-report .gm-hl.gm-hl-on,.gpumagic-report svg.gm-tl .gm-hl:target{opacity:1}"
        # a window band never hides the bars under it from the pointer (their hover names the event);
        # a shown band answers on its outline with the finding's window
        ".gpumagic-report svg.gm-tl .gm-hl{pointer-events:none}"
        ".gpumagic-report svg.gm-tl .gm-hl.gm-hl-on,.gpumagic-report svg.gm-tl .gm-hl:target{pointer-events:stroke}"
        ".gpumagic-report svg.gm-tl .gm-hl:target{stroke-width:3}"
        ".gpumagic-report ul.gm-tl-legend{list-style:none;display:flex;flex-wrap:wrap;gap:2px 16px;padding:0;margin:6px 0;"
        "font-size:13px}"
        ".gpumagic-report ul.gm-tl-legend li{display:flex;align-items:center;gap:6px}"
        ".gpumagic-report ul.gm-tl-legend svg{display:inline-block;flex:0 0 auto}"
        # stacked areas: the band edges in the text colour, every other band striped in the background's,
        # direct labels haloed in the background colour so they read over any fill
        ".gpumagic-report svg.gm-tl .gm-stack-edge{stroke:var(--gm-fg);stroke-width:1}"
        ".gpumagic-report svg.gm-tl .gm-stripe{fill:var(--gm-bg);fill-opacity:.55}"
        ".gpumagic-report svg.gm-tl .gm-stack-key{stroke:var(--gm-fg);stroke-width:1}"
        ".gpumagic-report svg.gm-tl text.gm-stack-label{paint-order:stroke;stroke:var(--gm-bg);stroke-width:3px;"
        "stroke-linejoin:round}"
        "@container (max-width:620px){.gpumagic-report svg.gm-tl .gm-odd{display:none}}"
        + "".join(f"@container (max-width:{bp - 0.02:.2f}px){{.gpumagic-report svg.gm-tl .gm-w{bp}{{display:none}}}}"
                  f"@container (min-width:{bp}px){{.gpumagic-report svg.gm-tl .gm-n{bp}{{display:none}}}}"
                  for bp in LABEL_BREAKPOINTS)
        + rules
    )


#: The chart's colours, light and dark: Okabe-Ito (and Paul Tol's muted hues) on light, lighter
#: tints of the same hues on dark, so that a bar stands out from either background.
SVG_LIGHT_VARS = (
    f"--gm-c-kernel:{palette.BLUE};--gm-c-comm:{palette.PURPLE};--gm-c-copy:{palette.GREEN};--gm-c-memset:{palette.SKY};"
    f"--gm-c-cpu:{palette.GREY};--gm-c-loader:{palette.ORANGE};--gm-c-sync:{palette.VERMILLION};--gm-c-fwd:#332288;"
    f"--gm-c-bwd:#DDCC77;--gm-c-opt:#999933;--gm-c-eval:#88CCEE;--gm-c-other:{palette.LIGHT_GREY};--gm-c-idlewait:{palette.WINE};"
    f"--gm-c-idlelaunch:{palette.TEAL};--gm-c-mem:{palette.PURPLE};--gm-c-cap:{palette.VERMILLION};--gm-hl-fill:rgba(240,228,66,.35);"
    f"--gm-c-mparam:{palette.GREEN};--gm-c-mopt:{palette.ORANGE};--gm-c-mgrad:{palette.BLUE};--gm-c-mact:{palette.VERMILLION};"
    f"--gm-c-mtemp:{palette.PURPLE};--gm-c-minput:{palette.DARK_GREY};--gm-c-mautograd:{palette.SKY}"
)
_T = palette.DARK_TINT
SVG_DARK_VARS = (
    f"--gm-c-kernel:{_T[palette.BLUE]};--gm-c-comm:{_T[palette.PURPLE]};--gm-c-copy:{_T[palette.GREEN]};"
    f"--gm-c-memset:{_T[palette.SKY]};--gm-c-cpu:{_T[palette.GREY]};"
    f"--gm-c-loader:{_T[palette.ORANGE]};--gm-c-sync:{_T[palette.VERMILLION]};--gm-c-fwd:{_T['#332288']};"
    f"--gm-c-bwd:{_T['#DDCC77']};--gm-c-opt:{_T['#999933']};--gm-c-eval:{_T['#88CCEE']};"
    f"--gm-c-other:{_T[palette.LIGHT_GREY]};--gm-c-idlewait:{_T[palette.WINE]};--gm-c-idlelaunch:{_T[palette.TEAL]};"
    f"--gm-c-mem:{_T[palette.PURPLE]};--gm-c-cap:{_T[palette.VERMILLION]};"
    "--gm-hl-fill:rgba(240,228,66,.28);"
    f"--gm-c-mparam:{_T[palette.GREEN]};--gm-c-mopt:{_T[palette.ORANGE]};--gm-c-mgrad:{_T[palette.BLUE]};"
    f"--gm-c-mact:{_T[palette.VERMILLION]};--gm-c-mtemp:{_T[palette.PURPLE]};"
    f"--gm-c-minput:{_T[palette.GREY]};--gm-c-mautograd:{_T[palette.SKY]}"
)
