"""``metrics.operators``: kernels attributed to the operators that launched them, FLOPs and bytes
checked by hand, the roofline, ``--top-ops``, and the finding that cites an operator."""

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.analysis.context import build_context
from gpumagic.analysis.operators import _BIG, _by_thread_start_longest, enclosing_op, parent_op
from gpumagic.shells.cli import main
from gpumagic.trace import load

A100 = "NVIDIA A100-SXM4-80GB"


def op(tb, name, ts, dur, dims, types=None, flops=None):
    args = {"Input Dims": dims, "Input type": types or ["float"] * len(dims)}
    if flops is not None:
        args["flops"] = flops
    tb.add(cat="cpu_op", name=name, ts=ts, dur=dur, args=args)


def mm_trace(kernel_us=100.0, steps=3):
    tb = TraceBuilder(gpu_name=A100)
    for i in range(steps):
        t = i * 1_000
        tb.step(i + 1, t, 1_000)
        op(tb, "aten::linear", t + 5, 60, [[256, 512], [1024, 512], [1024]])
        op(tb, "aten::mm", t + 8, 50, [[256, 512], [512, 1024]])       # inside linear: the leaf
        tb.kernel("ampere_sgemm_128x64_nn", t + 20, kernel_us, launch_ts=t + 10)
        tb.kernel("stray_kernel", t + 400, 10, launch_ts=t + 300)       # no operator around its launch
    return tb


def test_matmul_flops_bytes_and_roofline_by_hand():
    o = analyze(mm_trace().to_dict()).metrics["operators"]
    (row,) = [r for r in o["top"] if r["name"] == "aten::mm"]
    flops = 2 * 256 * 512 * 1024  # 2·M·K·N per call
    nbytes = (256 * 512 + 512 * 1024 + 256 * 1024) * 4  # A and B read, C written, FP32
    assert row["count"] == 3 and row["shapes"] == "256x512, 512x1024"
    assert row["flops"] == 3 * flops and row["bytes"] == 3 * nbytes
    assert row["gpu_ms"] == pytest.approx(0.3)
    assert row["tflops"] == pytest.approx(flops / 100e-6 / 1e12, rel=1e-3)   # 2.68 TFLOP/s
    assert row["tbps"] == pytest.approx(nbytes / 100e-6 / 1e12, rel=1e-3)
    assert (row["dtype"], row["peak_tflops"], row["peak_tbps"]) == ("fp32", 19.5, 2.039)
    assert row["frac_of_peak"] == pytest.approx(row["tflops"] / 19.5, abs=1e-3)
    # intensity 73 FLOP/B is above the A100's ridge (19.5 TFLOP/s ÷ 2.039 TB/s = 9.6 FLOP/B)
    assert row["intensity"] == pytest.approx(flops / nbytes, rel=1e-3) and row["bound"] == "compute"
    assert not any(r["name"] == "aten::linear" for r in o["top"])  # the kernel belongs to the leaf
    assert o["uncovered_ms"] == pytest.approx(0.03)  # the stray kernels
    assert o["attributed_ms"] + o["uncovered_ms"] == pytest.approx(o["kernel_ms"])


def test_graph_replays_are_uncovered_without_flops():
    tb = TraceBuilder(gpu_name=A100)
    tb.step(1, 0, 1_000)
    tb._gpu("kernel", "graph_node_kernel", 50, 200, 10, 7, 0, launch="cudaGraphLaunch")
    o = analyze(tb.to_dict()).metrics["operators"]
    assert o["top"] == [] and o["graph_uncovered_ms"] == pytest.approx(0.2) == o["uncovered_ms"]


