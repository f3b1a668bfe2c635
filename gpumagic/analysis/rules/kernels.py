"""``unfused-attention`` and ``elementwise-bound``: kernel-level fixes, from settings to custom kernels."""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import distinct, median
from gpumagic.analysis import names as nm
from gpumagic.analysis.context import Context
from gpumagic.analysis.gpubound import gpu_time_gain
from gpumagic.analysis.metrics import kernel_mask
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.analysis.rules.compute import is_training
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: A softmax kernel is attention's when a matmul kernel runs within this many kernels before it
#: and after it on the same stream (QKᵀ → [scale, mask] → softmax → [dropout] → ·V).
ATTENTION_NEIGHBOURS = 3
#: Fire when the unfused pieces take at least this share of kernel time (smaller is not worth a
#: finding next to the others) ...
ATTENTION_MIN_SHARE = 0.05
#: ... and the window runs no fused attention kernel. A fused kernel is at least 2× faster than
#: the separate matmul + softmax kernels it replaces (FlashAttention, Dao et al. 2022, §4.1:
#: 2–4× on GPT-2 and BERT attention; it never writes the L×S score matrix to memory).
FUSED_ATTENTION_SPEEDUP = 2.0
#: elementwise-bound: elementwise/reduction/normalisation kernels take ≥ 40 % of compute-kernel
#: time while the GPU is busy (≥ 50 %). Fusing a chain of such kernels reads and writes memory once
#: instead of once per kernel; Inductor's fusion measured 1.3–2× on whole models (PyTorch 2
#: paper, Ansel et al. 2024, §6), so at 40 % a 2× on that share saves ≥ 20 % of GPU time.
ELEMENTWISE_SHARE = 0.40
ELEMENTWISE_BUSY_MIN = 0.5
FUSION_SPEEDUP = 2.0
#: The SDPA replacement keeps what the hand-written attention did: its ``scale`` (SDPA's default is
#: 1/√d; T5 uses none, some models scale q beforehand) and its mask, whose boolean convention
#: SDPA inverts ("A boolean mask where a value of True indicates that the element *should take
#: part* in attention": the ``scaled_dot_product_attention`` docstring), while ``masked_fill(mask,
#: -inf)`` hides where True. tests/test_snippets.py compares both on CPU with assert_close.
SDPA_CODE = """
import torch.nn.functional as F
# instead of: scores = (q @ k.transpose(-2, -1)) * scale
#             attn = scores.masked_fill(mask, float("-inf")).softmax(-1); out = dropout(attn) @ v
out = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask, dropout_p=p if training else 0.0, scale=scale)
# a boolean attn_mask is True where attention is allowed: ~mask for a masked_fill-style mask (True =
# hidden), the mask itself if True already means "attend"; a float mask is added to the scores;
# is_causal=True (and no attn_mask) for a causal one"""
#: The Triton kernel's arithmetic runs in fp32: ``tl.erf`` (libdevice) accepts fp32/fp64 only and
#: fails to compile for fp16/bf16 (Triton's math dtype check, "Expected dtype ['fp32', 'fp64']");
#: the result is cast back to the output's dtype. tests/test_snippets.py runs it for fp32, fp16 and
#: bf16 under TRITON_INTERPRET=1 where Triton is installed.
TRITON_CODE = """
import triton
import triton.language as tl

@triton.jit
def bias_gelu(x_ptr, b_ptr, out_ptr, n, d, BLOCK: tl.constexpr):
    # x contiguous, its last dimension d (n = x.numel()); b holds d elements
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n).to(tl.float32) + tl.load(b_ptr + i % d, mask=i < n).to(tl.float32)
    y = 0.5 * x * (1 + tl.erf(x * 0.7071067811865476))   # tl.erf needs fp32: computed in fp32
    tl.store(out_ptr + i, y.to(out_ptr.dtype.element_ty), mask=i < n)   # back to the output's dtype

out = torch.empty_like(x)
bias_gelu[(triton.cdiv(x.numel(), 1024),)](x, bias, out, x.numel(), x.shape[-1], BLOCK=1024)"""
SDPA_DOC = "https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html"
COMPILE_DOC = "https://pytorch.org/docs/stable/torch.compiler.html"


def _kernels(ctx: Context) -> np.ndarray:
    """The primary device's kernels in the window (rows, time-ordered), collectives excluded."""
    return np.flatnonzero(kernel_mask(ctx) & ~ctx.masks["name_nccl"])


