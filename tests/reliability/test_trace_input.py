"""Hostile trace input (issue 11, items 5, 6, 7, 9, 14): every case loads, or fails with one
:class:`TraceError` line (exit 2 in the CLI), in bounded time and memory, without warnings."""

import gzip
import json
import os
import re
import subprocess
import sys
import warnings
import zlib

import numpy as np
import pytest
from tracebuilder import DATA, TraceBuilder, busy_steps

from gpumagic.analysis import analyze
from gpumagic.errors import TraceError
from gpumagic.trace import decode, files, pieces
from gpumagic.trace.columns import INT64_MAX
from gpumagic.trace.files import read_bytes
from gpumagic.trace.kineto import from_bytes
from gpumagic.trace.model import Kind

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def base() -> dict:
    tb = TraceBuilder()
    busy_steps(tb, 2, 1000, 500)
    return tb.to_dict()


def load(d: dict | bytes, **kw):
    raw = d if isinstance(d, bytes) else json.dumps(d).encode()
    return from_bytes(raw, "t.json", **kw)


def gpu_events(d: dict) -> list[dict]:
    return [e for e in d["traceEvents"] if e.get("cat") == "kernel"]


def one_line_error(fn, match: str) -> str:
    with pytest.raises(TraceError, match=match) as exc:
        fn()
    assert "\n" not in str(exc.value)
    return str(exc.value)


# --- item 5: out-of-range integers are stored wide enough, or read as absent with a note ---------

@pytest.mark.parametrize("tid", [140_234_567_890_123, 2**63 + 5, 2**64 - 1])
def test_64_bit_thread_ids_keep_their_value(tid):
    d = base()
    for e in d["traceEvents"]:
        if e.get("cat") != "kernel":
            e["tid"] = tid
    t = load(d)
    assert tid in {ln.tid for ln in t.lanes}
    assert analyze(t).metrics["steps"]["count"] == 2


def test_wide_pids_devices_and_streams_are_stored_exactly():
    d = base()
    d["traceEvents"][0]["pid"] = 2**40
    for e in gpu_events(d):
        e["args"]["device"] = 2**40 + 3
        e["args"]["stream"] = 4294967295
    t = load(d)
    gpu = np.isin(t.events.kind, [Kind.KERNEL])
    assert set(t.events.device[gpu].tolist()) == {2**40 + 3}
    assert set(t.events.stream[gpu].tolist()) == {4294967295}
    assert 2**40 in {ln.pid for ln in t.lanes}
    analyze(t)


def test_wide_pid_and_tid_pairs_do_not_collide():
    """(pid, tid) pairs are coded as one int64; ids far apart must not wrap into each other."""
    d = base()
    d["traceEvents"][0].update(pid=1, tid=2**62)
    d["traceEvents"][1].update(pid=2**40, tid=1)
    t = load(d)
    keys = [(ln.pid, ln.tid) for ln in t.lanes]
    assert len(keys) == len(set(keys)) and (1, 2**62) in keys and (2**40, 1) in keys


def test_ids_beyond_64_bits_read_as_absent_with_a_note():
    d = base()
    for e in gpu_events(d):
        e["args"]["correlation"] = 2**64 + 1
    d["traceEvents"].append({"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10, "s": "t",
                             "args": {"Device Type": 300, "Device Id": 2**33, "Bytes": 2**70,
                                      "Total Allocated": INT64_MAX, "Total Reserved": 6}})
    t = load(d)
    assert any("beyond 64 bits" in n for n in t.notes)
    assert (t.events.corr[np.isin(t.events.kind, [Kind.KERNEL])] == -1).all()
    assert t.memory.device_type.tolist() == [300] and t.memory.device.tolist() == [2**33]
    assert t.memory.nbytes.tolist() == [-1] and t.memory.allocated.tolist() == [INT64_MAX]
    analyze(t)


def test_rocm_string_numbers_stay_on_the_typed_path(monkeypatch):
    raw = read_bytes(os.path.join(DATA, "mi300_bert_small_infer.json.gz"))
    assert b'"bytes":"1"' in raw.replace(b" ", b"")
    monkeypatch.setattr(decode, "_decode_lenient", lambda *a: pytest.fail("took the lenient path"))
    t = from_bytes(raw, "mi300")
    copy = t.events.nbytes[t.names.index("hipMemcpyWithStream") == t.events.name]
    assert copy.tolist() == [1]


