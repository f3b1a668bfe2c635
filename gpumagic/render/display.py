"""How a Report shows itself in a notebook: the static report always, the live view on top.

``display(report)`` (and a report as a cell's last value, through IPython's
``_ipython_display_`` protocol) publishes:

1. an output holding the static report: ``text/html`` (self-contained, the timeline as an inline
   PNG, no script) and ``text/plain`` (the text render);
2. in a live Jupyter kernel with ipywidgets, a second output right after it holding the
   ipywidgets view (``application/vnd.jupyter.widget-view+json``) and a one-line ``text/plain``.
   The live view is built after the static report is published, so the report is on screen
   while its widgets (the slower part: tens of milliseconds) are made.

The static report never depends on saved widget state, so it shows wherever the notebook is
opened: the same notebook after the kernel stopped, ``nbconvert`` (with or without the widget
state that ``--execute`` saves, online or not), GitHub and other renderers that show only
``text/html``. While the live view renders, CSS in both outputs swaps them (see
:func:`gpumagic.render.page.swap_css`): the static report is hidden once the widget is drawn,
and the widget output is hidden while it has nothing to draw (so "Error displaying widget:
model not found" never shows). A person sees one report, never two and never none.

Why two outputs rather than one bundle with a fallback: ipympl puts a static PNG beside the
widget view in one bundle (matplotlib/ipympl#343), which nbconvert honours when no widget state
was saved (its ``WidgetsDataTypeFilter``, jupyter/nbconvert#1643); but JupyterLab prefers the
widget type in a trusted notebook, and its renderer (jupyterlab_widgets ``renderer.ts``) writes
"Error displaying widget: model not found" into that same output once the widget manager has
restored without the model (matplotlib/ipympl#38, widgetti/ipyreact#40), so the fallback in the
bundle is never shown. A separate output survives; CSS, not JavaScript, does the swap.

Memory: a live view keeps its report (and trace) for redrawing the timeline. Only the
:data:`LIVE_REPORTS` most recent live views are kept open; displaying another closes the oldest
(its models are closed, so its view disappears and the static report under it shows again) and
releases its report. ``GPUMAGIC_WIDGETS=0`` turns the live view off.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Collection

    from gpumagic.render.widget import ReportWidget
    from gpumagic.report.model import Report

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
HTML_MIME = "text/html"
TEXT_MIME = "text/plain"
ALL_MIMES = (WIDGET_MIME, HTML_MIME, TEXT_MIME)
#: Environment switch: ``GPUMAGIC_WIDGETS=0`` turns the live widget off (static HTML only).
WIDGETS_ENV = "GPUMAGIC_WIDGETS"
#: Live views kept open (each keeps its report and trace alive for redrawing); older ones close.
LIVE_REPORTS = 5
#: The widget output's plain-text form, shown only by frontends that cannot draw the widget.
LIVE_NOTE = "(interactive view of the gpumagic report above: shown in a live kernel)"

_live: deque[ReportWidget] = deque()


def mimebundle(report: Report, include: Collection[str] | None = None, exclude: Collection[str] | None = None) -> dict[str, Any]:
    """The static bundle (``text/html`` and ``text/plain``; IPython's ``include``/``exclude``
    honoured): what ``Report._repr_mimebundle_`` (:class:`~gpumagic.report.views.Viewable`) returns and what every
    frontend can show."""
    wanted = _wanted(include, exclude)
    bundle: dict[str, Any] = {}
    if TEXT_MIME in wanted:
        bundle[TEXT_MIME] = report.to_text()
    if HTML_MIME in wanted:
        from gpumagic.render.html import report_html

        bundle[HTML_MIME] = report_html(report)
    return bundle


def show(report: Report) -> None:
    """Display ``report``: the static report, then (in a live kernel) the live view after it."""
    from IPython.display import display

    wanted = _wanted(None, None)
    if HTML_MIME not in wanted or not widgets_live():
        display(mimebundle(report, include=wanted), raw=True)
        return
    from gpumagic.render.html import render_images, report_html
    from gpumagic.render.widget import build_widget

    images = render_images(report)
    token = secrets.token_hex(6)
    # the static report first: it is on screen while the live view (the slower part) is built
    display({HTML_MIME: report_html(report, images, live_token=token), TEXT_MIME: report.to_text()}, raw=True)
    try:
        view = build_widget(report, images, live_token=token)
    except Exception as exc:  # the static report is shown and stays: it stands alone (see the swap rules)
        from gpumagic.errors import exception_text

        print(f"gpumagic: warning: the interactive view was not built ({type(exc).__name__}: {exception_text(exc)}); "
              "the static report above is complete", file=sys.stderr)
        return
    display({WIDGET_MIME: view.root._repr_mimebundle_()[WIDGET_MIME], TEXT_MIME: LIVE_NOTE}, raw=True)
    keep_live(view)


def show_comparison(comparison, report: Report) -> None:
    """Display a comparison first (``--compare``), with the full ``report`` collapsed under it:
    one output, static, so it reads the same in every frontend."""
    from IPython.display import display

    from gpumagic.render.comparison import render_fragment
    from gpumagic.render.html import report_html

    wanted = _wanted(None, None)
    bundle: dict[str, Any] = {}
    if TEXT_MIME in wanted:
        bundle[TEXT_MIME] = comparison.to_text() + "\nFull report\n\n" + report.to_text()
    if HTML_MIME in wanted:
        bundle[HTML_MIME] = render_fragment(comparison.data, full_report_html=report_html(report))
    display(bundle, raw=True)


def keep_live(view: ReportWidget, limit: int | None = None) -> None:
    """Remember ``view`` as open; close the oldest open views beyond ``limit`` (default
    :data:`LIVE_REPORTS`)."""
    limit = LIVE_REPORTS if limit is None else limit
    _live.append(view)
    while len(_live) > max(limit, 0):
        _live.popleft().close()


def live_views() -> list[ReportWidget]:
    """The live views still open, oldest first."""
    return list(_live)


def close_live_views() -> None:
    """Close every open live view (each shows its static report again) and release its report."""
    while _live:
        _live.popleft().close()


def _wanted(include: Collection[str] | None, exclude: Collection[str] | None) -> set[str]:
    """The MIME types to compute: ``include`` if given, else what the shell displays (the one
    filter every data object's ``_repr_mimebundle_`` uses, :func:`gpumagic.report.views.wanted_mimes`)."""
    from gpumagic.report.views import wanted_mimes

    return wanted_mimes(include, exclude, _shell_types())


def shown_mimes() -> set[str]:
    """The MIME types the running frontend shows (all, outside IPython): the ``("display",
    "mime_types")`` view that :class:`~gpumagic.report.views.Viewable` asks."""
    return _shell_types()


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
    from gpumagic._env import env_flag

    if not env_flag(WIDGETS_ENV, True):
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
    return report.save_html(path)  # one spelling for every data object: gpumagic.report.views.Viewable


def widget(report: Report):
    """The ipywidgets view of the report (a ``VBox``), for ``display()`` or embedding."""
    from gpumagic.render.widget import build_widget

    return build_widget(report).root
