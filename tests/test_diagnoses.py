"""Issue 10: diagnoses right for the reason they state, on small built traces that isolate each
cause (both sides of every threshold). The real traces are in test_expected.py and
test_report_invariants.py."""

import pytest
from tracebuilder import TraceBuilder, busy_steps

from gpumagic import analyze
from gpumagic.analysis import names as nm
from gpumagic.analysis.context import LAUNCH_LATENCY_MAX_NS, build_context
from gpumagic.analysis.metrics import SYNC_MIN_BLOCKED_NS
from gpumagic.report.model import SCHEMA_VERSION
from gpumagic.trace import load


def report(tb):
    return analyze(tb.to_dict())


def fixes_text(r):
    return "\n".join(fx.description + "\n" + fx.code for f in r.findings for fx in f.fixes)


# ---- 1. host syncs: harmful only for the time they blocked while the GPU had queued work
def _sync_step_trace(sync_start: float, sync_dur: float, host_work_us: float = 1_500, sync="cudaStreamSynchronize"):
    """Five 4 ms steps: a 2 ms kernel launched at the step's start, a sync, then host work
    (``host_work_us``) before the next step's launch."""
    tb = TraceBuilder()
    for i in range(5):
        t = i * 4_000
        tb.step(i + 1, t, 4_000)
        tb.kernel("k_elementwise", t + 10, 2_000, launch_ts=t + 1)
        tb.runtime(sync, t + sync_start, sync_dur)
        tb.op("aten::my_preprocess", t + sync_start + sync_dur + 5, host_work_us)
    return tb


def test_a_sync_that_blocks_while_the_gpu_works_is_harmful():
    r = report(_sync_step_trace(20, 1_990))  # blocks 1.99 ms until the kernel ends
    s = r.metrics["syncs"]
    assert s["harmful_count"] == 4  # the last one has no GPU work after it
    assert s["blocked_ms"] == pytest.approx(5 * 1.99, abs=0.02)
    f = r.finding("host-sync")
    assert f is not None and "cudaStreamSynchronize" in f.title
    # the GPU then idles 2 ms per step waiting for the host; running 1.99 ms ahead hides 1.99 ms
    assert f.evidence.numbers["starved_ms"] == s["starved_ms"] == pytest.approx(4 * 1.99, abs=0.01)


def test_a_sync_that_returns_at_once_into_an_idle_gpu_is_harmless_however_long_the_gap():
    r = report(_sync_step_trace(2_100, 6))  # the kernel ended at 2.01 ms; the sync takes 6 µs
    s = r.metrics["syncs"]
    assert s["count"] == 5 and s["harmful_count"] == 0 and s["blocked_ms"] == 0
    assert "host-sync" not in r.finding_ids
    assert r.metrics["idle"]["host_wait_ms"] > 5  # the gap is the host's preprocessing


@pytest.mark.parametrize(("blocked_us", "harmful"), [(SYNC_MIN_BLOCKED_NS / 1000 - 4, False),
                                                      (SYNC_MIN_BLOCKED_NS / 1000 + 4, True)])
def test_sync_min_blocked_threshold(blocked_us, harmful):
    # the sync starts blocked_us before the kernel ends
    r = report(_sync_step_trace(2_010 - blocked_us, blocked_us + 1))
    assert (r.metrics["syncs"]["harmful_count"] > 0) is harmful


def test_blocking_calls_of_both_runtimes():
    for name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                 "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpyWithStream"):
        assert nm.is_sync_call(name), name
    for name in ("cudaEventQuery", "cudaStreamWaitEvent", "hipStreamWaitEvent", "cudaStreamQuery",
                 "Event Sync", "Stream Wait Event", "Context Sync", "cudaMemcpyAsync"):
        assert not nm.is_sync_call(name), name


def test_hip_memcpy_with_stream_blocks_like_a_sync():
    r = report(_sync_step_trace(20, 1_990, sync="hipMemcpyWithStream"))
    assert r.metrics["syncs"]["harmful_count"] == 4


