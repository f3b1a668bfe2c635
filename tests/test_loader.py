"""Loading traces of every schema year and shape; errors on bad input."""

import gzip
import json
import os

import numpy as np
import pytest
from tracebuilder import DATA, TraceBuilder, busy_steps

from gpumagic import TraceError, analyze, load_trace
from gpumagic.trace.model import Kind


def test_2021_categories_and_string_tids():
    t = load_trace(os.path.join(DATA, "resnet50_v100_workers0.json.gz"))
    assert t.meta["schema"] == "2021"
    kinds = set(np.unique(t.events.kind).tolist())
    assert {Kind.CPU_OP, Kind.RUNTIME, Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET} <= kinds
    # "25738" (string tid of the ops) and 25738 (int tid of flows) are one lane
    main = [ln for ln in t.lanes if ln.tid == 25738]
    assert len(main) == 1
    assert all(ln.gpu for ln in t.lanes if ln.name.startswith("stream"))


def test_ns_resolution_float_timestamps_keep_sub_microsecond_durations():
    t = load_trace(os.path.join(DATA, "v100_resnet_ns_timestamps.json.gz"))
    memcpy = t.events.dur_ns[t.events.kind == Kind.MEMCPY]
    assert (memcpy % 1000 != 0).any()  # e.g. 1.28 µs -> 1280 ns, not rounded to µs


def test_base_time_nanoseconds_sets_origin():
    t = load_trace(os.path.join(DATA, "h100_bert_small_inference.json.gz"))
    assert t.origin_ns > 1_751_410_836_000_000_000
    assert t.events.ts_ns.min() == 0


def test_correlation_links_launch_to_kernel():
    from gpumagic.analysis.context import build_context

    ctx = build_context(load_trace(os.path.join(DATA, "h100_bert_small_inference.json.gz")))
    k = ctx.masks["kernel"]
    assert (ctx.launch_ts[k] >= 0).all()
    assert (ctx.launch_ts[k] <= ctx.trace.events.ts_ns[k]).all()  # launched before it ran


def test_plain_and_gzip_and_bare_list(tmp_path):
    tb = TraceBuilder()
    busy_steps(tb, 3, 1000, 500)
    a = analyze(tb.write(tmp_path / "t.json"))
    b = analyze(tb.write(tmp_path / "t.json.gz", gz=True))
    (tmp_path / "list.json").write_text(json.dumps(tb.events))
    c = analyze(str(tmp_path / "list.json"))
    assert a.metrics["gpu"] == b.metrics["gpu"]
    assert c.metrics["steps"]["count"] == 3
    assert a.metrics["gpu"]["busy_frac"] == pytest.approx(0.5, abs=0.01)


def test_trailing_commas_are_repaired_with_a_note(tmp_path):
    tb = TraceBuilder()
    busy_steps(tb, 2, 1000, 500)
    text = json.dumps(tb.to_dict()).replace("}]", "},]").replace('"stream": 7}', '"stream": 7,}')
    p = tmp_path / "bad.json"
    p.write_text(text)
    r = analyze(str(p))
    assert any("not strictly valid JSON" in n for n in r.notes)
    assert r.metrics["steps"]["count"] == 2


def test_negative_durations_are_clamped_with_a_note():
    tb = TraceBuilder()
    busy_steps(tb, 2, 1000, 500)
    tb.op("aten::weird", 100, -0.001)
    r = analyze(tb.to_dict())
    assert any("negative durations" in n for n in r.notes)


def test_unexpected_types_take_the_lenient_path(tmp_path):
    tb = TraceBuilder()
    busy_steps(tb, 2, 1000, 500)
    d = tb.to_dict()
    d["traceEvents"][1]["args"]["stream"] = "7"  # a string where an int is expected
    p = tmp_path / "t.json"
    p.write_text(json.dumps(d))
    r = analyze(str(p))
    assert r.metrics["steps"]["count"] == 2
    assert r.metrics["kernels"]["count"] == 2


def test_cpu_only_trace_and_no_steps():
    tb = TraceBuilder(cc=None)
    tb.op("aten::mm", 0, 100)
    tb.op("aten::add", 200, 50)
    r = analyze(tb.to_dict())
    assert r.metrics["trace"]["cpu_only"] is True
    assert r.metrics["gpu"]["busy_frac"] is None
    assert r.metrics["window"]["source"] == "trace"
    assert r.metrics["window"]["dur_ms"] == pytest.approx(0.25)
    assert any("CPU activity only" in n for n in r.notes)
    assert any("whole trace" in n for n in r.notes)


def test_rocm_names():
    tb = TraceBuilder()
    for i in range(3):
        tb.step(i + 1, i * 1000, 1000)
        tb._gpu("kernel", "Cijk_Ailk_Bljk_SB_MT64x64", i * 1000 + 100, 200, i * 1000 + 10, 0, 0, launch="hipLaunchKernel")
        tb.runtime("hipStreamSynchronize", i * 1000 + 20, 290)
    r = analyze(tb.to_dict())
    assert r.metrics["syncs"]["by_name"]["hipStreamSynchronize"]["count"] == 3
    assert r.metrics["kernels"]["count"] == 3