# --- item 5: infinite and huge times; deep nesting; malformed bundle fields ---------------------

@pytest.mark.parametrize(("field", "value"), [("ts", 1e308), ("ts", -1e300), ("dur", 1e308), ("dur", -1e300),
                                              ("ts", 4.5e15)])
def test_times_out_of_range_skip_the_event_with_a_note(field, value):
    d = base()
    d["traceEvents"][3][field] = value
    t = load(d)
    assert any("not a finite number within range" in n for n in t.notes)
    assert len(t.events) == len(base()["traceEvents"]) - 1
    assert t.events.ts_ns.min() == 0 and t.events.ts_ns.max() < 10**12
    analyze(t)


@pytest.mark.parametrize("literal", [b"Infinity", b"-Infinity", b"NaN", b"1e999"])
def test_non_finite_json_numbers_are_one_line(literal):
    raw = json.dumps(base()).replace('"ts": 0.0', '"ts": X', 1).encode().replace(b"X", literal)
    one_line_error(lambda: load(raw), "not valid JSON")


@pytest.mark.parametrize("where", ["events", "header", "bundle", "args", "with_a_trailing_comma"])
def test_json_nested_100000_deep_is_one_line(where):
    deep = b"[" * 100_000 + b"]" * 100_000
    text = json.dumps(base()).encode()
    raw = {"events": b'{"traceEvents": [' + deep + b"]}",
           "header": text[:-1] + b', "x": ' + deep + b"}",
           "bundle": text[:-1] + b', "gpumagic": {"notes": ' + deep + b"}}",
           "args": text.replace(b'"args": {', b'"args": {"deep": ' + deep + b", ", 1),
           # found by the fuzzer: the repair pass (for the comma) meets the nesting
           "with_a_trailing_comma": text[:-1] + b', "x": ' + deep + b",}"}[where]
    one_line_error(lambda: load(raw), "nested too deeply")


BUNDLE_CASES = [
    ({"samples": 5}, "samples are not an object"),
    ({"samples": {"gpu": 3}}, "gpu samples have no valid times"),
    ({"samples": {"gpu": {"t_epoch_ns": "x"}}}, "gpu samples have no valid times"),
    ({"samples": {"gpu": {"t_epoch_ns": [1e300]}}}, "gpu samples have no valid times"),
    ({"samples": {"cpu": {"t_epoch_ns": [[1]]}}}, "cpu samples have no valid times"),
    ({"samples": {"gpu": {"t_epoch_ns": [1, 2], "gpu_util": [1], "power_w": ["a", "b"]}}}, "left out: gpu_util, power_w"),
    ({"clock": 5, "samples": {"cpu": {"t_epoch_ns": [1], "total": [3.0]}}}, "no clock anchor"),
    ({"clock": {"anchor_epoch_ns": 2**80}, "samples": {"cpu": {"t_epoch_ns": [1], "total": [3.0]}}}, "no clock anchor"),
    ({"notes": 5}, "notes are not a list"),
    ({"notes": "abc"}, "notes are not a list"),
    (5, "section is not an object"),
    ({"machine": 5}, "machine facts are not an object"),
    ({"machine": {"usable_cores": "2", "cpu_count": -1}}, "usable_cores"),
    ({"machine": {"cpu_affinity": [0, "x"], "cpu_quota_cores": 1e9}}, "cpu_affinity"),
]


@pytest.mark.parametrize(("bundle", "note"), BUNDLE_CASES)
def test_malformed_bundle_fields_are_left_out_with_a_note(bundle, note):
    d = base()
    d["gpumagic"] = bundle
    t = load(d)
    assert any(note in n for n in t.notes), t.notes
    analyze(t)


def test_operators_with_times_out_of_range_are_left_out_of_the_shapes_table():
    """The second pass over operators' shapes skips the same events the columns skip."""
    d = base()
    for ts in (0.0, 1e308):
        d["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts,
                                 "dur": 5.0, "args": {"Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"]}})
    t = load(d)
    assert t.ops is not None and len(t.ops.name) == 1
    analyze(t)


def test_bundle_label_and_notes_of_other_types():
    d = base()
    d["gpumagic"] = {"label": ["a", 1], "notes": ["kept", 3, {"x": 1}, ""]}
    t = load(d)
    assert t.meta["label"] == "['a', 1]"
    assert "kept" in t.notes and not any("{'x'" in n for n in t.notes)
    assert analyze(t).label == "['a', 1]"