def test_an_async_copy_to_pageable_memory_is_a_sync_and_to_pinned_memory_is_not():
    def trace(memory):
        tb = TraceBuilder()
        for i in range(5):
            t = i * 4_000
            tb.step(i + 1, t, 4_000)
            tb.kernel("k_elementwise", t + 10, 2_000, launch_ts=t + 1)
            tb.memcpy(f"Memcpy DtoH (Device -> {memory})", t + 2_012, 3, 4, launch_ts=t + 20)
            tb.events[-2]["dur"] = 1_996.0  # the cudaMemcpyAsync call returns when the copy is done
            tb.op("aten::my_preprocess", t + 2_030, 1_500)
        return report(tb)

    assert trace("Pageable").metrics["syncs"]["harmful_count"] == 4
    assert trace("Pinned").metrics["syncs"]["count"] == 0


def test_a_final_sync_that_only_drains_the_queue_costs_nothing():
    tb = TraceBuilder()
    busy_steps(tb, 3, 10_000, 9_000)
    tb.runtime("cudaDeviceSynchronize", 20_100, 8_900)  # waits for the last kernel, nothing after
    r = report(tb)
    assert r.metrics["syncs"]["blocked_ms"] > 8 and r.metrics["syncs"]["harmful_count"] == 0


# ---- idle gaps split at the launch
def _gap_trace(launch_offset_us: float, wait_call: str | None = None):
    """One 1 ms kernel, a 3 ms gap, the next kernel; its launch ``launch_offset_us`` after the gap began."""
    tb = TraceBuilder()
    tb.step(1, 0, 4_910)
    tb.kernel("k_a", 10, 1_000, launch_ts=1)
    if wait_call:
        tb.runtime(wait_call, 1_010 + launch_offset_us - 5, 2)
    tb.kernel("k_b", 4_010, 900, launch_ts=1_010 + launch_offset_us)
    return tb


def test_a_gap_whose_work_was_launched_a_moment_after_it_began_is_mostly_queued():
    r = report(_gap_trace(100, wait_call="cudaStreamWaitEvent"))
    i = r.metrics["idle"]
    assert i["host_wait_ms"] == pytest.approx(0.1 + LAUNCH_LATENCY_MAX_NS / 1e6 + 0.01, abs=0.002)
    assert i["other_ms"] == pytest.approx(3.0 - 0.1 - LAUNCH_LATENCY_MAX_NS / 1e6, abs=0.002)
    gap = max(i["gaps"], key=lambda g: g["end_ns"] - g["start_ns"])
    assert gap["cause"] == "stream_wait"  # the dependency is named


def test_a_gap_whose_work_was_launched_at_its_end_is_host_wait():
    r = report(_gap_trace(2_980))
    i = r.metrics["idle"]
    assert i["other_ms"] < 0.02 and i["host_wait_ms"] == pytest.approx(3.0, abs=0.02)


@pytest.mark.parametrize(("gap_us", "cause"), [(LAUNCH_LATENCY_MAX_NS / 1000 - 10, "launch_latency"),
                                               (LAUNCH_LATENCY_MAX_NS / 1000 + 10, "other")])
def test_a_gap_whose_work_was_already_queued(gap_us, cause):
    tb = TraceBuilder()
    tb.step(1, 0, 2_000)
    tb.kernel("k_a", 10, 500, launch_ts=1)
    tb.kernel("k_b", 510 + gap_us, 500, launch_ts=2)
    tb.kernel("k_c", 1_100 + gap_us, 800, launch_ts=1_090 + gap_us)
    gaps = report(tb).metrics["idle"]["gaps"]
    assert next(g for g in gaps if g["start_ns"] == 510_000)["cause"] == cause


def test_a_leading_gap_whose_work_was_queued_before_the_window_is_not_host_wait():
    tb = TraceBuilder()
    tb.runtime("cudaMemcpyAsync", 0, 5, corr=77)  # enqueued, no step markers: the window is the trace
    tb.add(cat="gpu_memcpy", name="Memcpy HtoD (Pinned -> Device)", ts=3_000, dur=50, pid=0, tid=7,
           args={"device": 0, "stream": 7, "correlation": 77, "bytes": 1024})
    tb.kernel("k", 3_060, 2_000, launch_ts=10)
    i = report(tb).metrics["idle"]
    assert i["host_wait_ms"] < 0.05 and i["other_ms"] == pytest.approx(3.0, abs=0.05)


