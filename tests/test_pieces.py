"""Decoding a large trace in pieces by forked processes gives exactly what one process gives,
or falls back to one process; it leaves no child behind."""

import dataclasses
import gzip
import json
import os
import re
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from processes import children
from tracebuilder import DATA, TraceBuilder, busy_steps

from gpumagic import _forked
from gpumagic.errors import TraceError
from gpumagic.trace import kineto, pieces, schema
from gpumagic.trace.files import Progress, read_bytes
from gpumagic.trace.kineto import from_bytes
from gpumagic.trace.model import Kind

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pieces are decoded by fork on Linux only")


def assert_same(a, b):
    for table in ("events", "memory"):
        x, y = getattr(a, table), getattr(b, table)
        for f in dataclasses.fields(x):
            u, v = getattr(x, f.name), getattr(y, f.name)
            assert u.dtype == v.dtype and np.array_equal(u, v), f"{table}.{f.name}"
    assert a.names == b.names
    assert a.lanes == b.lanes
    assert a.devices == b.devices
    assert a.origin_ns == b.origin_ns
    assert a.meta == b.meta
    assert a.notes == b.notes


def assert_same_part(a, b, where="part"):
    """Two values equal all the way down (dataclasses, dicts, numpy arrays: dtype and values),
    each array of ``a`` aligned and writeable, as the analysis may write into a column."""
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b) and a.flags.aligned and a.flags.writeable, where
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same_part(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_part(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert a == b, where


@pytest.fixture(autouse=True)
def _children_before():
    """The children that other tests of this worker process left running (an xdist worker runs
    several modules): the decoder's own must be gone after each call, those are not its."""
    global _BEFORE
    _BEFORE = children()
    yield


_BEFORE: set[int] = set()


def no_children_left():
    """Every process the decoder forked is gone and reaped: no child beyond those before the test."""
    assert children() <= _BEFORE, f"children left: {sorted(children() - _BEFORE)}"


@pytest.fixture
def small_pieces(monkeypatch):
    """Let even a small file be cut, into pieces of about 1 MB (the real minimum is 8 MB a
    piece, the real size 32 MB)."""
    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 1)
    monkeypatch.setattr(pieces, "PIECE_BYTES", 1 << 20)
    monkeypatch.setattr(pieces, "ONE_PROCESS_MIN_BYTES", 0)
    monkeypatch.setattr(kineto, "THREADED_MIN_EVENTS", 0)  # workers > 1: the columns put in order on threads


@pytest.mark.parametrize("name", ["a100_training_rank0.json.gz", "resnet50_v100_workers0.json.gz",
                                  "v100_resnet_ns_timestamps.json.gz", "h100_bert_small_inference.json.gz"])
@pytest.mark.parametrize("workers", [1, 2, 5])
@pytest.mark.parametrize("mutable", [False, True])
def test_pieces_give_the_same_trace(small_pieces, name, workers, mutable):
    path = os.path.join(DATA, name)
    raw = read_bytes(path, mutable=mutable)
    before = bytes(raw)
    assert pieces.decode_in_pieces(raw, workers) is not None  # really cut, not a fallback
    assert_same(from_bytes(raw, path, workers=workers), from_bytes(before, path))
    assert bytes(raw) == before  # a bytearray cut in place is put back
    no_children_left()


def test_pieces_with_odd_events_give_the_same_trace(small_pieces):
    """Negative durations, GPU events without device or stream ids (their lane's stand in), and
    starts equal across pieces (a stable sort keeps file order) come out as from one process."""
    with gzip.open(os.path.join(DATA, "resnet50_v100_workers0.json.gz")) as fh:
        doc = json.load(fh)
    events = doc["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "Kernel"]  # a 2021 trace: streams are "stream 7" lanes
    for i, e in enumerate(kernels[::7]):
        e["args"].pop("device", None)
        if i % 2:
            e["args"].pop("stream", None)
    for e in kernels[3::11]:
        e["dur"] = -0.5
    timed = [e for e in events if e.get("ph") == "X"]
    for a, b in zip(timed[:200], timed[-200:]):  # the same start at both ends of the file
        b["ts"] = a["ts"]
    raw = json.dumps(doc).encode()
    assert pieces.decode_in_pieces(bytearray(raw), 2) is not None
    whole = from_bytes(raw, "odd", workers=1)
    assert_same(from_bytes(bytearray(raw), "odd", workers=2), whole)
    assert any("negative durations" in n for n in whole.notes)
    assert (whole.events.device[whole.events.kind == int(Kind.KERNEL)] >= 0).all()
    no_children_left()


def test_small_files_are_not_cut():
    raw = read_bytes(os.path.join(DATA, "h100_bert_small_inference.json.gz"))
    assert pieces.decode_in_pieces(raw, 8) is None


def test_cuts_balance_duration_events_not_bytes():
    # first half: many short duration events; second half: fewer, long flow-heavy events
    short = [f'{{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": {i}, "dur": 1}}' for i in range(3000)]
    long = [f'{{"ph": "f", "cat": "ac2g", "name": "{"x" * 200}", "id": {i}, "pid": 1, "tid": 1, "ts": {i}}}' for i in range(3000)]
    raw = ('{"traceEvents": [' + ",\n".join(short + long) + "]}").encode()
    (cut,) = pieces.cuts(raw, 2)
    lead = 1 / pieces.FIRST_PIECE_WEIGHT  # the first piece, which costs more per event, gets fewer
    assert raw.count(b'"dur"', 0, cut) == pytest.approx(3000 * lead / (1 + lead), rel=0.1)
    # cut after the start (the rest of a text an early child began): equal shares of events
    start = raw.index(b'"dur"')
    (cut,) = pieces.cuts(raw, 2, start)
    assert raw.count(b'"dur"', start, cut) == pytest.approx(1500, rel=0.1)


def _trace_with_traps() -> bytes:
    """Kineto-like text in which ", {" also occurs inside strings, nested arrays of objects and
    another top-level array, with header fields on both sides of the events."""
    tb = TraceBuilder()
    busy_steps(tb, 4, 1000, 500)
    for i in range(4):
        tb.memory(100.0 + 1000 * i, allocated=2**30 + i, reserved=2**31)
    for i, e in enumerate(tb.events):
        e.setdefault("args", {})["trap"] = [{"a": i}, {"b": "x, {y"}]
        e["name"] = e["name"] + ", {not a cut"
    d = tb.to_dict()
    d["deviceProperties"] = d.get("deviceProperties", []) * 3
    events = d.pop("traceEvents")
    head = {k: v for k, v in d.items() if k != "baseTimeNanoseconds"}
    text = json.dumps(head, indent=1)[:-2] + ',\n "traceEvents": [\n' + ",\n".join(json.dumps(e, indent=1) for e in events)
    tail = '\n],\n "baseTimeNanoseconds": 1700000000000000000,\n "distributedInfo": {"rank": 0, "ranks": [{"r": 0}, {"r": 1}]}\n}'
    return (text + tail).encode()


@given(data=st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_cut_is_verified_a_bad_one_falls_back(monkeypatch, data):
    """Wherever the cuts fall (any comma followed by "{", in a string, a nested array, the
    header), the result is either None or exactly the one-process trace."""
    raw = _trace_with_traps()
    whole = from_bytes(raw, "t")
    assert whole.origin_ns >= 1_700_000_000_000_000_000  # the trailing header field was read
    candidates = [m.start() for m in pieces._CUT.finditer(raw)]
    chosen = sorted(set(data.draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3))))
    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 1)
    monkeypatch.setattr(pieces, "cuts", lambda raw, n, *span: chosen)
    mutable = data.draw(st.booleans())
    buf = bytearray(raw) if mutable else raw
    result = pieces.decode_in_pieces(buf, len(chosen) + 1)
    assert bytes(buf) == raw
    if result is not None:
        assert_same(from_bytes(buf, "t", workers=len(chosen) + 1), whole)
    assert_same(from_bytes(buf, "t", workers=4), whole)  # the caller's view: always right
    no_children_left()