def test_base_time_beyond_int64_is_ignored_with_a_note():
    d = base()
    d["baseTimeNanoseconds"] = 2**80
    t = load(d)
    assert any("baseTimeNanoseconds is out of range" in n for n in t.notes)


# --- item 6: bounded memory: repair, gzip bombs ------------------------------------------------

def nul_bomb(n_bytes: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join([c.compress(block) for _ in range(n_bytes >> 20)] + [c.flush()])


def run_measured(code: str, *args: str) -> tuple[int, str, float, int]:
    """(exit status, stderr, seconds, peak RSS in bytes) of a fresh Python running ``code``."""
    probe = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(p.returncode, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); "
             "sys.stderr.write(p.stderr)")
    out = subprocess.run([sys.executable, "-c", probe, sys.executable, "-c", code, *args], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    code_, secs, rss = out.stdout.split()
    return int(code_), out.stderr, float(secs), int(rss)


@pytest.mark.parametrize(("size", "message"), [(100 << 20, "not valid JSON"), (1 << 30, "inflates to more than 100 times")])
def test_nul_gzip_bombs_end_fast_in_bounded_memory(tmp_path, size, message):
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(nul_bomb(size))
    assert path.stat().st_size < 1.1e6
    status, err, secs, rss = run_measured("import sys; from gpumagic.shells.cli import main; sys.exit(main(sys.argv[1:]))",
                                          "analyze", str(path))
    assert status == 2 and len(err.splitlines()) == 1 and message in err, err
    assert secs < 20 and rss < 1 << 30, (secs, rss)


def test_the_inflation_cap_names_the_ratio_and_the_variable_that_lifts_it(tmp_path, monkeypatch):
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(nul_bomb(8 << 20))
    monkeypatch.setattr(files, "INFLATE_FREE_BYTES", 1 << 20)
    msg = one_line_error(lambda: read_bytes(path), r"inflates to more than 100 times its compressed size \(over \d+:1")
    assert files.INFLATE_ENV in msg
    monkeypatch.setenv(files.INFLATE_ENV, "0")
    assert len(read_bytes(path)) == 8 << 20
    monkeypatch.setenv(files.INFLATE_ENV, "nonsense")  # refused: one warning, and the default cap holds
    with pytest.warns(RuntimeWarning, match="GPUMAGIC_MAX_INFLATE='nonsense' is not a number"):
        one_line_error(lambda: read_bytes(path), "inflates to more than 100 times")


def test_a_real_trace_at_its_ratio_is_read(monkeypatch):
    """The cap leaves real traces alone: the 216k-event fixture compresses 18:1."""
    monkeypatch.setattr(files, "INFLATE_FREE_BYTES", 1 << 20)
    assert len(read_bytes(os.path.join(DATA, "v100_large_216k_events.json.gz"))) > 50e6


def test_multi_member_gzip_and_trailing_padding(tmp_path):
    text = json.dumps(base()).encode()
    half = len(text) // 2
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]) + bytes(512))
    assert bytes(read_bytes(path)) == text


@pytest.mark.parametrize("isize", [0, 1000, "real + 1", "real - 1"])
def test_a_gzip_trailer_that_lies_about_the_size_reads_as_before(tmp_path, isize):
    """The one-call inflation (``mutable=False``) trusts ISIZE only to size its output: when the
    text is not of that size it falls back to inflating step by step, so the outcome is the
    step-by-step one's (``mutable=True``)."""
    text = json.dumps(base()).encode()
    packed = bytearray(gzip.compress(text))
    size = {"real + 1": len(text) + 1, "real - 1": len(text) - 1}.get(isize, isize)
    packed[-4:] = size.to_bytes(4, "little")
    path = tmp_path / "t.json.gz"
    path.write_bytes(bytes(packed))

    def outcome(mutable: bool):
        try:
            return bytes(read_bytes(path, mutable=mutable))
        except TraceError as exc:
            return str(exc)

    assert outcome(False) == outcome(True)  # (ISA-L and zlib check ISIZE: each is an error)