def _cut_lead(host_us: float) -> TraceBuilder:
    """A trace whose first kernel (at 5 ms) was launched before it began (no launch recorded):
    ``host_us`` of host operators on the main thread before it, then a busy step of launches."""
    tb = TraceBuilder()
    tb.add(cat="python_function", name="worker loop", ts=0, dur=2, tid=99)  # the trace begins: another thread
    tb.add(cat="kernel", name="k_first", ts=5_000, dur=1_000, pid=0, tid=7, args={"device": 0, "stream": 7})
    if host_us:
        tb.op("aten::copy_", 0, host_us)
    for i in range(5):
        tb.kernel("k", 6_000 + i * 1_000, 990, launch_ts=5_990 + i * 1_000)
    return tb


def test_a_leading_gap_without_its_launch_is_host_wait_only_where_the_host_was_recorded_busy():
    """A trace cut before its first launches (an on-demand trace; the real MI300X vLLM decode trace
    cut at a tenth held 6.3 ms of such a gap and read launch-bound, 68 %): what the GPU waited for
    is not recorded, so only the host time recorded in the gap is host wait."""
    # (the four 10 µs gaps between the later kernels, each launched at its start, add 0.04 ms of host wait)
    i = report(_cut_lead(0)).metrics["idle"]
    assert i["host_wait_ms"] == pytest.approx(0.04, abs=0.005) and i["other_ms"] == pytest.approx(5.0, abs=0.02)
    i = report(_cut_lead(3_000)).metrics["idle"]
    assert i["host_wait_ms"] == pytest.approx(3.04, abs=0.01) and i["other_ms"] == pytest.approx(2.0, abs=0.02)
    assert "launch-bound" not in report(_cut_lead(0)).finding_ids


def test_collective_and_graph_dependencies_are_named():
    tb = TraceBuilder()
    tb.step(1, 0, 6_000)
    tb.kernel("k_a", 10, 1_000, launch_ts=1)
    tb.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", 4_000, 500, launch_ts=20, stream=20)
    gaps = report(tb).metrics["idle"]["gaps"]
    assert max(gaps, key=lambda g: g["end_ns"] - g["start_ns"])["cause"] == "collective"


# ---- graph replays are not launch-bound
def _tiny_kernels(graph: bool):
    tb = TraceBuilder()
    tb.step(1, 0, 20_000)
    if graph:
        tb.add(cat="cuda_runtime", name="cudaGraphLaunch", ts=5, dur=400, args={"correlation": 9})
    for i in range(400):
        t = 10 + i * 45.0
        if graph:
            tb.add(cat="kernel", name="vectorized_elementwise_kernel", ts=t + 8, dur=4, pid=0, tid=7,
                   args={"device": 0, "stream": 7, "correlation": 9})
        else:
            tb.kernel("vectorized_elementwise_kernel", t + 8, 4, launch_ts=t)
    return tb


def test_graph_replay_is_not_launch_bound():
    assert "launch-bound" in report(_tiny_kernels(graph=False)).finding_ids
    r = report(_tiny_kernels(graph=True))
    assert r.metrics["kernels"]["graph_frac"] == 1.0
    assert "launch-bound" not in r.finding_ids
    assert "reduce-overhead" not in fixes_text(r) and "CUDAGraph" not in fixes_text(r)


# ---- warm-up only on threads that drive the GPU; a cache lookup is not compilation
def test_compilation_counts_only_on_threads_that_drive_the_gpu():
    def trace(tid):
        tb = TraceBuilder()
        busy_steps(tb, 4, 10_000, 9_000)
        tb.op("torch/_inductor/async_compile.py(42): wait", 100, 30_000, cat="python_function", tid=tid)
        return report(tb)

    assert "warmup-in-window" not in trace(tid=555).finding_ids  # an idle compile-pool worker
    assert "warmup-in-window" in trace(tid=100).finding_ids  # the main thread compiling


def test_a_dynamo_cache_lookup_is_not_compilation():
    assert not nm.is_compile("TorchDynamo Cache Lookup")
    assert not nm.is_compile("Torch-Compiled Region: 0/0")
    assert nm.is_compile("torch/_dynamo/convert_frame.py(600): _compile")


