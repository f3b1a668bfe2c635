"""Issue 31: what kind of window is this? Each segment kind on small built traces, on both sides
of its line; the rule gating; and the invariant that no steady-state finding points into a
non-steady segment, over every fixture."""

import json
import os

import pytest
from tracebuilder import DATA, TraceBuilder, busy_steps

import gpumagic
from gpumagic.analysis import names as nm
from gpumagic.analysis.rules import STEADY_IDS

with open(os.path.join(DATA, "EXPECTED.json")) as fh:
    REAL = sorted(json.load(fh))


def analyze(tb):
    return gpumagic.analyze(tb.to_dict())


def kinds(r):
    return {s["kind"] for s in r.metrics["window"]["segments"]}


def tiny_loop(tb, start, n=300, gap=20.0, name="k_tiny"):
    """``n`` 2-µs kernels, each launched ``gap`` µs after the previous one: a launch-bound loop."""
    for i in range(n):
        t = start + i * gap
        tb.kernel(name, t + 8, 2, launch_ts=t)
        tb.op("aten::add", t - 2, 12)


# ---- steady is the default -----------------------------------------------------------------
def test_a_plain_loop_is_one_steady_segment():
    tb = TraceBuilder()
    busy_steps(tb, 4, 10_000, 9_000)
    w = analyze(tb).metrics["window"]
    assert [s["kind"] for s in w["segments"]] == ["steady"] and w["steady_frac"] == 1.0
    assert w["segments"][0]["start_ms"] == 0.0 and w["segments"][0]["dur_ms"] == w["dur_ms"]


def test_a_single_step_or_no_steps_is_steady():
    tb = TraceBuilder()
    busy_steps(tb, 1, 10_000, 9_000)
    assert kinds(analyze(tb)) == {"steady"}
    tb = TraceBuilder()
    tiny_loop(tb, 0, 100)
    assert kinds(analyze(tb)) == {"steady"}


# ---- cold_start: a launch that loads a module, context creation ------------------------------
def _cold_launch_trace(first_of_kernel: bool):
    tb = TraceBuilder()
    tiny_loop(tb, 0, 20, name="k_warm")
    # one launch of 60 ms while the GPU is idle; it launches a kernel that never ran before
    # (lazy module loading) or one that ran 20 times already (something else)
    name = "k_new" if first_of_kernel else "k_warm"
    tb._corr += 1
    tb.runtime("cudaLaunchKernel", 500, 60_000, tb._corr)
    tb.add(cat="kernel", name=name, ts=60_510, dur=2, pid=0, tid=7, args={"device": 0, "stream": 7, "correlation": tb._corr})
    tiny_loop(tb, 60_600, 2000, name="k_new")
    return tb


def test_a_first_launch_loading_its_module_is_cold_start():
    r = analyze(_cold_launch_trace(True))
    cold = [s for s in r.metrics["window"]["segments"] if s["kind"] == "cold_start"]
    assert cold and any("lazy loading" in e for e in cold[0]["evidence"])
    assert "warmup-in-window" in r.finding_ids
    # the idle time in that launch is host time in the launch, named as start-up
    gaps = r.finding("gpu-idle-gaps")
    assert gaps is None or "cold start" in gaps.evidence.summary
    assert "compare the ranks" not in " ".join(fx.description for f in r.findings for fx in f.fixes)


def test_a_slow_launch_of_a_kernel_that_already_ran_is_not_cold_start():
    r = analyze(_cold_launch_trace(False))
    assert "cold_start" not in kinds(r)


@pytest.mark.parametrize(("dur_us", "cold"), [(300_000, True), (500, False)])
def test_context_creation_by_an_outlying_call(dur_us, cold):
    tb = TraceBuilder()
    tb.runtime("cudaDeviceGetStreamPriorityRange", 0, dur_us)
    tiny_loop(tb, dur_us + 100, 3000)
    r = analyze(tb)
    assert ("cold_start" in kinds(r)) is cold
    if cold:
        f = r.finding("warmup-in-window")
        assert f is not None and "cold start" in f.evidence.summary
        assert "Nothing to fix" in f.fixes[0].description  # context creation: start profiling later


