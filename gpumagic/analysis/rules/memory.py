"""``memory-pressure``: peak allocated memory at the device's limit."""

from __future__ import annotations

from gpumagic.analysis.advice.huggingface import transformers_source
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule
from gpumagic.analysis.rules.precision import BF16_MIN_CC
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: Peak *allocated* (live tensors) above 90 % of device memory leaves the allocator no room to
#: cache and risks retries and out-of-memory errors. Peak reserved near capacity is normal.
PEAK_FRAC = 0.90
DOC = "https://pytorch.org/docs/stable/torch_cuda_memory.html"


@rule("memory-pressure")
def memory_pressure(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the allocator's peak *allocated* bytes from ``[memory]`` records against the
    device's total. Threshold: > 90 %. Reserved memory near capacity is the caching allocator
    working as designed, and NVML's "used" includes the CUDA context and other processes, so
    neither is the signal (both stay in the memory metrics). The live confirmation of pressure is
    ``torch.cuda.memory_stats()["num_alloc_retries"]`` > 0 (cudaMalloc failed, the cache was
    freed and the allocation retried); a trace does not record it, so the fix says how to read it.
    Not when the memory is a deliberate pool (``memory.pool``: allocated moves by ≤ 5 % of the
    device across the window and no allocation reaches the driver — vLLM's
    ``gpu_memory_utilization``, SGLang's ``mem_fraction_static``). Gain: not a speed finding by
    itself (0 %). False positives: a step that allocates one large buffer on purpose."""
    mem = m.memory
    if mem.peak_frac is None or mem.peak_frac <= PEAK_FRAC or mem.capacity_bytes is None:
        return None
    if mem.pool:  # held up front and never grown: a serving engine's pool, not pressure
        return None
    return finding(
        severity="medium", title=f"Memory peaks at {pct(mem.peak_frac)} of the GPU",
        why="""PyTorch's caching allocator keeps freed blocks reserved for reuse, so reserved memory (and
        nvidia-smi's "used") near the limit is normal. Live tensors near the limit are not: the allocator
        must then free its cache and retry cudaMalloc (slow, synchronising; counted in
        torch.cuda.memory_stats()["num_alloc_retries"]) and an out-of-memory error is one batch away.
        When reserved is far above allocated, fragmentation is the issue and
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps. Activation checkpointing, lower precision
        or a smaller micro-batch with gradient accumulation buy headroom.""",
        summary=f"Peak allocated {(mem.peak_allocated_bytes or 0) / 2**30:.2f} GiB "
                f"of {mem.capacity_bytes / 2**30:.2f} GiB"
                + (f" (peak reserved {mem.peak_reserved_bytes / 2**30:.2f} GiB)" if mem.peak_reserved_bytes else "")
                + ".",
        numbers={"peak_frac": mem.peak_frac, "capacity_bytes": mem.capacity_bytes, "source": mem.source or ""},
        est_gain=0.0, gain_method="not a direct speed loss: risk of OOM and allocator retries",
        fixes=_fixes(ctx),
        doc_url=DOC,
    )


#: Checking for real pressure, and the fragmentation switch (PyTorch CUDA semantics notes,
#: "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF": ``expandable_segments``). The
#: variable must be set before the first CUDA allocation.
CHECK_CODE = """
stats = torch.cuda.memory_stats()
print("allocator retries:", stats["num_alloc_retries"])          # > 0: real pressure
print("peak allocated GiB:", torch.cuda.max_memory_allocated() / 2**30)
print("peak reserved GiB:", torch.cuda.max_memory_reserved() / 2**30)
# reserved far above allocated (fragmentation): before the first CUDA allocation, e.g. in the shell
#   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py"""


def _fixes(ctx: Context) -> tuple[Fix, ...]:
    check = pytorch("Confirm it: allocator retries and peak allocated vs reserved", CHECK_CODE, diagnostic=True)
    return (check, *_shrink_fixes(ctx))


def _low_dtype(ctx: Context) -> str:
    """``"bfloat16"`` or ``"float16"`` by the device's compute capability (bf16 from
    ``rules.precision.BF16_MIN_CC``: Volta and Turing have fp16 tensor cores only); unknown (no
    device properties in the trace): ``""``, and the fix chooses at run time."""
    cc = ctx.device_info.compute_capability if ctx.device_info is not None else None
    if not cc:
        return ""
    return "bfloat16" if cc >= BF16_MIN_CC else "float16"


def checkpointing_argument() -> str:
    """The ``TrainingArguments`` name of activation checkpointing in the installed transformers:
    ``activation_checkpointing`` where its ``training_args.py`` declares it (transformers 5, where
    ``gradient_checkpointing`` is a "Deprecated alias of `activation_checkpointing`"), else
    ``gradient_checkpointing`` (4.x has only that one). Without transformers: the newer name."""
    text = transformers_source("training_args.py")
    return "gradient_checkpointing" if text is not None and "activation_checkpointing: " not in text \
        else "activation_checkpointing"


def _shrink_fixes(ctx: Context) -> tuple[Fix, ...]:
    low = _low_dtype(ctx)
    pick = ("" if low else "low = torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float16"
            "   # bf16 from Ampere\n")
    dtype = f"torch.{low}" if low else "low"
    if ctx.workload != "training":
        return (pytorch("Store less per batch: lower precision weights, a smaller batch",
                        f"""
{pick}model = model.to({dtype})       # half the memory of FP32 weights and activations
with torch.inference_mode():           # keeps no autograd state
    out = model(x[: len(x) // 2].to({dtype}))   # inputs in the weights' dtype; or a smaller batch"""),)
    precision = {"bfloat16": "bf16=True", "float16": "fp16=True"}.get(low, "bf16=True")
    autocast = {"bfloat16": "autocast to bf16", "float16": "autocast to fp16 with a GradScaler (no bf16 tensor cores "
                "before Ampere)"}.get(low, "autocast to bf16 (fp16 with a GradScaler before Ampere)")
    return (
            pytorch("Trade compute for memory, or shrink what is stored",
                    f"""
# recompute a block's activations in backward instead of keeping them
out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
# or: {autocast}; or micro-batches with gradient accumulation"""),
            huggingface("Through TrainingArguments",
                        f"TrainingArguments(..., {checkpointing_argument()}=True, {precision},\n"
                        "                  per_device_train_batch_size=8, gradient_accumulation_steps=4)"),
    )
