"""The static report survives every export: nbconvert with and without saved widget state,
``nbconvert --execute`` (a real kernel, which saves the widget state), and a GitHub-like
renderer that shows sanitised ``text/html`` only.

What a live kernel publishes for one report is two outputs: the static report, then the widget
view (see gpumagic.render.display). These tests take those outputs from ``show()`` itself, or
from a real kernel run by nbconvert, and check that each export holds the static report with the
top finding's title as visible text (outside any script), and no "model not found".
"""

import json
import re

import pytest
from nb_helpers import github_like, nbconvert_execute_html, notebook

from gpumagic.render import display as mb

nbformat = pytest.importorskip("nbformat")
nbconvert = pytest.importorskip("nbconvert")

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


class _Shell:
    kernel = object()

    class display_formatter:
        active_types = ("text/plain", "text/html", "image/png")


@pytest.fixture(scope="module")
def live_outputs(small_report):
    """The outputs ``display(report)`` publishes in a live kernel, as nbformat outputs."""
    import IPython.display

    published = []
    mp = pytest.MonkeyPatch()
    mp.setattr(mb, "_ipython_shell", lambda: _Shell())
    mp.setattr(IPython.display, "display", lambda obj, raw=False: published.append(obj))
    try:
        mb.show(small_report)
        view = mb.live_views()[-1]
    finally:
        mp.undo()
    outputs = [nbformat.v4.new_output("display_data", data=b) for b in published]
    yield outputs, view
    view.close()


def _notebook_with(outputs, widget_state: dict | None = None):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("%%gpuprofile\n...")
    cell.outputs = outputs
    nb.cells = [cell]
    if widget_state is not None:
        nb.metadata["widgets"] = {WIDGET_STATE: {"version_major": 2, "version_minor": 0, "state": widget_state}}
    return nb


def _visible_text(body: str) -> str:
    """The page's text outside <script> and <style> (what a reader can see, CSS aside)."""
    body = re.sub(r"<(script|style)\b.*?</\1>", "", body, flags=re.S | re.I)
    return re.sub(r"<[^>]+>", " ", body)


def test_two_outputs_static_first(live_outputs, small_report):
    outputs, _ = live_outputs
    assert [set(o["data"]) for o in outputs] == [{mb.HTML_MIME, mb.TEXT_MIME}, {mb.WIDGET_MIME, mb.TEXT_MIME}]


def test_nbconvert_without_widget_state_shows_the_static_report(live_outputs, small_report):
    outputs, _ = live_outputs
    body, _ = nbconvert.HTMLExporter().from_notebook_node(_notebook_with(outputs))
    assert "gpumagic-report gpumagic-static" in body
    assert small_report.findings[0].title in _visible_text(body)
    assert "model not found" not in body


def test_nbconvert_with_widget_state_keeps_the_static_report_too(live_outputs, small_report):
    outputs, view = live_outputs
    state = {view.root.model_id: {"model_name": "VBoxModel", "model_module": "@jupyter-widgets/controls",
                                  "model_module_version": "2.0.0", "state": {}}}
    body, _ = nbconvert.HTMLExporter().from_notebook_node(_notebook_with(outputs, state))
    assert view.root.model_id in body  # the widget view is there for an online reader ...
    assert small_report.findings[0].title in _visible_text(body)  # ... and the static report for everyone


def test_a_github_like_renderer_shows_the_report_as_plain_markup(live_outputs, small_report):
    outputs, _ = live_outputs
    page = github_like(json.loads(nbformat.writes(_notebook_with(outputs))))
    assert "<style" not in page and "<script" not in page and "class=" not in page
    text = _visible_text(page)
    assert small_report.findings[0].title in text and "Checklist" in text
    assert "[timeline: Timeline of the recorded steps" in page  # a dropped <svg> leaves its text alternative
    assert mb.LIVE_NOTE in text  # the widget output falls back to one line, not a second report


@pytest.mark.slow
def test_nbconvert_execute_saves_widget_state_and_the_static_report(tmp_path):
    src = tmp_path / "report.ipynb"
    src.write_text(json.dumps(notebook()))
    out = nbconvert_execute_html(src, tmp_path)
    body = out.read_text(encoding="utf-8")
    assert WIDGET_STATE in body  # nbconvert --execute stored the widget state (so it embeds the view)
    import gpumagic
    import gpumagic.examples

    top = gpumagic.analyze(gpumagic.examples.trace_path()).findings[0].title
    assert top in _visible_text(body)
    assert re.search(r"\.jp-OutputArea-child:has\(\.gm-static-([0-9a-f]+)\)", body)  # the swap rules made it
    assert "model not found" not in body