def test_a_few_millisecond_lead_in_is_no_warmup_finding():
    tb = TraceBuilder()
    tb.runtime("cudaDeviceGetStreamPriorityRange", 0, 3_000)  # 3 ms of a ~60 ms window
    busy_steps(tb, 6, 10_000, 9_000, start=3_100)
    r = analyze(tb)
    assert "warmup-in-window" not in r.finding_ids


def test_a_first_operator_call_lasting_milliseconds_is_cold_start_unless_it_was_copying():
    def trace(copying):
        tb = TraceBuilder()
        tb.op("aten::conv2d", 0, 30_000)
        if copying:
            tb.runtime("cudaMemcpyAsync", 10, 29_900)
        for i in range(20):
            t = 31_000 + i * 1_000
            tb.op("aten::conv2d", t, 100)
            tb.kernel("implicit_convolve_sgemm", t + 20, 900, launch_ts=t + 10)
        return analyze(tb)

    assert "cold_start" in kinds(trace(False))
    assert "cold_start" not in kinds(trace(True))


def test_cudnn_benchmark_syncs_are_the_librarys_not_host_sync():
    def trace(op):
        tb = TraceBuilder()
        for i in range(10):
            t = i * 10_000
            tb.step(i + 1, t, 10_000)
            tb.op(op, t + 100, 5_000)
            tb.kernel("k_conv", t + 200, 4_000, launch_ts=t + 150)
            tb.runtime("cudaEventSynchronize", t + 160, 4_100)
            tb.kernel("k_after", t + 6_000, 3_000, launch_ts=t + 5_200)
        return analyze(tb)

    lib = trace("aten::cudnn_convolution")
    user = trace("aten::item")
    assert lib.metrics["syncs"]["library_count"] == 10 and lib.metrics["syncs"]["count"] == 0
    assert user.metrics["syncs"]["library_count"] == 0 and user.metrics["syncs"]["count"] == 10
    assert "host-sync" not in lib.finding_ids
    assert "cold_start" in kinds(lib)


# ---- graph_capture ---------------------------------------------------------------------------
def _capture_trace():
    tb = TraceBuilder()
    tb.runtime("cudaStreamBeginCapture", 0, 5)
    for i in range(400):  # captured launches: nothing runs
        tb.runtime("cudaLaunchKernel", 10 + i * 20, 8)
    tb.runtime("cudaStreamEndCapture", 8_100, 5)
    tb.runtime("cudaGraphInstantiateWithFlags", 8_200, 800)
    tb.kernel("fill_kernel", 9_100, 2, launch_ts=9_050)
    return tb


def test_a_graph_capture_is_warmup_and_not_launch_bound():
    r = analyze(_capture_trace())
    cap = [s for s in r.metrics["window"]["segments"] if s["kind"] == "graph_capture"]
    assert cap and any("cudaStreamBeginCapture" in e for e in cap[0]["evidence"])
    assert "warmup-in-window" in r.finding_ids and "launch-bound" not in r.finding_ids
    assert any("not judged" in n for n in r.notes)  # no steady part: the steady rules say so


def test_graph_replays_are_steady():
    tb = TraceBuilder()
    for i in range(20):
        t = i * 1_000
        tb.runtime("cudaGraphLaunch", t, 20, tb._corr + 1)
        for j in range(5):
            tb._corr += 1
            tb.add(cat="kernel", name="k", ts=t + 30 + j * 150, dur=140, pid=0, tid=7,
                   args={"device": 0, "stream": 7, "correlation": tb._corr})
    assert kinds(analyze(tb)) == {"steady"}


def test_vllm_capture_fixture():
    r = gpumagic.analyze(os.path.join(DATA, "mi300_vllm_decode_fullgraph_capture.json.gz"))
    w = r.metrics["window"]
    assert w["steady_frac"] < 0.05 and w["steady_judged_ms"] is None
    assert r.metrics["trace"]["workload"] == "serving"  # save_for_backward frames do not make it training
    f = r.finding("warmup-in-window")
    assert "graph capture" in f.evidence.summary and "profile after capture" in f.fixes[0].description