# ---- where the host was: the innermost frame that covers the gap
def test_the_gap_story_names_the_innermost_frame_that_covers_it():
    tb = TraceBuilder()
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.op("<module>", t, 9_990, cat="python_function")
        tb.op("train.py(12): load_batch", t + 6_000, 3_900, cat="python_function")
        tb.op("aten::copy_", t + 9_850, 40)  # overlaps a sliver of the gap only
        tb.kernel("k", t + 10, 5_990, launch_ts=t + 1)
    f = report(tb).finding("gpu-idle-gaps")
    assert f is not None
    assert "train.py(12): load_batch" in f.evidence.summary
    assert "<module>" not in f.evidence.summary and "aten::copy_" not in f.evidence.summary


def test_a_frame_that_overlaps_only_a_sliver_of_the_gap_is_not_named():
    tb = TraceBuilder()
    tb.step(1, 0, 20_000)
    tb.kernel("k_a", 10, 500, launch_ts=1)
    tb.op("aten::mm", 19_000, 990)
    tb.kernel("k_b", 19_990, 10, launch_ts=19_985)
    f = report(tb).finding("gpu-idle-gaps")
    assert "no profiled activity" in f.evidence.summary and "aten::mm" not in f.evidence.summary


# ---- 2. every vendor's names
@pytest.mark.parametrize(("name", "matmul", "tensor_core"), [
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1", True, True),
    ("Cijk_Ailk_Bljk_SB_MT64x64x16_SN_K1", True, False),  # fp32 Tensile kernel without MFMA
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt64x64x16", True, True),  # MIOpen xdlops
    ("attn_fwd", True, True),  # Triton flash attention
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1", True, True),  # Triton MoE matmul
    ("kernel_unified_attention_3d", True, True),  # vLLM Triton attention
    ("_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwd", False, False),  # CK RMSNorm: no matmul
    ("ampere_sgemm_128x64_nn", True, False),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", True, True),
])
def test_matmul_and_matrix_core_names(name, matmul, tensor_core):
    assert nm.is_matmul(name) is matmul
    assert nm.is_tensor_core(name) is tensor_core


@pytest.mark.parametrize("name", [
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", "rcclKernel_AllGather", "multimem_all_reduce_kernel",
    "one_shot_all_reduce", "two_shot_all_reduce_kernel", "void vllm::cross_device_reduce_1stage<float, 8>()",
    "custom_all_reduce_kernel"])
def test_collective_names(name):
    assert nm.is_collective(name) and not nm.is_matmul(name)


def test_rocm_device_ids_map_to_device_properties_and_hip_allocator_records():
    tb = TraceBuilder(gpu_name="AMD Instinct MI300X", total_mem=192 * 2**30, cc=(9, 4))
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.kernel("Cijk_Ailk_Bljk_SB_MT64x64x16_SN_K1", t + 10, 6_000, launch_ts=t + 1, device=2)
    tb.add(ph="i", cat="cpu_instant_event", name="[memory]", ts=100, s="t",
           args={"Device Type": 6, "Device Id": 0, "Bytes": 0, "Total Allocated": 2**30, "Total Reserved": 2**31})
    r = report(tb)
    assert r.metrics["gpu"]["primary_device"] == 2
    assert r.metrics["memory"]["peak_frac"] == pytest.approx(1 / 192, abs=1e-4)  # peak allocated / capacity
    assert r.metrics["memory"]["peak_reserved_bytes"] == 2**31
    assert "mixed-precision-off" in r.finding_ids  # FP32 Tensile GEMMs on a matrix-core GPU


def test_an_unsigned_minus_one_stream_loads():
    tb = TraceBuilder()
    busy_steps(tb, 2, 1_000, 500)
    tb.add(cat="cuda_sync", name="Stream Sync", ts=600, dur=5, pid=0, tid=7,
           args={"stream": 4294967295, "device": 0, "correlation": 5})
    trace = load(tb.to_dict())
    assert (trace.events.stream >= -1).all()
    assert analyze(trace).metrics["syncs"]["count"] == 0  # a CUPTI record is not a host call


# ---- 3. one story
def test_report_json_has_schema_version_and_combined_gain():
    d = report(_sync_step_trace(20, 1_990)).to_dict()
    assert d["schema_version"] == SCHEMA_VERSION >= 2
    assert 0 <= d["combined_gain"] <= 1
    assert all(f["est_gain"] <= d["combined_gain"] for f in d["findings"])


