"""``memory-pressure``: peak memory at the device's limit."""

from __future__ import annotations

from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch

#: The issue's anchor: peak above 90 % of device memory leaves the allocator no room to cache
#: and risks fragmentation retries and out-of-memory errors.
PEAK_FRAC = 0.90
DOC = "https://pytorch.org/docs/stable/torch_cuda_memory.html"


def memory_pressure(ctx: Context, m: dict):
    """Signal: the allocator's peak reserved (else allocated) bytes from ``[memory]`` records, or
    NVML's peak used memory, against the device's total. Threshold: > 90 %. Gain: not a speed
    finding by itself (0 %) — it limits batch size and risks OOM and allocator retries.
    False positives: a process that reserves memory up front on purpose."""
    mem = m["memory"]
    if mem["peak_frac"] is None or mem["peak_frac"] <= PEAK_FRAC:
        return None
    return finding(
        "memory-pressure", severity="medium", title=f"Memory peaks at {pct(mem['peak_frac'])} of the GPU",
        why="""PyTorch's caching allocator keeps freed blocks for reuse. Near the device limit it must free
        its cache and retry allocations (slow, synchronising) and an out-of-memory error is one batch away.
        Activation checkpointing, lower precision or a smaller micro-batch with gradient accumulation buy
        headroom.""",
        summary=f"Peak {(mem['peak_reserved_bytes'] or mem['peak_allocated_bytes'] or mem.get('nvml_peak_used_bytes') or 0) / 2**30:.2f} GiB "
                f"of {mem['capacity_bytes'] / 2**30:.2f} GiB ({mem['source']}).",
        numbers={"peak_frac": mem["peak_frac"], "capacity_bytes": mem["capacity_bytes"], "source": mem["source"] or ""},
        est_gain=0.0, gain_method="not a direct speed loss: risk of OOM and allocator retries",
        fixes=_fixes(ctx),
        doc_url=DOC,
    )


def _fixes(ctx: Context):
    if ctx.workload != "training":
        return (pytorch("Store less per batch: lower precision weights, a smaller batch",
                        """
model = model.to(torch.bfloat16)       # half the memory of FP32 weights and activations
with torch.inference_mode():           # keeps no autograd state
    out = model(x[: len(x) // 2])      # or a smaller batch"""),)
    return (
            pytorch("Trade compute for memory, or shrink what is stored",
                    """
# recompute a block's activations in backward instead of keeping them
out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
# or: autocast to bf16; or micro-batches with gradient accumulation"""),
            huggingface("Through TrainingArguments",
                        "TrainingArguments(..., gradient_checkpointing=True, bf16=True,\n"
                        "                  per_device_train_batch_size=8, gradient_accumulation_steps=4)"),
    )
