"""The published JSON Schemas (``gpumagic schema KIND``): generated from the typed records, committed
in docs/schema/, and every JSON output of the fixtures validates against its schema."""

import glob
import json
import os
from pathlib import Path

import jsonschema
import pytest
from jobbuilder import build_job
from tracebuilder import DATA

import gpumagic
from gpumagic.report import metrics as rm
from gpumagic.report.model import SCHEMA_VERSION, Report
from gpumagic.shells.cli import main
from gpumagic.shells.cli.schema import SCHEMAS, schema, schema_text
from gpumagic.tuning.comparison import compare
from gpumagic.tuning.history import HistoryStore

DOCS = Path(__file__).resolve().parents[1] / "docs" / "schema"
FIXTURES = sorted(glob.glob(os.path.join(DATA, "**", "*.json.gz"), recursive=True))


def validator(kind: str) -> jsonschema.Draft202012Validator:
    s = schema(kind)
    jsonschema.Draft202012Validator.check_schema(s)
    return jsonschema.Draft202012Validator(s)


def check(kind: str, data) -> None:
    errors = sorted(validator(kind).iter_errors(json.loads(json.dumps(data))), key=lambda e: list(e.path))
    assert not errors, [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:5]]


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_the_committed_schema_is_what_the_code_generates(kind):
    committed = DOCS / f"{kind}.schema.json"
    assert committed.read_text(encoding="utf-8") == schema_text(kind), (
        f"regenerate it: python -m gpumagic schema {kind} > docs/schema/{kind}.schema.json")


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_each_schema_is_draft_2020_12_and_carries_the_schema_version(kind):
    s = schema(kind)
    assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert s["x-gpumagic-schema-version"] == SCHEMA_VERSION
    jsonschema.Draft202012Validator.check_schema(s)


def test_the_report_schema_pins_schema_version():
    record = schema("report")["$defs"]["ReportRecord"]
    assert record["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    assert set(record["required"]) == {"schema_version", "label", "combined_gain", "regression", "metrics", "findings", "notes"}


def test_every_metrics_field_is_described():
    """Each section's record and each of its properties says what it is (with its unit)."""
    defs = schema("report")["$defs"]
    sections = {n for n, v in vars(rm).items() if isinstance(v, type) and issubclass(v, rm.Record) and v is not rm.Record}
    assert {"IdleMetrics", "SyncMetrics", "ComputeMetrics", "SampleMetrics"} <= sections <= set(defs)
    for name in sections:
        assert defs[name].get("description"), name
        for key, prop in defs[name]["properties"].items():
            described = prop.get("description") or defs.get(prop.get("$ref", "").rsplit("/", 1)[-1], {}).get("description")
            assert described, f"{name}.{key}"


def test_optional_sections_are_nullable_and_not_required():
    m = schema("report")["$defs"]["Metrics"]
    assert "samples" not in m["required"] and {"type": "null"} in m["properties"]["samples"]["anyOf"]
    assert "compute" in m["required"] and {"type": "null"} in m["properties"]["compute"]["anyOf"]
    memory = schema("report")["$defs"]["MemoryMetrics"]
    assert "nvml_peak_used_bytes" not in memory["required"]


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_every_fixture_report_validates(path):
    check("report", gpumagic.analyze(path).to_dict())


def test_a_report_that_measured_nothing_validates():
    check("report", Report(metrics=None, findings=[], notes=["nothing"]).to_dict())


def test_a_report_of_another_shape_does_not_validate():
    d = gpumagic.analyze(FIXTURES[0]).to_dict()
    d["metrics"]["idle"]["total_ms"] = "12 ms"
    assert list(validator("report").iter_errors(d))
    del d["metrics"]["idle"]
    assert list(validator("report").iter_errors(d))


def test_a_job_validates(tmp_path):
    paths = [str(p) for p in build_job(tmp_path / "job", ranks=2)] + [str(tmp_path / "job" / "rank5.json.gz")]
    job = gpumagic.analyze_job(paths)
    data = job.to_dict()
    assert data["job"]["errors"]  # the missing rank file is listed
    check("job", data)


def test_a_comparison_validates():
    before, after = (os.path.join(DATA, f"resnet50_v100_workers{n}.json.gz") for n in (0, 4))
    check("comparison", compare(gpumagic.analyze(before), gpumagic.analyze(after)).to_dict())


def test_a_line_of_runs_export_validates(tmp_path):
    store = HistoryStore(tmp_path / "history.sqlite3")
    store.add(gpumagic.analyze(FIXTURES[0]), label="a", options={"steps": 3})
    store.add(Report(metrics=None, findings=[], notes=["nothing measured"]), label="b")
    rows = list(store.export_rows())
    assert len(rows) == 2
    for row in rows:
        check("run", row)


def test_the_cli_prints_the_report_schema_by_default(capsys):
    assert main(["schema"]) == 0
    assert capsys.readouterr().out == schema_text("report")
    assert main(["schema", "comparison"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "gpumagic comparison"


def test_the_cli_refuses_an_unknown_kind(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["schema", "nope"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err
