"""``cpu-low-precision-slow``: bfloat16/float16 matrix operators on a CPU that has no instructions for
them, where FP32 is the faster choice."""

from __future__ import annotations

from gpumagic.analysis.context import Context
from gpumagic.analysis.cpuprecision import low_precision, machine_support
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix
from gpumagic.trace.model import meta_block

#: Evidence: at least this many matrix-operator calls seen in 16 bits (one is not a habit).
MIN_CALLS = 2
#: A finding from this gain (TensorBoard profiler plugin's 5 % line for a bottleneck worth naming).
MIN_GAIN = 0.05
DOC = "https://pytorch.org/docs/stable/amp.html#cpu-ops-that-can-autocast-to-bfloat16"
NAMES = {"bf16": "bfloat16", "fp16": "float16"}
#: The instructions that compute each type natively, and the CPUs that have them.
NATIVE = {"bf16": "bfloat16 with AVX512_BF16 or AMX-BF16 (Intel Xeon from Cooper Lake and Sapphire Rapids on, AMD "
                  "Zen 4 on) or Arm's BF16 extension",
          "fp16": "float16 with AVX512_FP16 or AMX-FP16 (Intel Xeon from Sapphire Rapids on)"}
#: Measured by benchmarks/cpu_low_precision.py on a 2-core AMD EPYC with AVX2 only (medians of
#: interleaved rounds, three quiet runs on 2026-12-05): step time in bf16 autocast over FP32.
MEASURED = ("8× slower for a transformer encoder, 12–15× for two linear layers and 29–38× for a small "
            "convolution network")


@rule("cpu-low-precision-slow")
def cpu_low_precision_slow(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a CPU-only trace whose matrix operators ran in bfloat16 or float16 — autocast's
    casts inside ``aten::linear``/``aten::conv2d``... calls, or 16-bit input dtypes recorded with
    ``--shapes`` (``analysis.cpuprecision``), in at least 2 calls, or at least half of the
    optimizers' parameter elements in one 16-bit type (``capture.optimizer_parameter_elements``: a
    model cast with ``.half()`` or ``.bfloat16()``, seen without ``--shapes``) — on a CPU whose recorded
    features (``machine.cpu_flags``, a gpumagic capture) compute none of those types natively:
    x86 without AVX512_BF16/AMX-BF16 for bfloat16 (with AVX-512 alone oneDNN converts to FP32;
    with AVX2 PyTorch runs generic kernels), without AVX512_FP16/AMX-FP16 for float16; Arm
    without FEAT_BF16. There FP32 is faster: measured 8× (a transformer encoder) to 38× (a convolution
    network) on an AVX2 CPU. Silent with a GPU, on a plain trace (no CPU features recorded) and where a type the
    operators may have run in is native (autocast without recorded dtypes may be either).
    Fires when the matrix operators (forward and backward, counted once) take ≥ 5 % of the window.
    Gain, an upper bound: the share of the window in host operators, counted once — as if FP32
    made them free. Not the matrix operators' share alone: under autocast the other operators run
    on 16-bit tensors or cast between the types, and slow down too (a tiny BERT under the Trainer's
    ``bf16=True`` on the CPU: FP32 saved 0.85 of the step where the matrix operators took 0.71,
    all operators more). False positives: 16-bit kept for memory
    (a model that does not fit in FP32), which the fix then trades for speed."""
    if ctx.device >= 0:
        return None
    support = machine_support(ctx)
    lp = low_precision(ctx)
    dtypes = lp.dtypes
    if (lp.calls < MIN_CALLS and not lp.param_types) or not dtypes or any(support.get(d) in (None, "native")
                                                                          for d in dtypes):
        return None
    matrix = ctx.frac(lp.compute_ns)
    if matrix < MIN_GAIN:
        return None
    gain = max(ctx.frac(lp.ops_ns), matrix)
    machine = meta_block(ctx.trace.meta, "machine")
    flags = [f for f in machine.get("cpu_flags") or [] if isinstance(f, str)]
    kinds = " or ".join(NAMES[d] for d in dtypes)
    natives = "; ".join(NATIVE[d] for d in dtypes)
    ran_in = kinds if len(dtypes) == 1 else "16 bits (autocast's bfloat16 by default, or float16)"
    seen = (f"Autocast cast the inputs inside {lp.autocast_calls} matrix-operator calls"
            if lp.autocast_calls else "")
    typed = ", ".join(f"{n} with {NAMES[d]} inputs" for d, n in sorted(lp.typed_calls.items()) if n)
    if typed:
        seen = (seen + "; " if seen else "") + f"the recorded input types show {typed}"
    if lp.param_types and not typed:
        seen = ((seen + "; " if seen else "") + f"{pct(lp.param_share)} of the optimizer's parameter elements are "
                f"{NAMES[lp.param_types[0]]} (a model cast to 16 bits)")
    slow_conv = lp.slow_conv_calls
    emulated = [d for d in dtypes if support.get(d) == "emulated"]
    cpu = str(machine.get("cpu_model") or "this CPU")
    features = ", ".join(flags) if flags else "none of AVX2, AVX-512, AMX or Arm BF16"
    conv_note = (f" {slow_conv} convolution calls ran PyTorch's generic fallback (aten::_slow_conv2d_forward), "
                 "not oneDNN." if slow_conv else "")
    emul_why = (" With AVX-512 but no BF16 instructions oneDNN converts each bfloat16 product to FP32 and back: "
                "no faster than FP32 and usually slower." if emulated else "")
    return finding(
        severity=severity_for(gain),
        title=(f"{kinds.capitalize()} matrix work on a CPU without {kinds} instructions: FP32 is faster here"
               if len(dtypes) == 1 else
               "Autocast runs the matrix work in 16 bits on a CPU without 16-bit instructions: FP32 is faster here"),
        why=f"""The matmuls and convolutions ran in {ran_in} on the CPU (torch.autocast("cpu") or a model cast
        to 16 bits). 16-bit floats are faster only on a CPU that computes them natively: {natives}. {cpu} does
        not, so PyTorch converts or falls back to generic kernels, slower than FP32, not faster: {MEASURED}
        on an AVX2 CPU (benchmarks/cpu_low_precision.py).{emul_why} 16 bits belong on the GPU here; on this CPU
        compute in FP32.""",
        summary=(f"{seen}. The host's matrix operators take {pct(matrix)} of the window, all its operators "
                 f"{pct(gain)}. The CPU's recorded features: {features}.{conv_note}"),
        numbers={"autocast_calls": lp.autocast_calls, "bf16_calls": lp.typed_calls.get("bf16", 0),
                 "fp16_calls": lp.typed_calls.get("fp16", 0), "matrix_ops_frac": round(matrix, 4),
                 "host_ops_frac": round(gain, 4),
                 "cpu_bf16": support.get("bf16"), "cpu_fp16": support.get("fp16"), "cpu_flags": " ".join(flags),
                 "slow_conv_calls": slow_conv, "params_16bit_frac": lp.param_share},
        windows=windows(lp.compute[0], lp.compute[1], "cpu", label="matrix operators"),
        est_gain=gain,
        gain_method=("upper bound: the share of the window in host operators, counted once, as if FP32 made them "
                     "free (under autocast every operator works on 16-bit tensors or casts between the types, not "
                     f"only the matrix ones, which take matrix_ops_frac); measured {MEASURED} in bf16"),
        fixes=_fixes(bool(lp.autocast_calls),
                     (sum(lp.typed_calls.values()) > 0 or bool(lp.param_types)) and not lp.autocast_calls,
                     ctx.workload == "training"),
        doc_url=DOC,
    )


AUTOCAST_CODE = """
use_amp = torch.cuda.is_available()   # 16-bit only where it is native: a GPU here, FP32 on this CPU
with torch.autocast(device_type="cuda" if use_amp else "cpu", dtype=torch.bfloat16, enabled=use_amp):
    loss = loss_fn(model(x), y)
