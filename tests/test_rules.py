"""Each rule on small hand-built traces, on both sides of its threshold."""

import numpy as np
import pytest
from tracebuilder import TraceBuilder, busy_steps

from gpumagic import analyze

GIB = 2**30


def ids(tb):
    return analyze(tb.to_dict()).finding_ids


def get(tb, fid):
    return analyze(tb.to_dict()).finding(fid)


# ---- dataloader-bound: > 5 % of the window waiting in enumerate(DataLoader)
@pytest.mark.parametrize(("wait_us", "fires"), [(400, False), (600, True)])
def test_dataloader_bound_threshold(wait_us, fires):
    tb = TraceBuilder()
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.dataloader(t, wait_us)
        tb.kernel("k", t + wait_us + 20, 8_000, launch_ts=t + wait_us + 5)
    assert ("dataloader-bound" in ids(tb)) is fires


# ---- pageable-memcpy: ≥ 1 MiB pageable and a real share of bytes or time
@pytest.mark.parametrize(("name", "nbytes", "fires"), [
    ("Memcpy HtoD (Pageable -> Device)", 4 << 20, True),
    ("Memcpy HtoD (Pageable -> Device)", 64 << 10, False),
    ("Memcpy HtoD (Pinned -> Device)", 4 << 20, False),
])
def test_pageable_memcpy(name, nbytes, fires):
    tb = TraceBuilder()
    busy_steps(tb, 3, 10_000, 8_000)
    tb.memcpy(name, 9_000, 400, nbytes, launch_ts=8_900)
    assert ("pageable-memcpy" in ids(tb)) is fires


# ---- host-sync: syncs followed by GPU starvation ≥ 2 % of the window
def _sync_trace(gap_us: float, final_only: bool = False):
    tb = TraceBuilder()
    t = 0.0
    for i in range(5):
        tb.step(i + 1, t, 2_000 + gap_us)
        tb.kernel("k", t + 10, 2_000, launch_ts=t + 1)
        if not final_only or i == 4:
            tb.runtime("cudaStreamSynchronize", t + 5, 2_005)  # returns when the kernel ends
        # the next launch comes gap_us after the sync returns
        t += 2_000 + gap_us
    return tb


def test_host_sync_fires_when_the_gpu_starves_after_syncs():
    f = get(_sync_trace(300), "host-sync")
    assert f is not None and f.evidence.numbers["harmful_syncs"] == 4  # the last one has nothing after it
    assert f.est_gain == pytest.approx(4 * 300 / (5 * 2_300), abs=0.005)


def test_host_sync_silent_for_short_starvation_and_for_a_final_sync():
    assert "host-sync" not in ids(_sync_trace(20))  # under launch latency: noise
    tb = _sync_trace(300, final_only=True)  # one sync at the very end waits on queued work: free
    assert "host-sync" not in ids(tb)


# ---- launch-bound: tiny kernels, idle GPU, host launching
def _launch_trace(kernel_us):
    tb = TraceBuilder()
    tb.step(1, 0, 20_000)
    for i in range(400):
        t = 10 + i * 45.0
        tb.kernel("vectorized_elementwise_kernel", t + 8, kernel_us, launch_ts=t)
    return tb


def test_launch_bound():
    assert "launch-bound" in ids(_launch_trace(4))
    assert "low-gpu-utilization" in ids(_launch_trace(4))
    assert "launch-bound" not in ids(_launch_trace(40))  # kernels not tiny (and GPU busy ~ 90 %)


def _decoding(tb: TraceBuilder, tokens: int = 20, t0: float = 5.0, every: float = 900.0) -> TraceBuilder:
    """Token-by-token generation on the host: each token an attention call, a pick and the ids grown
    by concatenation, as Hugging Face generate() records them."""
    for i in range(tokens):
        t = t0 + i * every
        tb.op("aten::scaled_dot_product_attention", t, 3)
        tb.op("aten::argmax", t + 5, 2)
        tb.op("aten::cat", t + 8, 2)
    return tb


