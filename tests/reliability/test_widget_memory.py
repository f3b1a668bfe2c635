"""Displayed reports are freed (issue 11, item 4): memory after N displayed cells stays flat.

Each report is displayed the way a notebook cell displays it (``display(report)`` through IPython's
``_ipython_display_`` protocol), in a stand-in for a live kernel (widgets on) and outside one
(static only). Weak references then tell whether the Reports and their Traces are still alive once
the caller has dropped them, and ipywidgets' own registry tells how many widget models are open.
"""

from __future__ import annotations

import gc
import weakref

import ipywidgets
import pytest
from ipywidgets.widgets.widget import _instances

import gpumagic
from gpumagic.render import display as mb

EXAMPLE = "h100_bert_small_inference.json.gz"
CELLS = 3 * mb.LIVE_REPORTS


class _Formatter:
    active_types = ("text/plain", "text/html", "image/png")


class _Shell:
    def __init__(self, kernel):
        self.kernel = kernel
        self.display_formatter = _Formatter()


@pytest.fixture
def quiet_display(monkeypatch):
    """IPython's display publishes nothing outside a kernel; count what would be published."""
    import IPython.display

    published = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: published.append(obj))
    return published


@pytest.fixture(autouse=True)
def _close_live_views():
    """Start and end with no live view open (other tests may have displayed some)."""
    mb.close_live_views()
    yield
    mb.close_live_views()


def _display_cells(data_dir, n: int) -> list[tuple[weakref.ref, weakref.ref]]:
    """Analyse and display ``n`` reports like ``n`` cells; keep only weak references."""
    refs = []
    for _ in range(n):
        report = gpumagic.analyze(f"{data_dir}/{EXAMPLE}")
        assert report.trace is not None
        report._ipython_display_()
        refs.append((weakref.ref(report), weakref.ref(report.trace)))
        del report
    gc.collect()
    return refs


def _alive(refs) -> tuple[int, int]:
    return sum(r() is not None for r, _ in refs), sum(t() is not None for _, t in refs)


def test_with_widgets_only_the_most_recent_live_views_keep_their_reports(monkeypatch, data_dir, quiet_display):
    monkeypatch.setattr(mb, "_ipython_shell", lambda: _Shell(kernel=object()))
    models_before = len(_instances)
    refs = _display_cells(data_dir, CELLS)
    assert len(quiet_display) == 2 * CELLS  # static report + live view, per cell
    reports, traces = _alive(refs)
    assert reports == traces == mb.LIVE_REPORTS  # the rest were freed, not only their widgets
    assert all(r() is None for r, _ in refs[: CELLS - mb.LIVE_REPORTS])  # the oldest ones went first
    open_models = len(_instances) - models_before
    assert open_models == sum(len(list(_tree(v.root))) for v in mb.live_views())  # closed views left nothing open


def test_more_cells_do_not_grow_the_open_widget_models(monkeypatch, data_dir, quiet_display):
    monkeypatch.setattr(mb, "_ipython_shell", lambda: _Shell(kernel=object()))
    before = len(_instances)
    _display_cells(data_dir, mb.LIVE_REPORTS)
    after_few = len(_instances)
    _display_cells(data_dir, 2 * mb.LIVE_REPORTS)
    assert len(_instances) == after_few > before


def test_a_closed_view_drops_its_report_and_closes_every_model(monkeypatch, data_dir, quiet_display):
    monkeypatch.setattr(mb, "_ipython_shell", lambda: _Shell(kernel=object()))
    report = gpumagic.analyze(f"{data_dir}/{EXAMPLE}")
    report._ipython_display_()
    view = mb.live_views()[-1]
    ids = {w.model_id for w in _tree(view.root)}
    view.close()
    assert view.closed and view.report is None
    assert not ids & set(_instances)
    ref = weakref.ref(report)
    del report
    gc.collect()
    assert ref() is None


def test_without_widgets_nothing_keeps_a_displayed_report(monkeypatch, data_dir, quiet_display):
    monkeypatch.setattr(mb, "_ipython_shell", lambda: _Shell(kernel=None))
    before = len(_instances)
    refs = _display_cells(data_dir, CELLS)
    assert _alive(refs) == (0, 0)
    assert len(_instances) == before and mb.live_views() == []


def _tree(widget: ipywidgets.Widget):
    yield widget
    for part in ("layout", "style"):
        sub = getattr(widget, part, None)
        if isinstance(sub, ipywidgets.Widget):
            yield sub
    for child in getattr(widget, "children", ()) or ():
        yield from _tree(child)
