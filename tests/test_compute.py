"""Issue 14: FLOPs, peak table and MFU (metrics.compute), and the five new findings on both sides
of every threshold; the real fixtures against a hand calculation and tests/data/EXPECTED_extra.json."""

import json
import os

import pytest
from recorded import analysed
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.analysis import devices
from gpumagic.analysis.rules import compute as compute_rules
from gpumagic.analysis.rules import kernels as kernel_rules
from gpumagic.analysis.rules.precision import tf32_fix

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


def op(tb, name, ts, dur, dims, types=None, concrete=None, flops=None, tid=100):
    args = {"Input Dims": dims, "Input type": types or ["float"] * len(dims)}
    if concrete is not None:
        args["Concrete Inputs"] = concrete
    if flops is not None:
        args["flops"] = flops
    tb.add(cat="cpu_op", name=name, ts=ts, dur=dur, tid=tid, args=args)


def compute(tb):
    return analyze(tb.to_dict()).metrics["compute"]


# ---- the real ResNet-50 fixtures against a hand calculation ----------------------------------

def resnet50_forward_macs() -> int:
    """Multiply-accumulates of torchvision's ResNet-50 (v1.5: stride in the 3x3) on one 224² image,
    layer by layer: a conv does out_h·out_w·C_out·C_in·k_h·k_w MACs."""
    macs = 112 * 112 * 64 * 3 * 7 * 7  # stem: 7x7/2, 3 → 64 channels, 224 → 112 (max-pool then → 56)
    cin, size = 64, 56
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            s = stride if b == 0 else 1
            out = size // s
            macs += size * size * width * cin  # 1x1 reduce, at the input size
            macs += out * out * width * width * 9  # 3x3, stride s
            macs += out * out * 4 * width * width  # 1x1 expand
            if b == 0:
                macs += out * out * 4 * width * cin  # 1x1 projection shortcut, stride s
            cin, size = 4 * width, out
    return macs + 2048 * 1000  # the classifier


def test_resnet50_hand_calculation_is_about_8_2_gflop():
    macs = resnet50_forward_macs()
    assert 4.0e9 < macs < 4.2e9  # 4.09 G MACs = 8.2 GFLOP (a MAC is 2 FLOPs)


@pytest.mark.parametrize("name", ["resnet50_v100_workers0.json.gz", "resnet50_v100_workers4.json.gz"])
def test_resnet50_fixture_flops_match_the_hand_calculation(name):
    # per step: batch 32 × (forward + backward ≈ 2 × forward) = 32 × 3 × 2 × MACs ≈ 0.79 TFLOP
    per_step = 32 * 3 * 2 * resnet50_forward_macs()
    c = analysed(name).metrics["compute"]
    assert abs(c["flops_per_step"] - per_step) / per_step < 0.20
    assert (c["flops_source"], c["dtype"], c["peak_tflops"]) == ("shapes", "fp32", 15.7)
    assert c["ops_unresolved"] == 0
    # achieved = FLOPs / window, MFU = achieved / peak
    m = analysed(name).metrics
    assert c["achieved_tflops"] == pytest.approx(c["flops"] / (m["window"]["dur_ms"] / 1e3) / 1e12, rel=1e-3)
    assert c["mfu"] == pytest.approx(c["achieved_tflops"] / 15.7, abs=1e-3)


def test_trace_without_shapes_has_no_flops():
    c = analysed("v100_resnet_ns_timestamps.json.gz").metrics["compute"]
    assert c["flops_source"] is None and c["flops"] is None and c["mfu"] is None
    assert c["peak_tflops"] is None and c["device_sku"] == "V100 SXM2"


# ---- tests/data/EXPECTED_extra.json ----------------------------------------------------------

with open(os.path.join(DATA, "EXPECTED_extra.json")) as fh:
    EXTRA = {k: v for k, v in json.load(fh).items() if not k.startswith("_")}
_REPORTS: dict = {}


def fixture_report(name):
    if name not in _REPORTS:
        _REPORTS[name] = analysed(name)
    return _REPORTS[name]


