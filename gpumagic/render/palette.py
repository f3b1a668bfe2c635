"""Colours shared by the timeline, the breakdown bars and the HTML legend.

Based on the Okabe-Ito palette (Okabe & Ito, "Color Universal Design", 2008), which stays
distinguishable with the common colour-vision deficiencies. Colour is never the only cue:
every coloured thing also carries a label or a legend entry with text. One colour, one meaning:
the timeline, the idle bar and the step bars use the same colour for the same category, and no
two categories share one.
"""

from __future__ import annotations

BLUE = "#0072B2"
SKY = "#56B4E9"
GREEN = "#009E73"
ORANGE = "#E69F00"
VERMILLION = "#D55E00"
PURPLE = "#CC79A7"
YELLOW = "#F0E442"
GREY = "#8C8C8C"
DARK_GREY = "#4D4D4D"
LIGHT_GREY = "#C8C8C8"
PALE_GREY = "#E4E4E4"
#: Two more hues for the GPU idle causes, so that no colour means two things (Paul Tol's "muted"
#: scheme, also colour-blind safe: https://personal.sron.nl/~pault/).
WINE = "#882255"
TEAL = "#44AA99"

#: Timeline layers and breakdown categories (docs/metrics.md ``breakdown.order``).
CATEGORY_COLOR = {
    "kernel": BLUE,
    "memcpy": GREEN,
    "memset": SKY,
    "communication": PURPLE,
    "runtime": DARK_GREY,
    "dataloader": ORANGE,
    "cpu_exec": GREY,
    "other": PALE_GREY,
}

CATEGORY_LABEL = {
    "kernel": "GPU kernels",
    "memcpy": "memory copies",
    "memset": "memsets",
    "communication": "communication (NCCL)",
    "runtime": "CUDA runtime calls",
    "dataloader": "data-loader wait",
    "cpu_exec": "CPU ops",
    "other": "other",
}

#: GPU idle gaps by cause (docs/metrics.md ``idle.gaps[].cause``).
#: Colours used nowhere else (orange is the data-loader wait, vermillion a host sync, grey CPU ops).
#: Step phases (``metrics.phases``), in loop order.
#: Paul Tol's muted scheme (indigo, sand, olive, and cyan for an evaluation loop) beside the
#: data-loader orange, so that no phase shares a colour with a lane's kernels, copies or memsets
#: on the timeline.
PHASE_COLOR = {"data": ORANGE, "forward": "#332288", "backward": "#DDCC77", "optimizer": "#999933",
               "evaluation": "#88CCEE", "other": PALE_GREY}
PHASE_LABEL = {"data": "data (waiting for the batch)", "forward": "forward", "backward": "backward",
               "optimizer": "optimizer", "evaluation": "evaluation loop", "other": "other host work"}

#: Critical-path link kinds (``metrics.critical_path``).
PATH_COLOR = {"gpu_compute": BLUE, "gpu_comm": PURPLE, "gpu_copy": GREEN, "host_launch": DARK_GREY,
              "host_compute": GREY, "data": ORANGE, "sync_wait": VERMILLION, "other": PALE_GREY}
PATH_LABEL = {"gpu_compute": "GPU compute", "gpu_comm": "GPU communication", "gpu_copy": "GPU copies and memsets",
              "host_launch": "host: launches and runtime calls", "host_compute": "host: operators and Python",
              "data": "data loading", "sync_wait": "host waiting on the GPU", "other": "GPU waits not explained"}

IDLE_COLOR = {"host_wait": WINE, "launch_latency": TEAL, "other": LIGHT_GREY}
IDLE_LABEL = {
    "host_wait": "GPU idle: waiting for the host",
    "launch_latency": "GPU idle: launch latency",
    "other": "GPU idle: other",
}

HOST_SYNC = VERMILLION
#: A highlighted finding: a black outline and hatching with no fill, visible over any colour.
HIGHLIGHT = YELLOW
HIGHLIGHT_EDGE = "#000000"
HIGHLIGHT_HATCH = "////"

# -- themes ---------------------------------------------------------------------------------------

#: The same hues as lighter tints for a dark background (the SVG charts' dark set in
#: chart_css.py and the matplotlib figure's ``theme="dark"``), so that a bar stands out on it.
DARK_TINT = {
    BLUE: "#3d9be0", PURPLE: "#e08fc0", GREEN: "#2fc79a", SKY: "#8fd0f5", GREY: "#a6a6a6", ORANGE: "#f0b020",
    VERMILLION: "#ff7a33", "#332288": "#8877dd", "#DDCC77": "#e6d88f", "#999933": "#c2c257", "#88CCEE": "#a8dcf2", LIGHT_GREY: "#6e7681",
    PALE_GREY: "#6e7681", WINE: "#d45a93", TEAL: "#5cc4b3", DARK_GREY: "#8b949e",
}


class FigureTheme:
    """A matplotlib figure's colours on one background: ``text`` and ``muted`` (secondary text:
    step labels, axis labels) keep a WCAG contrast of at least 4.5:1 on ``background``
    (:func:`contrast`); ``line`` draws axes and step marks, ``grid`` the sampled panels' grid,
    ``edge`` a highlighted window's outline; :meth:`color` maps a palette colour to its tint."""

    def __init__(self, name: str, background: str, text: str, muted: str, line: str, grid: str, edge: str,
                 tints: dict[str, str]) -> None:
        self.name, self.background, self.text, self.muted = name, background, text, muted
        self.line, self.grid, self.edge, self._tints = line, grid, edge, tints

    def color(self, c: str) -> str:
        """``c`` (a palette colour) as drawn on this theme's background."""
        return self._tints.get(c, self._tints.get(c.upper(), c))


#: The page's light and dark text and background colours (gpumagic/render/page.py's defaults).
FIGURE_THEMES = {
    "light": FigureTheme("light", "#ffffff", "#1f2328", "#57606a", "#57606a", "#d0d7de", HIGHLIGHT_EDGE, {}),
    "dark": FigureTheme("dark", "#0d1117", "#e6edf3", "#9da7b3", "#9da7b3", "#3d444d", "#ffffff", DARK_TINT),
}


def figure_theme(theme: str) -> FigureTheme:
    """The :class:`FigureTheme` named ``theme`` (``'light'`` or ``'dark'``); ValueError otherwise."""
    try:
        return FIGURE_THEMES[theme]
    except (KeyError, TypeError):
        raise ValueError(f"theme must be 'light' or 'dark', not {theme!r}") from None


def contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two ``#rrggbb`` colours (https://www.w3.org/TR/WCAG21/#dfn-contrast-ratio)."""

    def luminance(c: str) -> float:
        rgb = [int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
