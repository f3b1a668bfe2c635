"""AMD GPUs and ``mixed-precision-off``: what Tensile/hipBLASLt and MIOpen kernel names say about
precision (``names.tensile_type``, ``names.says_fp32_matrix``), FP32 matmuls on the matrix cores at
the FP32 rate, and fixes that run on ROCm (no TF32 switch, no ``TrainingArguments(tf32=True)``)."""

from __future__ import annotations

import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.analysis import names as nm
from gpumagic.analysis.context import build_context
from gpumagic.integrations.huggingface import huggingface_fixes
from gpumagic.trace import load

MI300X = "AMD Instinct MI300X VF"

#: Kernel names as ROCm writes them (the first three from this project's MI300X fixtures and public
#: rocprof/profiler tables; the MIOpen ones from MIOpen's igemm_gtc naming), with the A/B type
#: Tensile spells, and what each precision test says.
NAMES = [
    # name, Tensile type, bf16, fp16, fp64, fp32 on matrix cores
    ("Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT16x16x128_MI16x16x1_SN_LDSB1", "B", True, False, False, False),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT32x32x256_MI16x16x1_SN", "B", True, False, False, False),
    ("Cijk_Ailk_Bljk_SB_MT128x96x16_MI32x32x2x1_SN_1LDSB0_APM1_ABV0", "S", False, False, False, True),
    ("Cijk_Ailk_Bljk_S_B_Bias_HA_S_SAV_UserArgs_MT16x16x128_MI16x16x1_SN_LDSB1", "S", False, False, False, True),
    ("Cijk_Ailk_Bljk_SB_MT64x64x16_SN_K1", "S", False, False, False, False),   # FP32 without MFMA
    ("Cijk_Ailk_Bljk_S_MX_B_Bias_HA_S_SAV_UserArgs_MT16x16x32_MI16x16x1_SN", "S", False, False, False, False),  # xf32
    ("Cijk_Ailk_Bjlk_HHS_BH_Bias_HA_S_SAV_MT64x96x64_MI16x16x1", "H", False, True, False, False),
    ("Cijk_Ailk_Bljk_DB_MT64x64x8_SN_1LDSB0_APM1", "D", False, False, True, False),
    ("Cijk_Ailk_Bljk_ZB_MT32x32x8_SN", "Z", False, False, True, False),
    ("Cijk_Ailk_Bljk_B8_BS_BH_MT64x64x64_MI16x16x1", "B8", False, False, False, False),   # bf8, not bf16
    ("Cijk_Ailk_Bljk_I8II_BH_MT64x64x64_MI32x32x8", "I8", False, False, False, False),
    ("igemm_fwd_gtcx_nhwc_fp32_bx0_ex0_bt128x128x32_wt32x32x2", None, False, False, False, True),
    ("igemm_bwd_data_gtcx_nhwc_fp32_bx0_bt128x128x16", None, False, False, False, True),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt64x64x16", None, True, False, False, False),
    ("ampere_sgemm_128x64_nn", None, False, False, False, False),
]


@pytest.mark.parametrize(("name", "kind", "bf16", "fp16", "fp64", "fp32_matrix"), NAMES)
def test_what_amd_kernel_names_say_about_precision(name, kind, bf16, fp16, fp64, fp32_matrix):
    assert nm.tensile_type(name) == kind
    assert (nm.says_bf16(name), nm.says_fp16(name), nm.says_fp64(name), nm.says_fp32_matrix(name)) == \
        (bf16, fp16, fp64, fp32_matrix)


def test_fp32_matrix_kernels_are_matrix_core_kernels_all_the_same():
    """The metric splits them out of tensor_core_ms; it does not unmark them as matrix-core kernels."""
    assert all(nm.is_tensor_core(n) for n, *_, fp32 in NAMES if fp32)