def test_warm_up_claims_no_speed_gain_and_leads_a_window_it_fills():
    """A window that is all graph capture once read "Fixing all could save up to 100 %": start-up
    that does not recur is not time the run would save. The warm-up claims none, and leads the
    checklist when it fills at least half the window."""
    from gpumagic.render.text import render_text

    r = gpumagic.analyze(os.path.join(DATA, "mi300_vllm_decode_fullgraph_capture.json.gz"))
    f = r.finding("warmup-in-window")
    assert f.est_gain == 0 and f.gain_method.startswith("not a speed gain") and f.evidence.numbers["warmup_frac"] > 0.9
    assert r.findings[0].id == "warmup-in-window" and len(r.findings) > 1 and r.combined_gain < 0.01
    text = render_text(r)
    assert "Fixing all could save under 1 %" in text and "save up to" not in text.split("CHECKLIST")[0]
    assert "CHECKLIST (warm-up first, then biggest estimated gain)" in text
    tb = TraceBuilder()  # warm-up under half the window: by gain, so last
    tb.runtime("cudaDeviceGetStreamPriorityRange", 0, 3_000)
    tiny_loop(tb, 3_100, n=600)
    late = analyze(tb)
    assert 0.1 <= late.finding("warmup-in-window").evidence.numbers["warmup_frac"] < 0.5
    assert "warmup-in-window" in late.finding_ids and late.findings[-1].id == "warmup-in-window"


# ---- compile ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("tid", "compiled"), [(100, True), (555, False)])
def test_compilation_on_a_thread_that_drives_the_gpu(tid, compiled):
    tb = TraceBuilder()
    busy_steps(tb, 4, 10_000, 9_000)
    tb.op("torch/_dynamo/convert_frame.py(600): _compile", 100, 9_000, cat="python_function", tid=tid)
    assert ("compile" in kinds(analyze(tb))) is compiled


@pytest.mark.parametrize(("cold", "compiling"), [(True, True), (True, False), (False, True)])
def test_one_skip_fix_for_compilation_and_a_cold_start(cold, compiling):
    """Compilation and context creation in one window: both are skipped the same way, so one fix
    says so, not the same snippet twice under two descriptions."""
    tb = TraceBuilder()
    busy_steps(tb, 4, 10_000, 9_000)
    if cold:
        tb.runtime("cuDevicePrimaryCtxRetain", 0, 6_000)
    if compiling:  # in the second step, apart from the context creation
        tb.op("torch/_dynamo/convert_frame.py(600): _compile", 10_100, 9_000, cat="python_function", tid=100)
    f = analyze(tb).finding("warmup-in-window")
    assert f is not None and len(f.fixes) == 1
    words = f.fixes[0].description
    assert ("compilation" in words) is compiling and ("context creation" in words) is cold


# ---- one_off_host: needs import/model-loading frames before the first launch -----------------
@pytest.mark.parametrize(("frame", "before", "one_off"), [
    ("<frozen importlib._bootstrap>(1176): _find_and_load", True, True),
    ("transformers/modeling_utils.py(3000): from_pretrained", True, True),
    ("<frozen importlib._bootstrap>(1176): _find_and_load", False, False),  # inside the loop: the loop's
    ("my_preprocessing.py(10): tokenize", True, False),  # no positive evidence
])
def test_one_off_host_work(frame, before, one_off):
    tb = TraceBuilder()
    start = 20_000 if before else 0
    if before:
        tb.op(frame, 0, 19_000, cat="python_function")
    tiny_loop(tb, start, 300, gap=100)
    if not before:
        tb.op(frame, 10_000, 15_000, cat="python_function")
    assert ("one_off_host" in kinds(analyze(tb))) is one_off


# ---- idle_tail -------------------------------------------------------------------------------
def test_idle_tail_only_without_steps():
    tb = TraceBuilder()
    tiny_loop(tb, 0, 300, gap=100)
    tb.op("logging.py(10): info", 30_100, 20_000, cat="python_function")
    r = analyze(tb)
    assert "idle_tail" in kinds(r) and "warmup-in-window" not in r.finding_ids
    tb = TraceBuilder()
    busy_steps(tb, 4, 10_000, 5_000)  # the host's time after the kernels is inside the steps
    assert "idle_tail" not in kinds(analyze(tb))


