"""``dataloader-bound``: the training loop waits for the next batch."""

from __future__ import annotations

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, severity_for, windows

#: TensorBoard profiler plugin: recommend more DataLoader workers when the DataLoader share of
#: step time exceeds 5 %.
DATALOADER_FRAC = 0.05
DOC = "https://pytorch.org/docs/stable/data.html#multi-process-data-loading"


def dataloader_bound(ctx: Context, m: dict):
    """Signal: time the main thread spends inside ``enumerate(DataLoader)#...__next__``.
    Threshold: > 5 % of the window (TensorBoard plugin). Gain: the part of that wait during
    which the GPU was also idle (the breakdown's exclusive data-loader time) — time that worker
    processes preparing batches in parallel could hide. False positives: a loader that is slow
    because of I/O stalls more workers cannot fix; an iterable dataset with one shard."""
    dl = ctx.cat_union["dataloader"]
    frac = ctx.frac(iv.total(dl))
    if frac <= DATALOADER_FRAC:
        return None
    gain = ctx.frac(iv.total(ctx.exclusive["dataloader"]))
    numbers = {"dataloader_ms": m["host"]["dataloader_ms"], "dataloader_frac": round(frac, 4),
               "gpu_idle_during_wait_frac": round(gain, 4), "threshold_frac": DATALOADER_FRAC}
    cpu_note = ""
    samples = m.get("samples") or {}
    if samples.get("cpu_util_mean") is not None:
        numbers["host_cpu_util_mean_pct"] = samples["cpu_util_mean"]
        cpu_note = f" Host CPU utilisation averaged {samples['cpu_util_mean']:.0f} %"
        if samples.get("workers_util_mean") is not None:
            numbers["workers_cpu_util_mean_pct"] = samples["workers_util_mean"]
            cpu_note += f"; loader workers used {samples['workers_util_mean']:.0f} % of a core"
        cpu_note += "."
    return finding(
        "dataloader-bound", severity=severity_for(gain), title="The training loop waits for the data loader",
        why="""Each step asks the DataLoader for the next batch on the main Python thread. With few or
        no worker processes, loading and augmenting the batch happens right there, while the GPU has
        nothing queued and sits idle. Worker processes prepare the next batches in parallel, so the
        batch is ready when the step asks for it.""",
        summary=f"{pct(frac)} of the window is spent waiting in the DataLoader "
                f"({m['host']['dataloader_ms']:.1f} ms); for {pct(gain)} of the window nothing else runs"
                f"{', GPU included' if ctx.device >= 0 else ''}."
                + cpu_note,
        numbers=numbers,
        windows=windows(dl[0], dl[1], "cpu", label="DataLoader wait"),
        est_gain=gain, gain_method="data-loader wait that does not overlap GPU work or other host activity",
        fixes=(
            pytorch("Load batches in worker processes, into pinned memory, and keep the workers alive",
                    """
loader = torch.utils.data.DataLoader(
    dataset, batch_size=batch_size, shuffle=True,
    num_workers=4,            # try os.cpu_count() // 2; gpumagic.tune_dataloader() measures it
    pin_memory=True,
    persistent_workers=True,
    prefetch_factor=2,
)"""),
            huggingface("The same through TrainingArguments",
                        """
TrainingArguments(..., dataloader_num_workers=4, dataloader_pin_memory=True,
                  dataloader_persistent_workers=True, dataloader_prefetch_factor=2)"""),
        ),
        doc_url=DOC,
    )
