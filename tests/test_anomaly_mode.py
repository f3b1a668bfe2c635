"""``anomaly-detection-on``: autograd's anomaly mode left on (every backward output checked for NaN,
a stack trace recorded for every forward operator), read from the NaN checks inside the autograd
engine's spans."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze


def test_a_recorded_loop_with_anomaly_mode_on():
    """Recorded on this project's 2-core machine (tests/data/MANIFEST.md): 2.54× slower with the mode on."""
    f = analyze(os.path.join(DATA, "cpu_anomaly_mode.json.gz")).finding("anomaly-detection-on")
    n = f.evidence.numbers
    assert n["checked_nodes"] == n["backward_nodes"] >= 20 and n["isnan_calls"] >= n["checked_nodes"]
    assert 0.05 < f.est_gain == n["check_frac"] and f.gain_method.startswith("estimate that runs low")
    assert f.fixes[0].code.startswith("torch.autograd.set_detect_anomaly(False)")
    compile(f.fixes[0].code, "<fix>", "exec")
    assert {w.label for w in f.evidence.windows} == {"NaN check"}


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz")))
                                        - {os.path.join(DATA, "cpu_anomaly_mode.json.gz")}))
def test_silent_on_every_other_recorded_trace(path):
    assert analyze(path).finding("anomaly-detection-on") is None


def _backward(nodes: int, checked: int) -> dict:
    """One step whose backward evaluates ``nodes`` nodes (and one AccumulateGrad), ``checked`` of
    them holding an isnan."""
    tb = TraceBuilder(cc=None)
    tb.step(1, 0, 10_000)
    tb.op("aten::addmm", 10, 1_000)
    t = 2_000
    for i in range(nodes):
        tb.op(f"autograd::engine::evaluate_function: AddmmBackward{i}", t, 500)
        if i < checked:
            tb.op("aten::isnan", t + 300, 50)
            tb.op("aten::any", t + 360, 40)
            tb.op("aten::item", t + 410, 30)
        t += 600
    tb.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t, 100)
    return tb.to_dict()


def test_a_custom_backward_checking_one_node_is_not_the_mode():
    assert analyze(_backward(10, 1)).finding("anomaly-detection-on") is None
    assert analyze(_backward(10, 4)).finding("anomaly-detection-on") is None  # under half of the nodes
    f = analyze(_backward(10, 10)).finding("anomaly-detection-on")
    assert f.evidence.numbers["checked_nodes"] == 10 and f.evidence.numbers["backward_nodes"] == 10
