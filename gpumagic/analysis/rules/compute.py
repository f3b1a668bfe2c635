"""``low-compute-efficiency`` and ``too-small-for-gpu``: how much of the GPU's arithmetic is used."""

from __future__ import annotations

import numpy as np

from gpumagic.analysis import devices
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.gpubound import CAP_SHARE, bounding_ns
from gpumagic.analysis.metrics import kernel_mask
from gpumagic.analysis.operators import least_efficient
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for
from gpumagic.analysis.rules.precision import tf32_fix
from gpumagic.report.metrics import ComputeMetrics, Metrics
from gpumagic.report.model import Finding, Fix

#: low-compute-efficiency fires only while the GPU is busy (≥ 50 % of the window, the same line
#: as ``low-gpu-utilization``): an idle GPU is a different problem with its own findings.
BUSY_MIN = 0.5
#: MFU below this is "very low". Large-model training runs report about 20–46 % MFU (PaLM paper,
#: Chowdhery et al. 2022, Table 3: GPT-3 21.3 %, Gopher 32.5 %, Megatron-Turing NLG 29.7 %, PaLM
#: 46.2 %); higher figures such as PaLM's 57.8 % or Megatron-LM's 52 % on A100s (Narayanan et al.
#: 2021) are hardware FLOPs utilisation, which counts the recomputed forward pass. A tuned
#: ResNet-50 reaches about 20–35 % (the V100 fixtures here: 28 % and 35 % in FP32). Under 10 %, more than
#: nine tenths of the arithmetic the GPU was busy for is lost to small matmuls, memory-bound
#: kernels or an unused faster dtype.
MFU_LOW = 0.10
#: too-small-for-gpu: the step's GPU work is tiny. All kernel time of a step under 1 ms ...
TINY_KERNEL_MS_PER_STEP = 1.0
#: ... the GPU busy at most a quarter of the step ...
TINY_BUSY_MAX = 0.25
#: ... and nearly every kernel short: ≥ 90 % of them under 20 µs (a few times the 5–10 µs a launch
#: costs, so each one's launch, not its work, sets the pace).
TINY_KERNEL_NS = 20_000
TINY_KERNEL_SHARE = 0.9
#: A conservative FP32 matmul rate for a few CPU cores with vectorised BLAS (one AVX2 core peaks
#: at 32 FLOP/cycle × ~3 GHz ≈ 100 GFLOP/s; small matrices reach a fraction of peak, so a few
#: cores reach about this). The teaching notebook measures the real figure on its machine.
CPU_REF_GFLOPS = 100.0
MFU_DOC = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
SMALL_DOC = "https://docs.nvidia.com/cuda/cuda-c-best-practices-guide/index.html#data-transfer-between-host-and-device"


def is_training(ctx: Context) -> bool:
    """Whether the trace shows a backward pass or an optimizer step (else: inference advice);
    :attr:`Context.workload` decides, the same test every rule uses."""
    return ctx.workload == "training"


