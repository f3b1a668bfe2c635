"""The JSON report as a contract: ``Report.to_dict()`` read back with ``report_from_dict`` gives the
same typed records and the same JSON, for every fixture trace and the built ones; old schema-2
reports still load; bad data is one clear error."""

import copy
import glob
import json
import os

import msgspec
import pytest
from test_report_invariants import BUILT
from tracebuilder import DATA

import gpumagic
from gpumagic.report import metrics as rm
from gpumagic.report.model import SCHEMA_VERSION, Report, report_from_dict

FIXTURES = sorted(os.path.relpath(p, DATA) for p in glob.glob(os.path.join(DATA, "**", "*.json.gz"), recursive=True))
_CACHE: dict = {}


def report(name: str) -> Report:
    if name not in _CACHE:
        _CACHE[name] = BUILT[name]() if name in BUILT else gpumagic.analyze(os.path.join(DATA, name))
    return _CACHE[name]


@pytest.mark.parametrize("name", FIXTURES + sorted(BUILT))
def test_to_dict_from_dict_to_dict_is_identical(name):
    r = report(name)
    text = json.dumps(r.to_dict(), indent=2, allow_nan=False)
    back = Report.from_dict(json.loads(text))
    assert json.dumps(back.to_dict(), indent=2, allow_nan=False) == text
    assert back.metrics == r.metrics  # the same typed records, not dicts
    assert back.findings == r.findings and back.notes == r.notes and back.combined_gain == r.combined_gain
    assert isinstance(back.metrics.idle, rm.IdleMetrics) and back.trace is None


def test_every_fixture_is_covered():
    with open(os.path.join(DATA, "EXPECTED.json")) as fh:
        expected = set(json.load(fh))
    assert expected <= set(FIXTURES) and "gpu_check/starved_loader.json.gz" in FIXTURES  # the one with NVML samples


def test_optional_keys_are_absent_as_before():
    """``samples`` and ``memory.nvml_peak_used_bytes`` appear only when samples were recorded."""
    plain = report("resnet50_v100_workers0.json.gz").to_dict()["metrics"]
    assert "samples" not in plain and "nvml_peak_used_bytes" not in plain["memory"]
    sampled = report("gpu_check/starved_loader.json.gz")
    d = sampled.to_dict()["metrics"]
    assert d["samples"]["count"] == sampled.metrics.samples.count > 0
    assert d["memory"]["nvml_peak_used_bytes"] == sampled.metrics.memory.nvml_peak_used_bytes > 0


def test_key_order_is_the_field_order():
    m = report("resnet50_v100_workers0.json.gz").to_dict()["metrics"]
    assert list(m) == [f for f in rm.Metrics.__struct_fields__ if f not in ("samples", "modules", "compile")]
    assert list(m["idle"]) == list(rm.IdleMetrics.__struct_fields__)


def test_a_report_that_measured_nothing():
    empty = Report(metrics=None, findings=[], notes=["another profiler was running"], label="x")
    d = empty.to_dict()
    assert d["metrics"] == {} and d["schema_version"] == SCHEMA_VERSION
    back = report_from_dict(d)
    assert back.metrics is None and back.notes == ["another profiler was running"] and back.label == "x"


def test_an_older_schema_2_report_loads_with_what_it_lacks_as_null():
    """Sections and keys added to schema 2 after it was first written (compute, small_copies,
    gpu.primary_name, the host CPU fields) read as None; keys this version does not know are ignored."""
    d = copy.deepcopy(report("resnet50_v100_workers0.json.gz").to_dict())
    m = d["metrics"]
    del m["compute"], m["small_copies"], m["gpu"]["primary_name"]
    for key in ("usable_cores", "usable_cores_source", "cpu_busy_cores", "cpu_saturation", "loader_cpu_bound"):
        del m["host"][key]
    m["idle"]["from_the_future_ms"] = 1.0
    d["from_the_future"] = True
    back = report_from_dict(d)
    assert back.metrics.compute is None and back.metrics.small_copies is None
    assert back.metrics.gpu.primary_name is None and back.metrics.host.usable_cores_source is None
    assert back.metrics.idle == report("resnet50_v100_workers0.json.gz").metrics.idle
    assert back.finding_ids == report("resnet50_v100_workers0.json.gz").finding_ids


@pytest.mark.parametrize(("data", "message"), [
    ("a string", "a report is a JSON object"),
    ({"metrics": {"trace": 3}}, "not a gpumagic report"),
    ({"metrics": {}, "findings": [{"id": "x"}]}, "not a gpumagic report"),
])
def test_data_of_another_shape_is_one_clear_error(data, message):
    with pytest.raises(ValueError, match=message):
        report_from_dict(data)


def test_a_required_field_missing_that_cannot_be_null_is_an_error():
    d = copy.deepcopy(report("resnet50_v100_workers0.json.gz").to_dict())
    del d["metrics"]["idle"]["total_ms"]
    with pytest.raises(ValueError, match="total_ms"):
        report_from_dict(d)


def test_records_read_by_key_for_dict_style_code_and_refuse_unknown_keys():
    m = report("resnet50_v100_workers0.json.gz").metrics
    assert m["idle"]["host_wait_ms"] == m.idle.host_wait_ms
    assert m["syncs"]["by_name"] == m.syncs.by_name
    with pytest.raises(KeyError, match="host_wait"):
        m["idle"]["host_wait"]  # a typo is an error, never a silent None
    assert m.get("samples") is None and m["copies"]["groups"][0].get("gbps") == m.copies.groups[0].gbps
    assert m.idle.get("no_such_key", 0) == 0  # dict.get


def test_records_are_frozen():
    m = report("resnet50_v100_workers0.json.gz").metrics
    with pytest.raises(AttributeError):
        m.idle.total_ms = 0.0
    changed = msgspec.structs.replace(m.idle, total_ms=0.0)
    assert changed.total_ms == 0.0 and m.idle.total_ms > 0
