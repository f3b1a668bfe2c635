"""``allocator-churn``: the caching allocator gives device memory back and asks the driver for it
again every step (``torch.cuda.empty_cache()`` in the loop, allocation retries at the memory
limit, or caching turned off)."""

from __future__ import annotations

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.allocator import churn
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.analysis.rules.memory import PEAK_FRAC
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: A finding when the GPU sits idle during and right after these calls for this share of the
#: window (the TensorBoard profiler plugin's 5 % line for a bottleneck worth naming).
MIN_FRAC = 0.05
#: Allocations a step above which the cache looks turned off (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``
#: calls the driver for every tensor: hundreds a step) rather than emptied once a step.
NO_CACHE_MALLOCS = 50
DOC = "https://pytorch.org/docs/stable/notes/cuda.html#memory-management"
REMOVE_CODE = """
for x, y in loader:
    train_step(x, y)            # no torch.cuda.empty_cache() inside the loop: freed blocks are reused
torch.cuda.empty_cache()        # once, after the loop, and only if another process needs the memory
"""
CHECK_CODE = """
stats = torch.cuda.memory_stats()
print("segments from cudaMalloc:", stats["segment.all.allocated"], "released:", stats["segment.all.freed"])
print("allocation retries:", stats["num_alloc_retries"])   # > 0: memory at its limit, the allocator emptied itself
"""
NO_CACHE_CODE = """
import os

# a debugging switch: with it every tensor goes to the driver. The allocator reads it when CUDA
# starts: remove it where it is set (a %env line, the shell that started Jupyter), restart the kernel
caching_off = "PYTORCH_NO_CUDA_MEMORY_CACHING" in os.environ
print("caching allocator off: unset the variable and restart" if caching_off else "caching allocator on")
"""


@rule("allocator-churn")
def allocator_churn(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: in ≥ half of the steps, the caching allocator both released device memory to the
    driver (``cudaFree``, ``hipFree``, ``cuMemRelease``) and allocated from it again
    (``cudaMalloc``, ``hipMalloc``, ``cuMemCreate``). PyTorch's allocator keeps freed blocks for
    reuse precisely to avoid these calls ("fast memory deallocation without device
    synchronizations", PyTorch CUDA semantics notes, "Memory management"): ``cudaFree`` waits
    for the device, and both take the driver's time. Causes: ``torch.cuda.empty_cache()`` in the
    loop (its docs: it "doesn't increase the amount of GPU memory available for PyTorch");
    allocation retries at the memory limit (the allocator empties its cache and retries,
    ``num_alloc_retries``: the peak allocated, reserved or NVML-used memory ≥ 90 % of the device
    says so); caching turned off (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``: ≥ 50 calls a
    step). Threshold: the GPU idle during those calls and until its next work ≥ 5 % of the
    window. Gain: that idle time, an upper bound. False positives: a step that frees on purpose
    for another process or library on the same GPU."""
    c = churn(ctx)
    steps = len(ctx.step_bounds)
    frac = ctx.frac(iv.total(c.idle))
    if not c.recurring or frac < MIN_FRAC:
        return None
    mem = m.memory
    cap = mem.capacity_bytes
    peaks = [b for b in (mem.peak_allocated_bytes, mem.peak_reserved_bytes, mem.nvml_peak_used_bytes) if b]
    near_limit = bool(cap and peaks and max(peaks) / cap >= PEAK_FRAC)
    top = max(peaks) / cap if cap and peaks else 0.0
    no_cache = c.mallocs_per_step >= NO_CACHE_MALLOCS
    if no_cache:
        cause = (f"{c.mallocs_per_step:,.0f} allocations a step reach the driver: the caching allocator looks turned "
                 "off (PYTORCH_NO_CUDA_MEMORY_CACHING=1, a debugging switch).")
    elif near_limit:
        cause = (f"Memory peaks at {pct(top)} of the GPU: near the limit the allocator empties its cache "
                 "and retries a failed allocation (see memory-pressure for ways to need less).")
    else:
        cause = "Most often torch.cuda.empty_cache() is called in the loop (with gc.collect(), to \"free memory\")."
    fixes = [pytorch("Check the allocator's counters: segments released and retries", CHECK_CODE, diagnostic=True)]
    if no_cache:
        fixes.insert(0, pytorch("Look for the switch that turns the cache off; unset it where it is set and restart the "
                                "kernel", NO_CACHE_CODE, diagnostic=True))
    elif not near_limit:
        fixes[:0] = [pytorch("Take torch.cuda.empty_cache() out of the loop", REMOVE_CODE),
                     huggingface("A Trainer empties the cache every torch_empty_cache_steps steps: leave it unset",
                                 "TrainingArguments(..., torch_empty_cache_steps=None)")]
    return finding(
        severity=severity_for(frac),
        title=(f"The GPU memory cache is handed back and allocated again every step "
               f"({c.frees_per_step:,.0f} cudaFree, {c.mallocs_per_step:,.0f} cudaMalloc a step)"),
        why="""PyTorch's caching allocator keeps the device memory that tensors free and reuses it, so that a
        training step normally makes no cudaMalloc or cudaFree call once the first steps have warmed it up: both
        take the driver's time, and cudaFree waits until the GPU has finished its queued work, so the GPU then
        idles until the host launches again. Here memory goes back to the driver and is allocated again in most
        steps. empty_cache() gives no more memory to PyTorch itself (its documentation says so): it lets other
        processes use the memory, and only in some cases reduces fragmentation.""",
        summary=(f"In {c.steps} of {steps} steps the allocator released and re-allocated device memory; the GPU sat "
                 f"idle {pct(frac)} of the window during those calls and until its next work. {cause}"),
        numbers={"churn_steps": c.steps, "mallocs_per_step": c.mallocs_per_step, "frees_per_step": c.frees_per_step,
                 "idle_frac": round(frac, 4), "threshold_frac": MIN_FRAC},
        windows=windows(*c.idle, "gpu", ctx.device, "idle around allocator calls"),
        est_gain=frac,
        gain_method="upper bound: the GPU's idle time during the allocator's driver calls and until its next work",
        fixes=tuple(fixes),
        doc_url=DOC,
    )


__all__ = ["allocator_churn"]