def _loop(kernel: str, gpu: str = MI300X, training: bool = True, launch: str = "hipLaunchKernel") -> dict:
    tb = TraceBuilder(cc=(9, 4), gpu_name=gpu, total_mem=192 * 2**30)
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.op("aten::mm", t + 5, 30)
        tb.kernel(kernel, t + 100, 8_000, launch_ts=t + 20, launch=launch)
        if training:
            tb.op("autograd::engine::evaluate_function: MmBackward0", t + 8_500, 300)
    return tb.to_dict()


FP32_MFMA = "Cijk_Ailk_Bljk_S_B_Bias_HA_S_SAV_UserArgs_MT16x16x128_MI16x16x1_SN_LDSB1"


@pytest.mark.parametrize("training", [True, False])
def test_fp32_matmuls_on_the_matrix_cores_are_told_to_use_bf16(training):
    """An FP32 Tensile GEMM with an MFMA instruction looks like matrix-core work by name, but runs at
    the FP32 matrix rate (163.4 TFLOP/s on an MI300X against 1,307.4 in bf16): the finding fires."""
    r = analyze(_loop(FP32_MFMA, training=training))
    k = r.metrics.kernels
    assert k.matmul_tensor_core_ms == pytest.approx(k.matmul_ms)   # a matrix-core kernel by name ...
    assert k.matmul_fp32_matrix_ms == pytest.approx(k.matmul_ms)   # ... at the FP32 rate
    f = r.finding("mixed-precision-off")
    assert f is not None and f.title == "Matmuls run in FP32 on a matrix-core GPU"
    assert "MFMA instructions on FP32 inputs" in f.why and "on ordinary cores" not in f.why
    assert f.evidence.numbers["vendor"] == "AMD" and f.evidence.numbers["peak_ratio"] == pytest.approx(8.0, abs=0.01)
    # an upper bound: the matmul share times (1 - 1/8)
    assert 0 < f.est_gain <= k.matmul_ms / r.metrics.window.dur_ms * (1 - 1 / 8.0) + 1e-6
    codes = "\n".join(x.code for x in f.fixes)
    assert "tf32" not in codes.lower() and "fp32_precision" not in codes
    assert "torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16)" in codes
    if training:
        assert any(x.flavor == "huggingface" and x.code == "TrainingArguments(..., bf16=True)" for x in f.fixes)


def test_the_same_loop_on_nvidia_keeps_the_tf32_line():
    r = analyze(_loop("ampere_sgemm_128x64_nn", gpu="NVIDIA A100-SXM4-80GB", launch="cudaLaunchKernel"))
    f = r.finding("mixed-precision-off")
    assert f.title == "Matmuls run in FP32 on a tensor-core GPU" and "vendor" not in f.evidence.numbers
    assert "tf32" in f.fixes[0].code


@pytest.mark.parametrize("kernel", [
    "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT32x32x256_MI16x16x1_SN",        # bf16
    "Cijk_Ailk_Bljk_S_MX_B_Bias_HA_S_SAV_UserArgs_MT16x16x32_MI16x16x1_SN",          # FP32 as xfloat32
])
def test_reduced_precision_on_the_matrix_cores_stays_silent(kernel):
    r = analyze(_loop(kernel))
    assert "mixed-precision-off" not in r.finding_ids and r.metrics.kernels.matmul_fp32_matrix_ms == 0


def test_trainer_advice_on_rocm_has_no_tf32():
    r = huggingface_fixes(analyze(_loop(FP32_MFMA)), fields={"bf16", "fp16", "tf32"})
    first = r.finding("mixed-precision-off").fixes[0]
    assert first.flavor == "huggingface" and first.code == "TrainingArguments(..., bf16=True)"


def test_float64_on_rocm_gets_the_cast_and_no_tf32():
    r = huggingface_fixes(analyze(_loop("Cijk_Ailk_Bljk_DB_MT64x64x8_SN_1LDSB0_APM1")), fields={"bf16", "fp16", "tf32"})
    f = r.finding("mixed-precision-off")
    assert f.title == "Matmuls run in float64 (double precision)"
    assert "tf32" not in "\n".join(x.code for x in f.fixes).lower()
    assert f.fixes[0].description.startswith("After the cast to float32 below")
    assert any("model = model.float()" in x.code for x in f.fixes)