def test_launch_bound_generation_gets_generates_own_compile():
    """torch.compile(model) does not reach what generate() runs: a decoding window's first fix is
    the static cache, with which transformers compiles the forward itself on a GPU."""
    f = get(_decoding(_launch_trace(4)), "launch-bound")
    assert "cache_implementation = \"static\"" in f.fixes[0].code and f.fixes[0].flavor == "huggingface"
    assert "torch.compile(model" in f.fixes[1].code  # a decoding loop of one's own
    plain = get(_launch_trace(4), "launch-bound")  # other inference: compile, then a CUDA graph
    assert not any("cache_implementation" in x.code for x in plain.fixes) and "CUDAGraph" in plain.fixes[1].code
    few = get(_decoding(_launch_trace(4), tokens=8), "launch-bound")  # 8 picks: a classifier's argmaxes
    assert not any("cache_implementation" in x.code for x in few.fixes)


# ---- low-gpu-utilization: busy < 50 %
@pytest.mark.parametrize(("kernel_us", "fires"), [(4_000, True), (6_000, False)])
def test_low_gpu_utilization(kernel_us, fires):
    tb = TraceBuilder()
    busy_steps(tb, 4, 10_000, kernel_us)
    assert ("low-gpu-utilization" in ids(tb)) is fires


# ---- gpu-idle-gaps: gaps ≥ 1 ms adding up to ≥ 5 %
@pytest.mark.parametrize(("gap_us", "fires"), [(900, False), (1_500, True)])
def test_gpu_idle_gaps(gap_us, fires):
    tb = TraceBuilder()
    step = 10_000
    for i in range(4):
        t = i * step
        tb.step(i + 1, t, step)
        tb.kernel("k", t, step - gap_us, launch_ts=t - 10 if i else t)
        tb.op("aten::log_metrics", t + step - gap_us, gap_us - 5)
    f = get(tb, "gpu-idle-gaps")
    assert (f is not None) is fires
    if fires:
        assert "aten::log_metrics" in f.evidence.summary  # the cause is named


def test_gpu_idle_gaps_with_queued_work_name_the_launch_that_queued_it():
    """Kernels of one CUDA graph, launched at the step's start, run with 2 ms holes between them:
    the host is not the holdup, and the evidence says the work was queued long before."""
    tb = TraceBuilder()
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.add(cat="cuda_runtime", name="cudaGraphLaunch", ts=t + 1, dur=20, args={"correlation": 500 + i})
        for j in range(3):
            tb.add(cat="kernel", name=f"graph_node_{j}", ts=t + 100 + j * 3_000, dur=1_000, pid=0, tid=7,
                   args={"device": 0, "stream": 7, "correlation": 500 + i})
    f = get(tb, "gpu-idle-gaps")
    assert f is not None
    assert "queued graph replay not started, launched" in f.evidence.summary
    assert "ms before it ran by cudaGraphLaunch" in f.evidence.summary
    assert "launched before it ran" in f.why  # the mechanism is explained


def test_gpu_idle_gaps_waiting_for_the_host_do_not_claim_queued_work():
    tb = TraceBuilder()
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.kernel("k", t + 2_000, 6_000, launch_ts=t + 1_990)  # launched as the gap ends
        tb.op("aten::log_metrics", t, 1_980)
    f = get(tb, "gpu-idle-gaps")
    assert f is not None and "launched" not in f.evidence.summary


# ---- mixed-precision-off: cc ≥ 7.0, FP32 matmuls, ~no tensor cores
@pytest.mark.parametrize(("cc", "kernel", "fires"), [
    ((7, 0), "volta_sgemm_128x64_nn", True),
    ((8, 0), "ampere_sgemm_128x64_nn", True),
    ((6, 1), "maxwell_sgemm_128x64_nn", False),  # no tensor cores before Volta
    ((7, 0), "volta_h884gemm_128x64_nn", False),  # fp16 tensor-core gemm
    ((9, 0), "nvjet_tst_128x64_64x4_1x2_h_bz_NNT", False),  # Hopper cuBLAS
    ((8, 0), "vectorized_elementwise_kernel", False),  # no matmul work at all
])
def test_mixed_precision_off(cc, kernel, fires):
    tb = TraceBuilder(cc=cc)
    busy_steps(tb, 3, 10_000, 6_000, kernel_name=kernel)
    tb.op("Optimizer.step#AdamW.step", 9_000, 100)  # a training step: training fixes
    f = get(tb, "mixed-precision-off")
    assert (f is not None) is fires
    if fires:
        code = " ".join(fx.code for fx in f.fixes)
        assert ("bfloat16" in code) is (cc >= (8, 0))  # bf16 needs Ampere; Volta gets fp16 + GradScaler
        assert ("GradScaler" in code) is (cc < (8, 0))


