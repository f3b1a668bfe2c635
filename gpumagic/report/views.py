"""The one-way hook through which data objects reach their views.

The report layer holds plain data (:class:`~gpumagic.report.model.Report`, and the comparison and
tuner results above it); the views (text, HTML, timeline, widget) live in :mod:`gpumagic.render`,
a layer *above*. A data object that offers ``to_text()`` or ``_repr_mimebundle_()`` therefore must
not import its renderer. Instead it asks this module for the view by name, and the views are
attached from above: :mod:`gpumagic.render.views` registers each one with :func:`register`, and
the package's top level (the shell layer) names that module as the place to load them from with
:func:`provide`. Nothing here imports a renderer; like IPython's ``_repr_*_`` protocol or rich's
``__rich_console__``, the data knows the *names* of its views, never their code.

::

    # render layer                          # data layer
    register("report", "text", render_text)  report_view("report", "text")(report, width=100)

:class:`Viewable` gives every data object (Report, Comparison, TuneResult, Job, History) the same
``to_text``, ``to_html``, ``save_html`` and one ``_repr_mimebundle_`` with one include/exclude
filter (:func:`wanted_mimes`), as rich's ``JupyterMixin`` does for its renderables.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, ClassVar

_views: dict[tuple[str, str], Callable[..., Any]] = {}
_providers: list[Callable[[], object]] = []
_lock = threading.Lock()


def register(kind: str, name: str, view: Callable[..., Any]) -> None:
    """Make ``view`` the ``name`` view (``"text"``, ``"html"``, …) of objects of ``kind``."""
    _views[(kind, name)] = view


def provide(loader: Callable[[], object]) -> None:
    """Call ``loader`` (once, lazily) the first time a view is missing; it registers the views."""
    with _lock:
        if loader not in _providers:
            _providers.append(loader)


def view(kind: str, name: str) -> Callable[..., Any]:
    """The registered ``name`` view of ``kind``; loads the providers when it is not there yet."""
    found = _views.get((kind, name))
    if found is None:
        with _lock:
            pending = list(_providers)
        for loader in pending:
            loader()
        found = _views.get((kind, name))
    if found is None:
        raise LookupError(f"no {name!r} view is registered for a {kind}; import gpumagic (the package) to load the views")
    return found


# -- one display protocol for every data object -----------------------------------------------

TEXT_MIME = "text/plain"
HTML_MIME = "text/html"
#: The MIME types a data object's ``_repr_mimebundle_`` offers.
OFFERED_MIMES = (TEXT_MIME, HTML_MIME)


def wanted_mimes(include: Collection[str] | None, exclude: Collection[str] | None,
                 default: Collection[str] = OFFERED_MIMES) -> set[str]:
    """The offered MIME types to compute: IPython's ``include`` if given, else ``default`` (what
    the frontend shows), less ``exclude``."""
    wanted = set(include) if include else set(default)
    return (wanted & set(OFFERED_MIMES)) - set(exclude or ())


class Viewable:
    """The views of a data object, reached by name: ``to_text``, ``to_html``, ``save_html`` and
    ``_repr_mimebundle_`` (text and an HTML fragment, IPython's ``include``/``exclude`` honoured).

    A subclass names its kind (``_view_kind = "job"``); the render layer registers that kind's
    ``text``, ``html`` (a whole page) and ``fragment`` (the notebook's HTML) views, and the
    ``("display", "mime_types")`` view says which types the running frontend shows (a terminal
    IPython: text only).
    """

    _view_kind: ClassVar[str] = ""

    def _view_subject(self) -> Any:
        """What the views are called with (the object itself, unless a subclass says otherwise)."""
        return self

    def _protected_paths(self) -> list[str]:
        """Input files :meth:`save_html` must never write over."""
        return []

    def to_text(self) -> str:
        text: str = view(self._view_kind, "text")(self._view_subject())
        return text

    def to_html(self) -> str:
        """One self-contained HTML document (no script, no network)."""
        html: str = view(self._view_kind, "html")(self._view_subject())
        return html

    def save_html(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_html` to ``path`` whole or not at all, never over an input file
        (:func:`gpumagic._atomic.write_atomic`); returns the path written."""
        from gpumagic._atomic import check_target, write_atomic

        # its own inputs, and what no output may replace whatever it read (the run history, asked
        # of the layer that keeps it through the same hook as the views)
        protect = [*self._protected_paths(), *view("outputs", "kept_files")()]
        check_target(path, protect)  # before rendering: a bad path costs nothing
        return write_atomic(path, self.to_html(), protect=protect)

    def _repr_mimebundle_(self, include: Collection[str] | None = None,
                          exclude: Collection[str] | None = None) -> dict[str, str]:
        """Text and the HTML fragment for a notebook's output (IPython's display protocol)."""
        wanted = wanted_mimes(include, exclude, view("display", "mime_types")())
        bundle = {}
        if TEXT_MIME in wanted:
            bundle[TEXT_MIME] = self.to_text()
        if HTML_MIME in wanted:
            bundle[HTML_MIME] = view(self._view_kind, "fragment")(self._view_subject())
        return bundle
