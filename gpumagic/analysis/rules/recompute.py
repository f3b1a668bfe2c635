"""``activation-recompute``: activation checkpointing runs each block's forward again in the backward pass.

Worth it when the memory it saves is needed; otherwise about one more forward pass a step."""

from __future__ import annotations

from gpumagic.analysis.context import Context
from gpumagic.analysis.recompute import kept_bytes, recompute
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for
from gpumagic.analysis.rules.memory import PEAK_FRAC, checkpointing_argument
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: A finding from this share of the window (the TensorBoard profiler plugin's 5 % line for a
#: bottleneck worth naming). Checkpointing every layer costs about one more forward pass: "~20 %
#: slower" (Hugging Face's gradient checkpointing guide), "a 20 % increase in computation time"
#: for feed-forward models (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost").
MIN_FRAC = 0.05
DOC = "https://pytorch.org/docs/stable/checkpoint.html"
#: benchmarks/recompute.py on this project's 2-core machine (profiled, then timed unprofiled).
MEASURED = ("benchmarks/recompute.py: residual MLP blocks, each checkpointed, on the CPU; calling them directly "
            "saved 0.31 of the step for an estimate of 0.18 (4 blocks, batch 64) and 0.27 for 0.19 (8 blocks, batch "
            "256): the estimate runs low, the checkpoint's own cost in the forward pass not counted")
DIRECT_CODE = """
# call the blocks directly: each keeps its activations for the backward pass
for block in blocks:
    x = block(x)   # was: x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
# a transformers model does this for every layer with model.gradient_checkpointing_disable()
"""
PARTIAL_CODE = """
# or checkpoint every other block: half the recomputation, part of the memory saving kept
for i, block in enumerate(blocks):
    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if i % 2 == 0 else block(x)
"""
MEASURE_GPU_CODE = """
# one training step with checkpointing off, then its peak
torch.cuda.reset_peak_memory_stats()
# ... forward, backward, optimizer step ...
peak = torch.cuda.max_memory_allocated() / torch.cuda.get_device_properties(0).total_memory
print(f"peak allocated without checkpointing: {peak:.0%} of the GPU")   # near 90 % or more: keep it on
"""


@rule("activation-recompute")
def activation_recompute(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: forward operators (``aten::linear``, ``aten::layer_norm``, ``aten::gelu``, ...:
    ``analysis.recompute.FORWARD_OPS``, which no derivative formula calls) running inside the
    autograd engine's nodes during the steps: ``torch.utils.checkpoint`` rebuilding the
    activations it dropped. Threshold: their time ≥ 5 % of the window — the host's time on a
    CPU-only trace, the GPU kernel time they launched with a GPU. Not when the allocator's
    records say the memory would not fit without it: the peak allocated plus what the
    recomputations rebuild (``analysis.recompute.kept_bytes``) above 90 % of the device (the
    ``memory-pressure`` line). When the trace has no such records, the finding says so and asks
    for them, and stays at most medium. Gain: the recomputation's share of the window, an
    estimate that runs low (the checkpoint's own cost in the forward pass and the operators not in
    the list are missed; ``benchmarks/recompute.py``: 0.31 saved for 0.18). False positives: a
    checkpoint whose memory the run needs on a device the trace does not describe (no capacity,
    no records): the finding then says that memory was not recorded."""
    if not ctx.step_bounds:
        return None
    rec = recompute(ctx)
    gpu = ctx.device >= 0
    spent = sum(rec.gpu_ns if gpu else rec.host_ns)
    frac = spent / ctx.window_ns if ctx.window_ns else 0.0
    if frac < MIN_FRAC:
        return None
    mem = m.memory
    kept = kept_bytes(ctx)
    fits: bool | None = None
    projected = None
    peak, cap = mem.peak_allocated_bytes, mem.capacity_bytes
    if gpu and mem.source == "allocator" and peak and cap and kept is not None:
        projected = (peak + kept) / cap
        fits = projected <= PEAK_FRAC
        if not fits:  # the checkpoints are what lets the step fit
            return None
    steps = len(ctx.step_bounds)
    calls = ", ".join(f"{n} ×{c / steps:,.0f}" for n, c in sorted(rec.names.items(), key=lambda kv: -kv[1])[:4])
    where = "GPU time" if gpu else "host time"
    if fits and peak and cap and kept is not None:
        memory = (f"Memory would fit without it: the peak allocated, {peak / 2**30:.2f} GiB, plus the "
                  f"{kept / 2**30:.2f} GiB the recomputations rebuild a step is {pct(projected or 0)} of the "
                  f"{cap / 2**30:.2f} GiB device.")
    elif kept is not None:
        memory = (f"The recomputations rebuild about {kept / 2**20:,.0f} MiB a step, which the forward pass would "
                  "keep without checkpointing; whether that fits is not recorded.")
    else:
        memory = "The trace has no allocator records, so whether the activations would fit is not known."
    sev = severity_for(frac)
    if fits is None and sev == "high":
        sev = "medium"
    fixes = [pytorch("Keep the activations where memory allows: call the blocks without checkpoint()", DIRECT_CODE),
             pytorch("Or checkpoint fewer blocks", PARTIAL_CODE),
             huggingface("Through TrainingArguments", f"TrainingArguments(..., {checkpointing_argument()}=False)")]
    if fits is None and gpu:
        fixes.insert(0, pytorch("First check that it fits: profile the cell with %%gpuprofile --memory (the report then "
                                "says), or measure a step without checkpointing",
                                MEASURE_GPU_CODE, diagnostic=True))
    return finding(
        severity=sev,
        title=(f"Activation checkpointing runs the forward again in the backward: {pct(frac)} of the window"
               + ("; memory would fit without it" if fits else "")),
        why="""torch.utils.checkpoint (Hugging Face's gradient_checkpointing) drops a block's activations in the
        forward pass and, when the backward reaches the block, runs its forward again to rebuild them: memory for
        compute, about one more forward pass when every layer is checkpointed. Where the activations fit in
        memory, keeping them makes each step that much shorter; checkpointing fewer blocks sits in between.""",
        summary=(f"Forward operators inside the backward pass ({calls} a step) took {pct(frac)} of the window "
                 f"({where}). {memory}"),
        numbers={"recompute_frac": round(frac, 4), "recompute_kept_bytes": kept,
                 "projected_peak_frac": None if projected is None else round(projected, 4),
                 "threshold_frac": MIN_FRAC},
        est_gain=frac,
        gain_method=(f"estimate: the recomputation's share of the window ({where}); it runs low: the checkpoint's own "
                     f"cost in the forward pass and operators outside the list of forward-only ones are missed "
                     f"({MEASURED})"),
        fixes=tuple(fixes),
        doc_url=DOC,
    )


__all__ = ["activation_recompute"]
