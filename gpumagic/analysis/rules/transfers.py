"""``pageable-memcpy`` and ``transfer-bound``: host↔device copies."""

from __future__ import annotations

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.metrics import copy_groups
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, severity_for, windows

#: Pageable copies matter once they move at least this much (smaller ones are scalars/flags).
PAGEABLE_MIN_BYTES = 1 << 20
#: ... and make up this share of host↔device bytes, or this share of the window.
PAGEABLE_BYTES_FRAC = 0.10
PAGEABLE_TIME_FRAC = 0.01
#: The issue's anchor: copies taking > 10 % of the window without overlapping compute.
TRANSFER_FRAC = 0.10
PINNED_DOC = "https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html"


def _host_copies(ctx: Context):
    groups = copy_groups(ctx)
    host = {k: g for k, g in groups.items() if k[0] in ("HtoD", "DtoH")}
    pageable = [g for k, g in host.items() if k[1] == "pageable"]
    return host, pageable


def pageable_memcpy(ctx: Context, m: dict):
    """Signal: copies named ``Memcpy HtoD (Pageable -> Device)`` / ``DtoH (Device -> Pageable)``.
    Threshold: ≥ 1 MiB in all, and ≥ 10 % of host↔device bytes or ≥ 1 % of the window.
    Gain: the GPU-side time of those copies (pinned copies run at full PCIe bandwidth and can
    overlap compute with ``non_blocking=True``). False positives: one-off copies of model
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
        "pageable-memcpy", severity=severity_for(gain, 0.1, 0.02), title="Host↔device copies use pageable memory",
        why="""The GPU's copy engine can only read page-locked (pinned) host memory. A copy from ordinary
        pageable memory is first staged by the CPU into a pinned buffer, which halves the bandwidth and
        makes the copy synchronous, so it cannot overlap with kernels. Pinned memory plus
        non_blocking=True lets the copy run at full speed while the GPU computes.""",
        summary=f"{sum(g['count'] for g in pageable)} pageable copies moved {p_bytes / 1e6:.1f} MB "
                f"in {p_ns / 1e6:.2f} ms ({gbps:.1f} GB/s), {pct(p_bytes / all_bytes)} of host↔device bytes.",
        numbers={"pageable_count": sum(g["count"] for g in pageable), "pageable_bytes": p_bytes,
                 "pageable_ms": round(p_ns / 1e6, 3), "pageable_gbps": round(gbps, 3),
                 "pageable_bytes_frac": round(p_bytes / all_bytes, 4)},
        windows=windows(ev.ts_ns[idx], ev.ts_ns[idx] + ev.dur_ns[idx], "gpu", ctx.device, "pageable copy"),
        est_gain=gain, gain_method="GPU time of the pageable copies (pinned copies are faster and can overlap compute)",
        fixes=_pageable_fixes(ctx),
        doc_url=PINNED_DOC,
    )


def _pageable_fixes(ctx: Context):
    return (
            pytorch("Pin host memory and copy asynchronously",
                    """
loader = DataLoader(dataset, batch_size=batch_size, pin_memory=True)   # keep your num_workers
for x, y in loader:
    x = x.to("cuda", non_blocking=True)
    y = y.to("cuda", non_blocking=True)
# for tensors you build yourself: t = t.pin_memory(); t.to("cuda", non_blocking=True)"""),
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


def transfer_bound(ctx: Context, m: dict):
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
        "transfer-bound", severity=severity_for(frac), title="Host↔device copies stall the GPU",
        why="""Moving data over PCIe is far slower than the GPU's own memory. When copies run while no
        kernel is running, the GPU waits for data. Pinned memory with non_blocking copies lets the next
        batch travel while the current one computes; keeping tensors on the GPU avoids the trip.""",
        summary=f"Host↔device copies run without overlapping compute for {pct(frac)} of the window.",
        numbers={"exposed_copy_ms": round(iv.total(exposed) / 1e6, 3), "exposed_copy_frac": round(frac, 4),
                 "threshold_frac": TRANSFER_FRAC},
        windows=windows(exposed[0], exposed[1], "gpu", ctx.device, "exposed copy"),
        est_gain=frac, gain_method="copy time not overlapped by any compute kernel",
        fixes=(
            pytorch("Overlap the copy of the next batch with compute",
                    """
loader = DataLoader(dataset, batch_size=batch_size, pin_memory=True)   # keep your num_workers
copy_stream = torch.cuda.Stream()
def to_gpu(batch):
    with torch.cuda.stream(copy_stream):
        return [t.to("cuda", non_blocking=True) for t in batch]
it = iter(loader); nxt = to_gpu(next(it))
for batch in it:
    torch.cuda.current_stream().wait_stream(copy_stream)
    cur, nxt = nxt, to_gpu(batch)
    train_step(*cur)"""),
        ),
        doc_url=PINNED_DOC,
    )
