"""``out-of-memory``: the profiled code raised ``torch.OutOfMemoryError``; and the batch that would fit.

This finding is not a rule over the trace: it comes from the exception alone (kept in the bundle's
``error`` block by the capture, ``trace.meta["error"]``), on any device, and
:func:`gpumagic.analysis.analyze` adds it after the analysis, so that no segment or empty-window
logic can drop it. The bytes asked, the device's capacity and the allocator's state are read from
the message, in the formats of c10's allocators (``c10/cuda/CUDACachingAllocator.cpp``: "CUDA out of
memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 3.06 MiB is
free. … Of the allocated memory 78.54 GiB is allocated by PyTorch, and 11.41 MiB is reserved by
PyTorch but unallocated."; the older "(GPU 0; 7.93 GiB total capacity; 130.35 MiB already
allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch)"; XPU's and MPS's twins).
What held the memory comes from the memory profile by category when it was captured (``--memory``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Evidence, Finding, Fix
from gpumagic.trace.model import meta_block

FINDING_ID = "out-of-memory"
DOC = "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"
#: Headroom kept when estimating the largest batch that fits: 10 % of the device, for the
#: allocator's cache and fragmentation, which grow with the step (the issue's margin).
FIT_MARGIN = 0.10
#: c10's ``format_size`` prints sizes in binary units ("bytes", "KiB", "MiB", "GiB"); MPS's message
#: writes KB/MB/GB for the same 1024-based units.
_UNITS = {"bytes": 1, "b": 1, "kib": 2**10, "kb": 2**10, "mib": 2**20, "mb": 2**20, "gib": 2**30, "gb": 2**30,
          "tib": 2**40, "tb": 2**40}
_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*(bytes|[KMGT]i?B|B)\b"
_FIELDS = {
    "asked_bytes": (rf"Tried to allocate {_SIZE}",),
    "capacity_bytes": (rf"total capac\w* of {_SIZE}", rf"{_SIZE} total capacity", rf"max allowed: {_SIZE}"),
    "free_bytes": (rf"of which {_SIZE} is free", rf"{_SIZE} free;"),
    "allocated_bytes": (rf"{_SIZE} is allocated by PyTorch", rf"{_SIZE} already allocated", rf"MPS allocated: {_SIZE}"),
    "unallocated_reserved_bytes": (rf"{_SIZE} is reserved by PyTorch but unallocated",),
    "reserved_bytes": (rf"{_SIZE} reserved in total by PyTorch",),
}
_OOM_MESSAGE = re.compile(r"\b(CUDA|HIP|XPU|MPS backend) out of memory", re.IGNORECASE)
#: The categories whose memory grows with the batch, and those that do not (parameters and what the
#: optimizer keeps per parameter). ``unknown`` is counted as growing with the batch, which can only
#: make the largest-batch estimate smaller.
FIXED_CATEGORIES = ("parameter", "gradient", "optimizer_state")


def is_out_of_memory(error: dict[str, Any] | None) -> bool:
    """Whether the bundle's error block is an out-of-memory error: ``OutOfMemoryError`` in its
    class's MRO (``torch.OutOfMemoryError``, ``torch.cuda.OutOfMemoryError``), or a RuntimeError
    with an allocator's out-of-memory message (torch before 1.13 raised those)."""
    if not isinstance(error, dict):
        return False
    types = error.get("types") or [error.get("type")]
    return "OutOfMemoryError" in types or ("RuntimeError" in types and bool(_OOM_MESSAGE.search(error.get("message", ""))))


def parse_message(message: str) -> dict[str, int | None]:
    """The sizes an allocator's out-of-memory message states (bytes; None when it does not)."""
    out: dict[str, int | None] = {}
    for key, patterns in _FIELDS.items():
        out[key] = None
        for pattern in patterns:
            hit = re.search(pattern, message)
            if hit:
                out[key] = round(float(hit.group(1)) * _UNITS[hit.group(2).lower()])
                break
    if out["unallocated_reserved_bytes"] is None and out["reserved_bytes"] is not None and out["allocated_bytes"] is not None:
        out["unallocated_reserved_bytes"] = max(0, out["reserved_bytes"] - out["allocated_bytes"])
    return out


def largest_batch(batch: int, peak_bytes: int, fixed_bytes: int, capacity_bytes: int) -> int | None:
    """Estimate of the largest batch whose peak stays under ``(1 - FIT_MARGIN)`` of the device,
    assuming memory beyond ``fixed_bytes`` (parameters, gradients, optimizer state) grows in
    proportion to the batch: ``floor((0.9 C - F) / ((P - F) / B))``. None when it cannot be said
    (no batch-dependent memory, bad input). With ``fixed_bytes=0`` the estimate is never larger
    than with the true fixed part (so it errs on the side of fitting)."""
    if batch < 1 or capacity_bytes <= 0 or peak_bytes <= fixed_bytes or fixed_bytes < 0:
        return None
    per_sample = (peak_bytes - fixed_bytes) / batch
    room = (1.0 - FIT_MARGIN) * capacity_bytes - fixed_bytes
    return max(0, math.floor(room / per_sample))


