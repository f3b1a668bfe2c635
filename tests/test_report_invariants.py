"""Issue 10's invariants, over every real fixture trace and a set of built ones: gains within
``combined_gain``, idle-type gains within the idle share, no CUDA advice in CPU-only reports, no
training advice in inference reports, and the numbers a finding quotes equal the metrics they
come from."""

import json
import os

import pytest
from recorded import analysed
from test_diagnoses import _gap_trace, _loader_trace, _sync_step_trace, _tiny_kernels, _with_samples
from tracebuilder import DATA, TraceBuilder

import gpumagic
from gpumagic.analysis.gains import IDLE_TYPE, OTHER_TIME_BASED

with open(os.path.join(DATA, "EXPECTED.json")) as fh:
    REAL = sorted(json.load(fh))
BUILT = {
    "sync": lambda: gpumagic.analyze(_sync_step_trace(20, 1_990).to_dict()),
    "gap": lambda: gpumagic.analyze(_gap_trace(100, "cudaStreamWaitEvent").to_dict()),
    "tiny": lambda: gpumagic.analyze(_tiny_kernels(False).to_dict()),
    "graph": lambda: gpumagic.analyze(_tiny_kernels(True).to_dict()),
    "loader-train": lambda: gpumagic.analyze(_loader_trace(True).to_dict()),
    "loader-infer": lambda: gpumagic.analyze(_loader_trace(False).to_dict()),
    "loader-cpu": lambda: gpumagic.analyze(_loader_trace(True, gpu=False).to_dict()),
    "saturated": lambda: _with_samples(_loader_trace(True), 96.0, 100.0),
    "saturated-cpu": lambda: _with_samples(_loader_trace(True, gpu=False), 96.0, 100.0),
    "spare-cores": lambda: _with_samples(_loader_trace(False), 30.0, 100.0, usable=8),
}
_CACHE: dict = {}


def dotted(metrics, path: str):
    """``metrics.a.b`` for the path ``"a.b"`` of EXPECTED.json (a dict level reads its key)."""
    node = metrics
    for key in path.split("."):
        node = node[key]
    return node


def report(name):
    if name not in _CACHE:
        _CACHE[name] = BUILT[name]() if name in BUILT else analysed(name)  # tests/recorded.py: once per process
    return _CACHE[name]


ALL = REAL + sorted(BUILT)
#: finding id -> {number key: metric path} for the numbers a finding quotes from the metrics.
QUOTED = {
    "dataloader-bound": {"dataloader_ms": "host.dataloader_ms", "dataloader_frac": "host.dataloader_frac",
                         "cpu_busy_cores": "host.cpu_busy_cores", "usable_cores": "host.usable_cores"},
    "host-sync": {"sync_calls": "syncs.count", "harmful_syncs": "syncs.harmful_count",
                  "harmful_blocked_ms": "syncs.harmful_blocked_ms", "starved_ms": "syncs.starved_ms"},
    "launch-bound": {"kernels": "kernels.count", "short_kernel_frac": "kernels.short_frac",
                     "median_kernel_us": "kernels.median_us", "gpu_busy_frac": "gpu.busy_frac"},
    "cpu-bound": {"host_wait_ms": "idle.host_wait_ms"},
    "gpu-idle-gaps": {"long_gaps": "idle.long_gap_count", "long_gap_ms": "idle.long_gap_ms"},
    "low-gpu-utilization": {"busy_frac": "gpu.busy_frac", "idle_ms": "idle.total_ms",
                            "host_wait_ms": "idle.host_wait_ms", "launch_latency_ms": "idle.launch_latency_ms",
                            "other_ms": "idle.other_ms"},
    "mixed-precision-off": {"matmul_ms": "kernels.matmul_ms", "matmul_tensor_core_ms": "kernels.matmul_tensor_core_ms"},
    "communication-heavy": {"nccl_kernels": "communication.count", "comm_ms": "communication.ms",
                            "comm_frac": "communication.frac", "exposed_frac": "communication.exposed_frac"},
    "memory-pressure": {"peak_frac": "memory.peak_frac", "capacity_bytes": "memory.capacity_bytes"},
    "host-cpu-saturated": {"cpu_saturation": "host.cpu_saturation", "busy_cores": "host.cpu_busy_cores",
                           "usable_cores": "host.usable_cores"},
}
CUDA_WORDS = ("pin_memory", "non_blocking", ".cuda(", 'device="cuda"', 'device_type="cuda"', "CUDAGraph",
              "reduce-overhead", "decode_jpeg")
TRAINING_WORDS = ("training loop", "TrainingArguments", "optimizer", "Optimizer", "GradScaler", "backward",
                  "shuffle=True", "gradient")


@pytest.mark.parametrize("name", ALL)
def test_gains_fit_within_combined_gain(name):
    r = report(name)
    assert 0.0 <= r.combined_gain <= 1.0
    for f in r.findings:
        assert f.est_gain <= r.combined_gain + 1e-9, f.id
    assert r.to_dict()["combined_gain"] == r.combined_gain


