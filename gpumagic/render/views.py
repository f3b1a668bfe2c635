"""Attach the views to the data objects below (see :mod:`gpumagic.report.views`).

Importing this module registers, for each kind of object, the renderers its methods name:

- ``report``: ``text``, ``html``, ``save_html``, ``timeline``, ``timeline_png``, ``widget``, ``mimebundle``, ``show``;
- ``comparison``: ``text``, ``html``, ``fragment``;
- ``tune``: ``text``, ``html``, ``figure``, ``png``;
- ``job``: ``text``, ``html``, ``mimebundle``;
- ``history`` (``gpumagic.history()``): ``text``, ``html``, ``figure``.

Each registered function imports its renderer when first called, so importing this module stays
cheap (no matplotlib, no ipywidgets).
"""

from __future__ import annotations

from gpumagic.report.views import register


def _report_text(report, width: int = 100) -> str:
    from gpumagic.render.text import render_text

    return render_text(report, width=width)


def _report_html(report) -> str:
    from gpumagic.render.html import render_html

    return render_html(report)


def _report_save_html(report, path):
    from gpumagic.render.display import save_html

    return save_html(report, path)


def _report_timeline(report, step=None, finding=None):
    from gpumagic.render.timeline import TimelineOptions, timeline_figure

    return timeline_figure(report, TimelineOptions(step=step, finding=finding))


def _report_timeline_png(report, step=None, finding=None) -> bytes:
    from gpumagic.render.timeline import TimelineOptions, timeline_png

    return timeline_png(report, TimelineOptions(step=step, finding=finding))


def _report_widget(report):
    from gpumagic.render.display import widget

    return widget(report)


def _report_mimebundle(report, include=None, exclude=None):
    from gpumagic.render.display import mimebundle

    return mimebundle(report, include=include, exclude=exclude)


def _report_show(report) -> None:
    from gpumagic.render.display import show

    show(report)


def _comparison_text(data) -> str:
    from gpumagic.render.comparison import render_text

    return render_text(data)


def _comparison_html(data) -> str:
    from gpumagic.render.comparison import html_document

    return html_document(data)


def _comparison_fragment(data) -> str:
    from gpumagic.render.comparison import render_fragment

    return render_fragment(data)


def _tune_text(result) -> str:
    from gpumagic.render.tuner import render_text

    return render_text(result)


def _tune_html(result) -> str:
    from gpumagic.render.tuner import render_html

    return render_html(result)


def _tune_figure(result):
    from gpumagic.render.tuner import figure

    return figure(result)


def _tune_png(result) -> bytes:
    from gpumagic.render.tuner import png

    return png(result)


def _job_text(job, width: int = 100) -> str:
    from gpumagic.render.job import render_text

    return render_text(job, width=width)


def _job_html(job) -> str:
    from gpumagic.render.job import html_document

    return html_document(job)


def _job_mimebundle(job, include=None, exclude=None):
    from gpumagic.render.job import mimebundle

    return mimebundle(job, include=include, exclude=exclude)


for _kind, _name, _view in (
    ("report", "text", _report_text), ("report", "html", _report_html), ("report", "save_html", _report_save_html),
    ("report", "timeline", _report_timeline), ("report", "timeline_png", _report_timeline_png),
    ("report", "widget", _report_widget), ("report", "mimebundle", _report_mimebundle), ("report", "show", _report_show),
    ("comparison", "text", _comparison_text), ("comparison", "html", _comparison_html),
    ("comparison", "fragment", _comparison_fragment),
    ("tune", "text", _tune_text), ("tune", "html", _tune_html), ("tune", "figure", _tune_figure), ("tune", "png", _tune_png),
    ("job", "text", _job_text), ("job", "html", _job_html), ("job", "mimebundle", _job_mimebundle),
):
    register(_kind, _name, _view)


def _history_text(history) -> str:
    from gpumagic.render.history import render_text

    return render_text(history)


def _history_html(history) -> str:
    from gpumagic.render.history import render_html

    return render_html(history)


def _history_figure(history):
    from gpumagic.render.history import figure

    return figure(history)


for _kind, _name, _view in (
    ("history", "text", _history_text), ("history", "html", _history_html), ("history", "figure", _history_figure),
):
    register(_kind, _name, _view)