def attention_pieces(ctx: Context) -> tuple[int, np.ndarray, int]:
    """(softmax kernels sitting between two matmul kernels, the rows of those kernels and what
    runs between them, the number of fused attention kernels)."""
    ev, names = ctx.trace.events, ctx.trace.names
    rows = _kernels(ctx)
    ids = ev.name[rows]
    soft = ctx.trace.name_ids(nm.is_softmax)[ids]
    fused = int(ctx.trace.name_ids(nm.is_fused_attention)[ids].sum())
    matmul = ctx.name_flags["matmul"][ids] & ~ctx.trace.name_ids(nm.is_fused_attention)[ids]
    pieces, count = set(), 0
    for stream in distinct(ev.stream[rows]).tolist():
        on = np.flatnonzero(ev.stream[rows] == stream)
        for p in np.flatnonzero(soft[on]).tolist():
            lo, hi = max(0, p - ATTENTION_NEIGHBOURS), min(on.size, p + ATTENTION_NEIGHBOURS + 1)
            before = [q for q in range(lo, p) if matmul[on[q]]]
            after = [q for q in range(p + 1, hi) if matmul[on[q]]]
            if before and after:
                count += 1
                pieces.update(on[before[-1]:after[0] + 1].tolist())
    del names
    return count, rows[sorted(pieces)], fused