# ---- transfer-bound: exposed host↔device copies > 10 %
@pytest.mark.parametrize(("overlap", "fires"), [(False, True), (True, False)])
def test_transfer_bound(overlap, fires):
    tb = TraceBuilder()
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.memcpy("Memcpy HtoD (Pinned -> Device)", t + 100, 2_000, 64 << 20, launch_ts=t + 50, stream=20)
        tb.kernel("k", t + (100 if overlap else 2_200), 5_000, launch_ts=t + 60)
    assert ("transfer-bound" in ids(tb)) is fires


@pytest.mark.parametrize(("name", "cc", "ratio"), [
    ("Tesla V100-SXM2-32GB", (7, 0), 125.0 / 15.7),    # FP16 tensor cores (no BF16 on Volta)
    ("NVIDIA A100-SXM4-80GB", (8, 0), 312.0 / 19.5),   # BF16
    ("NVIDIA L4", (8, 9), 121.0 / 30.3),               # ~4x
    ("NVIDIA GeForce RTX 4090", (8, 9), 165.2 / 82.6),  # ~2x: FP16/BF16 with FP32 accumulate
    ("Some Future GPU", (8, 0), None),                 # not in the table: the whole matmul share
])
def test_mixed_precision_gain_is_an_upper_bound_from_the_devices_own_peaks(name, cc, ratio):
    tb = TraceBuilder(cc=cc, gpu_name=name)
    for i in range(3):  # each sgemm queued before the previous one ends: the GPU bounds the step
        tb.step(i + 1, i * 10_000, 10_000)
        tb.kernel("sgemm_128x64_nn", i * 10_000 + 10, 6_000, launch_ts=max(i * 10_000 - 5_000, 1))
    r = analyze(tb.to_dict())
    f = r.finding("mixed-precision-off")
    share = f.est_gain / (1 - 1 / ratio) if ratio else f.est_gain
    assert share == pytest.approx(r.metrics["kernels"]["matmul_ms"] * 1e6 / (r.metrics["window"]["dur_ms"] * 1e6), abs=2e-3)
    assert f.gain_method.startswith("upper bound")
    assert (f.evidence.numbers.get("peak_ratio") == pytest.approx(ratio, abs=0.01)) if ratio else \
        "peak_ratio" not in f.evidence.numbers
    assert ("no BF16 before Ampere" in f.why) is (cc < (8, 0))


# ---- memory-pressure: peak allocated > 90 % of device memory (reserved near capacity is normal)
@pytest.mark.parametrize(("allocated", "reserved", "fires"), [(0.92, 0.95, True), (0.70, 0.98, False),
                                                             (0.70, 0.80, False)])
def test_memory_pressure(allocated, reserved, fires):
    tb = TraceBuilder(total_mem=16 * GIB)
    busy_steps(tb, 2, 10_000, 8_000)
    tb.memory(100, int(allocated * 16 * GIB), int(reserved * 16 * GIB))
    f = get(tb, "memory-pressure")
    assert (f is not None) is fires
    if fires:
        code = " ".join(fx.code for fx in f.fixes)
        assert "num_alloc_retries" in code and "expandable_segments:True" in code


# ---- communication-heavy: exposed NCCL > 10 %
@pytest.mark.parametrize(("overlap", "fires"), [(False, True), (True, False)])
def test_communication_heavy(overlap, fires):
    tb = TraceBuilder()
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.kernel("sgemm_compute", t + 10, 6_000, launch_ts=t + 1)
        start = t + 3_000 if overlap else t + 6_100
        tb.kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", start, 2_500, launch_ts=t + 2, stream=20)
    assert ("communication-heavy" in ids(tb)) is fires