def test_extra_expectations_cover_every_fixture():
    with open(os.path.join(DATA, "EXPECTED.json")) as fh:
        assert set(EXTRA) == set(json.load(fh))


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_extra_expectations(name):
    r, e = fixture_report(name), EXTRA[name]
    for fid in e["fires"]:
        assert fid in r.finding_ids
    for fid in e["silent"]:
        assert fid not in r.finding_ids, fid
    for path, want in e["metrics"].items():
        value = r.metrics
        for key in path.split("."):
            value = value[key]
        if isinstance(want, list):
            assert want[0] <= value <= want[1], (path, value)
        else:
            assert value == want, (path, value)


# ---- peak table --------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "sku", "bf16"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5),
    ("NVIDIA H200", "H200 SXM", 989.5),
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100", 312.0),
    ("AMD Instinct MI300X VF", "MI300X", 1307.4),
    ("AMD Instinct MI300X", "MI300X", 1307.4),
    ("NVIDIA L40S", "L40S", 362.05),
    ("NVIDIA L4", "L4", 121.0),
    ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090", 165.2),
])
def test_peak_table_names_sku_variants(name, sku, bf16):
    peak = devices.peak_for(name)
    assert peak.sku == sku and peak.tflops["bf16"] == bf16 and peak.source


@pytest.mark.parametrize("name", ["", "   ", None, "NVIDIA H800", "Some Future GPU", "AMD Instinct MI250X/MI250",
                                  "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA L40"])
def test_unknown_or_ambiguous_devices_get_no_peak(name):
    assert devices.peak_tflops(name, "bf16") == (None, None)


def test_peak_is_dense_and_per_dtype():
    assert devices.peak_tflops("Tesla V100-SXM2-32GB", "fp32")[0] == 15.7
    assert devices.peak_tflops("Tesla V100-SXM2-32GB", "bf16") == (None, None)  # Volta has no BF16
    assert devices.peak_tflops("Tesla T4", "tf32") == (None, None)
    assert devices.peak_tflops("NVIDIA A10G", "bf16") == (None, None)  # no datasheet: no guess
    h100 = devices.peak_for(H100)
    # the datasheet's sparse 3,958 / 1,979 / 989 halved
    assert (h100.tflops["fp8"], h100.tflops["bf16"], h100.tflops["tf32"]) == (1979.0, 989.5, 494.5)


def test_unknown_device_gives_flops_but_no_mfu():
    tb = TraceBuilder(gpu_name="Mystery Accelerator 9000")
    tb.step(1, 0, 1000)
    op(tb, "aten::mm", 10, 50, [[64, 32], [32, 16]])
    tb.kernel("gemm_kernel", 100, 500, launch_ts=20)
    c = compute(tb)
    assert c["flops"] == 2 * 64 * 32 * 16 and c["peak_tflops"] is None and c["mfu"] is None


# ---- FLOPs from shapes and profiler counts --------------------------------------------------------

def test_linear_and_the_addmm_inside_it_count_once():
    tb = TraceBuilder(cc=None)
    op(tb, "aten::linear", 10, 30, [[8, 16], [32, 16], [32]])
    op(tb, "aten::t", 12, 2, [[32, 16]])
    op(tb, "aten::addmm", 15, 20, [[32], [8, 16], [16, 32], [], []])
    c = compute(tb)
    assert (c["flops"], c["ops_counted"], c["flops_source"]) == (2 * 8 * 16 * 32, 1, "shapes")


def test_profiler_counts_win_and_shapes_fill_the_rest():
    tb = TraceBuilder(cc=None)
    op(tb, "aten::mm", 10, 20, [[8, 16], [16, 32]], flops=12345)
    op(tb, "aten::bmm", 40, 20, [[4, 8, 16], [4, 16, 2]])
    c = compute(tb)
    assert c["flops"] == 12345 + 2 * 4 * 8 * 16 * 2 and c["flops_source"] == "profiler"


def test_autocast_dtype_comes_from_the_innermost_matmul():
    tb = TraceBuilder(cc=None)
    op(tb, "aten::linear", 10, 30, [[8, 16], [32, 16], [32]])
    op(tb, "aten::addmm", 15, 20, [[32], [8, 16], [16, 32]], types=["c10::BFloat16"] * 3)
    assert compute(tb)["dtype"] == "bf16"


