"""``mixed-precision-off``: FP32 matmuls on a GPU with tensor cores."""

from __future__ import annotations

from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, severity_for

#: Tensor cores exist from compute capability 7.0 (Volta) on (NVIDIA CUDA C++ Programming Guide,
#: "Warp Matrix Functions").
TENSOR_CORE_MIN_CC = 7.0
#: Matmul/conv kernels must be a visible share of GPU kernel time ...
MATMUL_KERNEL_FRAC = 0.10
#: ... and "~no tensor-core kernel time": under 10 % of that matmul time on tensor cores.
TENSOR_CORE_SHARE_MAX = 0.10
#: FP32 (CUDA cores) vs FP16/BF16 tensor-core peak: V100 15.7 vs 125 TFLOPS, A100 19.5 vs 312
#: (NVIDIA datasheets) — at least 8x, so at most 7/8 of matmul time can go.
TENSOR_CORE_SPEEDUP = 8.0
DOC = "https://pytorch.org/docs/stable/amp.html"


def mixed_precision_off(ctx: Context, m: dict):
    """Signal: matmul/convolution/attention kernels (gemm, conv, cutlass, nvjet; AMD Tensile
    ``Cijk_``, MIOpen xdlops; Triton ``attn_fwd``, ``_matmul``: ``names.MATMUL_RE``) take ≥ 10 %
    of kernel time on a GPU of compute capability ≥ 7.0 (AMD CDNA GPUs report 9.x), and < 10 % of
    that time runs tensor-core / matrix-core kernels (h884/s1688/16816/tensorop/gmma/nvjet/bf16;
    MFMA ``MI16x16x1``, xdlops: ``names.TENSOR_CORE_RE``). Inference traces get autocast without
    a GradScaler. Gain: matmul time share ×
    (1 − 1/8), from the ≥ 8× peak of tensor cores over FP32. False positives: kernels whose
    names hide tensor-core use; FP32 kept on purpose for numerical reasons."""
    info = ctx.device_info
    k = m["kernels"]
    if info is None or info.compute_capability < TENSOR_CORE_MIN_CC or not k["total_ms"]:
        return None
    matmul, tc = k["matmul_ms"], k["matmul_tensor_core_ms"]
    if matmul / k["total_ms"] < MATMUL_KERNEL_FRAC or tc / max(matmul, 1e-9) >= TENSOR_CORE_SHARE_MAX:
        return None
    gain = ctx.frac(matmul * 1e6) * (1 - 1 / TENSOR_CORE_SPEEDUP)
    return finding(
        "mixed-precision-off", severity=severity_for(gain), title="Matmuls run in FP32 on a tensor-core GPU",
        why=f"""The {info.name} (compute capability {info.compute_capability:.1f}) has tensor cores that multiply
        matrices in BF16/FP16 (and TF32 on Ampere and later) many times faster than FP32 on ordinary cores.
        These matmul and convolution kernels run in plain FP32, so the tensor cores sit unused. Autocast
        runs them in reduced precision while keeping numerically sensitive operations in FP32.""",
        summary=f"Matmul/conv kernels take {matmul:.1f} ms ({pct(matmul / k['total_ms'])} of kernel time); "
                f"{pct(tc / max(matmul, 1e-9))} of it uses tensor cores.",
        numbers={"matmul_ms": matmul, "matmul_tensor_core_ms": tc, "matmul_kernel_frac": round(matmul / k["total_ms"], 4),
                 "compute_capability": info.compute_capability},
        est_gain=gain, gain_method="matmul/conv share of the window × (1 − 1/8), the tensor-core speed-up floor",
        fixes=_fixes(info.compute_capability) if ctx.workload == "training" else _inference_fixes(info.compute_capability),
        doc_url=DOC,
    )


def _inference_fixes(cc: float):
    """Inference: on Ampere and later TF32 first (one line), then autocast the forward pass (no loss
    scaling, no optimizer); bf16 from cc 8.0."""
    dtype = "bfloat16" if cc >= 8.0 else "float16"
    autocast = pytorch(f"{'Then a' if cc >= 8.0 else 'A'}utocast inference to {dtype}",
                       f"""
with torch.inference_mode(), torch.autocast(device_type="cuda", dtype=torch.{dtype}):
    out = model(x)""")
    if cc >= 8.0:
        return (pytorch("First, one line: let FP32 matmuls use TF32 tensor cores", 'torch.set_float32_matmul_precision("high")'),
                autocast)
    return (autocast,)


def _fixes(cc: float):
    """On Ampere and later (cc ≥ 8.0): TF32 first (one line, FP32 code unchanged), then bf16
    autocast; fp16 with a GradScaler on Volta/Turing, whose tensor cores have no bf16 or TF32."""
    if cc >= 8.0:
        return (
            pytorch("First, one line: let FP32 matmuls use TF32 tensor cores",
                    'torch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.allow_tf32 = True\n'
                    'torch.set_float32_matmul_precision("high")'),
            pytorch("Then autocast the forward pass to bfloat16",
                    """
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    loss = loss_fn(model(x), y)
loss.backward()"""),
            huggingface("Through TrainingArguments", "TrainingArguments(..., bf16=True, tf32=True)"),
        )
    return (
        pytorch("Autocast the forward pass to float16, with a GradScaler against underflow",
                """
scaler = torch.amp.GradScaler("cuda")
with torch.autocast(device_type="cuda", dtype=torch.float16):
    loss = loss_fn(model(x), y)
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()"""),
        huggingface("Through TrainingArguments", "TrainingArguments(..., fp16=True)"),
    )
