"""Every expectation in tests/data/EXPECTED.json (copied from shared/traces) holds."""

import json
import os

import pytest
from recorded import analysed
from tracebuilder import DATA

from gpumagic.analysis.rules.warmup import LEADS_FRAC

with open(os.path.join(DATA, "EXPECTED.json")) as fh:
    EXPECTED = json.load(fh)

CASES = [(f, "fires", i) for f, e in EXPECTED.items() for i in e["fires"]] + \
        [(f, "silent", i) for f, e in EXPECTED.items() for i in e["silent"]]
METRIC_CASES = [(f, path, lo, hi) for f, e in EXPECTED.items() for path, (lo, hi) in e.get("metrics", {}).items()]
_CACHE: dict = {}


def dotted(metrics, path: str):
    """``metrics.a.b`` for the path ``"a.b"`` of EXPECTED.json (a dict level reads its key)."""
    node = metrics
    for key in path.split("."):
        node = node[key]
    return node


def report(name):
    if name not in _CACHE:
        _CACHE[name] = analysed(name)  # shared with the other modules (tests/recorded.py)
    return _CACHE[name]


@pytest.mark.parametrize(("trace", "expect", "finding_id"), CASES)
def test_expected_findings(trace, expect, finding_id):
    ids = report(trace).finding_ids
    if expect == "fires":
        assert finding_id in ids
    else:
        assert finding_id not in ids


@pytest.mark.parametrize("trace", sorted(EXPECTED))
def test_every_trace_is_analysed(trace):
    assert report(trace).metrics["trace"]["events"] > 0


@pytest.mark.parametrize(("trace", "path", "lo", "hi"), METRIC_CASES)
def test_expected_metric_ranges(trace, path, lo, hi):
    value = dotted(report(trace).metrics, path)
    assert value is not None and lo <= value <= hi, f"{path} = {value}"


def test_every_expectation_is_collected():
    """Each fires/silent id and each metric range in the file becomes one check, for every trace."""
    assert len(CASES) == sum(len(e["fires"]) + len(e["silent"]) for e in EXPECTED.values())
    assert len(METRIC_CASES) == sum(len(e.get("metrics", {})) for e in EXPECTED.values())
    assert {f for f, _, _ in CASES} | {f for f, *_ in METRIC_CASES} <= set(EXPECTED)
    assert all(os.path.exists(os.path.join(DATA, f)) for f in EXPECTED)


def test_final_device_synchronize_is_not_harmful():
    """v100_resnet_ns_timestamps ends with one cudaDeviceSynchronize that waits on queued work."""
    s = report("v100_resnet_ns_timestamps.json.gz").metrics.syncs
    assert s.by_name["cudaDeviceSynchronize"].count == 1
    assert s.blocked_ms > 50  # it does block the host for a long time ...
    assert s.harmful_count == 0  # ... but nothing runs on the GPU after it


def test_manifest_facts():
    w0 = report("resnet50_v100_workers0.json.gz").metrics
    w4 = report("resnet50_v100_workers4.json.gz").metrics
    assert 0.25 < w0.host.dataloader_frac < 0.45  # "about a third of every step"
    assert w4.host.dataloader_frac < 0.02
    assert 0.7 < w4.steps.median_ms / w0.steps.median_ms < 0.8  # "about 20 % shorter"
    first = w0.copies.groups[0]
    assert (first.direction, first.memory, first.count) == ("HtoD", "pageable", 12)
    a100 = report("a100_training_rank0.json.gz").metrics
    assert 0.25 < a100.gpu.busy_frac < 0.45  # "busy about a third of the time"
    assert a100.kernels.short_frac > 0.5
    assert a100.syncs.sync_ops["aten::item"] > 100
    ns = report("v100_resnet_ns_timestamps.json.gz").metrics
    assert ns.gpu.busy_frac > 0.9
    big = report("v100_large_216k_events.json.gz").metrics
    assert big.steps.count == 5
    assert 0.15 < big.communication.frac < 0.25
    h100 = report("h100_bert_small_inference.json.gz").metrics
    assert h100.kernels.count == 60
    assert h100.gpu.busy_frac < 0.10


@pytest.mark.parametrize("trace", sorted(EXPECTED))
def test_findings_are_well_formed(trace):
    r = report(trace)
    findings = r.findings
    if findings and findings[0].id == "warmup-in-window" and findings[0].evidence.numbers["warmup_frac"] >= LEADS_FRAC:
        findings = findings[1:]  # warm-up that fills the window leads, though it claims no speed gain
    gains = [f.est_gain for f in findings]
    assert gains == sorted(gains, reverse=True)
    for f in r.findings:
        assert f.severity in ("high", "medium", "low")
        assert f.title and f.why and f.evidence.summary and f.gain_method
        assert 0.0 <= f.est_gain <= 1.0
        assert f.doc_url.startswith("https://") and isinstance(f.doc_url, str)
        assert f.fixes and all(fx.code.strip() for fx in f.fixes)
        assert all(fx.flavor in ("pytorch", "huggingface") for fx in f.fixes)
        for w in f.evidence.windows:
            assert w.start_ns < w.end_ns
    json.loads(r.to_json())  # JSON-clean: no NaN, no numpy scalars
