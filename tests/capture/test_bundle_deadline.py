"""The bundle writer (splice, rename, save) and the time-cap deadline."""

from __future__ import annotations

import gzip
import json
import threading
import time

import pytest

from gpumagic.capture import bundle
from gpumagic.capture.deadline import Deadline

KINETO = b'\n{\n  "schemaVersion": 1,\n  "traceEvents": [\n  {"ph": "X", "cat": "user_annotation", ' \
         b'"name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0},\n' \
         b'  {"ph": "X", "cat": "gpu_user_annotation", "name":"ProfilerStep#7", "pid": 0, "tid": 7, "ts": 11.0, ' \
         b'"dur": 3.0},\n  {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#70", "pid": 1, "tid": 1, ' \
         b'"ts": 20.0, "dur": 1.0}\n]}\n'


def _section(**extra):
    return bundle.make_section(label="run", notes=["n1"], capture={"skip": 1}, machine={"os": "Linux"},
                               versions={"torch": "2"}, anchor_epoch_ns=123,
                               samples={"cpu": {"t_epoch_ns": [1], "total": [5.0]}, "gpu": {}}, **extra)


def test_splice_adds_the_gpumagic_key_and_keeps_the_trace():
    data = json.loads(bundle.splice(KINETO, _section()))
    assert data["schemaVersion"] == 1 and len(data["traceEvents"]) == 3
    gm = data["gpumagic"]
    assert gm["format"] == bundle.BUNDLE_FORMAT and gm["label"] == "run" and gm["notes"] == ["n1"]
    assert gm["clock"] == {"anchor_epoch_ns": 123, "anchor_name": "gpumagic::clock_anchor"}
    assert gm["samples"] == {"cpu": {"t_epoch_ns": [1], "total": [5.0]}}  # the empty gpu block is left out


def test_splice_into_an_empty_object_and_refusal_of_non_objects():
    assert json.loads(bundle.splice(b"{ }", {"a": 1})) == {"gpumagic": {"a": 1}}
    with pytest.raises(ValueError, match="not a JSON object"):
        bundle.splice(b"[1, 2]", {"a": 1})


def test_splice_refuses_nan():
    with pytest.raises(ValueError):
        bundle.splice(KINETO, {"x": float("nan")})


def test_rename_partial_step_renames_cpu_and_gpu_copies_only():
    renamed = json.loads(bundle.rename_partial_step(KINETO, "ProfilerStep#7", 7))
    names = [e["name"] for e in renamed["traceEvents"]]
    assert names == ["gpumagic::partial_step#7", "gpumagic::partial_step#7", "ProfilerStep#70"]


def test_write_plain_and_gzip(tmp_path):
    data = bundle.splice(KINETO, _section())
    plain = bundle.write(tmp_path / "run.json", data)
    packed = bundle.write(tmp_path / "run.json.gz", data)
    assert plain.read_bytes() == data
    assert gzip.decompress(packed.read_bytes()) == data
    assert packed.stat().st_mode & 0o777 == bundle.SAVED_FILE_MODE
    assert not list(tmp_path.glob(".gpumagic-*"))  # no temporary file left


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p, "is a directory"),
    (lambda p: p / "missing" / "x.json", "does not exist"),
])
def test_check_target_explains_bad_paths(tmp_path, make, fragment):
    with pytest.raises(ValueError, match=fragment):
        bundle.check_target(make(tmp_path))


def test_the_saved_bundle_loads_with_samples_aligned_by_the_anchor(tmp_path):
    from gpumagic.trace import load

    anchor_epoch = 1_000_000_000_000
    raw = (b'{"baseTimeNanoseconds": 0, "traceEvents": ['
           b'{"ph": "X", "cat": "user_annotation", "name": "gpumagic::clock_anchor", "pid": 1, "tid": 1, '
           b'"ts": 500.0, "dur": 1.0},'
           b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 400.0, "dur": 300.0}]}')
    section = bundle.make_section(label="x", notes=[], capture={}, machine={}, versions={},
                                  anchor_epoch_ns=anchor_epoch,
                                  samples={"cpu": {"t_epoch_ns": [anchor_epoch + 50_000], "total": [12.5]}})
    path = bundle.write(tmp_path / "b.json.gz", bundle.splice(raw, section))
    trace = load(path)
    # the anchor starts 100 us after the trace origin; the sample 50 us after the anchor
    assert trace.samples.cpu["t_ns"].tolist() == [150_000]
    assert trace.samples.cpu["total"].tolist() == [12.5]


def test_deadline_runs_the_callback_on_the_main_thread():
    ran = []
    deadline = Deadline(0.05, lambda: ran.append(threading.current_thread() is threading.main_thread()))
    assert deadline.start() and deadline.armed
    t0 = time.monotonic()
    while not ran and time.monotonic() - t0 < 5:
        sum(range(1000))  # Python code: the pending call runs between bytecodes
    deadline.cancel()
    assert ran == [True] and deadline.fired


def test_a_cancelled_deadline_never_fires_and_leaves_no_thread():
    ran = []
    deadline = Deadline(0.05, lambda: ran.append(1))
    deadline.start()
    deadline.cancel()
    deadline.cancel()
    time.sleep(0.1)
    sum(range(1000))
    assert ran == [] and not deadline.armed


def test_deadline_refuses_to_arm_off_the_main_thread():
    result = []
    t = threading.Thread(target=lambda: result.append(Deadline(1.0, lambda: None).start()))
    t.start()
    t.join()
    assert result == [False]
