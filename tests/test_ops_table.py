"""The operators' shapes/FLOPs table (``gpumagic.trace.ops``), read in a second pass only when a
file recorded them."""

import json
import os

from tracebuilder import DATA, TraceBuilder

from gpumagic.trace import load
from gpumagic.trace.kineto import from_bytes


def shaped_trace():
    tb = TraceBuilder()
    tb.step(1, 0, 1000)
    tb.add(cat="cpu_op", name="aten::mm", ts=10.5, dur=20, args={
        "Input Dims": [[8, 16], [16, 32]], "Input type": ["c10::BFloat16", "c10::BFloat16"],
        "Concrete Inputs": ["", ""], "flops": 8192})
    tb.add(cat="cpu_op", name="aten::relu", ts=40, dur=5, tid=7, args={"Input Dims": [[8, 32]], "Input type": ["float"]})
    tb.add(cat="cpu_op", name="aten::empty", ts=50, dur=1)  # no shapes: not kept
    tb.kernel("gemm", 100, 50, launch_ts=20)
    return tb


def test_bytes_and_dict_give_the_same_table():
    tb = shaped_trace()
    a = from_bytes(json.dumps(tb.to_dict()).encode()).ops
    b = load(tb.to_dict()).ops
    for t in (a, b):
        assert t.name == ["aten::mm", "aten::relu"]
        assert t.dims[0] == [[8, 16], [16, 32]] and t.types[0] == ["c10::BFloat16", "c10::BFloat16"]
        assert t.concrete == [["", ""], None] and t.flops.tolist() == [8192.0, -1.0]
    assert a.ts_ns.tolist() == b.ts_ns.tolist() and a.lane.tolist() == b.lane.tolist()


def test_times_and_lanes_match_the_event_table():
    trace = from_bytes(json.dumps(shaped_trace().to_dict()).encode())
    ev, ops = trace.events, trace.ops
    for i, name in enumerate(ops.name):
        row = next(j for j in range(len(ev)) if trace.names[ev.name[j]] == name)
        assert (ops.ts_ns[i], ops.dur_ns[i], ops.lane[i]) == (ev.ts_ns[row], ev.dur_ns[row], ev.lane[row])


def test_a_list_form_trace_is_read_too():
    events = shaped_trace().to_dict()["traceEvents"]
    assert from_bytes(json.dumps(events).encode()).ops.name == ["aten::mm", "aten::relu"]


def test_no_shapes_recorded_means_no_table():
    tb = TraceBuilder()
    tb.step(1, 0, 1000)
    tb.op("aten::mm", 10, 20)
    assert from_bytes(json.dumps(tb.to_dict()).encode()).ops is None
    assert load(os.path.join(DATA, "v100_resnet_ns_timestamps.json.gz")).ops is None


def test_odd_shape_values_load_and_count_nothing():
    tb = TraceBuilder(cc=None)
    tb.add(cat="cpu_op", name="aten::mm", ts=10, dur=20, args={"Input Dims": "not a list", "Input type": 3})
    tb.add(cat="cpu_op", name="aten::mm", ts=40, dur=20, args={"Input Dims": [[8, "x"], [None]]})
    for trace in (from_bytes(json.dumps(tb.to_dict()).encode()), load(tb.to_dict())):
        assert len(trace.ops) == 2
    from gpumagic import analyze

    c = analyze(tb.to_dict()).metrics["compute"]
    assert (c["flops"], c["flops_source"], c["ops_unresolved"]) == (None, None, 2)


def test_decoding_in_pieces_gives_the_same_table():
    path = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
    one, two = load(path), load(path, workers=2)
    assert len(one.ops) == len(two.ops) == 23622
    assert (one.ops.ts_ns == two.ops.ts_ns).all() and (one.ops.lane == two.ops.lane).all()
    assert one.ops.dims == two.ops.dims and one.ops.name == two.ops.name


def test_the_same_pass_and_the_second_pass_make_the_same_table():
    """Shapes read with the events (schema.OpArgs, Part.ops) equal those of a second decode of
    the text (ops.attach, kept for the lenient and repaired paths)."""
    from gpumagic.trace import ops
    from gpumagic.trace.files import read_bytes

    raw = read_bytes(os.path.join(DATA, "a100_training_rank0.json.gz"))
    trace = from_bytes(raw)
    one = trace.ops
    ops.attach(trace, raw)
    two = trace.ops
    assert one is not two and len(one) == len(two) == 24015
    assert one.name == two.name and one.dims == two.dims and one.types == two.types and one.concrete == two.concrete
    for column in ("lane", "ts_ns", "dur_ns", "flops"):
        assert (getattr(one, column) == getattr(two, column)).all()


def test_a_repaired_text_goes_to_the_second_pass_as_before():
    """A text that needed repair (a trailing comma) keeps the former answer: its shapes come from
    the second pass over the original text, which cannot read it, so no table and one note."""
    text = json.dumps(shaped_trace().to_dict())
    trace = from_bytes((text[:-2] + ",]}").encode())
    assert any("repaired" in n for n in trace.notes)
    assert trace.ops is None and any("shapes could not be read" in n for n in trace.notes)
