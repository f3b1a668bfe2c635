"""``pageable-memcpy`` and ``transfer-bound``: host↔device copies."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.metrics import copy_groups
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: Pageable copies matter once they move at least this much (smaller ones are scalars/flags).
PAGEABLE_MIN_BYTES = 1 << 20
#: ... and make up this share of host↔device bytes, or this share of the window.
PAGEABLE_BYTES_FRAC = 0.10
PAGEABLE_TIME_FRAC = 0.01
#: The issue's anchor: copies taking > 10 % of the window without overlapping compute.
TRANSFER_FRAC = 0.10
PINNED_DOC = "https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html"
#: The prefetcher, after PyTorch's CUDA semantics notes ("CUDA streams", and
#: ``Tensor.record_stream``): the compute stream waits for the copy of the batch it is about
#: to use (and not for the next copy, queued after that wait), and every tensor made on the copy
#: stream is recorded on the compute stream, so the caching allocator does not hand its memory
#: to a later copy while kernels still read it. Every batch is yielded once, in order, the last
#: one included (tests/test_snippets.py runs this loop on CPU with stand-in streams).
PREFETCH_CODE = """
def prefetch(loader):
    copy_stream = torch.cuda.Stream()
    def start_copy(batch):
        with torch.cuda.stream(copy_stream):
            return [t.to("cuda", non_blocking=True) for t in batch]
    def ready(batch):
        compute = torch.cuda.current_stream()
        compute.wait_stream(copy_stream)   # this batch's copy is done before its kernels run
        for t in batch:
            t.record_stream(compute)       # memory made on copy_stream, used on compute
        return batch
    pending = None
    for batch in loader:
        if pending is None:
            pending = start_copy(batch)
            continue
        current = ready(pending)           # wait first, then queue the next copy
        pending = start_copy(batch)
        yield current
    if pending is not None:
        yield ready(pending)               # the last batch is trained too

loader = DataLoader(dataset, batch_size=batch_size, pin_memory=True)   # keep your num_workers
for x, y in prefetch(loader):
    train_step(x, y)"""


def _host_copies(ctx: Context) -> tuple[dict[tuple[str, str], dict[str, Any]], list[dict[str, Any]]]:
    groups = copy_groups(ctx)
    host = {k: g for k, g in groups.items() if k[0] in ("HtoD", "DtoH")}
    pageable = [g for k, g in host.items() if k[1] == "pageable"]
    return host, pageable


@rule("pageable-memcpy")
def pageable_memcpy(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: copies named ``Memcpy HtoD (Pageable -> Device)`` / ``DtoH (Device -> Pageable)``.
    Threshold: ≥ 1 MiB in all, and ≥ 10 % of host↔device bytes or ≥ 1 % of the window.
    Gain: the GPU-side time of those copies, an upper bound (pinned copies are faster, and overlap
    compute only from a side stream: ``transfer-bound``'s prefetcher). False positives: one-off copies of model
    weights at start-up that fall inside the window."""
    host, pageable = _host_copies(ctx)
    if not pageable:
        return None
    p_bytes = sum(g["bytes"] for g in pageable)
    p_ns = sum(g["ns"] for g in pageable)
    all_bytes = sum(g["bytes"] for g in host.values()) or 1
    if p_bytes < PAGEABLE_MIN_BYTES or (p_bytes / all_bytes < PAGEABLE_BYTES_FRAC and ctx.frac(p_ns) < PAGEABLE_TIME_FRAC):
        return None
    idx = np.concatenate([g["idx"] for g in pageable])
    ev = ctx.trace.events
    gbps = p_bytes / p_ns if p_ns else 0.0
    gain = ctx.frac(p_ns)
    return finding(
        severity=severity_for(gain, 0.1, 0.02), title="Host↔device copies use pageable memory",
        why="""The GPU's copy engines read only page-locked (pinned) host memory. A copy from ordinary
        pageable memory is first staged by the driver through a pinned buffer, which costs bandwidth (how
        much depends on the host; it is no fixed halving), and it blocks the host even with
        non_blocking=True. A copy without non_blocking=True blocks the host until it is done whatever
        the memory (PyTorch follows it with a stream synchronise): it is itself a host sync. From pinned
        memory with non_blocking=True the host returns at once; the copy overlaps kernels only when it is
        issued on another stream than those kernels and a copy engine is free, while on the same stream it
        frees the host, not the GPU. Pin once: DataLoader(pin_memory=True) pins each batch in a background
        thread when it has workers, and on the main thread, inside next(), without them; calling
        t.pin_memory() before every copy is usually slower than the plain copy (PyTorch's pin-memory
        tutorial).""",
        summary=f"{sum(g['count'] for g in pageable)} pageable copies moved {p_bytes / 1e6:.1f} MB "
                f"in {p_ns / 1e6:.2f} ms ({gbps:.1f} GB/s), {pct(p_bytes / all_bytes)} of host↔device bytes.",
        numbers={"pageable_count": sum(g["count"] for g in pageable), "pageable_bytes": p_bytes,
                 "pageable_ms": round(p_ns / 1e6, 3), "pageable_gbps": round(gbps, 3),
                 "pageable_bytes_frac": round(p_bytes / all_bytes, 4)},
        windows=windows(ev.ts_ns[idx], ev.ts_ns[idx] + ev.dur_ns[idx], "gpu", ctx.device, "pageable copy"),
        est_gain=gain, gain_method="GPU time of the pageable copies (an upper bound: pinned copies still take time, "
                                   "unless a side stream overlaps them with compute)",
        fixes=_pageable_fixes(ctx),
        doc_url=PINNED_DOC,
    )