def test_real_fixture_addmm_checked_by_hand():
    # BERT-small inference on an H100, bf16: 17 calls of addmm(bias[512], x[141,512], W[512,512])
    o = analyze(os.path.join(DATA, "h100_bert_small_inference.json.gz")).metrics["operators"]
    (row,) = [r for r in o["top"] if r["name"] == "aten::addmm" and r["shapes"] == "512, 141x512, 512x512"]
    assert row["count"] == 17
    assert row["flops"] == 17 * 2 * 141 * 512 * 512
    assert row["bytes"] == 17 * (512 + 141 * 512 + 512 * 512 + 141 * 512) * 2  # bias, x, W read; out written
    assert (row["dtype"], row["peak_tflops"], row["peak_tbps"]) == ("bf16", 989.5, 3.35)
    assert row["bound"] == "memory"  # 90 FLOP/B, under the H100's ridge of 295


def test_enclosing_op_matches_a_brute_force_search():
    trace = load(os.path.join(DATA, "a100_training_rank0.json.gz"))  # nested ops, autograd threads, ties
    ctx = build_context(trace)
    ev, m = trace.events, ctx.masks
    calls = np.flatnonzero(m["runtime"] & m["host"])[::37]
    got = enclosing_op(ctx, calls)
    ops = np.flatnonzero(m["cpu_op"] & m["host"])
    for c, g in zip(calls.tolist(), got.tolist()):
        t, lane = ev.ts_ns[c], ev.lane[c]
        # the latest-starting, shortest span around the call; of identical spans, the later row
        # (the loader keeps the file's order, parent before child)
        around = ops[(ev.lane[ops] == lane) & (ev.ts_ns[ops] <= t) & (ev.ts_ns[ops] + ev.dur_ns[ops] > t)]
        want = -1 if around.size == 0 else int(around[np.lexsort((-around, ev.dur_ns[around], -ev.ts_ns[around]))[0]])
        assert g == want


def test_parent_op_matches_a_brute_force_search():
    trace = load(os.path.join(DATA, "a100_training_rank0.json.gz"))  # nested ops, autograd threads, ties
    ctx = build_context(trace)
    ev, m = trace.events, ctx.masks
    ops = np.flatnonzero(m["cpu_op"] & m["host"])
    rows = np.concatenate([ops[::23], ops[ev.dur_ns[ops] == 0][:50]])  # a sample, and some empty ones
    got = parent_op(ctx, rows)
    spans = ops[ev.dur_ns[ops] > 0]
    start, dur, lane = ev.ts_ns[spans], ev.dur_ns[spans], ev.lane[spans]
    for r, g in zip(rows.tolist(), got.tolist()):
        t = ev.ts_ns[r]
        # open at its start on its thread, and ordered before it: an earlier start, or the same
        # start and longer, or the same span and an earlier row (the file's order, parent first)
        before = (start < t) | (dur > ev.dur_ns[r]) | ((dur == ev.dur_ns[r]) & (spans < r))
        around = spans[(lane == ev.lane[r]) & (start <= t) & (start + dur > t) & (spans != r) & before]
        want = -1 if around.size == 0 else int(around[np.lexsort((-around, ev.dur_ns[around], -ev.ts_ns[around]))[0]])
        assert g == want
    assert (got >= 0).any() and (got == -1).any()


def test_top_ops_option(tmp_path):
    out = tmp_path / "r.json"
    assert main(["analyze", os.path.join(DATA, "h100_bert_small_inference.json.gz"), "--top-ops", "3",
                 "--format", "json", "-o", str(out)]) == 0
    assert len(json.loads(out.read_text())["metrics"]["operators"]["top"]) == 3
    with pytest.raises(ValueError, match="top_ops"):
        analyze(mm_trace().to_dict(), top_ops=-1)