def test_idle_gaps_already_told_as_data_loader_waits_are_not_a_second_finding():
    tb = TraceBuilder()
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.dataloader(t, 4_000)
        tb.kernel("k", t + 4_100, 5_800, launch_ts=t + 4_010)
    r = report(tb)
    assert "dataloader-bound" in r.finding_ids and "gpu-idle-gaps" not in r.finding_ids
    assert r.metrics["idle"]["long_gap_count"] == 4  # the metrics still show them


def test_severity_follows_the_gain():
    from gpumagic.analysis.rules.base import severity_for

    for tb in (_sync_step_trace(20, 1_990), _tiny_kernels(False)):
        for f in report(tb).findings:
            if f.id not in ("memory-pressure", "warmup-in-window", "pageable-memcpy"):
                assert f.severity == severity_for(f.est_gain), f.id


# ---- 4. advice that fits the workload and the machine
def _loader_trace(training: bool, gpu: bool = True):
    tb = TraceBuilder(cc=(8, 0) if gpu else None)
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.dataloader(t, 4_000)
        tb.op("aten::to", t + 4_000, 50)
        if gpu:
            tb.kernel("ampere_sgemm_128x64_nn", t + 4_100, 5_800, launch_ts=t + 4_010)
        else:
            tb.op("aten::addmm", t + 4_100, 5_800)
        if training:
            tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 9_000, 500)
            tb.op("Optimizer.step#AdamW.step", t + 9_600, 300)
    return tb


def test_inference_reports_have_no_training_advice():
    r = report(_loader_trace(training=False))
    assert r.metrics["trace"]["workload"] == "inference"
    text = fixes_text(r) + " ".join(f.title + f.why for f in r.findings)
    for word in ("training loop", "TrainingArguments", "optimizer", "GradScaler", "backward", "shuffle=True", "fused=True"):
        assert word not in text, word


def test_training_reports_keep_training_advice():
    r = report(_loader_trace(training=True))
    assert r.metrics["trace"]["workload"] == "training"
    assert "shuffle=True" in fixes_text(r) and "TrainingArguments" in fixes_text(r)


def test_cpu_only_reports_have_no_cuda_advice():
    r = report(_loader_trace(training=True, gpu=False))
    assert r.metrics["trace"]["cpu_only"] and "dataloader-bound" in r.finding_ids
    text = fixes_text(r)
    for word in ("pin_memory", "non_blocking", ".cuda(", '"cuda"', "CUDAGraph", "reduce-overhead"):
        assert word not in text, word


def test_a_plain_trace_says_the_worker_count_is_an_assumption():
    r = report(_loader_trace(training=True))
    f = r.finding("dataloader-bound")
    assert "assumption" in f.evidence.summary
    assert "os.sched_getaffinity(0)" in f.fixes[0].code and "num_workers=max(1, usable_cores - 1)" in f.fixes[0].code
    compile(f.fixes[0].code.replace("dataset, batch_size=batch_size", "[], batch_size=1")
            .replace("torch.utils.data.DataLoader", "dict"), "<fix>", "exec")  # valid Python


def _with_samples(tb, busy_pct: float, main_pct: float, usable=2, workers=0, demand_pct: float | None = None):
    """A bundle: the trace plus a machine record and CPU samples every 2 ms."""
    d = tb.to_dict()
    times = list(range(0, 40_001_000, 2_000_000))
    d["gpumagic"] = {
        "format": 1, "label": "", "notes": [], "capture": {},
        "machine": {"cpu_count": usable, "cpu_affinity": list(range(usable)), "cpu_quota_cores": None,
                    "usable_cores": float(usable), "usable_cores_source": "affinity"},
        "versions": {}, "clock": {"anchor_epoch_ns": None},
        "samples": {"cpu": {"t_epoch_ns": times, "total": [busy_pct] * len(times),
                            "per_core": [[busy_pct] * usable] * len(times), "main": [main_pct] * len(times),
                            "workers": [0.0] * len(times), "worker_count": [workers] * len(times)}},
    }
    if demand_pct is not None:
        d["gpumagic"]["samples"]["cpu"].update(main_demand=[demand_pct] * len(times), workers_demand=[0.0] * len(times))
    return analyze(d)