def test_gzip_size_reads_the_trailer_and_never_waits(tmp_path):
    """``files.gzip_size``: the trailer's ISIZE of a gzip file; None for anything else, and for
    a FIFO without opening it (an open would wait for a writer)."""
    import threading

    text = json.dumps(base()).encode()
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(text))
    assert files.gzip_size(gz) == files.gzip_size(str(gz)) == len(text)
    plain = tmp_path / "t.json"
    plain.write_bytes(text)
    tiny = tmp_path / "tiny.json.gz"
    tiny.write_bytes(gzip.compress(text)[:10])  # a gzip header, no trailer
    fifo = tmp_path / "pipe.json.gz"
    os.mkfifo(fifo)
    sizes = {}
    for name, path in {"plain": plain, "tiny": tiny, "missing": tmp_path / "nothing.json.gz", "stdin": "-",
                       "folder": tmp_path, "fifo": fifo}.items():
        reader = threading.Thread(target=lambda n=name, p=path: sizes.__setitem__(n, files.gzip_size(p)), daemon=True)
        reader.start()
        reader.join(timeout=10)
        assert not reader.is_alive(), name
    assert sizes == dict.fromkeys(("plain", "tiny", "missing", "stdin", "folder", "fifo"))


def test_a_bomb_whose_trailer_claims_a_small_size_still_stops_at_the_cap(tmp_path, monkeypatch):
    """The one-call inflation makes at most ISIZE + 1 bytes; a bomb claiming a small size is then
    inflated step by step, and stopped by the cap as any other."""
    packed = bytearray(nul_bomb(64 << 20))  # larger than one step: the cap acts before the trailer is read
    packed[-4:] = (1000).to_bytes(4, "little")
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(bytes(packed))
    monkeypatch.setattr(files, "INFLATE_FREE_BYTES", 1 << 20)
    one_line_error(lambda: read_bytes(path), "inflates to more than 100 times")


def test_plain_zlib_inflates_the_same_when_isal_is_absent(monkeypatch, tmp_path):
    path = os.path.join(DATA, "h100_bert_small_inference.json.gz")
    fast = bytes(read_bytes(path))
    monkeypatch.setattr(files, "_inflate", zlib)
    assert bytes(read_bytes(path)) == fast
    cut = tmp_path / "cut.json.gz"
    with open(path, "rb") as fh:
        cut.write_bytes(fh.read()[:20_000])
    one_line_error(lambda: read_bytes(cut), "truncated or corrupt gzip")


def old_repair(raw: bytes) -> bytes:
    """The repair as one regex pass over the whole text (what the windowed repair must equal)."""
    raw = re.sub(rb",(\s*[\]}])", rb"\1", raw)
    raw = re.sub(rb'\\(?!["\\/bfnrtu])', rb"\\\\", raw)
    return re.sub(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]", b" ", raw)


@pytest.mark.parametrize("window", [1, 2, 3, 7, 64])
def test_windowed_repair_equals_one_pass(monkeypatch, window):
    monkeypatch.setattr(decode, "REPAIR_WINDOW", window)
    samples = [b'{"a": [1, 2 ,  ],\t"b": {"c": "x\\q\\\\y\\"" , } ,}', b"\\\\\\\\x,,, \n]\x00\x01\x1f}",
               b"  ,  ,\n", b"\\", b",", b"ok", json.dumps(base()).replace("}", ", }").encode()]
    for s in samples:
        assert bytes(decode.repair(s)) == old_repair(s), s


# --- item 7: non-regular files; standard input ---------------------------------------------------

def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    one_line_error(lambda: read_bytes(fifo), r"is not a regular file \(a FIFO\)")


def test_dev_zero_is_refused_at_once():
    one_line_error(lambda: read_bytes("/dev/zero"), r"is not a regular file \(a device\)")