def test_the_trainer_refuses_tf32_without_cuda():
    """Why the ROCm advice leaves tf32 out: transformers checks ``torch.version.cuda``, None on ROCm
    builds as on this CPU build, and raises."""
    transformers = pytest.importorskip("transformers")
    import torch
    assert torch.version.cuda is None
    with pytest.raises(ValueError, match="tf32"):
        transformers.TrainingArguments(output_dir=os.devnull, tf32=True, report_to=[])


@pytest.mark.parametrize(("fixture", "rocm"), [
    ("mi300_bert_small_infer.json.gz", True),               # deviceProperties: "AMD Instinct MI300X VF"
    ("mi300_vllm_decode_fullgraph_capture.json.gz", True),  # no device names: the HIP runtime calls say it
    ("h100_bert_small_inference.json.gz", False),
])
def test_rocm_is_read_from_the_device_name_or_the_runtime(fixture, rocm):
    trace = load(os.path.join(DATA, fixture))
    assert build_context(trace).rocm is rocm


def test_the_mi300x_fixtures_bf16_gemms_are_counted_as_bf16():
    k = analyze(os.path.join(DATA, "mi300_bert_small_infer.json.gz")).metrics.kernels
    assert k.matmul_bf16_ms > 0 and k.matmul_fp32_matrix_ms == 0
    assert "mixed-precision-off" not in analyze(os.path.join(DATA, "mi300_bert_small_infer.json.gz")).finding_ids


def _counted(kernel: str) -> dict:
    """Three MI300X steps of one FP32 matmul the profiler counted (9 GFLOP) and its 8 ms kernel."""
    tb = TraceBuilder(cc=(9, 4), gpu_name=MI300X, total_mem=192 * 2**30)
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.add(cat="cpu_op", name="aten::mm", ts=t + 5, dur=20, tid=100,
               args={"Input Dims": [[1024, 1024], [1024, 1024]], "Input type": ["float", "float"], "flops": 9e9})
        tb.kernel(kernel, t + 100, 8_000, launch_ts=t + 20, launch="hipLaunchKernel")
    return tb.to_dict()


def test_low_compute_efficiency_on_an_amd_gpu_has_no_tf32_line():
    f = analyze(_counted(FP32_MFMA)).finding("low-compute-efficiency")
    assert f is not None and f.fixes[0].code.startswith("with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16)")


def test_xf32_gemms_are_measured_against_the_xf32_peak():
    """FP32 matmuls that Tensile runs as xfloat32 (``_MX``) are AMD's TF32: the MFU's peak is the
    MI300X's 653.7 TFLOP/s, not its FP32 163.4."""
    c = analyze(_counted(NAMES[5][0])).metrics.compute
    assert nm.says_xf32(NAMES[5][0]) and not nm.says_xf32(FP32_MFMA)
    assert (c.dtype, c.peak_tflops) == ("tf32", 653.7)


def test_fp32_matmuls_on_the_vector_units_count_with_twice_the_ratio():
    """A Tensile FP32 GEMM without an MFMA instruction runs on the vector units, at half the FP32
    matrix rate the peak table holds: its ceiling is 1 − 1/16 on an MI300X, not 1 − 1/8, so that
    "up to" stays an upper bound."""
    vector = analyze(_loop("Cijk_Ailk_Bljk_SB_MT64x64x16_SN_K1")).finding("mixed-precision-off")
    mfma = analyze(_loop(FP32_MFMA)).finding("mixed-precision-off")   # the same loop's timings
    assert "vector units count with 16.0×" in vector.gain_method and "vector units" not in mfma.gain_method
    assert vector.est_gain / mfma.est_gain == pytest.approx((1 - 1 / 16) / (1 - 1 / 8), rel=0.01)