def test_cuts_between_top_level_events_are_accepted(monkeypatch):
    raw = _trace_with_traps()
    between = [m.start() + 1 for m in re.finditer(rb"\},\n\{", raw)]  # "},\n{": only between events
    chosen = [between[len(between) // 4], between[len(between) // 2], between[3 * len(between) // 4]]
    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 1)
    monkeypatch.setattr(pieces, "cuts", lambda raw, n, *span: chosen)
    assert pieces.decode_in_pieces(raw, 4) is not None
    assert_same(from_bytes(raw, "t", workers=4), from_bytes(raw, "t"))
    no_children_left()


def test_a_bad_cut_in_a_child_falls_back_and_reaps(monkeypatch):
    raw = _trace_with_traps()
    inside_string = raw.index(b", {not a cut", len(raw) // 2)
    first = next(m.start() for m in pieces._CUT.finditer(raw) if m.start() > len(raw) // 4)
    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 1)
    monkeypatch.setattr(pieces, "cuts", lambda raw, n, *span: [first, inside_string])
    assert pieces.decode_in_pieces(raw, 3) is None
    no_children_left()


def test_a_bad_first_piece_stops_the_children(monkeypatch):
    raw = _trace_with_traps()
    in_header = raw.index(b"deviceProperties")
    cut = next(m.start() for m in pieces._CUT.finditer(raw) if m.start() > in_header)
    assert cut < raw.index(b"traceEvents")
    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 1)
    monkeypatch.setattr(pieces, "cuts", lambda raw, n, *span: [cut, len(raw) // 2 + raw[len(raw) // 2:].index(b",")])
    assert pieces.decode_in_pieces(raw, 3) is None
    no_children_left()


def test_a_child_that_dies_while_sending_falls_back(monkeypatch, small_pieces):
    raw = read_bytes(os.path.join(DATA, "resnet50_v100_workers0.json.gz"))
    real, parent = pieces.decode_piece, os.getpid()

    def dying(raw, at, i, decoders=None):
        if os.getpid() == parent:
            return real(raw, at, i, decoders)
        os._exit(9)  # a child, as if killed (out of memory) before it wrote its result

    monkeypatch.setattr(pieces, "decode_piece", dying)
    assert pieces.decode_in_pieces(raw, 3) is None
    no_children_left()
    result = [real(raw, pieces.cuts(raw, 2), 1)]
    fd = _forked.result_file()
    _forked.write_result(fd, result)
    whole = os.pread(fd, os.fstat(fd).st_size, 0)
    os.close(fd)
    for payload, code in ((whole[:1000], 0), (whole[:-8], 0), (whole, 3), (b"", 0), (whole, 0)):
        fd = _forked.result_file()
        os.write(fd, payload)
        pid = os.fork()
        if pid == 0:  # a child that ended after writing this (truncated, failed, nothing, whole)
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        received = None if status else _forked.receive(fd)
        os.close(fd)
        assert (received is not None) is (payload is whole and code == 0)
        if received is not None:  # the columns, read back as they were written
            (_header, part), = received
            assert_same_part(part, result[0][1])
    no_children_left()


def test_when_no_process_can_be_forked_one_process_decodes_every_piece(monkeypatch, small_pieces):
    path = os.path.join(DATA, "v100_resnet_ns_timestamps.json.gz")
    raw = read_bytes(path)
    real_fork, calls = _forked.fork_quietly, []

    def fork_once_then_fail():
        calls.append(1)
        if len(calls) > 1:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real_fork()

    monkeypatch.setattr(_forked, "fork_quietly", fork_once_then_fail)
    before = set(os.listdir("/proc/self/fd"))
    assert pieces.decode_in_pieces(raw, 4) is not None  # the pieces, all decoded here
    assert len(calls) == 2
    no_children_left()
    assert set(os.listdir("/proc/self/fd")) == before  # no result file left open
    assert_same(from_bytes(raw, path, workers=4), from_bytes(raw, path))


def test_flow_arrows_are_decoded_in_a_second_pass_when_correlation_is_missing(tmp_path, small_pieces):
    tb = TraceBuilder()
    tb.step(1, 0, 1000)
    for i in range(40):
        tb.add(cat="cuda_runtime", name="cudaLaunchKernel", ts=10.0 + i, dur=0.5, args={})
        tb.add(ph="s", cat="ac2g", name="ac2g", id=100 + i, ts=10.0 + i)
        tb.add(cat="kernel", name="k", ts=100.0 + 10 * i, dur=5.0, pid=0, tid=7, args={"device": 0, "stream": 7})
        tb.add(ph="f", cat="ac2g", name="ac2g", id=100 + i, ts=100.0 + 10 * i, pid=0, tid=7, bp="e")
    raw = json.dumps(tb.to_dict(), indent=1).encode()
    for workers in (1, 3):
        t = from_bytes(raw, "t", workers=workers)
        kernel = t.events.kind == 5
        assert sorted(t.events.corr[kernel].tolist()) == list(range(100, 140))
        assert sorted(t.events.corr[t.events.kind == 3].tolist()) == list(range(100, 140))
    no_children_left()


def test_gzip_read_mutable_matches_and_rejects_truncation(tmp_path):
    path = os.path.join(DATA, "a100_training_rank0.json.gz")
    whole = read_bytes(path)  # one member whose trailer tells its size: inflated in one call
    assert isinstance(whole, bytes) and bytes(read_bytes(path, mutable=True)) == whole
    multi = tmp_path / "multi.json.gz"
    multi.write_bytes(gzip.compress(b'{"traceEvents": [') + gzip.compress(b"]}"))
    assert read_bytes(multi, mutable=True) == bytearray(b'{"traceEvents": []}')
    with open(path, "rb") as fh:
        data = fh.read()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 3])
    from gpumagic import TraceError

    with pytest.raises(TraceError, match="truncated or corrupt gzip"):
        read_bytes(cut, mutable=True)


@pytest.mark.parametrize("workers", [1, 2])
def test_consume_frees_a_bytearray_once_the_pieces_are_decoded(small_pieces, workers):
    """``consume=True`` empties the caller's bytearray before assembly (so its memory can be
    reused), and the trace is the same; bytes, or a call without it, keep the text intact."""
    path = os.path.join(DATA, "a100_training_rank0.json.gz")
    text = read_bytes(path)
    given = bytearray(text)
    assert_same(from_bytes(given, path, workers=workers, consume=True), from_bytes(text, path))
    assert len(given) == 0
    kept = bytearray(text)
    assert_same(from_bytes(kept, path, workers=workers), from_bytes(text, path))
    assert kept == text
    assert_same(from_bytes(text, path, workers=workers, consume=True), from_bytes(bytes(text), path))
    no_children_left()


def test_consume_keeps_a_text_that_a_second_pass_reads(small_pieces):
    """A trace whose GPU events lack correlation ids needs its flow arrows from the text after
    the pieces: then consume leaves the bytearray whole, and the answer is the same."""
    raw = read_bytes(os.path.join(DATA, "a100_training_rank0.json.gz"))
    doc = json.loads(raw)
    for e in doc["traceEvents"]:
        (e.get("args") or {}).pop("correlation", None)
    text = json.dumps(doc).encode()
    given = bytearray(text)
    assert pieces.decode_in_pieces(bytearray(text), 2) is not None
    assert_same(from_bytes(given, "t", workers=2, consume=True), from_bytes(text, "t"))
    assert given == text
    no_children_left()


def test_piece_text_is_one_copy_of_the_right_bytes():
    raw = b'{"traceEvents":[{"a":1}, {"b":2},\n{"c":3}], "x": 1}'
    at = [m.start() for m in re.finditer(rb",\s*\{", raw)]
    texts = [pieces.piece(raw, at, i) for i in range(len(at) + 1)]
    assert [json.loads(t)["traceEvents"] for t in texts] == [[{"a": 1}], [{"b": 2}], [{"c": 3}]]
    assert all(isinstance(t, bytes) for t in texts)


def test_module_ranges_in_pieces_get_their_forward_backward_links(small_pieces):
    """A trace with gpumagic's module ranges is told from its decoded names, as the whole-file
    path tells it: the pieces path then reads the fwdbwd arrows in a second pass and keeps the
    text for it, even when asked to consume it."""
    from gpumagic.trace.links import MODULE_PREFIX

    tb = TraceBuilder()
    for k in range(1500):
        t = 1000.0 * k
        tb.step(k + 1, t, 900)
        tb.op(f"{MODULE_PREFIX}net.0 (Linear)", t + 20, 180, cat="user_annotation")
        tb.op("aten::addmm", t + 50, 100)
        tb.op("AddmmBackward0", t + 601, 100, tid=100)
        tb.add(ph="s", id=2 * k + 1, cat="fwdbwd", name="fwdbwd", ts=t + 50)
        tb.add(ph="f", id=2 * k + 1, cat="fwdbwd", name="fwdbwd", ts=t + 601, bp="e", tid=100)
    text = json.dumps(tb.to_dict(), indent=1).encode()
    assert pieces.decode_in_pieces(text, 2) is not None
    given = bytearray(text)
    cut, whole = from_bytes(given, "t", workers=2, consume=True), from_bytes(text, "t")
    assert given == text  # the second pass needed it
    assert len(whole.links) == 1500
    assert cut.links.fwd.tolist() == whole.links.fwd.tolist() and cut.links.bwd.tolist() == whole.links.bwd.tolist()
    no_children_left()


# --- an early child: the first pieces decoded while the rest is still being inflated ---------


def _progress(text: bytearray, done: int, ended: bool = False) -> Progress:
    """A read caught in the middle: ``done`` bytes of ``text`` inflated so far."""
    p = Progress()
    p.text, p.done, p.total, p.ended = text, done, len(text), ended
    return p


@pytest.fixture
def early_pieces(small_pieces, monkeypatch):
    """Pieces of about 1 MB, and an early child for texts of 4 MB or more."""
    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 256 << 10)
    monkeypatch.setattr(pieces, "EARLY_MIN_BYTES", 4 << 20)


