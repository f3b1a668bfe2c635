"""A saved notebook without widget state still shows the report after nbconvert (static HTML)."""

import pytest

from gpumagic.render import display as mb

nbformat = pytest.importorskip("nbformat")
nbconvert = pytest.importorskip("nbconvert")


def _notebook_with(bundle: dict, widget_state: dict | None = None):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("%%gpuprofile\n...")
    cell.outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    nb.cells = [cell]
    if widget_state is not None:
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"version_major": 2, "version_minor": 0,
                                                                                "state": widget_state}}
    return nb


@pytest.fixture(scope="module")
def bundle(small_report):
    static = mb.mimebundle(small_report, include={mb.HTML_MIME, mb.TEXT_MIME})
    # what a live kernel adds: a view of a widget model that the saved notebook holds no state for
    return {**static, mb.WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": "0123456789abcdef"}}


def test_nbconvert_falls_back_to_the_static_report_without_widget_state(bundle):
    body, _ = nbconvert.HTMLExporter().from_notebook_node(_notebook_with(bundle))
    assert "gpumagic-report gpumagic-static" in body
    assert "0123456789abcdef" not in body  # no dangling widget view


def test_nbconvert_uses_the_widget_when_its_state_was_saved(bundle):
    state = {"0123456789abcdef": {"model_name": "VBoxModel", "model_module": "@jupyter-widgets/controls",
                                  "model_module_version": "2.0.0", "state": {}}}
    body, _ = nbconvert.HTMLExporter().from_notebook_node(_notebook_with(bundle, state))
    assert "0123456789abcdef" in body
    assert "gpumagic-static" not in body  # one view of the report, never both
