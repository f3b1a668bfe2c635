"""One display protocol for every data object (``gpumagic.report.views.Viewable``): the same
include/exclude filter, the frontend's shown types, and ``save_html`` whole or not at all."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import gpumagic.render.display as mb
from gpumagic.report.views import HTML_MIME, TEXT_MIME, Viewable, wanted_mimes
from gpumagic.tuning.comparison import compare
from gpumagic.tuning.history import History, StoredRun
from gpumagic.tuning.tuner import TuneConfig, TuneResult, TuneRow


def _tune() -> TuneResult:
    rows = [TuneRow(TuneConfig(w, False), batches=10, seconds=1.0, batches_per_s=b) for w, b in ((0, 10.0), (2, 18.0))]
    return TuneResult(rows=rows, batch_size=8)


def _history() -> History:
    run = StoredRun(id=1, label="base", created_ns=1_700_000_000 * 10**9, source="test", workdir="/w", notebook="",
                    options={}, bundle="", device="CPU", median_step_ms=12.5, gpu_busy_frac=0.4, top_finding="cpu-bound")
    return History(runs=[run], where="memory")


@pytest.fixture(params=["report", "comparison", "tune", "history"])
def obj(request, small_report) -> Viewable:
    return {"report": lambda: small_report, "comparison": lambda: compare(small_report, small_report),
            "tune": _tune, "history": _history}[request.param]()


def _shell(monkeypatch, *active):
    shell = SimpleNamespace(kernel=None, display_formatter=SimpleNamespace(active_types=list(active)))
    monkeypatch.setattr(mb, "_ipython_shell", lambda: shell)


def test_every_data_object_is_viewable(obj):
    assert isinstance(obj, Viewable) and "_repr_mimebundle_" not in type(obj).__dict__


def test_the_bundle_is_text_and_the_html_fragment(obj):
    bundle = obj._repr_mimebundle_()
    assert set(bundle) == {TEXT_MIME, HTML_MIME} and bundle[TEXT_MIME] == obj.to_text()
    assert bundle[HTML_MIME].startswith('<div class="gpumagic-report') and "<!DOCTYPE" not in bundle[HTML_MIME]


def test_include_and_exclude_are_honoured_by_all(obj):
    assert set(obj._repr_mimebundle_(include=[TEXT_MIME])) == {TEXT_MIME}
    assert set(obj._repr_mimebundle_(exclude=[TEXT_MIME])) == {HTML_MIME}
    assert obj._repr_mimebundle_(include=["image/png"]) == {}


def test_a_terminal_shell_gets_only_text_from_all(obj, monkeypatch):
    _shell(monkeypatch, TEXT_MIME)
    assert set(obj._repr_mimebundle_()) == {TEXT_MIME}


def test_save_html_writes_a_whole_page_or_nothing(obj, tmp_path):
    out = obj.save_html(tmp_path / "page.html")
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    with pytest.raises(OSError):
        obj.save_html(tmp_path / "missing" / "page.html")
    assert not (tmp_path / "missing").exists()


def test_the_filter():
    assert wanted_mimes(None, None) == {TEXT_MIME, HTML_MIME}
    assert wanted_mimes(None, None, default=[TEXT_MIME, "image/png"]) == {TEXT_MIME}
    assert wanted_mimes([HTML_MIME, "application/json"], [HTML_MIME]) == set()