def test_conv_output_from_recorded_stride_and_padding():
    tb = TraceBuilder(cc=None)
    op(tb, "aten::conv2d", 10, 30, [[2, 3, 32, 32], [8, 3, 3, 3], [], [], [], [], []],
       concrete=["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"])
    assert compute(tb)["flops"] == 2 * (2 * 8 * 16 * 16) * (3 * 3 * 3)


def test_conv_output_from_the_next_operators_input():
    tb = TraceBuilder(cc=None)
    op(tb, "aten::conv2d", 10, 30, [[2, 3, 32, 32], [8, 3, 5, 5], [], [], [], [], []])
    op(tb, "aten::batch_norm", 50, 10, [[2, 8, 28, 28], [8], [8]])
    assert compute(tb)["flops"] == 2 * (2 * 8 * 28 * 28) * (3 * 5 * 5)


def test_conv_output_from_the_matching_backward_and_backward_counts_twice():
    tb = TraceBuilder(cc=None)
    x, w, g = [2, 3, 32, 32], [8, 3, 3, 3], [2, 8, 15, 15]
    op(tb, "aten::convolution", 10, 30, [x, w, [], [], [], [], [], [], []])
    op(tb, "aten::convolution_backward", 100, 30, [g, x, w, [], [], [], [], [], [], [], []])
    forward = 2 * (2 * 8 * 15 * 15) * 27
    assert compute(tb)["flops"] == forward + 2 * forward


def test_conv_backward_output_mask_and_old_cudnn_parts():
    x, w, g = [2, 3, 32, 32], [8, 3, 3, 3], [2, 8, 30, 30]
    forward = 2 * (2 * 8 * 30 * 30) * 27
    tb = TraceBuilder(cc=None)
    op(tb, "aten::convolution_backward", 10, 30, [g, x, w] + [[]] * 8,
       concrete=[""] * 10 + ["[False, True, True]"])
    assert compute(tb)["flops"] == forward  # no input gradient: the first layer's case
    tb = TraceBuilder(cc=None)  # torch < 1.11: (input, grad_output, weight), parts as children
    op(tb, "aten::cudnn_convolution_backward", 10, 30, [x, g, w] + [[]] * 8)
    op(tb, "aten::cudnn_convolution_backward_input", 12, 10, [[], g, w])
    op(tb, "aten::cudnn_convolution_backward_weight", 25, 10, [[], g, x])
    assert compute(tb)["flops"] == 2 * forward


def test_attention_flops_and_causal_half():
    q = [1, 8, 128, 64]
    tb = TraceBuilder(cc=None)
    op(tb, "aten::scaled_dot_product_attention", 10, 30, [q, q, q, [], [], [], [], []],
       concrete=["", "", "", "", "0.", "False", "", "False"])
    op(tb, "aten::_scaled_dot_product_flash_attention", 12, 20, [q, q, q])
    full = 2 * 8 * 128 * 128 * (64 + 64)
    assert compute(tb)["flops"] == full
    tb = TraceBuilder(cc=None)
    op(tb, "aten::scaled_dot_product_attention", 10, 30, [q, q, q, [], [], []], concrete=["", "", "", "", "0.", "True"])
    assert compute(tb)["flops"] == full / 2
    tb = TraceBuilder(cc=None)  # the flash variant called directly (a compiled graph), (batch, seq, heads, dim)
    blhd = [1, 128, 8, 64]
    op(tb, "aten::_flash_attention_forward", 10, 30, [blhd, blhd, blhd] + [[]] * 6,
       concrete=["", "", "", "", "", "128", "128", "0.", "True"])
    assert compute(tb)["flops"] == full / 2


def test_ops_outside_the_window_do_not_count():
    tb = TraceBuilder()
    tb.step(1, 100, 1000)
    op(tb, "aten::mm", 10, 20, [[8, 16], [16, 32]])  # before the first step
    op(tb, "aten::mm", 200, 20, [[8, 16], [16, 4]])
    tb.kernel("gemm", 300, 100, launch_ts=210)
    assert compute(tb)["flops"] == 2 * 8 * 16 * 4


def test_tf32_kernels_make_fp32_matmuls_tf32():
    tb = TraceBuilder(gpu_name=A100)
    tb.step(1, 0, 1000)
    op(tb, "aten::mm", 10, 20, [[512, 512], [512, 512]])
    tb.kernel("cutlass_80_tensorop_s1688tf32gemm_256x128", 100, 500, launch_ts=15)
    c = compute(tb)
    assert (c["dtype"], c["peak_tflops"]) == ("tf32", 156.0)


