"""gpumagic: why is my GPU waiting, and what should I change?

Public API::

    gpumagic.analyze(path_or_trace) -> Report     # a saved trace, offline (no torch needed); "example": the bundled one
    gpumagic.load_trace(path) -> Trace
    gpumagic.__version__                            # the installed version (package metadata)
    gpumagic.analyze_job(paths, client=None, jobs=None) -> Job   # one trace per rank: stragglers
    gpumagic.profile(**options)                     # context manager / decorator (needs torch)
    gpumagic.Profiler(...)                          # start()/stop() across cells
    gpumagic.history() -> History                   # the run history: table + chart
    gpumagic.monitor(interval_ms=1000)              # live GPU/CPU sparklines (also %gpumonitor)
    gpumagic.TimeitResult                           # what %gputimeit -o NAME stores (for isinstance, annotations)
    %load_ext gpumagic  ->  %%gpuprofile, %gpuprofile

Importing gpumagic registers nothing and imports neither numpy, torch nor IPython; those load
when the names that need them are first used.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from gpumagic.errors import GpumagicError, TraceError
from gpumagic.report import views as _views
from gpumagic.report.model import Evidence, Finding, Fix, Report, Window

#: Public names whose modules import numpy, torch, IPython or ipywidgets: resolved on first use.
_LAZY = {
    "analyze": "gpumagic.analysis",
    "analyze_job": "gpumagic.jobs",
    "Trace": "gpumagic.trace.model",
    "profile": "gpumagic.shells.api",
    "Profiler": "gpumagic.shells.api",
    "compare": "gpumagic.tuning.comparison",
    "tune_dataloader": "gpumagic.capture.dataloader",
    "history": "gpumagic.tuning.runs",
    "monitor": "gpumagic.shells.monitor",
    "TimeitResult": "gpumagic.capture.timeit",
}

__all__ = [
    "Evidence", "Finding", "Fix", "GpumagicError", "Profiler", "Report", "TimeitResult", "Trace", "TraceError",
    "Window", "__version__", "analyze", "analyze_job", "compare", "history", "load_ipython_extension", "load_trace", "monitor",
    "profile",
    "tune_dataloader", "unload_ipython_extension",
]


def _load_views() -> None:
    """Register the renderers (:mod:`gpumagic.render.views`) the first time a view is asked for."""
    import gpumagic.render.views  # noqa: F401


_views.provide(_load_views)


def _installed_version() -> str:
    """The version of the installed distribution (pyproject.toml's ``version``, the one source of truth)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpumagic")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return _installed_version()
    if name == "load_trace":
        return import_module("gpumagic.trace.kineto").load
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpumagic' has no attribute {name!r}")
    return getattr(import_module(module), name)


def load_ipython_extension(ipython) -> None:
    """``%load_ext gpumagic``: register ``%%gpuprofile`` and ``%gpuprofile``.

    Warns first when this package is not the installed one (a folder named ``gpumagic`` earlier on
    ``sys.path`` shadows it: :mod:`gpumagic._origin` names the folder and the fix)."""
    from gpumagic._origin import shadowing_note

    note = shadowing_note()
    if note is not None:
        import warnings

        warnings.warn(note, UserWarning, stacklevel=2)
    import_module("gpumagic.shells.magic").load_ipython_extension(ipython)


def unload_ipython_extension(ipython) -> None:
    import_module("gpumagic.shells.magic").unload_ipython_extension(ipython)
