"""``job.collectives``: each collective across ranks, on a job built from the shared A100 rank with a
known late rank (tests/jobbuilder.py: rank 2 does 2 ms more host work before each collective), with
the message sizes and bandwidths the traces record."""

import json

import pytest
from jobbuilder import DELAY_US, JITTER_US, STRAGGLER, collective_kernels, rewrite

from gpumagic.jobs import analyze_job
from gpumagic.jobs.messages import kind_of


@pytest.fixture(scope="module")
def job(straggler_job):
    return analyze_job(straggler_job, jobs=1)


def test_the_late_rank_arrives_last_and_the_others_wait_for_it(job):
    table = job.collectives
    assert table, "no collectives tabulated"
    top = table[0]  # most total wait first
    assert top["last_rank"] == STRAGGLER and top["last_share"] >= 0.8  # a row holds one message: 5 calls here
    late = sum(r["last_count"] for c in table for r in c["ranks"] if r["rank"] == STRAGGLER)
    assert late >= 0.9 * sum(c["count"] for c in table)
    one = _row(table, "all_gather", 16_777_216)  # one collective, once a step, that overlaps no other
    by = {r["rank"]: r for r in one["ranks"]}
    assert sorted(by) == [0, 1, 2, 3] and one["count"] == 5 and one["last_rank"] == STRAGGLER
    delay_ms, jitter_ms = DELAY_US / 1000, JITTER_US / 1000
    # it arrives about the injected delay after the first rank and hardly waits; the others wait that long
    assert delay_ms - jitter_ms <= by[STRAGGLER]["skew_ms"] <= delay_ms + jitter_ms
    assert by[STRAGGLER]["wait_ms"] <= jitter_ms
    for r in (0, 1, 3):
        assert delay_ms - jitter_ms <= by[r]["wait_ms"] <= delay_ms + jitter_ms
        assert by[r]["skew_ms"] <= jitter_ms
        # medians of 5 calls, each with its own jitter on both sides
        assert by[r]["dur_ms"] == pytest.approx(by[STRAGGLER]["dur_ms"] + by[r]["wait_ms"], abs=2 * jitter_ms)


def _row(table, collective, size):
    found = [c for c in table if c["collective"] == collective and c["size_bytes"] == size]
    assert len(found) == 1, [(c["collective"], c["size_bytes"]) for c in table]
    return found[0]


def test_message_sizes_and_bus_bandwidth_from_the_a100_traces_shapes(job):
    """The A100 rank (torch ~2.0, record_shapes) gives each ``nccl:*`` annotation its input's shape
    and each ``c10d::*`` operator its output's and input's. By hand, from the trace:
    ``nccl:_all_gather_base`` Input Dims [[8192, 64]] float is one rank's 2,097,152 bytes, and
    ``c10d::_allgather_base_`` [[65536, 64], [8192, 64]] says the group has 8 ranks, so nccl-tests'
    S = 8 × 2,097,152 = 16,777,216 B and busbw = S/t × 7/8; ``nccl:all_reduce`` [[366336]] float is
    S = 1,465,344 B, with no group size recorded: algbw only."""
    gather = _row(job.collectives, "all_gather", 16_777_216)
    assert gather["group_size"] == 8 and gather["count"] == 5
    for r in gather["ranks"]:  # 5 calls: the median bandwidth is S over the median duration
        assert r["alg_gbps"] == pytest.approx(16_777_216 / (r["dur_ms"] * 1e6), rel=1e-3)
        assert r["bus_gbps"] == pytest.approx(r["alg_gbps"] * 7 / 8, rel=1e-3)
    late = next(r for r in gather["ranks"] if r["rank"] == STRAGGLER)
    assert late["bus_gbps"] > 2 * max(r["bus_gbps"] for r in gather["ranks"] if r["rank"] != STRAGGLER)  # the others wait
    scatter = _row(job.collectives, "reduce_scatter", 65536 * 384 * 4)  # Input Dims [[65536, 384]]: the whole array
    assert scatter["group_size"] == 8 and all(r["bus_gbps"] is not None for r in scatter["ranks"])
    reduce = _row(job.collectives, "all_reduce", 366336 * 4)
    assert reduce["group_size"] is None
    assert all(r["bus_gbps"] is None and r["alg_gbps"] == pytest.approx(366336 * 4 / (r["dur_ms"] * 1e6), rel=1e-3)
               for r in reduce["ranks"])


def test_no_sizes_where_the_trace_records_none(mixed_job):
    """The V100 rank (rank 1 of 2, torch 1.x) records ``nccl:all_reduce`` annotations without shapes
    and no metadata on its kernels: nothing is read, and its collectives have no message."""
    from gpumagic.jobs.summary import summarize
    from gpumagic.trace import comms
    from gpumagic.trace.files import read_bytes

    assert not comms.wanted(read_bytes(mixed_job[2]))
    v100 = summarize(str(mixed_job[2]))
    assert v100.ok and v100.steps and all(s.dur_ns and s.messages == () for s in v100.steps)
    a100 = summarize(str(mixed_job[0]))
    assert all(len(s.messages) == len(s.dur_ns) for s in a100.steps)


