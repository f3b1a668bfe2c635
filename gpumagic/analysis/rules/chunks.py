"""``small-transfers``: many small host↔device copies, each paying a fixed cost."""

from __future__ import annotations

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.copysizes import SMALL_COPY_BYTES, small_copies
from gpumagic.analysis.metrics import copy_groups
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.analysis.rules.compute import is_training
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: Fire when one direction has at least this many small copies per step ...
MIN_PER_STEP = 16
#: ... and they cost at least this share of the window on the host (the calls) and the GPU (the
#: copies) together — the same floor as ``host-sync``'s 2 %.
MIN_COST_FRAC = 0.02
DOC = "https://docs.nvidia.com/cuda/cuda-c-best-practices-guide/index.html#data-transfer-between-host-and-device"


def small_transfer_windows(ctx: Context) -> iv.Intervals:
    """The time the small copies of the directions over :data:`MIN_PER_STEP` cost (host calls ∪
    GPU copies while the GPU does nothing else): the idle time fixing them recovers, for combining
    gains across findings (:data:`gpumagic.analysis.gains.CLAIMS`)."""
    steps = max(len(ctx.step_bounds), 1)
    cost = iv.empty()
    for r in small_copies(ctx, copy_groups(ctx)).values():
        if r["count"] / steps >= MIN_PER_STEP:
            cost = iv.merge(cost, r["cost"])
    return cost


@rule("small-transfers")
def small_transfers(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: host↔device copies of ≤ 64 KiB, per direction. Threshold: ≥ 16 per step in one
    direction, costing ≥ 2 % of the window (the union of their issuing calls on the host and the
    copies on the GPU, while the GPU is busy with nothing else). Gain: that cost × (1 − 1/copies per step): one batched copy per step and
    direction pays the fixed cost once. False positives: copies that are inherently per-step
    scalars (a loss value read with ``.item()``) — ``host-sync`` covers those that block."""
    steps = max(len(ctx.step_bounds), 1)
    rows = {d: r for d, r in small_copies(ctx, copy_groups(ctx)).items() if r["count"] / steps >= MIN_PER_STEP}
    if not rows:
        return None
    cost = iv.empty()
    for r in rows.values():
        cost = iv.merge(cost, r["cost"])
    frac = ctx.frac(iv.total(cost))
    if frac < MIN_COST_FRAC:
        return None
    per_step = sum(r["count"] for r in rows.values()) / steps
    gain = frac * (1 - len(rows) / per_step)
    parts = [f"{d}: {r['count']} copies ({r['count'] / steps:.0f} per step), median {r['median_bytes'] / 1024:.1f} KiB, "
             f"{r['bytes'] / 1e6:.2f} MB in all, {r['gpu_ns'] / 1e6:.2f} ms on the GPU and {r['host_ns'] / 1e6:.2f} ms "
             f"of calls on the host" for d, r in sorted(rows.items())]
    idx = np.concatenate([r["idx"] for r in rows.values()])
    ev = ctx.trace.events
    return finding(
        severity=severity_for(gain, 0.1, 0.02),
        title=f"{per_step:.0f} small host↔device copies per step",
        why="""Every copy between host and GPU pays a fixed price — a runtime call, a DMA setup, often a
        synchronisation — whatever its size. Copies of a few kilobytes are all price and no transfer: a
        hundred of them cost a hundred times what one copy of the same bytes would. Assemble the batch
        on the host and move it once, in pinned memory with non_blocking=True, and keep constants on
        the GPU instead of sending them every step.""",
        summary="; ".join(parts) + f". Together they cost {pct(frac)} of the window.",
        numbers={"small_copy_bytes": SMALL_COPY_BYTES, "copies_per_step": round(per_step, 2), "cost_frac": round(frac, 4),
                 **{f"{d.lower()}_count": r["count"] for d, r in rows.items()},
                 **{f"{d.lower()}_bytes": r["bytes"] for d, r in rows.items()},
                 **{f"{d.lower()}_gpu_ms": round(r["gpu_ns"] / 1e6, 4) for d, r in rows.items()},
                 **{f"{d.lower()}_host_ms": round(r["host_ns"] / 1e6, 4) for d, r in rows.items()}},
        windows=windows(ev.ts_ns[idx], ev.ts_ns[idx] + ev.dur_ns[idx], "gpu", ctx.device, "small copy"),
        est_gain=gain, gain_method="host calls ∪ GPU copy time of the small copies while the GPU does nothing else × (1 − 1/copies per step)",
        fixes=(
            pytorch("Move the batch once: stack on the host, copy one tensor",
                    """
batch = torch.stack(samples)       # one host tensor instead of many
batch = batch.to("cuda")           # one copy per step; pinning it here, every step, is usually slower
                                   # than this plain copy: let the DataLoader pin (next fix)"""),
            pytorch("Do the per-sample stacking in the DataLoader's collate step, not in the loop",
                    """
loader = DataLoader(dataset, batch_size=64, collate_fn=torch.utils.data.default_collate, pin_memory=True)
for x, y in loader:
    x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)"""),
            pytorch("Keep constants on the GPU: create them once, outside the loop",
                    'scale = torch.tensor(0.5, device="cuda")   # not torch.tensor(0.5).cuda() every step'),
        ) + ((huggingface("The Trainer collates and pins batches; keep per-sample work in the dataset",
                          "TrainingArguments(..., dataloader_pin_memory=True)"),) if is_training(ctx) else ()),
        doc_url=DOC,
    )