def batch_size(meta: dict[str, Any]) -> int | None:
    """The batch size the capture was told (``capture.batch_size``), else None."""
    b = meta_block(meta, "capture").get("batch_size")
    return b if type(b) is int and b > 0 else None


def fit_for(metrics: Metrics | None, batch: int | None, *, needed_bytes: int | None = None,
            capacity_bytes: int | None = None) -> int | None:
    """:func:`largest_batch` from a report's memory metrics: the peak (by category when recorded,
    else the allocator's peak allocated, with no fixed part), or ``needed_bytes`` when larger
    (an out-of-memory error's allocated + asked)."""
    if batch is None or metrics is None:
        return None
    mem = metrics.memory
    cats = {k: v for k, v in (mem.at_peak or {}).items() if k != "allocator_cache"}
    peak = sum(cats.values()) if cats else mem.peak_allocated_bytes
    fixed = sum(cats.get(k, 0) for k in FIXED_CATEGORIES) if cats else 0
    peak = max(peak or 0, needed_bytes or 0)
    cap = capacity_bytes or mem.capacity_bytes
    if not peak or not cap:
        return None
    return largest_batch(batch, peak, fixed, cap)


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def out_of_memory(meta: dict[str, Any], metrics: Metrics | None) -> Finding | None:
    """Signal: the profiled code raised an out-of-memory error, kept in the bundle's ``error``
    block — ``OutOfMemoryError`` in the exception class's MRO, or a RuntimeError with an
    allocator's "out of memory" message (torch before 1.13). The bytes asked, the device's
    capacity, the free, allocated and reserved-but-unallocated bytes are read from the message;
    what held the memory comes from the memory profile by category (``--memory``), and the
    largest batch estimated to fit from the batch size the capture was told (``--batch-size``).
    Threshold: none: every such error is reported, on any device, with or without memory records
    (any other error, or none, gives no finding: None);
    the largest-batch estimate keeps FIT_MARGIN of the device free. Gain: no speed gain is
    claimed (the step did not complete); each fix names how much it could free at most, from each
    category's own peak, and the fixes come in that order. False positives: none for the finding;
    the largest-batch estimate assumes that the memory beyond parameters, gradients and optimizer
    state grows in proportion to the batch, so it is called an estimate."""
    error = meta.get("error")
    if not is_out_of_memory(error):
        return None
    assert isinstance(error, dict)
    sizes = parse_message(error["message"])
    mem = metrics.memory if metrics is not None else None
    cats = dict((mem.by_category if mem is not None else None) or {})  # each category's own peak
    held_at = dict((mem.at_peak if mem is not None else None) or {})
    capacity = sizes["capacity_bytes"] or (mem.capacity_bytes if mem is not None else None)
    unallocated = sizes["unallocated_reserved_bytes"]
    if unallocated is None and "allocator_cache" in cats:
        unallocated = cats["allocator_cache"]
    batch = batch_size(meta)
    needed = (sizes["allocated_bytes"] + sizes["asked_bytes"]
              if sizes["allocated_bytes"] is not None and sizes["asked_bytes"] is not None else None)
    fits = fit_for(metrics, batch, needed_bytes=needed, capacity_bytes=capacity)
    missing = _missing(sizes, cats, mem, batch)
    numbers: dict[str, float | int | str | None] = {
        **{k: v for k, v in sizes.items() if k != "reserved_bytes"},
        "capacity_bytes": capacity, "unallocated_reserved_bytes": unallocated,
        **{f"{k}_peak_bytes": v for k, v in cats.items()},
        "batch_size": batch, "largest_batch_estimate": fits, "null_because": "; ".join(missing),
    }
    held = ", ".join(f"{k.replace('_', ' ')} {_size(v)}" for k, v in sorted(held_at.items(), key=lambda kv: -kv[1]) if v)
    top = (mem.top_allocations or [])[:3] if mem is not None else []
    summary = (f"{error['type']}: the code asked for {_size(sizes['asked_bytes'])}"
               + (f" with {_size(sizes['free_bytes'])} free of {_size(capacity)}" if sizes["free_bytes"] is not None else "")
               + (f"; PyTorch held {_size(sizes['allocated_bytes'])} in tensors" if sizes["allocated_bytes"] is not None else "")
               + (f" and {_size(unallocated)} reserved but unallocated" if unallocated is not None else "") + "."
               + (f" At the recorded peak: {held}." if held else " What held the memory was not recorded (profile with --memory).")
               + ("".join(f" {_size(a.bytes)} {a.category} from {a.frame or 'before the recording'}"
                          + (f" ({a.op})" if a.op else "") + ";" for a in top).rstrip(";") + ("." if top else ""))
               + (f" Largest batch estimated to fit with a {FIT_MARGIN * 100:.0f} % margin: {fits} (now {batch}; an estimate "
                  "that assumes activation memory grows in proportion to the batch)." if fits is not None else ""))
    return Finding(
        id=FINDING_ID, severity="high", title=f"Out of memory: asked for {_size(sizes['asked_bytes'])}",
        why=("The profiled code ran out of device memory; the error was re-raised unchanged and this report covers "
             "what was recorded up to it. Memory in a training step is parameters, their gradients, the optimizer's "
             "state (Adam keeps two values per parameter), the activations saved for the backward pass (they grow "
             "with the batch), temporaries, and the caching allocator's reserved but unused blocks. The fixes below "
             "are ordered by how much each could free at most for this model (each category's own peak), where the "
             "memory profile says so."),
        evidence=Evidence(summary=summary, numbers=numbers),
        est_gain=0.0, gain_method="not a speed finding: the step did not complete",
        fixes=_fixes(cats, sizes, unallocated, batch, fits), doc_url=DOC)


