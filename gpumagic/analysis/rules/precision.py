"""``mixed-precision-off``: FP32 matmuls on a GPU with tensor cores, or float64 matmuls on any GPU."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpumagic.analysis import names as nm
from gpumagic.analysis.context import Context
from gpumagic.analysis.devices import peak_tflops
from gpumagic.analysis.gpubound import bounding_ns
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: Tensor cores exist from compute capability 7.0 (Volta) on (NVIDIA CUDA C++ Programming Guide,
#: "Warp Matrix Functions").
TENSOR_CORE_MIN_CC = 7.0
#: Matmul/conv kernels must be a visible share of GPU kernel time ...
MATMUL_KERNEL_FRAC = 0.10
#: ... and "~no tensor-core kernel time": under 10 % of that matmul time on tensor cores.
TENSOR_CORE_SHARE_MAX = 0.10
#: bf16 tensor cores exist from compute capability 8.0 (Ampere); Volta and Turing have FP16 only
#: (NVIDIA CUDA C++ Programming Guide, "Warp Matrix Functions", element types).
BF16_MIN_CC = 8.0
DOC = "https://pytorch.org/docs/stable/amp.html"
#: AMD CDNA GPUs multiply FP32 on the matrix cores at twice their vector FP32 rate (datasheets:
#: MI300X 163.4 against 81.7 TFLOPS, MI250X 95.7 against 47.9, MI210 45.3 against 22.6). The peak
#: table holds the matrix rate, so an FP32 matmul on the vector units is that much further from
#: bf16: counting it with the matrix ratio would make "up to" no upper bound.
AMD_FP32_MATRIX_OVER_VECTOR = 2.0
#: The gain is capped by the matmul time on the critical path (``critical_matmul_ns``) when that is
#: under 90 % of the matmul time; above it the step is GPU-bound and the cap changes nothing.
CRITICAL_SHARE = 0.9


@rule("mixed-precision-off")
def mixed_precision_off(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: matmul/convolution/attention kernels (gemm, conv, cutlass, nvjet; AMD Tensile
    ``Cijk_``, MIOpen xdlops; Triton ``attn_fwd``, ``_matmul``: ``names.MATMUL_RE``) take ≥ 10 %
    of kernel time on a GPU of compute capability ≥ 7.0 (AMD CDNA GPUs report 9.x), and < 10 % of
    that time runs tensor-core / matrix-core kernels (h884/s1688/16816/tensorop/gmma/nvjet/bf16;
    MFMA ``MI16x16x1``, xdlops: ``names.TENSOR_CORE_RE``), not counting AMD matrix-core kernels
    that multiply FP32 at the FP32 matrix rate (``names.says_fp32_matrix``: Tensile type ``S``
    with an MFMA instruction, MIOpen xdlops fp32), which gain the bf16 rate only in bf16.
    Inference traces get autocast without a GradScaler. On ROCm (``Context.rocm``) the fixes leave
    out TF32: ``TrainingArguments(tf32=True)`` raises there (transformers' ``is_torch_tf32_available``
    requires CUDA) and PyTorch's xfloat32 path depends on the GPU and the build. Gain, an upper bound: matmul
    time share × (1 − FP32 peak / BF16-or-FP16 peak) from the device's own datasheet peaks
    (``analysis.devices``: ~16× on A100, ~8× on V100, ~4× on L4/L40S, ~2× on GeForce Ampere/Ada
    with FP32 accumulate; on AMD, FP32 kernels on the vector units count with twice the ratio, as
    the table holds the FP32 matrix rate, twice the vector one) — a peak ratio is a ceiling no real
    kernel mix reaches; on a device
    missing from the table, the whole matmul share. Float64: when kernels whose names say double
    precision (``names.is_fp64_matmul``) hold ≥ half of the matmul time (≥ 10 % of kernel time),
    on any GPU, the finding says so and leads with the cast to float32 (autocast skips float64
    tensors, TF32 is an FP32 mode); its gain, the float64 matmul share, is an upper bound.
    False positives: kernels whose names hide tensor-core use; FP32 or float64 kept on purpose
    for numerical reasons."""
    info = ctx.device_info
    k = m.kernels
    if info is not None and k.total_ms and k.matmul_ms / k.total_ms >= MATMUL_KERNEL_FRAC \
            and k.matmul_fp64_ms >= FP64_SHARE * k.matmul_ms:
        return _float64(ctx, m)
    if info is None or info.compute_capability < TENSOR_CORE_MIN_CC or not k.total_ms:
        return None
    # reduced precision on tensor/matrix cores: AMD's FP32 MFMA kernels are matrix-core kernels at FP32's rate
    matmul, tc = k.matmul_ms, max(k.matmul_tensor_core_ms - k.matmul_fp32_matrix_ms, 0.0)
    if matmul / k.total_ms < MATMUL_KERNEL_FRAC or tc / max(matmul, 1e-9) >= TENSOR_CORE_SHARE_MAX:
        return None
    low = "bf16" if info.compute_capability >= BF16_MIN_CC else "fp16"
    gpu = info.name or "GPU (architecture read from its kernels' names: no deviceProperties in the trace)"
    fp32_peak, _src = peak_tflops(info.name, "fp32")
    low_peak, _src = peak_tflops(info.name, low)
    ratio = low_peak / fp32_peak if fp32_peak and low_peak else None
    speedup_share = 1 - 1 / ratio if ratio else 1.0
    amd = ctx.rocm
    # AMD's table rate is FP32 on the matrix cores; FP32 kernels on the vector units run at half of it
    vector_ms = max(matmul - tc - k.matmul_fp32_matrix_ms, 0.0) if amd else 0.0
    if ratio and vector_ms > 0:
        on_matrix = k.matmul_fp32_matrix_ms / (vector_ms + k.matmul_fp32_matrix_ms)
        speedup_share = on_matrix * (1 - 1 / ratio) + (1 - on_matrix) * (1 - 1 / (AMD_FP32_MATRIX_OVER_VECTOR * ratio))
    gain = ctx.frac(matmul * 1e6) * speedup_share
    critical = critical_matmul_ns(ctx)
    bounded = critical is not None and critical < CRITICAL_SHARE * matmul * 1e6
    if bounded and critical is not None:  # the host sets the pace: faster kernels save only what the host waited on
        gain = ctx.frac(critical) * speedup_share
    method = (f"upper bound: matmul/conv share of the window × (1 − 1/{ratio:.1f}), the {gpu}'s "
              f"{low.upper()} {'matrix' if amd else 'tensor'}-core over FP32 peak ratio (datasheet ceilings, not a measured speed-up)"
              if ratio else "upper bound: the whole matmul/conv share of the window (this GPU is not in the "
              "peak table)")
    if ratio and vector_ms > 0:
        method += (f"; FP32 matmuls on the vector units count with {AMD_FP32_MATRIX_OVER_VECTOR * ratio:.1f}× (AMD's "
                   "FP32 vector rate is half its FP32 matrix rate)")
    if bounded and critical is not None:
        method += (f"; capped at the {critical / 1e6:.1f} ms of matmul kernels after which the next GPU work was "
                   "already queued: after the others the GPU waited for the host, which sets the step's pace")
    cores = "matrix cores" if amd else "tensor cores"
    lowp = ("BF16/FP16" if amd else "BF16/FP16 (and TF32)") if info.compute_capability >= BF16_MIN_CC \
        else "FP16 (no BF16 before Ampere)"
    ceiling = f": its datasheet peak is {ratio:.0f}x the FP32 one, a ceiling real kernels do not reach" if ratio else ""
    custom_ms, custom_names = _custom_matmuls(ctx)
    custom = custom_ms >= CUSTOM_SHARE * max(matmul - tc, 1e-9)
    fixes = _fixes(info.compute_capability, amd) if ctx.workload == "training" \
        else _inference_fixes(info.compute_capability, amd)
    fp32_matrix = k.matmul_fp32_matrix_ms
    plain = (f"""These matmul and convolution kernels run in FP32 ({pct(fp32_matrix / matmul)} of their time on the
        matrix cores at the FP32 rate: MFMA instructions on FP32 inputs), so the matrix cores' BF16 rate goes
        unused.""" if fp32_matrix > 0 else f"These matmul and convolution kernels run in plain FP32, so the {cores} sit unused.")
    ordinary = "" if amd else " on ordinary cores"
    custom_why = ""
    if custom:
        fixes = (pytorch("These matmul kernels are hand-written: autocast changes the inputs of library calls "
                         "(cuBLAS, CUTLASS, cuDNN, hipBLASLt, Triton), not a custom kernel's arithmetic. Do the "
                         "product through a library call in 16-bit, or use tl.dot on 16-bit tiles in Triton",
                         CUSTOM_CODE), *fixes)
        custom_why = (f" {pct(custom_ms / max(matmul - tc, 1e-9))} of the FP32 matmul time is in kernels no library"
                      f" names ({', '.join(custom_names)}): hand-written, so autocast alone will not move them to"
                      " tensor cores.")
    return finding(
        severity=severity_for(gain), title=f"Matmuls run in FP32 on a {cores.replace(' cores', '-core')} GPU",
        why=f"""The {gpu} (compute capability {info.compute_capability:.1f}) has {cores} that multiply
        matrices in {lowp} faster than FP32{ordinary}{ceiling}. {plain} Autocast runs matmuls and convolutions in reduced
        precision and keeps the ops on its FP32 list (layer_norm, softmax, losses and friends) in FP32
        (PyTorch AMP docs, "Autocast Op Reference").{custom_why}""",
        summary=f"Matmul/conv kernels take {matmul:.1f} ms ({pct(matmul / k.total_ms)} of kernel time); "
                f"{pct(tc / max(matmul, 1e-9))} of it uses {cores}"
                + (f" in reduced precision, {pct(fp32_matrix / matmul)} in FP32." if fp32_matrix > 0 else "."),
        numbers={"matmul_ms": matmul, "matmul_tensor_core_ms": tc, "matmul_kernel_frac": round(matmul / k.total_ms, 4),
                 "compute_capability": info.compute_capability,
                 **({"matmul_fp32_matrix_ms": fp32_matrix} if fp32_matrix > 0 else {}),
                 **({"vendor": "AMD"} if amd else {}),
                 **({"peak_ratio": round(ratio, 2)} if ratio else {})},
        est_gain=gain, gain_method=method,
        fixes=fixes,
        doc_url=DOC,
    )