def test_several_gpus_and_streams_busy_is_a_union_not_a_sum():
    tb = TraceBuilder()
    tb.step(1, 0, 1000)
    tb.kernel("k_a", 100, 600, stream=7)
    tb.kernel("k_b", 200, 600, stream=14)  # overlaps k_a: union 100..800
    tb.kernel("k_c", 100, 100, device=1)
    r = analyze(tb.to_dict())
    g = r.metrics["gpu"]
    assert g["primary_device"] == 0
    assert g["busy_frac"] == pytest.approx(0.7)
    assert {d["device"] for d in g["per_device"]} == {0, 1}
    assert next(d for d in g["per_device"] if d["device"] == 0)["streams"] == [7, 14]


def test_flows_link_when_correlation_args_are_missing():
    tb = TraceBuilder()
    tb.step(1, 0, 1000)
    tb.add(cat="cuda_runtime", name="cudaLaunchKernel", ts=10.0, dur=3.0, args={})
    tb.add(ph="s", cat="ac2g", name="ac2g", id=77, ts=10.0)
    tb.add(cat="kernel", name="k", ts=500.0, dur=100.0, pid=0, tid=7, args={"device": 0, "stream": 7})
    tb.add(ph="f", cat="ac2g", name="ac2g", id=77, ts=500.0, pid=0, tid=7, bp="e")
    from gpumagic.analysis.context import build_context

    ctx = build_context(load_trace(tb.to_dict()))
    k = np.flatnonzero(ctx.masks["kernel"])[0]
    assert ctx.launch_ts[k] == ctx.trace.events.ts_ns[np.flatnonzero(ctx.masks["runtime"])[0]]


def test_bundle_samples_are_aligned_by_the_clock_anchor():
    tb = TraceBuilder()
    busy_steps(tb, 2, 1000, 500)
    tb.op("gpumagic::clock_anchor", 50.0, 1.0, cat="user_annotation")
    d = tb.to_dict()
    anchor_epoch = 1_700_000_000_000_000_000
    d["gpumagic"] = {"format": 1, "label": "run-a", "notes": ["NVML not available"],
                     "clock": {"anchor_epoch_ns": anchor_epoch},
                     "samples": {"gpu": {"t_epoch_ns": [anchor_epoch, anchor_epoch + 1_000_000], "device": [0, 0],
                                         "gpu_util": [50, 70], "mem_used_bytes": [10, 20], "mem_total_bytes": [100, 100]},
                                 "cpu": {"t_epoch_ns": [anchor_epoch], "total": [30.0]}}}
    t = load_trace(d)
    assert t.meta["label"] == "run-a"
    assert "NVML not available" in t.notes
    # the anchor annotation starts 50 µs after the trace origin
    assert t.samples.gpu["t_ns"].tolist() == [50_000, 1_050_000]
    r = analyze(t)
    assert r.label == "run-a"
    assert r.metrics["samples"]["gpu_util_mean"] == 60.0


@pytest.mark.parametrize(("content", "message"), [
    (b"", "empty"),
    (b"not json at all", "not valid JSON"),
    (b'{"hello": 1}', "no traceEvents"),
    (b'{"traceEvents": []}', "no profiler events"),
    (b"[1, 2, 3]", "no profiler events"),
    (b'"just a string"', "not a PyTorch profiler trace"),
])
def test_bad_input_raises_one_sentence(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(TraceError, match=message) as exc:
        analyze(str(p))
    assert "\n" not in str(exc.value)


def test_a_directory_names_the_traces_inside_it(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match=r"is a directory, not a trace file \(it holds no \.json or \.json\.gz file\)$"):
        load_trace(str(tmp_path / "empty"))
    logs = tmp_path / "logs"
    logs.mkdir()
    for i, name in enumerate(["host_1.pt.trace.json.gz", "host_2.pt.trace.json", "notes.txt", "host_3.pt.trace.json.gz",
                              "host_4.json", "host_5.json.gz"]):
        (logs / name).write_bytes(b"{}")
        os.utime(logs / name, (1_700_000_000 + i, 1_700_000_000 + i))
    with pytest.raises(TraceError) as exc:
        load_trace(str(logs))
    msg = str(exc.value)
    assert "\n" not in msg and "notes.txt" not in msg
    assert msg.endswith(f"give one of its 5 trace files, newest first: {logs / 'host_5.json.gz'}, {logs / 'host_4.json'}, "
                        f"{logs / 'host_3.pt.trace.json.gz'} and 2 more")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "w.pt.trace.json").write_bytes(b"{}")
    with pytest.raises(TraceError, match=r"its trace file is .*w\.pt\.trace\.json$"):
        load_trace(str(tmp_path / "one"))


def test_missing_directory_and_truncated(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        analyze(str(tmp_path / "nope.json"))
    with pytest.raises(TraceError, match="directory"):
        analyze(str(tmp_path))
    with open(os.path.join(DATA, "h100_bert_small_inference.json.gz"), "rb") as fh:
        raw = fh.read()
    (tmp_path / "cut.json.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceError, match="truncated or corrupt gzip"):
        analyze(str(tmp_path / "cut.json.gz"))
    (tmp_path / "cut.json").write_bytes(gzip.decompress(raw)[:100_000])
    with pytest.raises(TraceError, match="not valid JSON"):
        analyze(str(tmp_path / "cut.json"))