# ---- low-compute-efficiency: GPU busy ≥ 50 % and MFU < 10 % --------------------------------------

def efficiency_trace(flops_per_step, kernel_us=8_000, step_us=10_000):
    tb = TraceBuilder(gpu_name=A100)
    for i in range(3):
        t = i * step_us
        tb.step(i + 1, t, step_us)
        op(tb, "aten::mm", t + 5, 20, [[1024, 1024], [1024, 1024]], flops=flops_per_step)  # launches the gemm
        tb.kernel("ampere_sgemm_128x64_nn", t + 100, kernel_us, launch_ts=t + 20)
    return tb


@pytest.mark.parametrize(("flops", "kernel_us", "fires"), [
    (9e9, 8_000, True),     # 0.9 TFLOP/s of 19.5: MFU 4.6 %, busy 80 %
    (2.5e10, 8_000, False),  # MFU 12.8 %
    (9e9, 4_000, False),    # busy 40 %: an idle problem, not an efficiency one
])
def test_low_compute_efficiency_threshold(flops, kernel_us, fires):
    r = analyze(efficiency_trace(flops, kernel_us).to_dict())
    assert ("low-compute-efficiency" in r.finding_ids) is fires
    if fires:
        f = r.finding("low-compute-efficiency")
        assert f.evidence.numbers["mfu"] == r.metrics["compute"]["mfu"] < compute_rules.MFU_LOW
        assert f.fixes[0].code.startswith(tf32_fix().code)


def test_low_compute_efficiency_is_silent_without_flops():
    tb = TraceBuilder(gpu_name=A100)
    for i in range(3):
        tb.step(i + 1, i * 10_000, 10_000)
        tb.kernel("ampere_sgemm_128x64_nn", i * 10_000 + 100, 8_000, launch_ts=i * 10_000 + 20)
    assert "low-compute-efficiency" not in analyze(tb.to_dict()).finding_ids


# ---- too-small-for-gpu: tiny GPU work that a CPU could do within the step -----------------------

def tiny_trace(flops_per_step, kernel_us=5.0, kernels=20, step_us=2_000, shapes=True):
    tb = TraceBuilder(gpu_name=H100)
    for i in range(3):
        t = i * step_us
        tb.step(i + 1, t, step_us)
        if shapes:
            op(tb, "aten::mm", t + 2, 3, [[64, 64], [64, 64]], flops=flops_per_step)
        for j in range(kernels):
            tb.kernel("k_small", t + 50 + j * 80, kernel_us, launch_ts=t + 45 + j * 80)
    return tb


@pytest.mark.parametrize(("flops", "kernel_us", "fires"), [
    (1e7, 5.0, True),     # 0.1 ms on a 100 GFLOP/s CPU, within the 2 ms step
    (1e9, 5.0, False),    # 10 ms on the CPU: the GPU still wins
    (1e7, 25.0, False),   # kernels not short (≥ 20 µs)
    (1e7, 60.0, False),   # 1.2 ms of kernels per step
])
def test_too_small_for_gpu_threshold(flops, kernel_us, fires):
    r = analyze(tiny_trace(flops, kernel_us).to_dict())
    assert ("too-small-for-gpu" in r.finding_ids) is fires
    if fires:
        n = r.finding("too-small-for-gpu").evidence.numbers
        assert n["gflops_per_step"] == pytest.approx(0.01) and n["flops_known"] is True
        assert n["cpu_estimate_ms"] == pytest.approx(0.1)


