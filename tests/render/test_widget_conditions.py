"""Issue 21: the live report widget shows the machine's state during the capture — how much CPU
other processes used — in its notes tab, and the "shared machine" fact in its header when it
matters; a plain trace (nothing sampled) shows no such section."""

import pytest
from recorded import analysed
from test_loader_demand import RECORDED, _bundle

from gpumagic.render.conditions import condition_lines

pytest.importorskip("ipywidgets")


def test_the_widget_says_other_processes_shared_the_machine():
    from gpumagic.render.widget import build_widget

    r = _bundle(RECORDED["scenarios"]["sleeping"])  # recorded beside busy neighbours
    lines = condition_lines(r)
    assert lines and lines[0].startswith("Other processes used") and "shared machine" in lines[0]
    w = build_widget(r)
    notes = w.tabs.children[-1].value
    assert "Machine state during the capture" in notes and "Other processes used" in notes
    assert "Shared machine" in w.header.value
    w.close()


def test_a_plain_trace_has_no_conditions_section():
    from gpumagic.render.widget import build_widget

    r = analysed("resnet50_v100_workers4")
    assert condition_lines(r) == []
    w = build_widget(r)
    assert "Machine state during the capture" not in w.tabs.children[-1].value
    w.close()