@pytest.mark.parametrize(("busy_pct", "fires"), [(85.0, False), (95.0, True)])
def test_host_cpu_saturated_threshold(busy_pct, fires):
    r = _with_samples(_loader_trace(training=True), busy_pct, main_pct=100.0)
    assert ("host-cpu-saturated" in r.finding_ids) is fires
    assert r.metrics["host"]["cpu_saturation"] == pytest.approx(busy_pct / 100)
    text = fixes_text(r)
    assert "num_workers=2" not in text and "num_workers=4" not in text  # never more than the cores allow
    if fires:
        f = r.finding("host-cpu-saturated")
        assert f.evidence.numbers["cpu_saturation"] == r.metrics["host"]["cpu_saturation"]
        assert "decode_jpeg" in text
        assert "dataloader-bound" not in r.finding_ids  # the same waits, told once
    else:
        f = r.finding("dataloader-bound")
        assert f.evidence.numbers["suggested_num_workers"] == 1  # 2 usable cores, 1.7 busy: one spare
        assert "num_workers=1," in f.fixes[0].code


def test_host_cpu_saturated_never_fires_without_samples():
    assert "host-cpu-saturated" not in report(_loader_trace(training=True)).finding_ids


def test_with_spare_cores_the_fix_is_the_count_they_allow():
    r = _with_samples(_loader_trace(training=True), 25.0, main_pct=100.0, usable=8)
    f = r.finding("dataloader-bound")
    assert f.evidence.numbers["suggested_num_workers"] == 6  # 8 usable, 2 busy: 6 spare, ≤ 7
    assert "recorded at capture" in f.evidence.summary


def _loading_in_main_trace(load_us: int, step_us: int = 10_000):
    """A CPU-only training loop whose main process loads each batch itself (``num_workers=0``)."""
    tb = TraceBuilder(cc=None)
    for i in range(4):
        t = i * step_us
        tb.step(i + 1, t, step_us)
        tb.dataloader(t, load_us)
        tb.op("aten::addmm", t + load_us + 50, step_us - load_us - 400)
        tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + step_us - 300, 250)
    return tb


@pytest.mark.parametrize(("usable", "load_us", "workers"), [(2, 9_500, 2), (2, 4_000, 1), (4, 9_500, 4), (8, 4_000, 7)])
def test_the_core_the_main_process_loads_on_is_the_workers_once_they_take_the_loading(usable, load_us, workers):
    """With ``num_workers=0`` and CPU-bound loading, the main process's busy core is mostly the
    loading, which moves into the workers: they may use it. On 2 cores, a loop that loads 95 % of
    each step gets 2 workers (measured on this project's 2-core machine: 15.0 ms a step with none,
    15.6 ms with 1, 9.0 ms with 2), one that loads 40 % keeps 1 (the main process still needs most
    of a core); never more than the usable cores, PyTorch's own ceiling."""
    r = _with_samples(_loading_in_main_trace(load_us), 100.0 / usable, main_pct=100.0, usable=usable)
    f = r.finding("dataloader-bound")
    assert r.metrics["host"]["loader_cpu_bound"] is True
    assert f.evidence.numbers["suggested_num_workers"] == workers
    assert f"num_workers={workers}," in f.fixes[0].code
    assert ("once the loading leaves the main process" in f.evidence.summary) and "recorded at capture" in f.evidence.summary
    assert f.gain_method.startswith(f"estimate: the data-loader wait that {workers} worker(s) would hide")


def test_only_the_main_process_own_cpu_bound_loading_moves():
    """Workers already running, loading that is not CPU work, or no CPU samples: nothing moves, and
    the count is the spare cores' (at most ``usable − 1``)."""
    from gpumagic.analysis.hostcpu import HostCpu, loading_in_main, suggested_workers

    main_loads = HostCpu(2.0, "affinity", 20, 1.0, 0.5, True, "samples", 0)
    assert loading_in_main(main_loads, 1.0, 0.95) == 0.95 and suggested_workers(main_loads, 0.95) == 2
    assert loading_in_main(main_loads, 0.6, 0.95) == 0.6  # never more than the process's own busy cores
    for other in (HostCpu(2.0, "affinity", 20, 1.0, 0.5, True, "samples", 1),  # workers running
                  HostCpu(2.0, "affinity", 20, 1.0, 0.5, False, "samples", 0),  # I/O, sleeps
                  HostCpu(2.0, "unknown", 0, None, None, True, "main-thread ops", None)):  # no samples
        assert loading_in_main(other, 1.0, 0.95) == 0.0
        assert suggested_workers(other, 0.0) == 1


