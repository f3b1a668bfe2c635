"""Attach the views to the data objects below (see :mod:`gpumagic.report.views`).

Importing this module registers, for each kind of object, the renderers its methods name
(:data:`VIEWS`): every kind has ``text``, ``html`` (a whole page) and ``fragment`` (the HTML of a
notebook output, :class:`~gpumagic.report.views.Viewable`); the report also ``timeline``,
``timeline_png``, ``widget`` and ``show``, the tuner's result and the history a ``figure`` (and the
tuner's its ``png``); ``("display", "mime_types")`` says what the running frontend shows.

Each entry is a ``"module:function"`` string, imported when the view is first called, so importing
this module stays cheap (no matplotlib, no ipywidgets).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from gpumagic.report.views import register

#: (kind, view name) → the renderer, as ``"module:function"``.
VIEWS: dict[tuple[str, str], str] = {
    ("report", "text"): "gpumagic.render.text:render_text",
    ("report", "html"): "gpumagic.render.html:render_html",
    ("report", "fragment"): "gpumagic.render.html:report_html",
    ("report", "timeline"): "gpumagic.render.views:_report_timeline",
    ("report", "timeline_png"): "gpumagic.render.views:_report_timeline_png",
    ("report", "widget"): "gpumagic.render.display:widget",
    ("report", "show"): "gpumagic.render.display:show",
    ("comparison", "text"): "gpumagic.render.comparison:render_text",
    ("comparison", "html"): "gpumagic.render.comparison:html_document",
    ("comparison", "fragment"): "gpumagic.render.comparison:render_fragment",
    ("tune", "text"): "gpumagic.render.tuner:render_text",
    ("tune", "html"): "gpumagic.render.tuner:html_document",
    ("tune", "fragment"): "gpumagic.render.tuner:render_html",
    ("tune", "figure"): "gpumagic.render.tuner:figure",
    ("tune", "png"): "gpumagic.render.tuner:png",
    ("job", "text"): "gpumagic.render.job:render_text",
    ("job", "html"): "gpumagic.render.job:html_document",
    ("job", "fragment"): "gpumagic.render.job:render_fragment",
    ("history", "text"): "gpumagic.render.history:render_text",
    ("history", "html"): "gpumagic.render.history:html_document",
    ("history", "fragment"): "gpumagic.render.history:render_html",
    ("history", "figure"): "gpumagic.render.history:figure",
    ("display", "mime_types"): "gpumagic.render.display:shown_mimes",
    ("outputs", "kept_files"): "gpumagic.tuning.history:kept_files",
}


def lazy(target: str) -> Callable[..., Any]:
    """A function that imports ``"module:function"`` when called (after the first call the import
    is a lookup in ``sys.modules``) and calls it; the function is looked up each time, so a
    replaced one (a test's monkeypatch, a reloaded module) is the one called."""
    module, _, name = target.partition(":")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{target}, imported on use."
    return call


def _report_timeline(report, step=None, finding=None, theme="light"):
    from gpumagic.render.timeline import TimelineOptions, timeline_figure

    return timeline_figure(report, TimelineOptions(step=step, finding=finding, theme=theme))


def _report_timeline_png(report, step=None, finding=None, theme="light") -> bytes:
    from gpumagic.render.timeline import TimelineOptions, timeline_png

    return timeline_png(report, TimelineOptions(step=step, finding=finding, theme=theme))


for (_kind, _name), _target in VIEWS.items():
    register(_kind, _name, lazy(_target))