@pytest.mark.parametrize("name", ["a100_training_rank0.json.gz", "resnet50_v100_workers0.json.gz"])
@pytest.mark.parametrize("workers", [2, 3])
def test_an_early_child_gives_the_same_trace(early_pieces, name, workers):
    path = os.path.join(DATA, name)
    raw = read_bytes(path, mutable=True)
    share = len(raw) // (workers + 2)
    early = pieces.start_early(_progress(raw, share + 12345), workers)
    assert early is not None and len(early.at) >= 2 and early.at[-1] < share  # its pieces end in its share
    assert pieces.decode_in_pieces(bytearray(raw), workers, early=early) is not None  # not a fallback
    no_children_left()
    early = pieces.start_early(_progress(raw, share), workers)
    assert_same(from_bytes(raw, path, workers=workers, early=early), from_bytes(bytes(raw), path))
    no_children_left()


def test_start_early_waits_for_its_share_while_another_thread_inflates(early_pieces):
    import threading
    import time

    raw = read_bytes(os.path.join(DATA, "a100_training_rank0.json.gz"), mutable=True)
    progress = _progress(raw, 0)
    share = len(raw) // 4

    def inflate():  # as a gunzip does: a step at a time
        while progress.done < len(raw):
            time.sleep(0.001)
            progress.done = min(len(raw), progress.done + (256 << 10))
        progress.ended = True

    reader = threading.Thread(target=inflate)
    reader.start()
    early = pieces.start_early(progress, 2)
    reader.join()
    assert early is not None and share - (1 << 20) < early.at[-1] < share
    assert pieces.decode_in_pieces(raw, 2, early=early) is not None
    no_children_left()