# ---- warmup-in-window: cold start in the window
def test_warmup_first_step_outlier_and_allocator_growth():
    tb = TraceBuilder()
    durations = [30_000, 10_000, 10_000, 10_000]
    t = 0
    for i, d in enumerate(durations):
        tb.step(i + 1, t, d)
        tb.kernel("k", t + 10, d - 100, launch_ts=t + 1)
        t += d
    assert "warmup-in-window" in ids(tb)
    tb2 = TraceBuilder()
    busy_steps(tb2, 4, 10_000, 9_000)
    assert "warmup-in-window" not in ids(tb2)
    tb2.runtime("cudaMalloc", 100, 3_000)  # 7.5 % of the window: under the 10 % line
    assert "warmup-in-window" not in ids(tb2)
    tb2.runtime("cudaMalloc", 20_000, 2_000)  # now 12.5 %
    f = get(tb2, "warmup-in-window")
    assert f is not None and "allocator growth" in f.evidence.summary and "cold start" in f.evidence.summary


def test_a_first_step_within_the_runs_own_variation_is_not_warm_up():
    """Twice the median of the others, but another step nearly as long: the steps of a loop
    beside a busy neighbour (134, 132, 44, 59, 12 ms recorded on this project's 2-core machine),
    not a one-off. Half again the longest of the others is."""
    for durations, fires in (([134_000, 132_000, 44_000, 59_000, 12_000], False),
                             ([134_000, 80_000, 44_000, 59_000, 12_000], True)):
        tb = TraceBuilder()
        t = 0
        for i, d in enumerate(durations):
            tb.step(i + 1, t, d)
            tb.kernel("k", t + 10, d - 100, launch_ts=t + 1)
            t += d
        assert ("warmup-in-window" in ids(tb)) is fires, durations


@pytest.mark.parametrize(("first_passes", "fires"), [(1, True), (2, False), (12, False)])
def test_a_first_step_that_ran_more_passes_is_not_warm_up(first_passes, fires):
    """LBFGS converging: its first recorded step evaluated the closure 12 times, each later one
    once, and took 25x their median (a recorded fit). Twice the others' backward passes or more is
    more work, not a warm-up; the same passes in a longer step still are."""
    tb = TraceBuilder(cc=None)
    t = 0
    for i, d in enumerate([30_000, 10_000, 10_000, 10_000]):
        tb.step(i + 1, t, d)
        n = first_passes if i == 0 else 1
        for k in range(n):  # a forward (the linear layer), then its backward node
            at = t + 100 + k * (d - 1_000) // n
            tb.op("aten::linear", at, 40)
            tb.op("aten::addmm", at + 5, 30)
            tb.op("autograd::engine::evaluate_function: AddmmBackward0", at + 100, 50)
        t += d
    assert ("warmup-in-window" in analyze(tb.to_dict()).finding_ids) is fires


def _long_first_step(cpu: dict | None) -> dict:
    """A first step of 30 ms beside three of 10 ms on a GPU, with these CPU sample columns (a
    gpumagic bundle) or none (a plain trace)."""
    tb = TraceBuilder()
    t = 0
    for i, d in enumerate([30_000, 10_000, 10_000, 10_000]):
        tb.step(i + 1, t, d)
        tb.kernel("k", t + 10, d - 100, launch_ts=t + 1)
        t += d
    out = tb.to_dict()
    if cpu is not None:
        out["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "versions": {}, "machine": {},
                           "clock": {"anchor_epoch_ns": None}, "samples": {"cpu": cpu}}
    return out


