"""``dataloader-worker-restarts``: the DataLoader starts its worker processes again every epoch."""

from __future__ import annotations

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.loaderrestart import worker_starts
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: A finding from this share of the window (TensorBoard profiler plugin's 5 % line for a
#: bottleneck worth naming).
MIN_GAIN = 0.05
DOC = "https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader"
#: benchmarks/worker_restarts.py on this project's 2-core machine (5 alternated rounds): four
#: steps an epoch, two workers, a profiled window of eight steps.
MEASURED = "persistent workers saved 0.72 of the time where the restarts took 0.61 of the profiled window"


@rule("dataloader-worker-restarts")
def dataloader_worker_restarts(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a gpumagic capture recorded the start of a DataLoader's worker processes inside the
    window (``iter(loader)`` of a loader with workers: each epoch without
    ``persistent_workers=True``; ``analysis.loaderrestart``), and the start, the wait for the new
    workers' first batch and the old workers' shutdown at the end of the epoch before take ≥ 5 %
    of the window. Gain, an estimate: that time's share of the window. Persistent workers keep only
    each epoch's first batch's making, which it includes; but the profiler slows the rest of the
    loop and not the starts, so the share of a plain run is larger, and so is the saving
    (``benchmarks/worker_restarts.py``: 0.72 saved where the restarts took 0.61 of the window). Never fires on a plain trace (the
    start is not recorded there) or on the loop's first start (its workers had to start once):
    only a start after a batch of the same thread counts. False positives: a new
    DataLoader built on purpose each epoch (a changing dataset), where the fix is to keep one."""
    found = worker_starts(ctx)
    if not found.count:
        return None
    cost = iv.total(found.intervals)
    gain = ctx.frac(cost)
    if gain < MIN_GAIN:
        return None
    n = found.count
    workers = f"{found.workers} worker processes" if found.workers else "its worker processes"
    return finding(
        severity=severity_for(gain),
        title=f"The DataLoader starts {workers} again each epoch: {pct(gain)} of the window",
        why="""Without persistent_workers=True, every pass over a DataLoader (every epoch's for loop) shuts the
        worker processes down when the data runs out and starts new ones: each new worker is forked (Linux) or
        spawned, importing its modules and receiving the dataset (macOS, Windows), sets itself up and must make
        its first batch before the loop gets one. The loop waits through all of it. persistent_workers=True
        keeps the workers alive between epochs (PyTorch's DataLoader documentation), so only the first epoch
        pays the start.""",
        summary=(f"{n} worker start{'s' if n > 1 else ''} in the window: "
                 f"{found.start_ns / 1e6:.1f} ms starting, and with the waits for the new workers' first "
                 f"batch and for the old ones' shutdown {cost / 1e6:.1f} ms, {pct(gain)} of the window."),
        numbers={"starts": n, "workers_per_start": found.workers, "start_ms": round(found.start_ns / 1e6, 4),
                 "restart_ms": round(cost / 1e6, 4), "restart_frac": round(gain, 4)},
        windows=windows(found.intervals[0], found.intervals[1], "cpu", label="DataLoader workers restart"),
        est_gain=gain,
        gain_method=("estimate: the share of the window in the workers' starts, the waits for their first batch "
                     "and the shutdown waits before them; persistent workers still make each epoch's first batch, "
                     "but without the profiler the rest of the loop runs faster, so the share, and the saving, can "
                     f"be larger ({MEASURED})"),
        fixes=(pytorch("Keep the workers between epochs", persistent_loader_code(found.workers)),
               huggingface("Trainer: keep the workers between epochs",
                           "TrainingArguments(..., dataloader_persistent_workers=True)")),
        doc_url=DOC,
    )


def persistent_loader_code(workers: int | None) -> str:
    """The loader kept between passes over it (PyTorch's DataLoader documentation:
    ``persistent_workers=True`` keeps the worker processes, and their dataset instances, alive
    after the data has been consumed once), with the ``workers`` it starts now; without that
    count, a line that sets it (persistent workers need at least one)."""
    keep = "   # and your other arguments as they are: shuffle=True, collate_fn..."
    if workers:
        return (f"loader = DataLoader(dataset, batch_size=batch_size, num_workers={workers}, persistent_workers=True)"
                + keep)
    return ("num_workers = 2   # as many as your loader starts now: persistent workers need at least one\n"
            "loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, persistent_workers=True)"
            + keep)


__all__ = ["dataloader_worker_restarts", "persistent_loader_code"]