# ---- workload from what ran --------------------------------------------------------------------
@pytest.mark.parametrize(("name", "cat", "workload"), [
    ("torch/autograd/function.py(39): save_for_backward", "python_function", "inference"),
    ("AddmmBackward0", "cpu_op", "training"),
    ("Optimizer.step#AdamW.step", "user_annotation", "training"),
    ("vllm/v1/worker/gpu_model_runner.py(2000): execute_model", "python_function", "serving"),
])
def test_workload_from_what_ran(name, cat, workload):
    tb = TraceBuilder()
    busy_steps(tb, 3, 10_000, 9_000)
    tb.op(name, 100, 50, cat=cat)
    assert analyze(tb).metrics["trace"]["workload"] == workload


# ---- no deviceProperties: the architecture from kernel names -------------------------------------
def test_architecture_from_kernel_names():
    assert nm.kernel_arch("volta_sgemm_128x64_nn") == (7, 0)
    assert nm.kernel_arch("sm90_xmma_gemm_bf16bf16_bf16f32") == (9, 0)
    assert nm.kernel_arch("void at::native::vectorized_elementwise_kernel") is None
    tb = TraceBuilder(cc=None)
    busy_steps(tb, 3, 10_000, 9_000, kernel_name="volta_sgemm_128x64_nn")
    f = analyze(tb).finding("mixed-precision-off")
    assert f is not None and "kernels' names" in f.why


def test_volta_cold_start_and_its_steady_twin_differ():
    cold = gpumagic.analyze(os.path.join(DATA, "volta_resnet50_coldstart_nw4.json.gz"))
    warm = gpumagic.analyze(os.path.join(DATA, "volta_resnet50_profiler_nw4.json.gz"))
    assert "warmup-in-window" in cold.finding_ids and "warmup-in-window" not in warm.finding_ids
    assert warm.metrics["window"]["steady_frac"] == 1.0
    ev = " ".join(e for s in cold.metrics["window"]["segments"] for e in s["evidence"])
    assert "cudaLaunchKernel 2125" in ev
    assert cold.metrics["syncs"]["library_count"] > 300  # cuDNN's benchmark syncs


# ---- the invariant: steady-state findings point only into steady time ---------------------------
BUILT = {
    "capture": _capture_trace, "cold-launch": lambda: _cold_launch_trace(True),
    "context": lambda: _ctx_trace(),
}


def _ctx_trace():
    tb = TraceBuilder()
    tb.runtime("cudaDeviceGetStreamPriorityRange", 0, 300_000)
    tiny_loop(tb, 300_100, 3000)
    return tb


def _reports():
    for name in REAL:
        yield name, gpumagic.analyze(os.path.join(DATA, name))
    for name, build in BUILT.items():
        yield name, analyze(build())


def test_no_steady_finding_points_into_a_non_steady_segment():
    checked = 0
    for name, r in _reports():
        lo = r.metrics["window"]["start_ns"]
        other = [(lo + s["start_ms"] * 1e6, lo + (s["start_ms"] + s["dur_ms"]) * 1e6)
                 for s in r.metrics["window"]["segments"] if s["kind"] != "steady"]
        for f in r.findings:
            if f.id not in STEADY_IDS:
                continue
            for w in f.evidence.windows:
                inside = sum(max(0.0, min(w.end_ns, b) - max(w.start_ns, a)) for a, b in other)
                assert inside <= 0.5 * (w.end_ns - w.start_ns) + 1e3, (name, f.id, w)
                checked += 1
    assert checked > 0


def test_segments_tile_the_window():
    for name, r in _reports():
        w = r.metrics["window"]
        segs = w["segments"]
        assert all(s["kind"] in ("steady", "cold_start", "graph_capture", "compile", "one_off_host", "idle_tail")
                   for s in segs)
        assert all(s["evidence"] for s in segs if s["kind"] != "steady"), name
        starts = [s["start_ms"] for s in segs]
        assert starts == sorted(starts)
        assert abs(sum(s["dur_ms"] for s in segs) - w["dur_ms"]) < 0.01 * w["dur_ms"] + 0.01, name
        assert 0.0 <= w["steady_frac"] <= 1.0


