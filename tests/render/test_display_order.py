"""``show()`` in a live kernel publishes the static report before it builds the live view, and a
live view that cannot be built leaves the static report alone on screen, with one warning."""

import pytest

from gpumagic.render import display as mb
from gpumagic.render import widget


class _Shell:
    kernel = object()

    class display_formatter:  # stands in for IPython's formatter
        active_types = ("text/plain", "text/html")


@pytest.fixture
def events(monkeypatch):
    """What happens, in order: each bundle published and each widget build."""
    import IPython.display

    mb.close_live_views()  # views another test of this worker left open are not this test's
    seen = []
    monkeypatch.setattr(mb, "_ipython_shell", lambda: _Shell())
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: seen.append(("display", tuple(sorted(obj)))))
    real = widget.build_widget

    def build(*args, **kwargs):
        seen.append(("build", ()))
        return real(*args, **kwargs)

    monkeypatch.setattr(widget, "build_widget", build)
    yield seen
    mb.close_live_views()


def test_the_static_report_is_published_before_the_live_view_is_built(small_report, events):
    mb.show(small_report)
    assert events == [("display", (mb.HTML_MIME, mb.TEXT_MIME)), ("build", ()),
                      ("display", (mb.WIDGET_MIME, mb.TEXT_MIME))]
    assert len(mb.live_views()) == 1


def test_a_live_view_that_fails_leaves_the_static_report_and_a_warning(small_report, events, monkeypatch, capsys):
    def broken(*args, **kwargs):
        events.append(("build", ()))
        raise RuntimeError("no comm")

    monkeypatch.setattr(widget, "build_widget", broken)
    before = len(mb.live_views())
    mb.show(small_report)
    assert events == [("display", (mb.HTML_MIME, mb.TEXT_MIME)), ("build", ())]
    assert len(mb.live_views()) == before
    assert "the interactive view was not built (RuntimeError: no comm)" in capsys.readouterr().err