def _pageable_fixes(ctx: Context) -> tuple[Fix, ...]:
    return (
            pytorch("Pin host memory once, and copy without blocking the host",
                    """
loader = DataLoader(dataset, batch_size=batch_size, pin_memory=True)   # keep your num_workers
for x, y in loader:
    x = x.to("cuda", non_blocking=True)   # the host returns at once; kernels on this stream
    y = y.to("cuda", non_blocking=True)   # still wait for the copy (side stream: transfer-bound)
    train_step(x, y)"""),
            pytorch("For tensors you build yourself: one pinned buffer, reused only after its copy is done",
                    """
staging = torch.empty(batch_shape, pin_memory=True)   # pin once: pinning per step is slower
copied = torch.cuda.Event()
for batch in host_batches:
    copied.synchronize()          # the previous non_blocking copy has finished reading staging
    staging.copy_(batch)
    x = staging.to("cuda", non_blocking=True)
    copied.record()               # marks the end of that copy on the current stream
    train_step(x)"""),
    ) + ((huggingface("The Trainer pins batches by default; make sure it is on",
                      "TrainingArguments(..., dataloader_pin_memory=True)"),) if ctx.workload == "training" else ())


def exposed_copies(ctx: Context) -> iv.Intervals:
    """Host↔device copy time on the primary GPU that no compute kernel overlaps."""
    host, _ = _host_copies(ctx)
    if not host:
        return iv.empty()
    ev = ctx.trace.events
    mask = np.zeros(len(ev), dtype=bool)
    mask[np.concatenate([g["idx"] for g in host.values()])] = True
    return iv.subtract(ctx.intervals(mask), ctx.cat_union["kernel"])


@rule("transfer-bound")
def transfer_bound(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: host↔device copy time on the GPU that no compute kernel overlaps. Threshold:
    > 10 % of the window. Gain: that exposed copy time (prefetching the next batch on a side
    stream, or keeping data on the GPU, hides or removes it); ``analysis.gains`` caps it to the
    idle time no other idle-type finding claims, since it counts among the GPU-idle findings.
    False positives: a workload whose
    purpose is moving data (checkpointing, offload)."""
    exposed = exposed_copies(ctx)
    frac = ctx.frac(iv.total(exposed))
    if frac <= TRANSFER_FRAC:
        return None
    return finding(
        severity=severity_for(frac), title="Host↔device copies stall the GPU",
        why="""Moving data over PCIe is far slower than the GPU's own memory. When copies run while no
        kernel is running, the GPU waits for data. Copying the next batch on a side stream from pinned
        memory lets it travel while the current batch computes (non_blocking alone, on the compute
        stream, frees the host but still queues the copy before the kernels); keeping tensors on the GPU
        avoids the trip.""",
        summary=f"Host↔device copies run without overlapping compute for {pct(frac)} of the window.",
        numbers={"exposed_copy_ms": round(iv.total(exposed) / 1e6, 3), "exposed_copy_frac": round(frac, 4),
                 "threshold_frac": TRANSFER_FRAC},
        windows=windows(exposed[0], exposed[1], "gpu", ctx.device, "exposed copy"),
        est_gain=frac, gain_method="copy time not overlapped by any compute kernel",
        fixes=(
            pytorch("Copy the next batch on a side stream while this one trains", PREFETCH_CODE),
        ),
        doc_url=PINNED_DOC,
    )