@rule("unfused-attention")
def unfused_attention(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: softmax kernels with a matmul kernel just before and just after them on the same
    stream (attention computed as QKᵀ, softmax, ·V in separate kernels), and no fused attention
    kernel (flash, memory-efficient, cuDNN SDPA, CK/Triton attention) in the window. Threshold:
    those pieces take ≥ 5 % of kernel time. Gain, an estimate: their time × (1 − 1/2), a fused
    kernel being about 2× faster (at most the time that can bound the steps,
    ``analysis.gpubound``). False positives: a softmax between two unrelated matmuls (a
    mixture-of-experts router, a classifier head followed by a projection)."""
    count, pieces, fused = attention_pieces(ctx)
    if count == 0 or fused:
        return None
    ev = ctx.trace.events
    k_ns = float(ev.dur_ns[_kernels(ctx)].sum()) or 1.0
    p_ns = float(ev.dur_ns[pieces].sum())
    if p_ns / k_ns < ATTENTION_MIN_SHARE:
        return None
    gain, method = gpu_time_gain(ctx, pieces, 1 - 1 / FUSED_ATTENTION_SPEEDUP,
                                 ("estimate: the unfused attention kernels' time × (1 − 1/2), assuming a fused "
                                  "kernel 2× faster (FlashAttention measured 2–4×: it may save more)"))
    steps = max(len(ctx.step_bounds), 1)
    return finding(
        severity=severity_for(gain),
        title="Attention runs as separate matmul and softmax kernels",
        why="""Attention written out by hand — scores = q @ k.T, softmax, then @ v — launches a kernel per
        piece and writes the whole sequence × sequence score matrix to GPU memory and reads it back,
        several times. A fused attention kernel (FlashAttention, memory-efficient or cuDNN attention)
        computes the same result in tiles that stay on chip: less memory traffic, fewer launches, and
        memory that grows with the sequence length instead of its square.""",
        summary=f"{count} softmax kernels sit between matmul kernels ({count / steps:.0f} per step); these attention "
                f"pieces take {p_ns / 1e6:.2f} ms, {pct(p_ns / k_ns)} of kernel time; no fused attention kernel runs.",
        numbers={"attention_softmax_count": count, "attention_ms": round(p_ns / 1e6, 4),
                 "attention_kernel_frac": round(p_ns / k_ns, 4), "fused_attention_kernels": fused},
        windows=windows(ev.ts_ns[pieces], ev.ts_ns[pieces] + ev.dur_ns[pieces], "gpu", ctx.device, "attention piece"),
        est_gain=gain, gain_method=method,
        fixes=(
            pytorch("Call the fused kernel: scaled_dot_product_attention picks flash / memory-efficient / cuDNN "
                    "(pass your scale: without it SDPA uses 1/√d; a boolean attn_mask is True where attention is "
                    "allowed, the opposite of masked_fill's)", SDPA_CODE),
            huggingface("Ask transformers for the SDPA implementation",
                        'model = AutoModel.from_config(config, attn_implementation="sdpa")'),
        ),
        doc_url=SDPA_DOC,
    )


@rule("elementwise-bound")
def elementwise_bound(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the share of compute-kernel time (collectives excluded) in elementwise, reduction and
    normalisation kernels (``names.ELEMENTWISE_RE``: PyTorch's TensorIterator and reduce kernels,
    batch/layer/RMS norm, softmax, ``multi_tensor_apply``; Inductor's already-fused Triton kernels
    excluded). Threshold: ≥ 40 % while the GPU is busy ≥ 50 %. Gain, an estimate: that time ×
    (1 − 1/2), the fusion speed-up assumed (at most the time that can bound the steps). False
    positives: models that are memory-bound by nature (embedding-heavy recommenders), where fusion
    helps less."""
    busy = m.gpu.busy_frac
    if busy is None or busy < ELEMENTWISE_BUSY_MIN:
        return None
    ev = ctx.trace.events
    rows = _kernels(ctx)
    if rows.size == 0:
        return None
    elem = ctx.trace.name_ids(nm.is_elementwise)[ev.name[rows]]
    k_ns = float(ev.dur_ns[rows].sum()) or 1.0
    e_rows = rows[elem]
    e_ns = float(ev.dur_ns[e_rows].sum())
    share = e_ns / k_ns
    if share < ELEMENTWISE_SHARE:
        return None
    gain, method = gpu_time_gain(ctx, e_rows, 1 - 1 / FUSION_SPEEDUP,
                                 ("estimate: elementwise kernel time × (1 − 1/2), assuming fusion makes them 2× "
                                  "faster (Inductor measured 1.3–2× on whole models)"))
    training = is_training(ctx)
    optimizer = training and any("multi_tensor_apply" in ctx.trace.names[n] or "Adam" in ctx.trace.names[n]
                                 for n in distinct(ev.name[e_rows]).tolist())
    med_us = float(median(ev.dur_ns[e_rows])) / 1000
    return finding(
        severity=severity_for(gain),
        title=f"{pct(share)} of GPU time in memory-bound elementwise kernels",
        why="""Activations, normalisations, casts, residual adds and optimizer updates do a few operations per
        element they read and write, so their speed is set by memory bandwidth, not arithmetic. Run as
        separate kernels, each one reads its inputs from GPU memory and writes its output back. Fusing a chain
        of them into one kernel reads and writes once: torch.compile does it automatically; fused optimizers,
        norms and losses do it for the common cases; a custom Triton kernel is the last step, for a hot
        pattern the compiler misses.""",
        summary=f"{e_rows.size} elementwise/reduction/normalisation kernels (median {med_us:.1f} µs) take "
                f"{e_ns / 1e6:.2f} ms, {pct(share)} of kernel time, while the GPU is busy {pct(busy)}.",
        numbers={"elementwise_ms": round(e_ns / 1e6, 4), "elementwise_kernel_frac": round(share, 4),
                 "elementwise_kernels": int(e_rows.size), "median_us": round(med_us, 3),
                 "threshold_frac": ELEMENTWISE_SHARE},
        est_gain=gain, gain_method=method,
        fixes=_fusion_fixes(optimizer, training),
        doc_url=COMPILE_DOC,
    )


def _fusion_fixes(optimizer: bool, training: bool) -> tuple[Fix, ...]:
    fixes = [pytorch("Let the compiler fuse chains of elementwise operations", "model = torch.compile(model)")]
    if optimizer:
        fixes.append(pytorch("Fuse the optimizer's per-parameter math into a few kernels",
                             "opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)   # or foreach=True"))
    fixes += [
        pytorch("Use the fused forms of norms and losses",
                "y = torch.nn.functional.rms_norm(x, (d,), weight)   # one kernel, not pow/mean/rsqrt/mul\n"
                + ("loss = torch.nn.functional.cross_entropy(logits, target)   # not log(softmax(x))" if training else
                   "probs = torch.softmax(logits, dim=-1)   # one kernel, not exp / sum / div")),
        pytorch("Last: a custom Triton kernel for a hot chain the compiler misses (see example notebook 07)",
                TRITON_CODE),
    ]
    if training:
        fixes.append(huggingface("Through TrainingArguments",
                                 'TrainingArguments(..., torch_compile=True, optim="adamw_torch_fused")'))
    return tuple(fixes)