@rule("low-compute-efficiency")
def low_compute_efficiency(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: model FLOPs utilisation (``metrics.compute.mfu``: FLOPs of the matmul-family
    operators over the window ÷ the device's dense peak for their dtype) while the GPU is busy.
    Threshold: GPU busy ≥ 50 % and MFU < 10 %. Needs FLOPs (``--shapes`` or ``--flops``) and a
    device the peak table names; silent otherwise. Gain: the busy time that raising MFU to the
    threshold would save, busy × (1 − MFU/10 %): an estimate (a higher MFU saves more). False positives: workloads whose real work is not
    matmuls (embedding lookups, sorting, sparse or memory-bound models): MFU measures only matmul
    and convolution FLOPs. Withheld when the counted FLOPs cover under 90 % of the matmul-family
    kernel time (``compute.flops_coverage``: graph replays, kernels without a launching operator)."""
    c, busy = m.compute, m.gpu.busy_frac
    if c is None or c.mfu is None or busy is None or busy < BUSY_MIN or c.mfu >= MFU_LOW:
        return None
    if c.mfu_lower_bound:  # the FLOPs miss some matmul work: a low lower bound proves nothing
        return None
    gain = busy * (1 - c.mfu / MFU_LOW)
    method = ("estimate: busy share × (1 − MFU / 10 %), the GPU time saved if the same FLOPs ran at the "
              "threshold's 10 % of peak (a higher MFU saves more)")
    rows = np.flatnonzero(kernel_mask(ctx) & ~ctx.masks["name_nccl"])
    bound = ctx.frac(bounding_ns(ctx, rows))  # the host sets the pace: faster kernels save only where they bound
    if bound < CAP_SHARE * busy:
        gain = min(gain, bound * (1 - c.mfu / MFU_LOW))
        method += (f"; capped at the compute-kernel time that can bound the steps ({pct(bound)} of the window, "
                   "analysis.gpubound): after the rest the GPU waited for the host's next launch")
    top = m.kernels.top[:3]
    top_text = "; ".join(f"{k.name[:60]} {k.total_ms:.1f} ms" for k in top)
    op = least_efficient(m, MFU_LOW)  # the operator behind it, with its own numbers (metrics.operators)
    op_text = "" if op is None else (f" The largest operator under {pct(MFU_LOW)} of peak: {op.name}"
                                     + (f" [{op.shapes}]" if op.shapes else "") + f", {op.count}× in "
                                     f"{op.gpu_ms:.2f} ms of GPU time at {op.tflops:.3g} TFLOP/s, "
                                     f"{pct(op.frac_of_peak or 0.0)} of its {op.dtype} peak"
                                     + (f", {op.bound}-bound on the roofline" if op.bound else "") + ".")
    return finding(
        severity=severity_for(gain),
        title=f"The GPU is busy but uses {pct(c.mfu)} of its arithmetic",
        why=f""""GPU busy" means some kernel was running, not that the streaming multiprocessors were doing
        useful math. Here the matmuls and convolutions amount to {c.achieved_tflops:.2f} TFLOP/s, against a
        peak of {c.peak_tflops:g} TFLOP/s for {c.dtype} on this {c.device_sku}. The time goes to kernels
        that do little arithmetic per byte (elementwise, normalisation, small matmuls) or to a dtype slower
        than the GPU offers. Larger matmuls (bigger batches), fewer memory-bound kernels (fusion) and a
        faster dtype (TF32/BF16) raise it.""",
        summary=f"MFU {pct(c.mfu)}: {c.achieved_tflops:.2f} of {c.peak_tflops:g} TFLOP/s ({c.dtype}) "
                f"while the GPU is busy {pct(busy)}. Longest kernels: {top_text}." + op_text,
        numbers={"mfu": c.mfu, "achieved_tflops": c.achieved_tflops, "peak_tflops": c.peak_tflops,
                 "dtype": c.dtype, "gpu_busy_frac": busy, "threshold_mfu": MFU_LOW,
                 **({} if op is None else {"operator": op.name, "operator_tflops": op.tflops,
                                           "operator_frac_of_peak": op.frac_of_peak})},
        est_gain=gain, gain_method=method,
        fixes=_efficiency_fixes(c, is_training(ctx), ctx.rocm),
        doc_url=MFU_DOC,
    )


def _efficiency_fixes(c: ComputeMetrics, training: bool, rocm: bool = False) -> tuple[Fix, ...]:
    fixes: list[Fix] = []
    peak = devices.peak_for(c.device_name or "")
    if c.dtype in ("fp32", "tf32") and peak and peak.tflops.get("bf16"):
        body = "    loss = loss_fn(model(x), y)" if training else "    out = model(x)"
        # no TF32 line on an AMD GPU: NVIDIA's switch, whose ROCm twin depends on the GPU and the build
        tf32 = "" if rocm else tf32_fix().code + "\n"
        fixes.append(pytorch(f"Use the faster dtype: bf16/fp16 peaks at {peak.tflops.get('bf16', 0):g} TFLOP/s here",
                             tf32 + f'with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n{body}'))
    fixes += [
        pytorch("Give each matmul more work: a bigger batch (or sequence packing)" if training else
                "Give each matmul more work: batch requests together",
                "loader = DataLoader(dataset, batch_size=2 * batch_size, ...)" if training else
                "out = model(torch.stack(requests))   # one call for many inputs"),
        pytorch("Fuse the memory-bound kernels between matmuls", "model = torch.compile(model)"),
    ]
    if training:  # bf16 only where the peak table gives the device bf16 tensor cores (Ampere on), else fp16
        low = "bf16" if peak and peak.tflops.get("bf16") else "fp16"
        # no batch size here: a larger per_device_train_batch_size only with the memory check of the
        # Hugging Face advice (analysis.advice.huggingface), which knows what the run's memory allows
        fixes.append(huggingface("Through TrainingArguments", f"TrainingArguments(..., {low}=True, torch_compile=True)"))
    return tuple(fixes)


@rule("too-small-for-gpu")
def too_small_for_gpu(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the step's GPU work is tiny — kernel time per step ≤ 1 ms, the GPU busy ≤ 25 % of
    the step, ≥ 90 % of kernels under 20 µs — so launches, copies and syncs cost more than the
    kernels; and the CPU could do the same arithmetic within the step time: FLOPs per step (or,
    without recorded shapes, the most the kernels could have done: kernel time × the device's
    highest peak) ≤ 100 GFLOP/s × step time. Gain, an estimate: the GPU-idle share of the step
    less the CPU compute the work would cost at that assumed rate. Without recorded FLOPs (the default capture), the kernels'
    durations decide: when ≥ half the kernel time is in kernels ending within 5 µs (the
    launch-latency floor), the work is too small whatever the GPU's peak; the gain is then the
    GPU-idle share. It may fire beside ``launch-bound``. False positives: a latency-bound service
    whose batch size is fixed by the traffic (then the fix is batching requests, or the CPU)."""
    k, busy = m.kernels, m.gpu.busy_frac
    steps = max(len(ctx.step_bounds), 1)
    if not k.count or busy is None or busy > TINY_BUSY_MAX or k.total_ms / steps > TINY_KERNEL_MS_PER_STEP:
        return None
    dur = ctx.trace.events.dur_ns[kernel_mask(ctx)]
    short = float(np.mean(dur < TINY_KERNEL_NS))
    if short < TINY_KERNEL_SHARE:
        return None
    step_s = ctx.window_ns / 1e9 / steps
    flops = _flops_per_step(m, ctx, steps)
    floor_share = float(dur[dur <= NEAR_FLOOR_NS].sum()) / max(float(dur.sum()), 1.0)
    if (m.compute is None or m.compute.flops is None) and floor_share >= NEAR_FLOOR_SHARE:
        return _near_floor(ctx, m, busy, short, floor_share, steps, step_s)
    if flops is None:
        return None
    cpu_s = flops / (CPU_REF_GFLOPS * 1e9)
    if cpu_s > step_s:
        return None
    kernel_ms = k.total_ms / steps
    gain = max(0.0, (1 - busy) - cpu_s / step_s)
    known = m.compute is not None and m.compute.flops is not None
    return finding(
        severity=severity_for(gain),
        title="The GPU's work per step is too small to pay for launching it",
        why=f"""Each kernel launch, copy and synchronisation costs the host microseconds whatever the size of
        the work. This step gives the GPU {kernel_ms:.2f} ms of kernels in {k.count // steps} launches, so
        the GPU finishes each kernel before the next one arrives and sits idle {pct(1 - busy)} of the step.
        The arithmetic itself is small: {flops / 1e9:.2f} GFLOP per step{'' if known else ' at most'}, which a
        CPU doing {CPU_REF_GFLOPS:g} GFLOP/s finishes in {cpu_s * 1e3:.2f} ms, within the {step_s * 1e3:.2f} ms
        step. Either give the GPU more work per launch, or keep this work on the CPU.""",
        summary=f"{kernel_ms:.2f} ms of kernels per {step_s * 1e3:.2f} ms step ({pct(short)} of {k.count} kernels "
                f"under {TINY_KERNEL_NS // 1000} µs, GPU busy {pct(busy)}); {flops / 1e9:.2f} GFLOP per step"
                f"{'' if known else ' at most (no shapes recorded: kernel time × peak)'} ≈ {cpu_s * 1e3:.2f} ms on a "
                f"CPU at {CPU_REF_GFLOPS:g} GFLOP/s.",
        numbers={"kernel_ms_per_step": round(kernel_ms, 4), "step_ms": round(step_s * 1e3, 4), "gpu_busy_frac": busy,
                 "short_kernel_frac": round(short, 4), "gflops_per_step": round(flops / 1e9, 4),
                 "flops_known": known, "cpu_estimate_ms": round(cpu_s * 1e3, 4), "cpu_ref_gflops": CPU_REF_GFLOPS},
        est_gain=gain, gain_method=f"estimate: GPU idle share of the step less the CPU time the same FLOPs would "
                                   f"take, assuming a CPU at {CPU_REF_GFLOPS:g} GFLOP/s",
        fixes=(
            pytorch("Give the GPU more work per launch: batch samples (or requests) together, vectorise loops "
                    "over samples into one tensor operation",
                    "xs = torch.stack(samples).to(device)   # one launch for the batch\nys = model(xs)"),
            pytorch("Or keep this work on the CPU, where it needs no launches, copies or syncs",
                    'device = "cpu"\nmodel = model.to(device)\ny = model(x)   # measure both: %%gpuprofile --compare'),
            pytorch("If it must stay on the GPU, replay the launches at once", 'model = torch.compile(model, mode="reduce-overhead")'),
        ),
        doc_url=SMALL_DOC,
    )


#: Without recorded FLOPs (the default capture has no shapes): a kernel that ends within 5 µs —
#: the low end of the 5–10 µs a launch costs the host (``context.SHORT_KERNEL_NS`` notes) — sits
#: at the launch-latency floor and did almost no work. When such kernels hold at least half of
#: the GPU time, the work is too small whatever the GPU's peak.
NEAR_FLOOR_NS = 5_000
NEAR_FLOOR_SHARE = 0.5


def _near_floor(ctx: Context, m: Metrics, busy: float, short: float, floor_share: float, steps: int,
                step_s: float) -> Finding:
    k = m.kernels
    kernel_ms = k.total_ms / steps
    gain = 1 - busy
    return finding(
        severity=severity_for(gain),
        title="The GPU's work per step is too small to pay for launching it",
        why=f"""Each kernel launch, copy and synchronisation costs the host microseconds whatever the size of
        the work. This step gives the GPU {kernel_ms:.2f} ms of kernels in {k.count // steps} launches, and
        {pct(floor_share)} of that GPU time is in kernels that end within {NEAR_FLOOR_NS // 1000} µs — the
        launch-latency floor, where a kernel does almost no work — so the GPU sits idle {pct(1 - busy)} of the
        step. Either give the GPU more work per launch, or measure this work on the CPU.""",
        summary=f"{kernel_ms:.2f} ms of kernels per {step_s * 1e3:.2f} ms step; {pct(floor_share)} of kernel time in "
                f"kernels ≤ {NEAR_FLOOR_NS // 1000} µs ({pct(short)} of {k.count} kernels under "
                f"{TINY_KERNEL_NS // 1000} µs); GPU busy {pct(busy)}. No FLOPs recorded (no shapes): judged by "
                "kernel durations.",
        numbers={"kernel_ms_per_step": round(kernel_ms, 4), "step_ms": round(step_s * 1e3, 4), "gpu_busy_frac": busy,
                 "short_kernel_frac": round(short, 4), "near_floor_time_frac": round(floor_share, 4),
                 "flops_known": False},
        est_gain=gain, gain_method="GPU idle share of the step (no FLOPs recorded: no CPU estimate is subtracted)",
        fixes=(
            pytorch("Give the GPU more work per launch: batch samples (or requests) together, vectorise loops "
                    "over samples into one tensor operation",
                    "xs = torch.stack(samples).to(device)   # one launch for the batch\nys = model(xs)"),
            pytorch("Or try this work on the CPU, where it needs no launches, copies or syncs, and compare",
                    'device = "cpu"\nmodel = model.to(device)\ny = model(x)   # measure both: %%gpuprofile --compare'),
            pytorch("If it must stay on the GPU, replay the launches at once", 'model = torch.compile(model, mode="reduce-overhead")'),
        ),
        doc_url=SMALL_DOC,
    )


def too_small_windows(ctx: Context) -> iv.Intervals:
    """The GPU idle time of the window: what too-small-for-gpu's fixes recover (more work per
    launch fills it; on the CPU there is no GPU to idle), for combining gains across findings
    (:data:`gpumagic.analysis.gains.CLAIMS`)."""
    return ctx.gaps.intervals


def _flops_per_step(m: Metrics, ctx: Context, steps: int) -> float | None:
    """Recorded FLOPs per step, else the upper bound kernel time × the device's highest peak."""
    c = m.compute
    if c is None:
        return None
    if c.flops is not None:
        return c.flops / steps
    peak = devices.peak_for(c.device_name or "")
    if peak is None or not peak.tflops:
        return None
    return m.kernels.total_ms / 1e3 / steps * max(peak.tflops.values()) * 1e12
