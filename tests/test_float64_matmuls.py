"""``mixed-precision-off`` when the matmuls run in float64: the model or its inputs are double
(a NumPy array is float64), which autocast skips and TF32 does not touch; the first fix is the cast
to float32 (``names.is_fp64_matmul``, ``rules.precision``)."""

from __future__ import annotations

import pytest
import torch
from tracebuilder import TraceBuilder

from gpumagic import analyze
from gpumagic.analysis import names as nm

#: Kernel names of float64 matmuls as cuBLAS names them in public profiler output (nvprof/nsys
#: tables: ``volta_dgemm_64x64_nn``, ``volta_dgemm_128x64_nt``), its templated gemv over double,
#: and a Tensile double GEMM.
FP64 = ["volta_dgemm_64x64_nn", "volta_dgemm_128x64_nt",
        "void gemv2T_kernel_val<int, int, double, double, double, double, 128, 16, 4, 4, false, false, "
        "cublasGemvParamsEx<int, double const*, double const*, double> >(cublasGemvParamsEx<int, double const*, "
        "double const*, double>, double, double)",
        "Cijk_Ailk_Bljk_DB_MT64x64x8_SN_1LDSB0_APM1_AF0EM1"]
FP32 = ["volta_sgemm_128x64_nn", "ampere_sgemm_128x64_nn", "Cijk_Ailk_Bljk_SB_MT64x64x8_SN_1LDSB0_APM1_AF0EM1",
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma",
        "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<double, at::native::MeanOps<double, double, "
        "double, double>, unsigned int, double, 4> >"]


@pytest.mark.parametrize("name", FP64)
def test_float64_matmul_names(name):
    assert nm.is_fp64_matmul(name)


@pytest.mark.parametrize("name", FP32)
def test_other_names_are_not_float64_matmuls(name):
    assert not nm.is_fp64_matmul(name)   # the last: float64, but a reduction, not a matmul


def _loop(kernel: str, cc=(7, 0), gpu="Tesla V100-SXM2-16GB", training: bool = True) -> dict:
    tb = TraceBuilder(cc=cc, gpu_name=gpu)
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.op("aten::mm", t + 5, 30)
        tb.kernel(kernel, t + 100, 8_000, launch_ts=t + 20)
        if training:
            tb.op("autograd::engine::evaluate_function: MmBackward0", t + 8_500, 300)
    return tb.to_dict()


@pytest.mark.parametrize("training", [True, False])
def test_float64_matmuls_get_the_cast_to_float32_first(training):
    r = analyze(_loop("volta_dgemm_128x64_nn", training=training))
    assert r.metrics.kernels.matmul_fp64_ms == pytest.approx(r.metrics.kernels.matmul_ms)
    f = r.finding("mixed-precision-off")
    assert f.title == "Matmuls run in float64 (double precision)"
    assert "autocast skips" in f.why and f.gain_method.startswith("upper bound")
    assert 0 < f.est_gain <= r.metrics.kernels.matmul_fp64_ms / r.metrics.window.dur_ms + 1e-6
    first = f.fixes[0]
    assert "model = model.float()" in first.code and "x = x.float()" in first.code
    assert not any("First, one line" in x.description for x in f.fixes)   # the cast comes first
    assert any("autocast" in x.code for x in f.fixes[1:])   # then the mixed-precision steps, on float32


def test_the_cast_runs_and_autocast_alone_would_not_have_changed_float64():
    """The reason the fix exists: under autocast a float64 matmul stays float64; after the cast,
    autocast runs it in 16 bits."""
    model = torch.nn.Linear(4, 4).double()
    x = torch.from_numpy(__import__("numpy").ones((2, 4)))   # float64, as NumPy makes it
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x).dtype == torch.float64
    from gpumagic.analysis.rules.precision import FLOAT32_CODE
    ns = {"torch": torch, "model": model, "x": x}
    exec(compile(FLOAT32_CODE, "<fix>", "exec"), ns)
    assert next(ns["model"].parameters()).dtype == torch.float32 and ns["x"].dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ns["model"](ns["x"]).dtype == torch.bfloat16


def test_float32_matmuls_keep_the_mixed_precision_finding():
    r = analyze(_loop("volta_sgemm_128x64_nn"))
    f = r.finding("mixed-precision-off")
    assert f.title == "Matmuls run in FP32 on a tensor-core GPU" and r.metrics.kernels.matmul_fp64_ms == 0


def test_float64_on_a_gpu_without_tensor_cores_is_still_told():
    """The cast pays on any GPU (float64 runs at a fraction of the float32 rate): no 16-bit step follows
    where there are no tensor cores."""
    f = analyze(_loop("maxwell_dgemm_64x64_nn", cc=(5, 2), gpu="Tesla M40")).finding("mixed-precision-off")
    assert f.title == "Matmuls run in float64 (double precision)" and len(f.fixes) == 1