# ---- issue 31 causes: a serving engine's pool is not memory pressure ----------------------------
@pytest.mark.parametrize(("low", "pool"), [(0.93, True), (0.40, False)])
def test_a_pool_held_up_front_is_not_memory_pressure(low, pool):
    gib = 2**30
    tb = TraceBuilder(total_mem=16 * gib)
    busy_steps(tb, 4, 10_000, 8_000)
    for i in range(8):  # allocated swings between low and 95 % of the device, or stays flat
        frac = 0.95 if i % 2 else low
        tb.memory(100 + i * 5_000, int(frac * 16 * gib), int(0.97 * 16 * gib))
    r = analyze(tb)
    assert r.metrics["memory"]["pool"] is pool
    assert ("memory-pressure" in r.finding_ids) is (not pool)


def test_vllm_kv_cache_pool_fixture():
    m = gpumagic.analyze(os.path.join(DATA, "mi300_vllm_decode_fullgraph_capture.json.gz")).metrics["memory"]
    assert m["peak_frac"] > 0.9 and m["pool"] is True


# ---- gains that respect what bounds the step ----------------------------------------------------
def _fp32_trace(host_bound: bool):
    """FP32 sgemms on a V100; host-bound: each is launched only after the previous one ended (the
    GPU waits for the host in between); GPU-bound: all queued ahead."""
    tb = TraceBuilder(cc=(7, 0), gpu_name="Tesla V100-SXM2-32GB")
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        for j in range(10):
            start = t + 100 + j * (900 if host_bound else 300)
            tb.kernel("volta_sgemm_128x64_nn", start, 250 if host_bound else 295,
                      launch_ts=start - 20 if host_bound else t + 5 + j)
    return analyze(tb)


def test_a_faster_kernel_saves_little_on_a_host_bound_step():
    host, gpu = _fp32_trace(True).finding("mixed-precision-off"), _fp32_trace(False).finding("mixed-precision-off")
    assert host is not None and gpu is not None  # what ran: FP32 either way
    assert host.est_gain < 0.1 * gpu.est_gain and "capped" in host.gain_method and "capped" not in gpu.gain_method


# ---- advice that fits the kernel -----------------------------------------------------------------
@pytest.mark.parametrize(("kernel", "custom"), [("my_fp32_gemm_kernel", True), ("volta_sgemm_128x64_nn", False),
                                                ("sgemm_128x64_nn", False), ("Cijk_Ailk_Bljk_SB_MT64x64x8", False)])
def test_autocast_advice_fits_the_kernel(kernel, custom):
    assert nm.is_library_matmul(kernel) is not custom
    tb = TraceBuilder(cc=(7, 0), gpu_name="Tesla V100-SXM2-32GB")
    busy_steps(tb, 3, 10_000, 9_000, kernel_name=kernel)
    f = analyze(tb).finding("mixed-precision-off")
    assert f is not None
    assert ("hand-written" in f.fixes[0].description) is custom and ("hand-written" in f.why) is custom


# ---- advice that fits the host work ----------------------------------------------------------------
@pytest.mark.parametrize("op", ["aten::normal_", "aten::python_heavy_preprocessing"])
def test_host_tensor_creation_gets_create_on_device_not_compile(op):
    tb = TraceBuilder()
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.op(op, t, 4_000)
        tb.memcpy("Memcpy HtoD (Pageable -> Device)", t + 4_020, 50, 4 << 20, launch_ts=t + 4_005)
        tb.kernel("k_big", t + 4_100, 5_800, launch_ts=t + 4_010)
    f = analyze(tb).finding("cpu-bound")
    assert f is not None
    code = " ".join(fx.code for fx in f.fixes)
    creation = op == "aten::normal_"
    assert ('device="cuda"' in code) is creation and ("torch.compile" in code) is not creation