loss.backward()
"""
AUTOCAST_INFERENCE_CODE = """
use_amp = torch.cuda.is_available()   # 16-bit only where it is native: a GPU here, FP32 on this CPU
with torch.inference_mode(), torch.autocast(device_type="cuda" if use_amp else "cpu", dtype=torch.bfloat16,
                                            enabled=use_amp):
    out = model(x)
"""
CAST_CODE = """
model = model.float()                 # parameters and buffers back to FP32 (in place)
loss = loss_fn(model(x.float()), y)   # and the inputs, in the forward pass
"""
CAST_INFERENCE_CODE = """
model = model.float()   # parameters and buffers back to FP32 (in place)
with torch.inference_mode():
    out = model(x.float())   # and the inputs
"""
MEASURE_CODE = """
import time

import torch

a = torch.randn(512, 512)
for dtype in (torch.float32, torch.bfloat16):
    b = a.to(dtype)
    b @ b   # once before timing
    start = time.perf_counter()
    for _ in range(5):
        b @ b
    print(dtype, f"{(time.perf_counter() - start) / 5 * 1e3:.2f} ms")   # bfloat16 slower: no bf16 instructions
"""


def _fixes(autocast: bool, cast: bool, training: bool) -> tuple[Fix, ...]:
    fixes: list[Fix] = []
    if autocast or not cast:
        fixes.append(pytorch("Turn autocast off on the CPU and keep it for the GPU, where 16 bits are native",
                             AUTOCAST_CODE if training else AUTOCAST_INFERENCE_CODE))
    if cast:
        fixes.append(pytorch("Compute in FP32: cast the model and its inputs back",
                             CAST_CODE if training else CAST_INFERENCE_CODE))
    if training:
        fixes.append(huggingface("Trainer on the CPU: leave bf16/fp16 off (bf16=True with use_cpu=True runs CPU "
                                 "autocast)", "TrainingArguments(..., use_cpu=True, bf16=False, fp16=False)"))
    fixes.append(pytorch("Time a matrix product in both types on this CPU", MEASURE_CODE, diagnostic=True))
    return tuple(fixes)