def test_low_compute_efficiency_cites_the_operator():
    tb = TraceBuilder(gpu_name=A100)
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        op(tb, "aten::mm", t + 5, 30, [[1024, 1024], [1024, 1024]])
        tb.kernel("ampere_sgemm_128x64_nn", t + 100, 8_000, launch_ts=t + 20)
    r = analyze(tb.to_dict())
    f = r.finding("low-compute-efficiency")
    assert f is not None
    (row,) = r.metrics["operators"]["top"]
    assert f.evidence.numbers["operator"] == "aten::mm"
    assert f.evidence.numbers["operator_tflops"] == row["tflops"] == pytest.approx(2 * 1024**3 / 8e-3 / 1e12, rel=1e-3)
    assert "aten::mm [1024x1024, 1024x1024]" in f.evidence.summary


def test_instances_are_grouped_by_name_and_shapes_whatever_their_order():
    """Instances of one operator with two shapes, interleaved, make two rows; an instance whose
    recorded inputs are all non-tensors (no shape text) joins the same operator's instances that
    recorded nothing; the profiler's own FLOP count wins over the shapes' where it has one."""
    tb = TraceBuilder(gpu_name=A100)
    tb.step(1, 0, 10_000)
    shapes = ([[64, 128], [128, 256]], [[32, 128], [128, 256]])
    for k in range(6):
        t = 100 + k * 1_000
        op(tb, "aten::mm", t, 50, shapes[k % 2], flops=1e9 if k == 4 else None)
        tb.kernel("sgemm", t + 20, 10 + k, launch_ts=t + 5)
    op(tb, "aten::copy_", 7_000, 50, [[], []])  # recorded, but no tensor shape
    tb.kernel("copy_kernel", 7_020, 5, launch_ts=7_005)
    tb.add(cat="cpu_op", name="aten::copy_", ts=8_000, dur=50)  # recorded nothing
    tb.kernel("copy_kernel", 8_020, 7, launch_ts=8_005)
    rows = {(r["name"], r["shapes"]): r for r in analyze(tb.to_dict()).metrics["operators"]["top"]}
    assert set(rows) == {("aten::mm", "64x128, 128x256"), ("aten::mm", "32x128, 128x256"), ("aten::copy_", None)}
    big, small = rows[("aten::mm", "64x128, 128x256")], rows[("aten::mm", "32x128, 128x256")]
    assert (big["count"], small["count"]) == (3, 3)
    assert big["gpu_ms"] == pytest.approx((10 + 12 + 14) / 1000) and small["gpu_ms"] == pytest.approx((11 + 13 + 15) / 1000)
    assert big["flops"] == 2 * 64 * 128 * 256 * 2 + 1e9  # the fifth instance: the profiler's count
    assert small["flops"] == 3 * 2 * 32 * 128 * 256
    assert big["flops_source"] == "shapes"  # the group's first instance
    copy = rows[("aten::copy_", None)]
    assert copy["count"] == 2 and copy["gpu_ms"] == pytest.approx(0.012) and copy["flops"] is None


@given(st.integers(0, 2**32 - 1), st.integers(0, 400), st.sampled_from([1, 3, 40, 1 << 15]), st.integers(1, 50))
@settings(max_examples=80, deadline=None)
def test_thread_start_longest_order_is_the_lexsort(seed, n, lanes, span):
    """The linear-time (thread, start, longest first) order is exactly ``np.lexsort((-dur,
    s_key))`` on rows in time order, ties of start and of duration included (a coarse ``span``
    makes many), with thread ids past 16 bits (the lexsort itself) and rows out of time order."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, span, n)).astype(np.int64)
    lane = rng.integers(0, lanes, n).astype(np.int32)
    dur = rng.integers(1, 4, n).astype(np.int64)
    s_key = (lane.astype(np.int64) + 1) * _BIG + ts
    assert np.array_equal(_by_thread_start_longest(lane, s_key, dur), np.lexsort((-dur, s_key)))
    shuffled = rng.permutation(n)  # not in time order: the check falls back to the lexsort
    assert np.array_equal(_by_thread_start_longest(lane[shuffled], s_key[shuffled], dur[shuffled]),
                          np.lexsort((-dur[shuffled], s_key[shuffled])))