def test_too_small_for_gpu_without_shapes_uses_the_kernel_time_bound():
    # issue 31: without shapes, 5-µs kernels on an H100 sit at the launch floor: too small whatever
    # the peak (the kernel time × peak bound alone never fires on a big GPU)
    f = analyze(tiny_trace(0, shapes=False).to_dict()).finding("too-small-for-gpu")
    assert f is not None and f.evidence.numbers["near_floor_time_frac"] == 1.0
    assert f.evidence.numbers["flops_known"] is False
    # 12-µs kernels are short but not at the floor: no verdict without FLOPs on an H100
    assert "too-small-for-gpu" not in analyze(tiny_trace(0, kernel_us=12.0, shapes=False).to_dict()).finding_ids
    # ... but with a small peak and a long step the bound fits: T4 (65 TFLOP/s), 20 × 1 µs of kernels
    # per 20 ms step: at most 1.3 GFLOP, 13 ms on a 100 GFLOP/s CPU
    tb = TraceBuilder(gpu_name="Tesla T4", cc=(7, 5))
    for i in range(3):
        t = i * 20_000
        tb.step(i + 1, t, 20_000)
        for j in range(20):
            tb.kernel("k_small", t + 50 + j * 80, 1.0, launch_ts=t + 45 + j * 80)
    f = analyze(tb.to_dict()).finding("too-small-for-gpu")
    assert f is not None and f.evidence.numbers["flops_known"] is False


def test_too_small_for_gpu_may_come_with_launch_bound():
    """launch-bound says how to launch faster; too-small-for-gpu that the work itself is too small,
    and offers the CPU."""
    r = analyze(tiny_trace(1e7).to_dict())
    assert {"too-small-for-gpu", "launch-bound"} <= set(r.finding_ids)
    fixes = r.finding("too-small-for-gpu").fixes
    assert any('device = "cpu"' in fx.code for fx in fixes) and any("torch.stack" in fx.code for fx in fixes)


# ---- small-transfers: ≥ 16 small copies per step costing ≥ 2 % of the window ---------------------

def copies_trace(per_step, nbytes=4096, gpu_us=10.0, step_us=10_000):
    tb = TraceBuilder()
    for i in range(3):
        t = i * step_us
        tb.step(i + 1, t, step_us)
        tb.kernel("k", t + 5_000, 4_000, launch_ts=t + 4_990)
        for j in range(per_step):
            tb.memcpy("Memcpy HtoD (Pinned -> Device)", t + 100 + j * 100, gpu_us, nbytes, launch_ts=t + 90 + j * 100)
    return tb


@pytest.mark.parametrize(("per_step", "nbytes", "gpu_us", "fires"), [
    (20, 4096, 10.0, True),        # 20 × (10 µs GPU + 3 µs call) = 2.6 % of each step
    (15, 4096, 10.0, False),       # under 16 per step
    (20, 100 * 1024, 10.0, False),  # not small
    (20, 4096, 2.0, False),        # 20 × 5 µs = 1 % of the step
])
def test_small_transfers_threshold(per_step, nbytes, gpu_us, fires):
    r = analyze(copies_trace(per_step, nbytes, gpu_us).to_dict())
    assert ("small-transfers" in r.finding_ids) is fires
    if fires:
        n = r.finding("small-transfers").evidence.numbers
        assert n["htod_count"] == 60 and n["htod_bytes"] == 60 * 4096 and n["copies_per_step"] == 20
        assert n["htod_gpu_ms"] == pytest.approx(0.6) and n["htod_host_ms"] == pytest.approx(0.18)


# ---- unfused-attention: softmax between matmul kernels, no fused attention kernel ----------------

def attention_trace(softmax="softmax_warp_forward", after="ampere_bf16_s16816gemm_bf16", fused=False, other_us=1_000):
    tb = TraceBuilder()
    for i in range(3):
        t = i * 20_000
        tb.step(i + 1, t, 20_000)
        tb.kernel("ampere_bf16_s16816gemm_bf16", t + 100, 100, launch_ts=t + 10)
        tb.kernel("vectorized_elementwise_kernel<mask>", t + 205, 20, launch_ts=t + 20)
        tb.kernel(softmax, t + 230, 50, launch_ts=t + 30)
        tb.kernel(after, t + 285, 100, launch_ts=t + 40)
        for j in range(3):
            tb.kernel("k_tail", t + 390 + 3 * j, 2, launch_ts=t + 42 + j)
        tb.kernel("k_other", t + 400, other_us, launch_ts=t + 50)
        if fused:
            tb.kernel("pytorch_flash::flash_fwd_kernel", t + 400 + other_us + 10, 30, launch_ts=t + 60)
    return tb