def _missing(sizes: dict[str, int | None], cats: dict[str, int], mem: Any, batch: int | None) -> list[str]:
    out = [f"{k} not in the error message" for k, v in sizes.items() if v is None and k != "reserved_bytes"]
    if not cats:
        out.append("categories need a capture with --memory" if mem is None or not mem.categories_missing
                   else f"categories {mem.categories_missing}")
    if batch is None:
        out.append("largest_batch_estimate needs the batch size (--batch-size)")
    return out


def _fixes(cats: dict[str, int], sizes: dict[str, int | None], unallocated: int | None, batch: int | None,
           fits: int | None) -> tuple[Fix, ...]:
    """Each fix with the bytes it would free here (an upper bound; None: unknown), most first."""
    act, grads, state = cats.get("activation"), cats.get("gradient"), cats.get("optimizer_state")
    scaling = sum(cats.get(k, 0) for k in ("activation", "temporary", "input")) if cats else None
    smaller = (fits if fits is not None and batch is not None and 0 < fits < batch
               else max(1, batch // 2) if batch else None)
    accumulate = -(-batch // smaller) if batch and smaller else 2
    freed = None if scaling is None else (scaling * (batch - smaller) // batch if batch and smaller else scaling // 2)
    candidates: list[tuple[int | None, Fix]] = [
        (freed, Fix("pytorch", f"A smaller micro-batch{f' ({smaller})' if smaller else ''} with gradient accumulation keeps "
                               "the effective batch: activations shrink with the micro-batch"
                               + (f" (frees up to {_size(freed)})" if freed else ""),
                    f"""accumulation = {accumulate}          # micro-batches per optimizer step
for i, (x, y) in enumerate(loader):    # a loader with batch_size = the old one // accumulation
    loss = loss_fn(model(x), y) / accumulation
    loss.backward()
    if (i + 1) % accumulation == 0:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)""")),
        (act, Fix("pytorch", "Activation checkpointing: keep a block's inputs and recompute its activations in the "
                             f"backward pass (about one extra forward){f' (frees up to {_size(act)})' if act else ''}",
                  "out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)   # per block of the model")),
        (None if act is None else act // 2,
         Fix("pytorch", "Mixed precision: activations saved in 16 bits"
             + (f" (frees up to {_size(act // 2)})" if act else ""),
             "with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16):   # fp16 + GradScaler before Ampere\n"
             "    loss = loss_fn(model(x), y)")),
        (state, Fix("pytorch", "An optimizer with less state: Adam keeps two values per parameter, SGD with momentum one"
                    + (f" (frees up to {_size(state)})" if state else ""),
                    "optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)   # or an 8-bit / factored optimizer")),
        (grads, Fix("pytorch", "Free gradients between steps (set_to_none=True, the default since torch 2.0)"
                    + (f" (frees up to {_size(grads)} where the peak comes before backward)" if grads else ""),
                    "optimizer.zero_grad(set_to_none=True)")),
    ]
    asked = sizes["asked_bytes"]
    if unallocated is not None and asked is not None and unallocated >= asked:  # the cache held enough, split up
        candidates.append((unallocated, Fix(
            "pytorch", f"The allocator held {_size(unallocated)} reserved but unallocated, more than the "
                       f"{_size(asked)} asked: fragmentation. Let segments grow instead",
            "# before the first CUDA allocation (e.g. in the shell, or first thing in the notebook):\n"
            "import os; os.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\"")))
    ordered = sorted(enumerate(candidates), key=lambda ic: (ic[1][0] is None, -(ic[1][0] or 0), ic[0]))
    return tuple(fx for _, (_, fx) in ordered)