#: Float64 kernels (``names.is_fp64_matmul``) take at least half the matmul time: the finding is
#: about double precision, which autocast and TF32 leave alone (``ATen/autocast_mode.h``:
#: ``is_eligible`` skips ``kDouble`` tensors; TF32 applies to FP32 matmuls only).
FP64_SHARE = 0.5
FLOAT32_CODE = """
model = model.float()          # parameters and buffers to float32 (in place)
x = x.float()                  # every float64 input: a NumPy array is float64, and so is
                               # torch.from_numpy(array) or torch.tensor(array); .float() each
# then check: next(model.parameters()).dtype and x.dtype are torch.float32"""


def _float64(ctx: Context, m: Metrics) -> Finding:
    """Matmuls in double precision: cast to float32 first (autocast ignores float64 tensors)."""
    k = m.kernels
    fp64 = k.matmul_fp64_ms
    critical = critical_matmul_ns(ctx)
    cap = critical if critical is not None and critical < fp64 * 1e6 else None
    gain = ctx.frac(fp64 * 1e6 if cap is None else cap)
    method = ("upper bound: the float64 matmul kernels' share of the window (float32 cannot take more than "
              "their time; the datasheet ratio of FP32 to FP64 peaks ranges from 2× on data-centre GPUs to 64× "
              "on consumer ones)")
    if cap is not None:
        method += (f"; capped at the {cap / 1e6:.1f} ms of matmul kernels after which the next GPU work was "
                   "already queued")
    info = ctx.device_info
    gpu = (info.name if info is not None else "") or "GPU"
    training = ctx.workload == "training"
    later = () if info is None or info.compute_capability < TENSOR_CORE_MIN_CC else (
        _fixes(info.compute_capability, ctx.rocm) if training else _inference_fixes(info.compute_capability, ctx.rocm))
    # once in float32, the mixed-precision steps follow: none of them comes "first" any more
    then = tuple(replace(f, description=f.description.replace("First, one line", "Then, one line"))
                 for f in later)
    return finding(
        severity=severity_for(gain), title="Matmuls run in float64 (double precision)",
        why=f"""{pct(fp64 / k.matmul_ms)} of the matmul kernel time is in double-precision kernels (dgemm and
        kin): the model or its inputs are float64. A NumPy array is float64 by default, and so is a tensor
        made from one; a model that met one with .double() computes in float64 too. The {gpu} runs float64 at a
        fraction of its float32 rate, and neither autocast nor TF32 changes float64 tensors (autocast skips
        them), so the mixed-precision fixes do nothing until the model and inputs are float32.""",
        summary=f"Float64 matmul kernels take {fp64:.1f} ms of {k.matmul_ms:.1f} ms of matmul time "
                f"({pct(k.matmul_ms / k.total_ms)} of kernel time).",
        numbers={"matmul_ms": k.matmul_ms, "matmul_fp64_ms": fp64, "matmul_kernel_frac": round(k.matmul_ms / k.total_ms, 4),
                 "fp64_share_of_matmul": round(fp64 / k.matmul_ms, 4),
                 **({"compute_capability": info.compute_capability} if info is not None else {}),
                 **({"vendor": "AMD"} if ctx.rocm else {})},
        est_gain=gain, gain_method=method,
        fixes=(pytorch("Compute in float32: cast the model and every floating-point input (autocast and TF32 "
                       "leave float64 alone)", FLOAT32_CODE), *then),
        doc_url=DOC,
    )