def run_cli(*args: str, stdin=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpumagic", *args], stdin=stdin, capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})


def test_dash_reads_standard_input():
    with open(os.path.join(DATA, "h100_bert_small_inference.json.gz"), "rb") as fh:
        p = run_cli("analyze", "-", "--format", "json", stdin=fh)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["metrics"]["trace"]["events"] == 2551


def test_dash_reads_a_pipe_bounded_like_a_file():
    code = ("import sys; from gpumagic.trace.files import read_bytes; raw = read_bytes('-'); "
            "print(len(raw), bytes(raw[:1]).decode())")
    text = json.dumps(base()).encode()
    p = subprocess.run([sys.executable, "-c", code], input=gzip.compress(text), capture_output=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert p.stdout.decode().split() == [str(len(text)), "{"], p.stderr


def test_bad_json_on_standard_input_is_one_line_naming_stdin():
    p = subprocess.run([sys.executable, "-m", "gpumagic", "analyze", "-"], input=b'{"traceEvents": [', capture_output=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 2 and p.stderr.decode().splitlines() == [
        "gpumagic: error: <stdin>: not valid JSON (Input data was truncated)"]


def test_a_device_on_standard_input_is_refused():
    with open("/dev/zero", "rb") as zero:
        p = run_cli("analyze", "-", stdin=zero)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and b"terminal or a device" in p.stderr


# --- item 9: pieces cut only inside traceEvents ----------------------------------------------------

def two_arrays(before: bool) -> bytes:
    """A trace with a second top-level array of event-like objects (before or after traceEvents)."""
    d = base()
    others = [dict(e, name="other-" + e["name"]) for e in d["traceEvents"]] * 3
    events = json.dumps(d["traceEvents"])
    header = {k: v for k, v in d.items() if k != "traceEvents"}
    other = json.dumps(others)
    body = f'"otherEvents": {other}, "traceEvents": {events}' if before else f'"traceEvents": {events}, "otherEvents": {other}'
    return ("{" + json.dumps(header)[1:-1] + ", " + body + "}").encode()


@pytest.mark.parametrize("before", [False, True])
def test_a_cut_in_another_top_level_array_is_refused(monkeypatch, before):
    raw = two_arrays(before)
    other = raw.index(b'"otherEvents"')
    in_other = [m.start() for m in pieces._CUT.finditer(raw) if m.start() > other][5]
    whole = load(raw)
    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 1)
    monkeypatch.setattr(pieces, "ONE_PROCESS_MIN_BYTES", 0)
    for chosen in ([in_other], [raw.index(b"},", raw.index(b'"traceEvents"')) + 1, in_other]):
        if before and len(chosen) > 1:
            continue
        monkeypatch.setattr(pieces, "cuts", lambda raw, n, *span, chosen=chosen: chosen)
        assert pieces.decode_in_pieces(raw, 1) is None
        assert pieces.decode_in_pieces(bytearray(raw), 2) is None
        cut = load(raw, workers=2)
        assert np.array_equal(cut.events.ts_ns, whole.events.ts_ns) and cut.names == whole.names
    assert not any(n.startswith("other-") for n in whole.names)


@pytest.mark.parametrize("before", [False, True])
def test_second_array_same_answer_with_and_without_pieces(monkeypatch, before):
    raw = two_arrays(before)
    whole = analyze(load(raw)).metrics
    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 1)
    monkeypatch.setattr(pieces, "ONE_PROCESS_MIN_BYTES", 0)
    for size in (200, 1000, 5000):
        monkeypatch.setattr(pieces, "PIECE_BYTES", size)
        assert analyze(load(raw, workers=2)).metrics == whole
        assert analyze(load(raw, workers=1)).metrics == whole


# --- item 14: no warnings on valid but odd input ---------------------------------------------------

@pytest.mark.parametrize("case", ["huge_dur", "negative_dur", "no_args", "no_dur", "no_ts", "zero_length_steps"])
def test_odd_but_valid_traces_analyse_without_warnings(case):
    d = base()
    ev = d["traceEvents"]
    if case == "huge_dur":
        ev[2]["dur"] = 9e14
    elif case == "negative_dur":
        for e in ev:
            e["dur"] = -abs(e.get("dur", 1))
    elif case == "no_args":
        for e in ev:
            e.pop("args", None)
    elif case in ("no_dur", "no_ts"):
        for e in ev:
            e.pop(case[3:], None)
    else:
        for e in ev:
            e["dur"] = 0
    analyze(load(d)).to_dict()


def test_memory_args_on_a_duration_event_never_leave_the_typed_path(monkeypatch):
    """The allocator's keys belong to ``[memory]`` instants; on a duration event nothing reads
    them, so the typed decode does not take them (``schema.OpArgs``), and a value there that
    no int could hold no longer sends the whole file to the lenient path."""
    d = base()
    d["traceEvents"][3].setdefault("args", {}).update({"Total Allocated": "n/a", "Device Type": [1]})
    raw = json.dumps(d).encode()
    monkeypatch.setattr(decode, "_decode_lenient", lambda *a: pytest.fail("took the lenient path"))
    t = from_bytes(raw, "mixed")
    assert len(t.events) == len(base()["traceEvents"])
    assert not any("unexpected types" in n for n in t.notes)
