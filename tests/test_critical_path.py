"""``metrics.critical_path`` on small built traces whose bounding chain is known."""

import pytest
from tracebuilder import TraceBuilder

from gpumagic import analyze


def cp(tb):
    m = analyze(tb.to_dict()).to_dict()["metrics"]
    c = m["critical_path"]
    assert sum(c["frac"].values()) == pytest.approx(1.0, abs=2e-3)
    if m["steps"]["count"]:
        assert c["per_step_ms"] == pytest.approx(m["steps"]["durations_ms"], abs=1e-3)
    return c


def test_gpu_bound_step_is_gpu_compute():
    tb = TraceBuilder()
    for i in range(3):
        t = i * 6_000
        tb.step(i + 1, t, 6_000)
        for j in range(10):  # launched in the first 100 µs, run back to back for 5 ms
            tb.kernel("gemm_kernel", t + 20 + 500 * j, 500, launch_ts=t + 5 + 10 * j)
        tb.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t + 5_020, 500, launch_ts=t + 106)
        tb.runtime("cudaDeviceSynchronize", t + 110, 5_000 - 90 + 520)
    c = cp(tb)
    assert c["bound"]["what"] == "GPU compute"
    assert c["frac"]["gpu_compute"] > 0.8
    assert c["frac"]["gpu_comm"] == pytest.approx(500 / 6_000, abs=0.01)
    assert c["top"][0] == {"name": "gemm_kernel", "kind": "gpu_compute", "ms": pytest.approx(15.0, abs=0.01)}


def test_launch_bound_step_is_host_launches():
    tb = TraceBuilder()
    for i in range(3):
        t = i * 2_000
        tb.step(i + 1, t, 2_000)
        for j in range(90):  # a tiny kernel every 20 µs, each right after its launch
            at = t + 10 + 20 * j
            tb.op("aten::add", at, 18)
            tb.kernel("tiny_kernel", at + 16, 2, launch_ts=at + 3)
    c = cp(tb)
    assert c["bound"]["what"] == "host Python and launches"
    assert c["frac"]["host_compute"] + c["frac"]["host_launch"] > 0.8
    assert c["frac"]["gpu_compute"] < 0.15


def test_data_bound_step_is_data():
    tb = TraceBuilder()
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.dataloader(t + 10, 8_000)
        tb.kernel("k", t + 8_100, 1_000, launch_ts=t + 8_050)
        tb.runtime("cudaDeviceSynchronize", t + 8_060, 1_050)
    c = cp(tb)
    assert c["bound"]["what"] == "data loading"
    assert c["frac"]["data"] == pytest.approx(0.8, abs=0.01)
    assert c["top"][0]["kind"] == "data"


def test_sync_in_the_middle_hands_the_path_to_the_gpu_and_back():
    tb = TraceBuilder()
    for i in range(3):
        t = i * 8_200
        tb.step(i + 1, t, 7_040)  # the step ends when kernel_b does, at t + 8050
        tb.kernel("kernel_a", t + 20, 5_000, launch_ts=t + 10)  # 5 ms on the GPU
        tb.runtime("cudaStreamSynchronize", t + 15, 5_010)       # returns 5 µs after it ends
        tb.op("aten::host_work", t + 5_030, 2_000)                # 2 ms of host work
        tb.kernel("kernel_b", t + 7_050, 1_000, launch_ts=t + 7_035)
    c = cp(tb)
    assert c["links"]["sync"] == 3
    assert c["frac"]["gpu_compute"] == pytest.approx(6_000 / 8_050, abs=0.01)
    assert c["frac"]["host_compute"] == pytest.approx(2_000 / 8_050, abs=0.01)
    assert c["frac"]["sync_wait"] < 0.01
    names = {x["name"] for x in c["top"]}
    assert {"kernel_a", "kernel_b", "aten::host_work"} <= names


def test_two_streams_with_an_event_wait():
    tb = TraceBuilder()
    for i in range(3):
        t = i * 7_000
        tb.step(i + 1, t, 7_000)
        tb.kernel("producer", t + 20, 4_000, launch_ts=t + 5, stream=7)
        tb.runtime("cudaStreamWaitEvent", t + 10, 2)
        tb.kernel("consumer", t + 4_025, 2_000, launch_ts=t + 14, stream=8)  # queued; waits for the producer
        tb.runtime("cudaDeviceSynchronize", t + 20, 6_010)
    c = cp(tb)
    assert c["links"]["cross_stream"] == 3
    assert c["frac"]["gpu_compute"] == pytest.approx(6_000 / 7_000, abs=0.01)
    top = {x["name"]: x["ms"] for x in c["top"] if x["kind"] == "gpu_compute"}
    assert top["producer"] == pytest.approx(12.0, abs=0.01) and top["consumer"] == pytest.approx(6.0, abs=0.01)


def test_without_a_recorded_wait_a_late_start_is_not_blamed_on_the_host():
    tb = TraceBuilder()
    for i in range(3):
        t = i * 7_000
        tb.step(i + 1, t, 6_010)
        tb.kernel("k1", t + 20, 1_000, launch_ts=t + 5)
        tb.kernel("k2", t + 4_000, 2_000, launch_ts=t + 8)  # queued, stream free, starts 3 ms late
        tb.runtime("cudaDeviceSynchronize", t + 20, 5_990)
    c = cp(tb)
    assert c["frac"]["other"] == pytest.approx(2_980 / 6_010, abs=0.01)
    assert c["frac"]["host_compute"] + c["frac"]["host_launch"] < 0.01


