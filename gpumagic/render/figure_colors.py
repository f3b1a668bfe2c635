"""One theme for the small matplotlib figures (run history, DataLoader tuning, memory): drawn
with the palette's light colours, then recoloured for the theme asked for.

:func:`apply_theme` walks a finished figure: background, axes, ticks, titles and labels take the
theme's text colours (a WCAG contrast of at least 4.5:1 on its background, see
:class:`gpumagic.render.palette.FigureTheme`), and lines, markers, bars and areas drawn in a
palette colour take that colour's tint for the theme (:data:`palette.DARK_TINT`), so that a series
keeps its hue and still stands out. Axis labels are drawn in the text colour, not their series'
colour (an orange label on white is under 4.5:1); the legend says which line is which. The
timeline figure themes itself as it draws (:mod:`gpumagic.render.timeline`).
"""

from __future__ import annotations

from typing import Any

from gpumagic.render import palette


def apply_theme(fig: Any, theme: str) -> Any:
    """``fig`` recoloured for ``theme`` (``'light'`` or ``'dark'``; ValueError otherwise), in place; returns it."""
    from matplotlib.colors import to_hex

    th = palette.figure_theme(theme)

    def tint(color: Any) -> str:
        return th.color(to_hex(color).upper())

    fig.set_facecolor(th.background)
    for ax in fig.axes:
        ax.set_facecolor(th.background)
        for spine in ax.spines.values():
            spine.set_color(th.line)
        ax.tick_params(colors=th.line, labelcolor=th.text)
        for text in (ax.title, ax.xaxis.label, ax.yaxis.label):
            text.set_color(th.text)
        for text in ax.texts:
            text.set_color(th.muted)
        for line in ax.lines:
            line.set_color(tint(line.get_color()))
            line.set_markerfacecolor(tint(line.get_markerfacecolor()))
            line.set_markeredgecolor(tint(line.get_markeredgecolor()))
        for patch in ax.patches:
            patch.set_facecolor(tint(patch.get_facecolor()))
        for collection in ax.collections:
            faces = collection.get_facecolor()
            if len(faces):
                collection.set_facecolor([tint(c) for c in faces])
        legend = ax.get_legend()
        if legend is not None:
            legend.get_frame().set_facecolor(th.background)
            for text in legend.get_texts():
                text.set_color(th.text)
            for handle in getattr(legend, "legend_handles", []):
                if hasattr(handle, "get_color"):
                    handle.set_color(tint(handle.get_color()))
    return fig