def _combined_of_listed(r) -> float:
    """What the listed findings' gains combine to: time-based gains (idle-type, and the exposed
    communication) add, being disjoint or counted once; the others multiply, each on what is left."""
    timed = sum(f.est_gain for f in r.findings if f.id in IDLE_TYPE or f.id in OTHER_TIME_BASED)
    keep = 1.0 - min(1.0, timed)
    for f in r.findings:
        if f.id not in IDLE_TYPE and f.id not in OTHER_TIME_BASED:
            keep *= 1.0 - f.est_gain
    return 1.0 - keep


@pytest.mark.parametrize("name", ALL)
def test_combined_gain_is_no_more_than_the_listed_findings_give(name):
    """"Fixing all could save" counts what the checklist's gains count: not the whole time a
    finding claimed when its gain is an estimate or capped below it, nor the rest of a symptom
    that was dropped from the list (the ResNet-50 trace's combined gain was 0.5148 for findings
    that give 0.5121; four built traces 0.502 for 0.487)."""
    r = report(name)
    assert r.combined_gain <= _combined_of_listed(r) + 1e-3


def test_combined_gain_of_an_estimate_is_the_estimate():
    """A CPU-only loop whose loader takes 8 ms of each 10 ms step, on 2 cores of which another
    process keeps half of one busy: the one worker they allow would hide only what the step's own
    2 ms allow, about 20 %. "Fixing all" said 80 % (the whole wait the finding claimed) beside that
    finding's 20 %."""
    tb = TraceBuilder(cc=None)
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.dataloader(t, 8_000)
        tb.op("aten::addmm", t + 8_050, 1_500)
        tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 9_600, 300)
    r = _with_samples(tb, 75.0, 100.0, usable=2)
    assert r.metrics["host"]["dataloader_frac"] == pytest.approx(0.8)
    (f,) = r.findings
    assert f.id == "dataloader-bound" and f.gain_method.startswith("estimate") and f.est_gain < 0.5
    assert r.combined_gain == pytest.approx(f.est_gain)


@pytest.mark.parametrize("name", ALL)
def test_idle_type_gains_fit_within_the_idle_share(name):
    r = report(name)
    busy = r.metrics["gpu"]["busy_frac"]
    if busy is None:  # CPU only: no GPU idle share
        return
    total = sum(f.est_gain for f in r.findings if f.id in IDLE_TYPE)
    assert total <= 1.0 - busy + 1e-3


@pytest.mark.parametrize("name", ALL)
def test_no_cuda_advice_in_cpu_only_reports(name):
    r = report(name)
    if not r.metrics["trace"]["cpu_only"]:
        return
    text = "\n".join(fx.description + "\n" + fx.code for f in r.findings for fx in f.fixes)
    for word in CUDA_WORDS:
        assert word not in text, word


@pytest.mark.parametrize("name", ALL)
def test_no_training_advice_in_inference_reports(name):
    r = report(name)
    if r.metrics["trace"]["workload"] != "inference":
        return
    text = "\n".join([f.title for f in r.findings]
                     + [fx.description + "\n" + fx.code for f in r.findings for fx in f.fixes])
    for word in TRAINING_WORDS:
        assert word not in text, word


@pytest.mark.parametrize("name", ALL)
def test_quoted_numbers_equal_their_metrics(name):
    r = report(name)
    for f in r.findings:
        for key, path in QUOTED.get(f.id, {}).items():
            if key in f.evidence.numbers:
                assert f.evidence.numbers[key] == dotted(r.metrics, path), (f.id, key)


@pytest.mark.parametrize("name", ALL)
def test_severity_follows_the_gain(name):
    from gpumagic.analysis.rules.base import severity_for

    for f in report(name).findings:
        if f.id in IDLE_TYPE:
            assert f.severity == severity_for(f.est_gain), f.id


@pytest.mark.parametrize("name", ALL)
def test_worker_advice_never_exceeds_the_usable_cores_when_loading_is_cpu_work(name):
    r = report(name)
    f = r.finding("dataloader-bound")
    cores = r.metrics["host"]["usable_cores"]
    if f is None or cores is None or r.metrics["host"]["loader_cpu_bound"] is False:
        return
    assert f.evidence.numbers.get("suggested_num_workers", 0) <= cores


def test_the_same_gaps_have_the_same_numbers_everywhere():
    r = report("event_sync_multistream.json.gz")
    f = r.finding("gpu-idle-gaps")
    i = r.metrics["idle"]
    assert f.title.startswith(f"{i['long_gap_count']} GPU idle gap") and f"total {i['long_gap_ms']:.1f} ms" in f.evidence.summary
    assert f.evidence.numbers["long_gaps"] == i["long_gap_count"] == 1


@pytest.mark.parametrize("name", ALL)
def test_every_fix_is_valid_python(name):
    """Fixes get pasted into training loops: each parses (IPython magic lines aside)."""
    import ast

    for f in report(name).findings:
        for fx in f.fixes:
            code = "\n".join(line for line in fx.code.splitlines() if not line.lstrip().startswith("%"))
            ast.parse(code)  # `TrainingArguments(..., x=1)` is valid: the Ellipsis stands for your arguments