def test_workers_that_take_what_the_cores_allow_get_no_count_at_or_below_theirs():
    """Two CPU-bound workers on 2 cores, 1.7 of them busy: the count the cores allow is the
    two there are. The finding said "1 worker(s): what the spare cores allow" with a fix setting
    ``num_workers=1`` (fewer than running) and a gain under 1 %; it now says more would not help,
    offers the cheaper-batch fix, and claims the wait as an upper bound."""
    d = _loading_in_main_trace(4_000).to_dict()
    times = list(range(0, 40_001_000, 2_000_000))
    d["gpumagic"] = {
        "format": 1, "label": "", "notes": [], "capture": {},
        "machine": {"cpu_count": 2, "cpu_affinity": [0, 1], "cpu_quota_cores": None,
                    "usable_cores": 2.0, "usable_cores_source": "affinity"},
        "versions": {}, "clock": {"anchor_epoch_ns": None},
        "samples": {"cpu": {"t_epoch_ns": times, "total": [85.0] * len(times), "per_core": [[85.0, 85.0]] * len(times),
                            "main": [20.0] * len(times), "workers": [150.0] * len(times),
                            "worker_count": [2] * len(times)}},
    }
    r = analyze(d)
    assert r.metrics["host"]["loader_cpu_bound"] is True and "host-cpu-saturated" not in r.finding_ids
    f = r.finding("dataloader-bound")
    assert "The 2 worker(s) running already take what the cores allow" in f.evidence.summary
    assert "suggested_num_workers" not in f.evidence.numbers
    assert "num_workers=" not in fixes_text(r) and "cache" in f.fixes[0].description
    assert f.est_gain == pytest.approx(0.4, abs=0.01) and not f.gain_method.startswith("estimate")


def test_an_io_bound_wait_may_use_more_workers_than_cores_and_says_why():
    r = _with_samples(_loader_trace(training=True), 20.0, main_pct=5.0, usable=4)
    f = r.finding("dataloader-bound")
    assert f.evidence.numbers["suggested_num_workers"] == 8
    assert "not CPU work" in f.evidence.summary


def test_cpu_only_saturated_fix_has_no_gpu_decode():
    r = _with_samples(_loader_trace(training=True, gpu=False), 97.0, main_pct=100.0)
    assert "host-cpu-saturated" in r.finding_ids
    text = fixes_text(r)
    assert "decode_jpeg" not in text and "pin_memory" not in text and "cuda" not in text


def test_build_context_caches_the_workload():
    ctx = build_context(load(_loader_trace(training=True).to_dict()))
    assert ctx.workload == "training" and ctx.workload == "training"


@pytest.mark.parametrize(("demand_pct", "cpu_bound"), [(5.0, False), (95.0, True)])
def test_on_saturated_cores_the_loaders_demand_tells_sleeping_from_starved(demand_pct, cpu_bound):
    """Other processes keep both cores busy; the loader got 30 % of a core. Whether it wanted a
    core (starved: CPU work) or slept (I/O) comes from its run + run-queue time."""
    r = _with_samples(_loader_trace(training=True), 100.0, main_pct=30.0, demand_pct=demand_pct)
    assert r.metrics["host"]["loader_cpu_bound"] is cpu_bound
    assert ("host-cpu-saturated" in r.finding_ids) is cpu_bound
    if not cpu_bound:  # sleeping loaders overlap across workers whatever the cores: more help
        assert r.finding("dataloader-bound").evidence.numbers["suggested_num_workers"] == 4


def test_without_demand_samples_a_saturated_machine_leaves_the_loader_unknown():
    r = _with_samples(_loader_trace(training=True), 100.0, main_pct=30.0)
    assert r.metrics["host"]["loader_cpu_bound"] is None
    assert "host-cpu-saturated" not in r.finding_ids  # cannot tell: no claim that workers won't help