#: Hand-written kernels take at least half the FP32 matmul time: the advice starts with them.
CUSTOM_SHARE = 0.5
CUSTOM_CODE = """
# a library matmul in bf16 runs on tensor cores (cuBLAS / hipBLASLt), where a hand-written FP32 kernel cannot
out = torch.matmul(x.to(torch.bfloat16), weight.to(torch.bfloat16))
# in a Triton kernel instead: accumulate tl.dot over 16-bit tiles, e.g.
#   acc += tl.dot(a_tile.to(tl.bfloat16), b_tile.to(tl.bfloat16))"""


def _custom_matmuls(ctx: Context) -> tuple[float, list[str]]:
    """FP32 (non-tensor-core) matmul-named kernel time (ms) in kernels no library names
    (``names.is_library_matmul``), and the longest of their names."""
    ev, msk = ctx.trace.events, ctx.masks
    sel = ctx.events_in_window(msk["kernel"] & msk["name_matmul"] & ~msk["name_tensor_core"]) & ctx.on_device
    lib = ctx.trace.name_ids(nm.is_library_matmul)[ev.name]
    rows = np.flatnonzero(sel & ~lib)
    if rows.size == 0:
        return 0.0, []
    tot = np.bincount(ev.name[rows], weights=ev.dur_ns[rows])
    top = np.argsort(-tot)[:3]
    return float(ev.dur_ns[rows].sum()) / 1e6, [f"`{ctx.trace.names[n][:40]}`" for n in top.tolist() if tot[n] > 0]


