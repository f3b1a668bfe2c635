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


def _gpu_anomaly(with_mode: bool) -> dict:
    """Five GPU steps whose backward node reads a value on the host (``.item()``: a sync that
    blocks while a 2 ms kernel runs); with the mode, the read is its NaN check."""
    tb = TraceBuilder()
    for i in range(5):
        t = i * 4_000
        tb.step(i + 1, t, 4_000)
        tb.kernel("k_elementwise", t + 10, 2_000, launch_ts=t + 1)
        for j in range(6):  # the step's backward nodes, each checked
            node = t + 5 + j * 5
            tb.op(f"autograd::engine::evaluate_function: MmBackward{j}", node, 4 if j < 5 else 2_000)
            if with_mode:
                tb.op("aten::isnan", node + 1, 1)
        if with_mode:
            tb.op("aten::item", t + 28, 1_990)
        tb.runtime("cudaStreamSynchronize", t + 30, 1_985)
        tb.op("aten::my_preprocess", t + 2_040, 1_500)
    return tb.to_dict()


def test_on_a_gpu_the_checks_syncs_are_this_findings_not_host_syncs():
    """Each NaN check reads its answer on the host: the syncs are the mode's, and host-sync's
    "read values rarely" would be the wrong fix; without the mode, host-sync reports them."""
    r = analyze(_gpu_anomaly(True))
    assert r.finding("anomaly-detection-on") is not None and r.finding("host-sync") is None
    assert r.finding("anomaly-detection-on").why.endswith("one sync per backward node.")
    plain = analyze(_gpu_anomaly(False))
    assert plain.finding("anomaly-detection-on") is None and plain.finding("host-sync") is not None