@pytest.mark.parametrize(("kwargs", "fires"), [
    ({}, True),
    ({"fused": True}, False),
    ({"after": "nll_loss_forward_reduce_cuda_kernel"}, False),  # a classifier's softmax, not attention
    ({"other_us": 10_000}, False),  # 270 µs of 10.3 ms: under 5 %
])
def test_unfused_attention(kwargs, fires):
    r = analyze(attention_trace(**kwargs).to_dict())
    assert ("unfused-attention" in r.finding_ids) is fires
    if fires:
        n = r.finding("unfused-attention").evidence.numbers
        assert n["attention_softmax_count"] == 3 and n["attention_ms"] == pytest.approx(3 * 0.27)  # gemm, mask, softmax, gemm
        assert "scaled_dot_product_attention" in r.finding("unfused-attention").fixes[0].code


# ---- elementwise-bound: ≥ 40 % of kernel time elementwise while busy ≥ 50 % ----------------------

def elementwise_trace(elem_us, gemm_us, step_us=10_000):
    tb = TraceBuilder()
    for i in range(3):
        t = i * step_us
        tb.step(i + 1, t, step_us)
        tb.kernel("ampere_sgemm_128x64_nn", t + 100, gemm_us, launch_ts=t + 10)
        tb.kernel("void at::native::vectorized_elementwise_kernel<4, GeluFunctor>", t + 110 + gemm_us, elem_us,
                  launch_ts=t + 20)
        # the host waits for the step's kernels (a GPU-bound step: they bound it, analysis.gpubound)
        tb.runtime("cudaDeviceSynchronize", t + 30, 80 + gemm_us + elem_us)
    return tb


@pytest.mark.parametrize(("elem_us", "gemm_us", "fires"), [
    (3_600, 5_400, True),    # 40 % exactly, busy 90 %
    (3_400, 5_600, False),   # 38 %
    (1_800, 2_700, False),   # 40 % but busy 45 %
])
def test_elementwise_bound_threshold(elem_us, gemm_us, fires):
    r = analyze(elementwise_trace(elem_us, gemm_us).to_dict())
    assert ("elementwise-bound" in r.finding_ids) is fires
    if fires:
        f = r.finding("elementwise-bound")
        assert f.evidence.numbers["elementwise_kernel_frac"] == pytest.approx(0.4)
        assert f.est_gain == pytest.approx(0.4 * 0.9 * 0.5, abs=1e-3)
        assert any("triton.jit" in fx.code for fx in f.fixes)


def test_inductor_triton_kernels_are_already_fused():
    from gpumagic.analysis import names

    assert names.is_elementwise("void at::native::vectorized_elementwise_kernel<4, AddFunctor>")
    assert names.is_elementwise("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>")
    assert not names.is_elementwise("triton_poi_fused_add_gelu_0")
    assert not names.is_elementwise("ampere_sgemm_128x64_nn")
    assert names.is_fused_attention("void pytorch_flash::flash_fwd_kernel<...>")
    assert names.is_fused_attention("attn_fwd")
    assert not names.is_softmax("attn_fwd_softmax_fused") and names.is_softmax("cunn_SoftMaxForward")
    assert kernel_rules.ATTENTION_NEIGHBOURS >= 2


def test_small_copies_metrics_per_direction():
    d = analyze(copies_trace(20).to_dict()).metrics["small_copies"]
    assert d["max_bytes"] == 64 * 1024 and set(d["directions"]) == {"HtoD"}
    h = d["directions"]["HtoD"]
    assert (h["count"], h["per_step"], h["bytes"], h["median_bytes"]) == (60, 20, 60 * 4096, 4096)
    assert h["size_classes"] == {"<=1KiB": 0, "<=8KiB": 60, "<=64KiB": 0}
    assert h["gpu_ms"] == pytest.approx(0.6) and h["host_ms"] == pytest.approx(0.18)
    assert h["cost_frac"] == pytest.approx(3 * 20 * 13 / 30_000, abs=1e-4)  # 10 µs copy + 3 µs call, apart