def test_without_sync_calls_long_runtime_calls_during_gpu_work_are_waits_not_host_work():
    tb = TraceBuilder()
    for i in range(3):
        t = i * 5_000
        tb.step(i + 1, t, 5_000)
        tb.kernel("big", t + 20, 4_900, launch_ts=t + 5)
        tb.runtime("cudaFree", t + 30, 4_960)  # blocks until the GPU is done (not a known sync call)
    c = cp(tb)
    assert any("No blocking sync calls" in n for n in c["notes"])
    assert c["frac"]["sync_wait"] > 0.9
    assert c["frac"]["host_launch"] < 0.02  # the launch, and the call's last 70 µs after the GPU finished


def test_without_correlation_ids_the_trace_says_so():
    tb = TraceBuilder()
    for i in range(3):
        t = i * 3_000
        tb.step(i + 1, t, 3_000)
        tb.op("aten::mm", t + 5, 100)
        tb.add(cat="kernel", name="gemm", ts=t + 200, dur=2_000, pid=0, tid=7, args={"device": 0, "stream": 7})
        tb.runtime("cudaDeviceSynchronize", t + 110, 2_100)
    c = cp(tb)
    assert any("No correlation ids" in n for n in c["notes"])
    assert c["links"]["unlinked"] == 3


def test_cpu_only_trace_is_all_host():
    tb = TraceBuilder(cc=None)
    for i in range(3):
        t = i * 1_000
        tb.step(i + 1, t, 1_000)
        tb.op("aten::mm", t + 10, 900)
    c = cp(tb)
    assert c["frac"]["host_compute"] == 1.0  # the operators, and Python between them
    assert c["host_unrecorded_ms"] == pytest.approx(0.3)
    assert c["bound"]["what"] == "host operators and Python"  # no GPU: nothing is launched


def test_blocking_threshold_matches_the_sync_metrics():
    from gpumagic.analysis import critical_path, metrics

    assert critical_path.SYNC_MIN_BLOCKED_NS == metrics.SYNC_MIN_BLOCKED_NS


def test_cap_limits_a_gain_to_the_share_of_the_path_its_fix_shortens():
    from gpumagic.analysis.critical_path import KINDS, cap

    ms = dict.fromkeys(KINDS, 0.0) | {"gpu_compute": 70.0, "host_compute": 20.0, "host_launch": 5.0, "data": 5.0}
    assert cap(ms, 100.0, "cpu-bound", 0.4) == pytest.approx(0.25)
    assert cap(ms, 100.0, "dataloader-bound", 0.4) == pytest.approx(0.05)
    assert cap(ms, 200.0, "dataloader-bound", 0.4) == pytest.approx(0.025)  # steps cover half the window
    assert cap(ms, 100.0, "launch-bound", 0.1) == pytest.approx(0.1)  # below the cap: unchanged
    assert cap(ms, 100.0, "mixed-precision-off", 0.4) == 0.4  # not a time-on-the-path finding


def test_rules_gains_stay_within_the_critical_path():
    tb = TraceBuilder()
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.dataloader(t, 3_000)
        tb.kernel("k", t + 3_020, 6_900, launch_ts=t + 3_005)
        tb.runtime("cudaDeviceSynchronize", t + 3_010, 6_920)
    r = analyze(tb.to_dict())
    c = r.to_dict()["metrics"]["critical_path"]
    f = r.finding("dataloader-bound")
    assert f is not None and f.est_gain <= c["ms"]["data"] / r.to_dict()["metrics"]["window"]["dur_ms"] + 1e-4


FIXTURES = ["a100_training_rank0", "compile_triton_small", "event_sync_multistream", "h100_bert_small_inference",
            "mi300_vllm_decode_fullgraph", "resnet50_v100_workers0", "resnet50_v100_workers4",
            "v100_resnet_ns_timestamps"]


@pytest.mark.parametrize("name", FIXTURES)
def test_invariants_on_the_real_fixtures(name):
    import os

    from tracebuilder import DATA

    m = analyze(os.path.join(DATA, f"{name}.json.gz")).to_dict()["metrics"]
    c = m["critical_path"]
    assert sum(c["frac"].values()) == pytest.approx(1.0, abs=2e-3)
    assert sum(c["ms"].values()) == pytest.approx(sum(m["steps"]["durations_ms"]) or m["window"]["dur_ms"], rel=1e-3)
    if m["steps"]["count"]:
        assert c["per_step_ms"] == pytest.approx(m["steps"]["durations_ms"], abs=1e-3)
        for parts, dur in zip(m["phases"]["per_step"], m["steps"]["durations_ms"]):
            assert sum(parts.values()) == pytest.approx(dur, abs=1e-3)
    # the path's GPU links never exceed the GPU's busy time, nor its host links the host's
    gpu_ms = c["ms"]["gpu_compute"] + c["ms"]["gpu_comm"] + c["ms"]["gpu_copy"]
    assert gpu_ms <= m["gpu"]["busy_ms"] + 1e-3
    o = m["operators"]
    assert o["attributed_ms"] + o["uncovered_ms"] == pytest.approx(o["kernel_ms"], abs=2e-3)