def test_no_early_child_when_it_cannot_help(early_pieces):
    raw = read_bytes(os.path.join(DATA, "a100_training_rank0.json.gz"), mutable=True)
    assert pieces.start_early(_progress(raw, len(raw) // 2), 1) is None  # one process
    assert pieces.start_early(_progress(raw, len(raw), ended=True), 2) is None  # all there already
    small = bytearray(raw[: 3 << 20])
    assert pieces.start_early(_progress(small, 1 << 20), 2) is None  # under EARLY_MIN_BYTES
    plain = Progress()
    plain.ended = True  # a plain file: no gunzip, nothing to follow
    assert pieces.start_early(plain, 2) is None
    assert pieces.start_early(_progress(bytearray(b"[" + bytes(raw[1:])), len(raw) // 3), 2) is None  # not an object
    no_children_left()


def test_an_early_child_that_fails_or_does_not_fit_costs_time_only(early_pieces, monkeypatch):
    path = os.path.join(DATA, "a100_training_rank0.json.gz")
    raw = read_bytes(path, mutable=True)
    want = from_bytes(bytes(raw), path)
    # decoded with other decoders than the caller's: stopped, and the file decoded without it
    early = pieces.start_early(_progress(raw, len(raw) // 3), 2, schema.COMMS)
    assert early is not None
    assert_same(from_bytes(raw, path, workers=2, early=early), want)
    no_children_left()
    # a caller that ends up in one process stops it, and decodes every piece itself
    early = pieces.start_early(_progress(raw, len(raw) // 3), 2)
    assert early is not None and pieces.decode_in_pieces(raw, 1, early=early) is not None
    no_children_left()
    # killed before it wrote its result: the whole file is decoded instead
    real, parent = pieces.decode_piece, os.getpid()

    def dying(raw, at, i, decoders=None):
        if os.getpid() != parent and i == 0:
            os._exit(9)
        return real(raw, at, i, decoders)

    monkeypatch.setattr(pieces, "decode_piece", dying)
    early = pieces.start_early(_progress(raw, len(raw) // 3), 2)
    assert pieces.decode_in_pieces(raw, 2, early=early) is None
    no_children_left()
    early = pieces.start_early(_progress(raw, len(raw) // 3), 2)
    assert_same(from_bytes(raw, path, workers=2, early=early), want)
    no_children_left()


def test_the_command_line_reaps_an_early_child_when_the_gzip_turns_out_corrupt(early_pieces, tmp_path, capsys,
                                                                                 monkeypatch):
    import time

    from gpumagic.shells.cli import main
    from gpumagic.trace import files

    class SlowInflate:  # each step takes 20 ms: the early child is forked long before the end
        def __init__(self, real):
            self.real = real

        def decompress(self, data, length):
            time.sleep(0.02)
            return self.real.decompress(data, length)

        def __getattr__(self, name):
            return getattr(self.real, name)

    real = files._inflate

    class Inflate:
        error = real.error

        @staticmethod
        def decompressobj(wbits):
            return SlowInflate(real.decompressobj(wbits=wbits))

    monkeypatch.setattr(files, "_inflate", Inflate)
    started = []
    real_start = pieces.start_early
    monkeypatch.setattr(pieces, "start_early", lambda *a: started.append(real_start(*a)) or started[-1])
    text = read_bytes(os.path.join(DATA, "a100_training_rank0.json.gz"))
    data = gzip.compress(bytes(text), compresslevel=1)
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(data[: len(data) * 9 // 10] + data[-8:])  # the trailer kept: it still claims the whole size
    assert main(["analyze", str(bad), "-j", "2", "--format", "json", "-o", str(tmp_path / "r.json")]) == 2
    assert "truncated or corrupt gzip" in capsys.readouterr().err
    assert started and started[0] is not None  # an early child was decoding when the gzip failed
    assert not (tmp_path / "r.json").exists()
    no_children_left()


def test_progress_follows_a_gzip_read_and_ends(tmp_path):
    path = os.path.join(DATA, "h100_bert_small_inference.json.gz")
    progress = Progress()
    raw = read_bytes(path, mutable=True, progress=progress)
    assert progress.text is raw and progress.done == len(raw) == progress.total and progress.ended
    plain = tmp_path / "t.json"
    plain.write_bytes(bytes(raw))
    progress = Progress()
    assert read_bytes(str(plain), mutable=True, progress=progress) == raw
    assert progress.text is None and progress.ended  # nothing inflated to follow
    progress = Progress()
    with pytest.raises(TraceError):
        read_bytes(str(tmp_path / "missing.json.gz"), mutable=True, progress=progress)
    assert progress.ended