def test_host_sync_fix_follows_the_workload():
    from test_diagnoses import _sync_step_trace

    inference = gpumagic.analyze(_sync_step_trace(20, 1_990).to_dict()).finding("host-sync")
    assert inference is not None and "loss" not in inference.fixes[0].code
    tb = _sync_step_trace(20, 1_990)
    tb.op("autograd::engine::evaluate_function: AddmmBackward0", 100, 5)
    training = gpumagic.analyze(tb.to_dict()).finding("host-sync")
    assert "loss.item()" in training.fixes[0].code


def test_one_off_host_work_is_not_a_cpu_bound_loop():
    tb = TraceBuilder()
    tb.op("<frozen importlib._bootstrap>(1176): _find_and_load", 0, 30_000, cat="python_function")
    tb.op("aten::empty", 100, 29_000)  # operator time under the import: host work before the first launch
    for i in range(30):  # then a GPU-bound loop (no step markers: the window is the whole trace)
        tb.kernel("k_big", 30_100 + i * 1_000, 950, launch_ts=30_050 + i * 1_000)
    r = analyze(tb)
    assert "one_off_host" in kinds(r) and "cpu-bound" not in r.finding_ids
    assert "warmup-in-window" in r.finding_ids


def test_context_creation_counts_on_a_counter_mode_trace():
    tb = TraceBuilder()
    tb.runtime("cudaDeviceGetStreamPriorityRange", 0, 300_000)
    for i in range(200):  # counter mode: launches on the host, kernels only as cuda_profiler_range
        t = 300_100 + i * 100
        tb.runtime("cudaLaunchKernel", t, 5)
        tb.add(cat="cuda_profiler_range", name="k", ts=t + 10, dur=50, args={"device": 0})
        tb.op("aten::add", t - 2, 20)
    r = analyze(tb)
    assert "cold_start" in kinds(r) and "warmup-in-window" in r.finding_ids
    assert any("Counter-mode" in n for n in r.notes)


def test_the_skip_suggested_leaves_the_warm_up_out():
    """A gpumagic capture that skipped 3 steps and still recorded a recompilation in its first
    recorded step is told to skip 4, not a fixed 3; without a capture block the fixed 3 stays."""
    from types import SimpleNamespace

    from gpumagic.analysis.rules.warmup import SKIP_CODE, _skip_code
    from gpumagic.analysis.segments import Segment

    ctx = SimpleNamespace(step_bounds=[(0, 100), (100, 200), (200, 300)])
    first = SimpleNamespace(items=[Segment("compile", 10, 90), Segment("steady", 90, 300)])
    assert _skip_code(ctx, first, {"skip": 3}).startswith("%%gpuprofile --skip 4\n")
    two = SimpleNamespace(items=[Segment("cold_start", 0, 150), Segment("steady", 150, 300)])
    assert "--skip 2\n" in _skip_code(ctx, two, {"skip": 0}) and "warmup=1," in _skip_code(ctx, two, {"skip": 0})
    assert _skip_code(ctx, first, {}) == SKIP_CODE
    before = SimpleNamespace(items=[Segment("one_off_host", -50, -10)])
    assert "--skip 6\n" in _skip_code(ctx, before, {"skip": 5})


def test_a_steady_stretch_too_short_to_judge_is_named_in_the_note():
    """A long graph capture then 2 ms of a loop: the steady stretch exists but is under 5 % of the
    window; the note says so rather than that there is none."""
    tb = TraceBuilder()
    tb.runtime("cudaStreamBeginCapture", 0, 5)
    for i in range(4000):
        tb.runtime("cudaLaunchKernel", 10 + i * 20, 8)
    tb.runtime("cudaStreamEndCapture", 80_100, 5)
    tb.runtime("cudaGraphInstantiateWithFlags", 80_200, 800)
    tiny_loop(tb, 81_100, n=100)
    r = analyze(tb)
    assert "steady" in kinds(r)
    note = next(n for n in r.notes if "not judged" in n)
    assert note.startswith("No steady part long enough to judge") and "the longest steady stretch, 2.1 ms" in note
