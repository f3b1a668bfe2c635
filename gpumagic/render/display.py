"""How a Report shows itself: one MIME bundle with the live widget *and* static fallbacks.

``Report._repr_mimebundle_`` returns, in one output:

- ``application/vnd.jupyter.widget-view+json``: the ipywidgets view, when running in a live
  kernel with ipywidgets installed;
- ``text/html``: the self-contained static report (timeline as an inline PNG);
- ``text/plain``: the text render.

A frontend renders exactly one MIME type per output, the richest it can: JupyterLab and
Notebook 7 with the widget manager show the widget and ignore the rest, so the static report
never appears twice. nbconvert's HTML exporter skips the widget type when the notebook saved no
widget state (its ``WidgetsDataTypeFilter``) and uses ``text/html``, as do GitHub's viewer and
frontends without the widget manager; terminals use ``text/plain``.

Limitation: JupyterLab prefers the widget type for a *trusted* notebook even after the kernel
is gone, and then shows "model not found" until the cell runs again (or widget state was saved).
Set ``GPUMAGIC_WIDGETS=0`` to always get the static report.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Collection

    from gpumagic.report.model import Report

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
HTML_MIME = "text/html"
TEXT_MIME = "text/plain"
ALL_MIMES = (WIDGET_MIME, HTML_MIME, TEXT_MIME)
#: Environment switch: ``GPUMAGIC_WIDGETS=0`` turns the live widget off (static HTML only).
WIDGETS_ENV = "GPUMAGIC_WIDGETS"


def mimebundle(report: Report, include: Collection[str] | None = None, exclude: Collection[str] | None = None) -> dict[str, Any]:
    """The bundle for ``Report._repr_mimebundle_`` (IPython's ``include``/``exclude`` honoured)."""
    wanted = _wanted(include, exclude)
    bundle: dict[str, Any] = {}
    if TEXT_MIME in wanted:
        bundle[TEXT_MIME] = report.to_text()
    if not wanted & {HTML_MIME, WIDGET_MIME}:
        return bundle
    from gpumagic.render.html import render_images, report_html

    images = render_images(report)
    if WIDGET_MIME in wanted and widgets_live():
        from gpumagic.render.widget import build_widget

        view = build_widget(report, images).root._repr_mimebundle_()
        if WIDGET_MIME in view:
            bundle[WIDGET_MIME] = view[WIDGET_MIME]
    if HTML_MIME in wanted:
        bundle[HTML_MIME] = report_html(report, images)
    return bundle


def _wanted(include: Collection[str] | None, exclude: Collection[str] | None) -> set[str]:
    """The MIME types to compute: ``include`` if given, else what the shell displays.

    IPython's formatters do not list the widget type, so a shell that displays HTML (a kernel
    behind a rich frontend) is taken to want it too; :func:`widgets_live` decides the rest.
    """
    if include:
        wanted = set(include)
    else:
        wanted = _shell_types()
        if HTML_MIME in wanted:
            wanted.add(WIDGET_MIME)
    return (wanted & set(ALL_MIMES)) - set(exclude or ())


def _shell_types() -> set[str]:
    """The active display types of the running IPython shell (a terminal wants only text)."""
    shell = _ipython_shell()
    formatter = getattr(shell, "display_formatter", None)
    active = getattr(formatter, "active_types", None)
    return set(active) if active else set(ALL_MIMES)


def _ipython_shell() -> Any:
    """The running IPython shell, without importing IPython when nothing did."""
    if "IPython" not in sys.modules:
        return None
    return sys.modules["IPython"].get_ipython()


def widgets_live() -> bool:
    """True inside a live Jupyter kernel with ipywidgets importable and not switched off."""
    if os.environ.get(WIDGETS_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if getattr(_ipython_shell(), "kernel", None) is None:
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def save_html(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write the report as one self-contained HTML file, whole or not at all (through
    :func:`gpumagic._atomic.write_atomic`; :class:`~gpumagic._atomic.WriteError`, an OSError, when
    it cannot); returns the path written."""
    from gpumagic._atomic import check_target, write_atomic
    from gpumagic.render.html import html_document

    check_target(path)  # before rendering: a bad path costs nothing
    return write_atomic(path, html_document(report))


def widget(report: Report):
    """The ipywidgets view of the report (a ``VBox``), for ``display()`` or embedding."""
    from gpumagic.render.widget import build_widget

    return build_widget(report).root