def test_synchronous_small_copies_waiting_on_kernels_cost_only_their_own_time():
    """Scalar reads behind a long kernel: each call blocks until the queue drains. The wait is
    host-sync's matter; the copies themselves cost little, so small-transfers stays silent."""
    tb = TraceBuilder()
    corr = 5000
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.kernel("k_long", t + 10, 8_000, launch_ts=t + 2)
        call_start = t + 50
        for j in range(20):
            corr += 1
            copy_ts = t + 8_020 + j * 10
            tb.runtime("cudaMemcpyAsync", call_start, copy_ts + 6 - call_start, corr)
            tb.add(cat="gpu_memcpy", name="Memcpy DtoH (Device -> Pageable)", ts=copy_ts, dur=5, pid=0, tid=7,
                   args={"device": 0, "stream": 7, "correlation": corr, "bytes": 256})
            call_start = copy_ts + 7
    r = analyze(tb.to_dict())
    h = r.metrics["small_copies"]["directions"]["DtoH"]
    assert h["host_ms"] == pytest.approx(3 * 20 * 0.006, abs=1e-3)  # from each copy's start to the return
    assert "small-transfers" not in r.finding_ids


def test_inference_gets_no_training_advice():
    """No backward or optimizer in the trace: no TrainingArguments, loss or optimizer fixes."""
    inference = analyze(elementwise_trace(3_600, 5_400).to_dict()).finding("elementwise-bound")
    assert not any("TrainingArguments" in fx.code or "optim" in fx.code or "loss" in fx.code for fx in inference.fixes)
    tb = elementwise_trace(3_600, 5_400)
    tb.op("autograd::engine::evaluate_function: AddmmBackward0", 50, 10)
    training = analyze(tb.to_dict()).finding("elementwise-bound")
    assert any("TrainingArguments" in fx.code for fx in training.fixes)
    eff = analyze(efficiency_trace(9e9).to_dict()).finding("low-compute-efficiency")
    assert not any("TrainingArguments" in fx.code or "loss_fn" in fx.code for fx in eff.fixes)


def test_tf32_is_the_first_step_on_ampere():
    f = fixture_report("event_sync_multistream.json.gz").finding("mixed-precision-off")  # FP32 sgemm on an A100
    assert tf32_fix().code == f.fixes[0].code and "autocast" in f.fixes[1].code


def test_claim_windows_match_the_quoted_cost():
    """The windows offered for combining gains are the cost the finding quotes."""
    from gpumagic import load_trace
    from gpumagic.analysis import intervals as iv
    from gpumagic.analysis.context import build_context
    from gpumagic.analysis.rules.chunks import small_transfer_windows

    tb = copies_trace(20)
    ctx = build_context(load_trace(tb.to_dict()))
    n = analyze(tb.to_dict()).finding("small-transfers").evidence.numbers
    assert iv.total(small_transfer_windows(ctx)) / ctx.window_ns == pytest.approx(n["cost_frac"], abs=1e-4)


# ---- issue 31: MFU only when the FLOPs cover the matmul work ------------------------------------
def _coverage_trace(covered_steps):
    """Three steps of 8 ms of sgemm; the counted aten::mm launches the gemm in the first
    ``covered_steps`` steps; in the others the gemm is replayed by a graph launch."""
    tb = TraceBuilder(gpu_name=A100)
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        if i < covered_steps:
            op(tb, "aten::mm", t + 5, 20, [[1024, 1024], [1024, 1024]], flops=9e9)
            tb.kernel("ampere_sgemm_128x64_nn", t + 100, 8_000, launch_ts=t + 20)
        else:
            tb.kernel("ampere_sgemm_128x64_nn", t + 100, 8_000, launch_ts=t + 20)
            tb.events[-2]["name"] = "cudaGraphLaunch"
    return analyze(tb.to_dict())


@pytest.mark.parametrize(("covered", "coverage", "mfu", "lower_bound"), [
    (3, 1.0, True, False), (2, 0.6667, True, True), (1, 0.3333, False, None)])
def test_mfu_follows_flops_coverage(covered, coverage, mfu, lower_bound):
    r = _coverage_trace(covered)
    c = r.metrics["compute"]
    assert c["flops_coverage"] == coverage
    assert (c["mfu"] is not None) is mfu and c["mfu_lower_bound"] is lower_bound
    if not mfu:
        assert c["flops"] is not None  # the FLOPs are still reported; only MFU is withheld
    # a lower bound or a withheld MFU proves no low efficiency
    assert ("low-compute-efficiency" in r.finding_ids) is (covered == 3)