def test_the_sampler_records_what_the_loading_threads_wanted():
    from gpumagic.capture.cpu import CpuTimes, cpu_row

    before = CpuTimes(cores=[(0, 0)], main_ticks=0, main_demand_ns=0, worker_demand_ns={7: 0})
    after = CpuTimes(cores=[(100, 100)], main_ticks=30, main_demand_ns=900_000_000, worker_demand_ns={7: 500_000_000})
    row = cpu_row(before, after, dt_s=1.0, hz=100, t_epoch_ns=1)
    assert row["main"] == 30.0 and row["main_demand"] == 90.0 and row["workers_demand"] == 50.0
    assert "main_demand" not in cpu_row(CpuTimes([(0, 0)], 0), CpuTimes([(1, 1)], 0), 1.0, 100, 1)


def _scaler_step_trace(opt="Adam", scaler=True, cc=(8, 0), kernel="k_elementwise"):
    """Five 4 ms AMP steps: a 2 ms kernel launched at the step's start; GradScaler's unscale, then
    its found_inf read (``aten::item`` around a ``cudaStreamSynchronize`` that blocks until the
    kernel ends) right before ``Optimizer.step#Adam.step``; with ``scaler=False`` the same read is
    the loop's own, followed by other host work."""
    tb = TraceBuilder(cc=cc)
    for i in range(5):
        t = i * 4_000
        tb.step(i + 1, t, 4_000)
        tb.kernel(kernel, t + 10, 2_000, launch_ts=t + 1)
        if scaler:
            tb.op("aten::_amp_foreach_non_finite_check_and_unscale_", t + 15, 4)
        tb.op("aten::item", t + 20, 1_995)
        tb.op("aten::_local_scalar_dense", t + 21, 1_993)
        tb.runtime("cudaStreamSynchronize", t + 22, 1_990)
        if scaler:
            tb.add(cat="user_annotation", name=f"Optimizer.step#{opt}.step", ts=t + 2_080, dur=300)
        tb.op("aten::my_preprocess", t + 2_400, 1_500)
    return tb


def test_gradscalers_own_sync_is_told_apart_and_fixed_with_a_fused_optimizer():
    f = report(_scaler_step_trace()).finding("host-sync")
    assert "GradScaler's" in f.evidence.summary
    assert "torch.optim.Adam(model.parameters(), lr=lr, fused=True)" in f.fixes[0].code
    assert 'torch.autocast("cuda", dtype=torch.bfloat16)' in f.fixes[1].code  # Ampere: bf16 needs no scaler
    volta = report(_scaler_step_trace(cc=(7, 0))).finding("host-sync")
    assert "fused=True" in volta.fixes[0].code and "bfloat16" not in volta.fixes[1].code
    other = report(_scaler_step_trace(opt="RMSprop")).finding("host-sync")  # no fused step: the generic name
    assert "torch.optim.AdamW(model.parameters(), lr=lr, fused=True)   # Adam, AdamW" in other.fixes[0].code


def test_a_gradscaler_beside_bf16_matmuls_is_told_to_go():
    """Autocast to bfloat16 with a GradScaler copied from a float16 recipe: the scaler scales for
    nothing (bf16 keeps fp32's exponent range) and syncs each step. fp16 matmuls keep it."""
    bf16 = report(_scaler_step_trace(kernel="ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn"))
    assert bf16.metrics.kernels.matmul_bf16_ms == 10.0 and bf16.metrics.kernels.matmul_fp16_ms == 0
    f = bf16.finding("host-sync")
    assert f.fixes[0].description.startswith("Drop the GradScaler: the matmuls already run in bfloat16")
    assert "no scaler.scale" in f.fixes[0].code and not any("fused=True" in x.code for x in f.fixes)
    fp16 = report(_scaler_step_trace(kernel="ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_64x3_nn"))
    assert fp16.metrics.kernels.matmul_fp16_ms == 10.0
    g = fp16.finding("host-sync")
    assert "fused=True" in g.fixes[0].code and not g.fixes[0].description.startswith("Drop the GradScaler")


def test_an_item_the_loop_reads_itself_is_not_gradscalers():
    f = report(_scaler_step_trace(scaler=False)).finding("host-sync")
    assert "GradScaler" not in f.evidence.summary and "fused=True" not in f.fixes[0].code
