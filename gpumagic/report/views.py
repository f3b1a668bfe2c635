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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

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