def critical_matmul_ns(ctx: Context) -> int | None:
    """Matmul-kernel time that bounds the step: a GPU event is on the critical path when the next
    GPU work had already been launched before it ended (the queue was ahead of the GPU, so a
    shorter kernel starts the next one sooner), and the last one in the window. A kernel after
    which the GPU waits for the host's next launch is not: shortening it only lengthens the
    wait (a launch- or CPU-bound step). And never more than the matmul kernels' time that can
    bound the steps (``gpubound.bounding_ns``): kernels queued ahead of the GPU still save
    nothing when the run they belong to ends in a wait for the host's next launch. ``None``
    without GPU work."""
    ev, msk = ctx.trace.events, ctx.masks
    on = np.flatnonzero(ctx.events_in_window(msk["gpu"]) & ctx.on_device)
    if on.size == 0:
        return None
    end = ev.ts_ns[on] + ev.dur_ns[on]
    nxt = np.append(ctx.launch_ts[on[1:]], -1)
    critical = (nxt < end) | (np.arange(on.size) == on.size - 1)  # unknown launch (-1): kept
    mm = msk["kernel"][on] & msk["name_matmul"][on]
    return min(int(ev.dur_ns[on[critical & mm]].sum()), bounding_ns(ctx, on[mm]))


def tf32_fix() -> Fix:
    """TF32 for FP32 matmuls, in the API the installed torch documents: from PyTorch 2.9
    ``torch.backends.cuda.matmul.fp32_precision = "tf32"`` (CUDA semantics notes, "TensorFloat-32
    (TF32) on Ampere (and later) devices"); before it ``set_float32_matmul_precision("high")``,
    which is the same switch as ``matmul.allow_tf32 = True``. cuDNN convolutions already use TF32
    by default (``cudnn.allow_tf32`` defaults to True), so only matmuls need the line. Without
    torch installed (offline analysis), the newer spelling is given. The version is read from the
    package metadata: analysing a saved trace never imports torch."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        major, minor = (int("".join(c for c in p if c.isdigit()) or 0) for p in version("torch").split(".")[:2])
        new = (major, minor) >= (2, 9)
    except (PackageNotFoundError, ValueError):
        new = True
    code = ('torch.backends.cuda.matmul.fp32_precision = "tf32"   # PyTorch ≥ 2.9; cuDNN convs use TF32 by default'
            if new else 'torch.set_float32_matmul_precision("high")   # = matmul.allow_tf32; cuDNN convs use TF32 by default')
    return pytorch("First, one line: let FP32 matmuls use TF32 tensor cores", code)


def _inference_fixes(cc: float, rocm: bool = False) -> tuple[Fix, ...]:
    """Inference: on Ampere and later TF32 first (one line), then autocast the forward pass (no loss
    scaling, no optimizer); bf16 from cc 8.0. On ROCm, autocast alone (no TF32 line)."""
    dtype = "bfloat16" if cc >= 8.0 else "float16"
    tf32 = cc >= 8.0 and not rocm
    autocast = pytorch(f"{'Then a' if tf32 else 'A'}utocast inference to {dtype}",
                       f"""
with torch.inference_mode(), torch.autocast(device_type="cuda", dtype=torch.{dtype}):
    out = model(x)""")
    if tf32:
        return (tf32_fix(), autocast)
    return (autocast,)


def _fixes(cc: float, rocm: bool = False) -> tuple[Fix, ...]:
    """On Ampere and later (cc ≥ 8.0): TF32 first (one line, FP32 code unchanged), then bf16
    autocast; fp16 with a GradScaler on Volta/Turing, whose tensor cores have no bf16 or TF32. On
    ROCm (AMD CDNA reports cc 9.x): bf16 autocast and the Trainer's ``bf16=True``, no TF32
    (``TrainingArguments(tf32=True)`` raises without CUDA)."""
    if rocm and cc >= 8.0:
        return (
            pytorch("Autocast the forward pass to bfloat16: matmuls and convolutions run at the matrix cores' BF16 "
                    "rate",
                    """
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):   # "cuda" is ROCm's device type too
    loss = loss_fn(model(x), y)
loss.backward()"""),
            huggingface("Through TrainingArguments (tf32=True raises on ROCm: leave it out)",
                        "TrainingArguments(..., bf16=True)"),
        )
    if cc >= 8.0:
        return (
            tf32_fix(),
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