def test_sizes_recorded_on_the_kernels_as_recent_kineto_writes_them(straggler_job, tmp_path):
    """Recent Kineto copies ``record_param_comms``' metadata onto the NCCL kernel (libkineto's
    GpuNCCLCollectiveTest: "Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size").
    The A100 ranks rewritten so: every collective kernel an all-gather of 65,664 bf16 elements per
    rank out of 131,328 in a group of 2 (the test's own numbers), so S = 131,328 × 2 B and
    busbw = S/t × 1/2."""
    def tag(doc):
        for k in collective_kernels(doc):
            k["args"] |= {"Collective name": "_allgather_base", "dtype": "BFloat16", "In msg nelems": 65664,
                          "Out msg nelems": 131328, "Group size": 2}
    paths = [rewrite(p, tmp_path / p.name, tag) for p in straggler_job]
    table = analyze_job([str(p) for p in paths], jobs=1).collectives
    rows = [c for c in table if c["size_bytes"] == 131328 * 2]
    assert rows and all(c["collective"] == "all_gather" and c["group_size"] == 2 for c in rows)
    assert sum(c["count"] for c in rows) >= 70  # the kernels with a launch on record (75 of the 80 here)
    for r in (r for c in rows for r in c["ranks"]):
        assert r["bus_gbps"] == pytest.approx(r["alg_gbps"] / 2, rel=1e-3)


@pytest.mark.parametrize(("name", "kind"), [
    ("nccl:all_reduce", "all_reduce"), ("allreduce_coalesced", "all_reduce"), ("nccl:_all_gather_base", "all_gather"),
    ("all_gather_into_tensor_coalesced", "all_gather"), ("nccl:_reduce_scatter_base", "reduce_scatter"),
    ("c10d::alltoall_base_", "all_to_all"), ("nccl:broadcast", "broadcast"), ("reduce", "reduce"), ("nccl:send", "send_recv"),
    ("recv", "send_recv"), ("barrier", None), ("gather", None), ("scatter", None)])
def test_collective_kinds(name, kind):
    assert kind_of(name) == kind


def test_straggler_finding_cites_the_table(job):
    f = job.finding("straggler-rank")
    assert f is not None
    assert f"rank {STRAGGLER} arrives last" in f.finding.evidence.summary
    assert "ncclKernel" in f.finding.evidence.summary


def test_json_and_text_carry_the_table(job):
    d = json.loads(job.to_json())["job"]
    assert d["collectives"] == json.loads(json.dumps(job.collectives))
    text = job.to_text()
    assert "COLLECTIVES ACROSS RANKS" in text and f"last: rank {STRAGGLER}" in text
    assert "Collectives across ranks" in job.to_html()


def test_a_large_file_is_read_in_pieces_with_the_same_answer(monkeypatch):
    """The message pass cuts a large file as the loader does (only one piece's structs alive at a
    time): the same table as decoding it at once."""
    from jobbuilder import A100

    from gpumagic.trace import comms, pieces
    from gpumagic.trace.files import read_bytes
    from gpumagic.trace.kineto import from_bytes

    raw = read_bytes(A100)
    trace = from_bytes(raw, A100)
    whole = comms.read(trace, raw)
    monkeypatch.setattr(pieces, "ONE_PROCESS_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(pieces, "PIECE_BYTES", 4 << 20)
    assert comms._in_pieces(raw) is not None  # it was cut
    cut = comms.read(trace, raw)
    assert whole is not None and cut is not None and len(cut) == len(whole) > 100
    for field in ("kernel", "corr", "lane", "ts_ns", "dur_ns", "in_nelems", "group_size"):
        assert (getattr(cut, field) == getattr(whole, field)).all(), field
    assert cut.name == whole.name and cut.dims == whole.dims and cut.collective == whole.collective


def _same_table(a, b) -> None:
    import dataclasses

    import numpy as np

    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y), f.name


@pytest.mark.parametrize("name, rows", [("a100_training_rank0.json.gz", 300),  # sizes on record_param_comms
                                         ("v100_resnet_ns_timestamps.json.gz", 40)])  # nccl: annotations' shapes
@pytest.mark.parametrize("workers", [1, 2])
def test_the_loaders_own_pass_reads_the_same_messages_as_a_second_pass(name, rows, workers, monkeypatch):
    """``from_bytes(..., comms=True)`` keeps the events that describe messages while it decodes
    (no second decode of the file): the same table as :func:`comms.read`'s pass over the text,
    whole or cut into pieces, in this process or in forked ones."""
    from jobbuilder import DATA

    from gpumagic.trace import comms, pieces, schema
    from gpumagic.trace.files import read_bytes
    from gpumagic.trace.kineto import from_bytes

    raw = read_bytes(f"{DATA}/{name}")
    second = comms.read(from_bytes(raw, name), raw)
    assert second is not None and len(second) > rows
    monkeypatch.setattr(pieces, "ONE_PROCESS_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 256 << 10)
    monkeypatch.setattr(pieces, "PIECE_BYTES", 1 << 20)
    cut = pieces.decode_in_pieces(bytearray(raw), workers, schema.COMMS)
    assert cut is not None and len(cut[1]) > 2 and all(p.comms is not None for p in cut[1])
    for text in (raw, bytearray(raw)):
        one_pass = from_bytes(text, name, workers=workers, comms=True).comms
        _same_table(one_pass, second)


def test_a_file_the_typed_pass_cannot_read_falls_back_to_the_second_pass(tmp_path):
    """A trace with an arg of an unexpected type takes the lenient path, which keeps no message
    rows: ``comms=True`` then reads them in the second pass, as before."""
    from gpumagic.trace import comms
    from gpumagic.trace.kineto import from_bytes

    events = [{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
               "args": {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1024, "Out msg nelems": 1024,
                        "Group size": 8}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 20, "dur": 5,
               "args": {"correlation": {"not": "an int"}}}]
    raw = json.dumps({"traceEvents": events}).encode()
    trace = from_bytes(raw, "t.json", comms=True)
    assert trace.comms is not None and trace.comms.collective == ["allreduce"]
    assert trace.comms.in_nelems.tolist() == [1024] and trace.comms.group_size.tolist() == [8]
    _same_table(trace.comms, comms.read(trace, raw))
    assert from_bytes(raw, "t.json").comms is None  # not asked for: not read