@pytest.mark.parametrize(("main_wait", "fires"), [(None, True), (0.0, True), (20.0, True), (60.0, False)])
def test_a_first_step_the_machine_made_long_is_not_warm_up(main_wait, fires):
    """A first step of 30 ms beside 10 ms ones: warm-up, unless the CPU samples show the main
    thread waiting for a core (schedstat's run-queue wait) for half its 20 ms excess or more —
    60 % of the step, 18 ms — as beside spinning processes, where the same code needs no warm-up."""
    cpu = None if main_wait is None else {  # samples at 0, 30 ms (the first step) and at 60 ms
        "t_epoch_ns": [0, 30_000_000, 60_000_000], "main": [100.0] * 3, "main_wait": [0.0, main_wait, 0.0]}
    assert ("warmup-in-window" in analyze(_long_first_step(cpu)).finding_ids) is fires


@pytest.mark.parametrize(("later_wait", "fires"), [(0.0, True), (20.0, False)])
def test_a_first_step_no_sample_reaches_is_judged_by_the_rest_of_the_window(later_wait, fires):
    """The sampler's first reading comes as the first step ends (samples at 30, 45 and 60 ms: the
    first covers nothing before it), so the samples say nothing of the 30 ms first step. Where the
    loop's thread waited for a core over the rest of the window (20 % of two samples: 10 % of it),
    a neighbour's burst cannot be told from a warm-up: not called one; on a quiet machine it is."""
    cpu = {"t_epoch_ns": [30_000_000, 45_000_000, 60_000_000], "main": [100.0] * 3,
           "main_wait": [0.0, later_wait, later_wait]}
    assert ("warmup-in-window" in analyze(_long_first_step(cpu)).finding_ids) is fires


def test_the_first_samples_span_reaches_the_first_step_when_recorded():
    """The capture's ``span_ns`` column gives each sample its time since the reading before it, the
    first one's too: a sample at 30 ms with a 30 ms span covers the first step, which waited for a
    core for 60 % of it (18 ms of its 20 ms excess): a busy machine, not a warm-up."""
    cpu = {"t_epoch_ns": [30_000_000, 45_000_000, 60_000_000], "main": [100.0] * 3, "main_wait": [60.0, 0.0, 0.0]}
    assert "warmup-in-window" in analyze(_long_first_step(cpu)).finding_ids  # the first span unknown: nothing waited
    cpu["span_ns"] = [30_000_000, 15_000_000, 15_000_000]
    assert "warmup-in-window" not in analyze(_long_first_step(cpu)).finding_ids


def test_sample_spans_use_the_recorded_span_and_refuse_a_bad_one():
    from gpumagic.analysis.hostcpu import sample_spans

    t = np.array([300, 100, 200])
    rows, lo, hi = sample_spans(t, np.array([50, 100, 100]))
    assert rows.tolist() == [1, 2, 0] and lo.tolist() == [0, 100, 250] and hi.tolist() == [100, 200, 300]
    for bad in (None, np.array([0, 100, 100]), np.array([100, 100])):  # absent, a zero, a wrong length
        rows, lo, hi = sample_spans(t, bad)
        assert rows.tolist() == [2, 0] and lo.tolist() == [100, 200] and hi.tolist() == [200, 300]


# ---- cpu-bound: the GPU waits on host operators (not the loader, not tiny kernels)
def _host_wait_trace(loader: bool):
    tb = TraceBuilder()
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        if loader:
            tb.dataloader(t, 4_000)
        else:
            tb.op("aten::python_heavy_preprocessing", t, 4_000)
        tb.kernel("k_big", t + 4_100, 5_800, launch_ts=t + 4_010)
    return tb


def test_cpu_bound_generation_gets_generates_own_compile():
    f = get(_decoding(_host_wait_trace(loader=False), tokens=20, every=1_900), "cpu-bound")
    assert "cache_implementation" in f.fixes[0].code and f.fixes[1].code == "model = torch.compile(model)"
    assert not any("cache_implementation" in x.code for x in get(_host_wait_trace(loader=False), "cpu-bound").fixes)


def test_cpu_bound_versus_dataloader_bound():
    ops = ids(_host_wait_trace(loader=False))
    assert "cpu-bound" in ops and "dataloader-bound" not in ops
    dl = ids(_host_wait_trace(loader=True))
    assert "dataloader-bound" in dl and "cpu-bound" not in dl
