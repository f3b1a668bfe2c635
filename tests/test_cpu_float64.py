"""``cpu-float64``: a CPU-only run whose matrix work computes in float64. On a recorded loop, on
live captures (recorded input types; a float32 model) and on the recorded bundle with one
condition changed at a time."""

from __future__ import annotations

import glob
import gzip
import json
import os

import pytest
import test_cpu_low_precision as tlp
from test_host_cores_idle import _bundle
from tracebuilder import DATA

from gpumagic import analyze
from gpumagic.analysis.rules import cpudouble

ID = "cpu-float64"
RECORDED = os.path.join(DATA, "cpu_float64.json.gz")


def _recorded() -> dict:
    with gzip.open(RECORDED, "rt") as f:
        return json.load(f)


def test_a_recorded_float64_loop():
    """benchmarks/cpu_float64.py --record: an MLP of 1024-wide layers made float64 with .double(),
    Adam; unprofiled, 2.65x slower than the same loop in float32 (a saving of 0.62)."""
    f = analyze(RECORDED).finding(ID)
    n = f.evidence.numbers
    assert n["float64_params_frac"] == 1.0 and n["float64_calls"] == 0  # no shapes recorded: the parameters say it
    assert n["long_matrix_calls_frac"] >= cpudouble.MIN_MATRIX_FRAC
    assert f.est_gain == n["host_ops_frac"] >= n["matrix_ops_frac"] and f.gain_method.startswith("upper bound")
    assert "model = model.float()" in f.fixes[0].code and "x = x.float()" in f.fixes[0].code
    assert "optimizer's parameter elements are float64" in f.evidence.summary


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz"))) - {RECORDED}))
def test_silent_on_every_other_recorded_trace(path):
    assert analyze(path).finding(ID) is None


@pytest.mark.parametrize(("why", "elements"), [
    ("the parameters are float32", {"float32": 1_312_266}),
    ("under half of the elements are float64", {"float32": 700_000, "float64": 600_000}),
    ("not recorded (a bundle from before, or no optimizer step)", None),
    ("not a count", {"float64": "many"}),
])
def test_silent_when_the_parameters_do_not_say_float64(why, elements):
    d = _recorded()
    d["gpumagic"]["capture"]["optimizer_parameter_elements"] = elements
    assert ID not in analyze(d).finding_ids, why


def _built(elements: dict | None = None, **kwargs) -> dict:
    """Five 25 ms CPU steps, each one ``aten::addmm`` call (test_host_cores_idle's bundle), with
    the parameters' elements by dtype as a capture records them."""
    d = _bundle(100.0, 100.0, 100.0, **kwargs)
    d["gpumagic"]["capture"]["optimizer_parameter_elements"] = {"float64": 4096} if elements is None else elements
    return d


def test_a_built_float64_loop_fires():
    f = analyze(_built()).finding(ID)
    assert f is not None and f.evidence.numbers["long_matrix_calls_frac"] > 0.7


@pytest.mark.parametrize(("why", "kwargs"), [
    ("calls of 40 µs: a call's fixed cost, which float32 does not shorten (a tiny MLP measured 0.98x)",
     {"op_us": 40}),
    ("a GPU run: mixed-precision-off reads the float64 kernels there", {"gpu": True}),
    ("float32 parameters", {"elements": {"float32": 4096}}),
])
def test_a_built_loop_stays_silent_when_a_condition_fails(why, kwargs):
    assert ID not in analyze(_built(**kwargs)).finding_ids, why


@pytest.mark.parametrize("training", [True, False])
def test_recorded_input_types_say_it_with_or_without_an_optimizer(training):
    """Shapes recorded (``Input type``): the matrix calls' first inputs are ``double``; in an
    inference window, where no optimizer holds the parameters, the types alone say it."""
    f = analyze(tlp.bundle(tlp.AVX2, autocast=False, typed="double", training=training)).finding(ID)
    assert f.evidence.numbers["float64_calls"] == f.evidence.numbers["typed_calls"] == 5
    assert ("inference_mode" in f.fixes[0].code) is not training
    assert ID not in analyze(tlp.bundle(tlp.AVX2, autocast=False, typed="float", training=training)).finding_ids


def test_live_recorded_input_types_and_a_float32_model():
    """With shapes recorded, the matrix calls' input types say float64 (inference: no optimizer
    to read parameters from); the same model in float32 is silent."""
    torch = pytest.importorskip("torch")
    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    x = torch.randn(256, 512)
    reports = {}
    for dtype in (torch.float64, torch.float32):
        model, x = model.to(dtype), x.to(dtype)
        with gpumagic.profile(display=False, shapes=True) as run, torch.inference_mode():
            for _ in range(5):
                model(x)
        reports[dtype] = run.report
    f = reports[torch.float64].finding(ID)
    assert f is not None and f.evidence.numbers["float64_calls"] == f.evidence.numbers["typed_calls"] >= 10
    assert "inference_mode" in f.fixes[0].code and "model(x.float())" in f.fixes[0].code
    assert ID not in reports[torch.float32].finding_ids
