"""Valid traces at the edges: zero-length steps, huge and negative durations, missing fields.

Any pair compares (no division by zero, exit 0 from ``gpumagic compare``), and analysing or
rendering them prints nothing on stderr: every warning is an error here (numpy RuntimeWarning,
matplotlib UserWarning).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from tracebuilder import TraceBuilder, busy_steps

from gpumagic import analyze, compare
from gpumagic.shells.cli import main
from gpumagic.trace.kineto import from_bytes

pytestmark = pytest.mark.filterwarnings("error")


def _steps(**kw) -> TraceBuilder:
    tb = TraceBuilder(**kw)
    busy_steps(tb, 4, 1000.0, 200.0)
    return tb


def _zero_steps() -> TraceBuilder:
    tb = TraceBuilder()
    for i in range(4):
        tb.step(i + 1, i * 100.0, 0.0)
        tb.kernel("k", i * 100.0 + 10.0, 5.0)
    return tb


def _edit(tb: TraceBuilder, edit) -> TraceBuilder:
    for e in tb.events:
        edit(e)
    return tb


def _variants() -> dict[str, TraceBuilder]:
    v = {"normal": _steps(), "zero-length-steps": _zero_steps()}
    tb = TraceBuilder()
    tb.step(1, 0.0, 0.0)
    v["one-zero-step"] = tb
    tb = TraceBuilder()
    busy_steps(tb, 4, 0.0, 0.0)
    v["all-zero"] = tb
    tb = _steps()
    tb.kernel("huge", 10.0, 1e15)
    v["huge-kernel"] = tb
    tb = _steps()
    tb.kernel("negative", 10.0, -500.0)
    v["negative-kernel"] = tb
    tb = _steps()
    tb.step(9, 5000.0, -100.0)
    v["negative-step"] = tb
    tb = TraceBuilder()
    busy_steps(tb, 4, 1e12, 200.0)
    v["huge-steps"] = tb
    tb = _steps()
    tb.memcpy("Memcpy HtoD", 50.0, 0.0, 0)
    tb.memcpy("Memcpy DtoH", 60.0, 10.0, 10**15)
    v["copies-zero-and-huge"] = tb
    tb = _steps()
    tb.memory(5.0, -10, -10)
    tb.memory(15.0, 10**18, 10**18)
    v["memory-extremes"] = tb
    tb = TraceBuilder(cc=None)
    tb.op("aten::x", 0.0, 0.0)
    v["cpu-one-zero-op"] = tb
    v["kernels-without-dur"] = _edit(_steps(), lambda e: e.pop("dur") if e.get("cat") == "kernel" else None)
    v["no-args"] = _edit(_steps(), lambda e: e.pop("args", None))
    tb = TraceBuilder()
    tb.devices = [{"id": 0}]
    busy_steps(tb, 3, 1000.0, 0.0)
    v["bare-device-zero-kernels"] = tb
    return v


VARIANTS = _variants()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("edges")
    return {name: tb.write(folder / f"{name}.json") for name, tb in VARIANTS.items()}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_analysing_and_rendering_is_quiet(name):
    report = analyze(from_bytes(json.dumps(VARIANTS[name].to_dict()).encode(), name))
    report.to_text()
    report.to_json()
    report.to_html()  # the static report draws the timeline too
    report.timeline()


@pytest.mark.parametrize("before, after", list(itertools.product(sorted(VARIANTS), repeat=2)))
def test_any_pair_compares(before, after, files, capsys):
    assert main(["compare", files[before], files[after], "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ratio = data["step_time_ratio"]
    assert ratio is None or ratio > 0
    assert data["speedup"] is None or data["speedup"] == pytest.approx(1 / ratio, rel=1e-3, abs=1e-4)  # both rounded to 4 decimals


def test_zero_length_steps_say_why_step_times_do_not_compare(files, capsys):
    assert main(["compare", files["normal"], files["zero-length-steps"]]) == 0
    out = capsys.readouterr()
    assert "Step times cannot be compared: a run's median step lasts no time." in out.out
    assert out.err == ""


@pytest.mark.parametrize("before, after", [("normal", "zero-length-steps"), ("zero-length-steps", "all-zero"),
                                           ("huge-steps", "negative-step")])
def test_every_view_of_an_edge_comparison(before, after, files):
    cmp = compare(Path(files[before]), Path(files[after]))
    cmp.to_text()
    cmp.to_html()
    assert set(cmp.to_dict()) >= {"step_time_ratio", "verdict"}


def test_an_ignored_base_time_is_ignored_by_the_operator_table_too():
    """A baseTimeNanoseconds past int64's safe range is ignored (with a note) by the loader; the
    shapes pass must use the same origin, not cast an overflowed time (found by the fuzzer)."""
    import warnings

    tb = TraceBuilder()
    busy_steps(tb, 4, 1000.0, 400.0)
    tb.add(cat="cpu_op", name="aten::mm", ts=10.0, dur=5.0,
           args={"Input Dims": [[2, 2], [2, 2]], "Input type": ["float", "float"]})
    doc = tb.to_dict() | {"baseTimeNanoseconds": 2**63 - 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = from_bytes(json.dumps(doc).encode(), "x.json")
    assert trace.ops is not None and abs(int(trace.ops.ts_ns[0])) < 10**12  # µs 10 of a trace that starts at 0
    assert any("baseTimeNanoseconds is out of range" in n for n in trace.notes)


@pytest.mark.parametrize("value", [3, [1], "x", None])
def test_bundle_blocks_of_the_wrong_type_read_as_unknown(value):
    """A hand-edited bundle whose capture, versions or machine block is not an object: the run's
    conditions are unknown (null), the report is made (found by the fuzzer after issue 21's merge)."""
    import gzip

    from tracebuilder import DATA

    with gzip.open(Path(DATA) / "h100_bert_small_inference.json.gz") as fh:
        d = json.load(fh)
    d["gpumagic"] = {"capture": value, "versions": value, "machine": value}
    report = analyze(d)
    assert report.metrics is not None and report.metrics.conditions.torch is None
    assert report.metrics.conditions.capture_options is None
