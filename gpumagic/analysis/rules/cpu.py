"""``host-cpu-saturated``: the host's cores are all busy while the loop waits for data or the
GPU idles — the CPU, not the model, holds the run back."""

from __future__ import annotations

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.hostcpu import host_cpu
from gpumagic.analysis.loadergain import saturated_by, worker_gain
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for, windows
from gpumagic.analysis.rules.cachefix import CACHE_CODE, CACHE_FIX
from gpumagic.analysis.rules.stagefixes import stage_fixes, stage_sentence
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: The issue's anchor: the host CPU samples average ≥ 90 % of the usable cores over the window.
#: Below that a core is free about one sample in ten, and another worker can still use it.
SATURATION = 0.90
#: An average needs a few samples: at gpumagic's default 100 ms period, a window of 0.3 s.
MIN_SAMPLES = 3
#: "While the loop waits": the data-loader wait (TensorBoard profiler plugin's 5 % data-loader
#: threshold) or the GPU's host-wait idle time must reach this share of the window.
WAIT_FRAC = 0.05
DOC = "https://pytorch.org/vision/stable/generated/torchvision.io.decode_jpeg.html"


def saturated_idle(ctx: Context) -> iv.Intervals:
    """The time ``host-cpu-saturated`` recovers: data-loader waits and host-wait idle time
    (within GPU idle time when there is a GPU)."""
    waits = iv.merge(ctx.cat_union["dataloader"], ctx.gaps.host_wait())
    return iv.intersect(waits, ctx.gaps.intervals) if ctx.device >= 0 else waits


@rule("host-cpu-saturated")
def host_cpu_saturated(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: host CPU samples (gpumagic's ``/proc`` sampler, recorded in a bundle) average
    ≥ 90 % of the usable cores (affinity mask and cgroup quota recorded at capture) over the
    window (at least 3 samples), while the loop waits for data or the GPU waits on the host for
    ≥ 5 % of the window; when the loop waits for data, the samples must show that the wait is
    CPU work (``analysis.hostcpu``: a loader sleeping on I/O is not held back by busy cores, and
    more workers still help it). Never fires on a plain Kineto trace (no samples). Says whose work
    filled the cores (``analysis.loadergain.saturated_by``): this process's own threads — then
    more workers cannot help, fewer threads or less CPU work per batch can, and the gain is the
    waiting time within GPU idle time, an upper bound — or other processes — then workers would
    get a larger share of the cores, the gain is what they would recover (an estimate,
    ``analysis.loadergain``), and step times measured now will not hold when the load changes.
    With the data pipeline's stages timed at capture (``metrics.host.loader_stages``) and a loop
    that waits for data, it names the slowest stage and puts the fix that fits it first
    (``rules.stagefixes``): with the cores full, a cheaper batch is what helps.
    False positives: a sampling period longer than the window."""
    h = host_cpu(ctx)
    if h.saturation is None or h.saturation < SATURATION or h.sample_count < MIN_SAMPLES:
        return None
    if iv.total(ctx.cat_union["dataloader"]) and h.loader_cpu_bound is not True:
        return None  # the loop waits for data, but not for CPU work (or we cannot tell)
    recover = saturated_idle(ctx)
    wait_frac = ctx.frac(iv.total(recover))
    if wait_frac < WAIT_FRAC:
        return None
    gpu = ctx.device >= 0
    host = m["host"]
    who = saturated_by(host)
    fixes = [
        pytorch(CACHE_FIX, CACHE_CODE),
        pytorch("Do less CPU work per sample: a cheaper format or a lower resolution",
                "# e.g. store images pre-resized to the training resolution, or as uint8 tensors / numpy arrays"),
    ]
    if gpu:
        fixes.insert(0, pytorch("Decode and augment on the GPU instead of the CPU",
                                """
import torchvision
from torchvision.transforms import v2
# the dataset returns the encoded bytes only: torchvision.io.read_file(path)
augment = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
imgs = torchvision.io.decode_jpeg(encoded_batch, device="cuda")   # a list of uint8 CHW tensors
x = torch.stack([augment(img) for img in imgs]).float().div_(255)
# or NVIDIA DALI: a pipeline that decodes and augments on the GPU"""))
    cores = f"{h.usable_cores:g} usable cores ({h.usable_source})"
    numbers: dict[str, float | int | str | None] = {"cpu_saturation": h.saturation, "busy_cores": h.busy_cores,
               "usable_cores": h.usable_cores,
               "cpu_samples": h.sample_count, "wait_frac": round(wait_frac, 4), "threshold": SATURATION}
    for key in ("own_busy_cores", "other_busy_cores", "own_main_thread_cores", "own_other_threads_cores",
                "own_workers_cores"):
        if host.get(key) is not None:
            numbers[key] = host[key]
    numbers["saturated_by"] = who
    gain, method = wait_frac, ("upper bound: the data-loader and host waits while the cores were saturated — "
                               "less CPU work per batch shortens them, by at most their length")
    waits_for = " while the GPU idles" if gpu else ""
    if who == "others":
        workers = max(1, int(float(h.usable_cores or 1)) - 1)  # the main process needs a core too
        wg = worker_gain(wait_frac, host, workers)
        gain, method = wg.gain, wg.method
        title = f"Host CPU saturated by other processes ({host['other_busy_cores']:.1f} of {h.usable_cores:g} cores)"
        why = f"""Other processes keep most of the usable cores busy ({host['other_busy_cores']:.1f} of
        {h.usable_cores:g}); this process used {host['own_busy_cores']:.1f}, and the loop waits for its data{waits_for}.
        Linux shares the cores between runnable threads, so more DataLoader workers would get a larger share of
        the machine — at the neighbours' expense, slowing them. Step times measured now will not hold when the
        other processes' load changes: compare runs only under the same load."""
        fixes.insert(0, pytorch(f"Load in {workers} worker process(es): they get a larger share of the busy cores",
                                "loader = torch.utils.data.DataLoader(\n    dataset, batch_size=batch_size,\n"
                                f"    num_workers={workers},\n    persistent_workers=True,\n)"))
        fixes.append(pytorch("Run where or when the cores are free (ask your scheduler for dedicated cores)",
                             "# e.g. Slurm: #SBATCH --cpus-per-task=8 ; Kubernetes: resources.requests.cpu: 8\n"
                             "# then check: len(os.sched_getaffinity(0))"))
    elif who in ("own", "both"):
        threads = host.get("own_other_threads_cores")
        parts = [(name, host.get(key)) for name, key in (("main thread", "own_main_thread_cores"),
                                                         ("intra-op and other threads", "own_other_threads_cores"),
                                                         ("DataLoader workers", "own_workers_cores"))]
        split = ", ".join(f"{name} {v:.1f}" for name, v in parts if v)
        whose = "this process's own threads" if who == "own" else "this process and other processes"
        title = f"Host CPU saturated by {whose} ({pct(h.saturation)} of {h.usable_cores:g} cores)"
        others = f"; other processes used {host['other_busy_cores']:.1f}" if who == "both" else ""
        why = f"""This process's own threads keep the usable cores busy ({host['own_busy_cores']:.1f} of
        {h.usable_cores:g} cores{': ' + split if split else ''}{others}),
        and the loop still waits for its data{waits_for}. More DataLoader workers cannot help: they would compete with
        these threads for the same cores (an intra-op parallel region waits for its slowest thread, so one that loses
        its core stalls them all). Use fewer threads — torch.set_num_threads, fewer workers — or less CPU work per
        batch: decode and augment on the GPU, cache preprocessed tensors, a cheaper format or resolution."""
        usable = max(1, int(float(h.usable_cores or 1)))
        if threads is not None and threads >= 0.5:
            # after the cheaper batch, which the gain is about: with a step whose own matmuls want every
            # core, one thread and one worker ran 13-58 % slower (benchmarks/dataloader_advice.py,
            # cpu-busy-cores, 2 cores)
            fixes.append(pytorch("Fewer threads than cores: intra-op threads and workers together at most the usable "
                                 "cores (measure it: a step whose own matmuls want every core can get slower)",
                                 f"torch.set_num_threads({max(1, usable - 1)})   # leave a core for the data loading\n"
                                 "loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=1, "
                                 "persistent_workers=True)"))
    else:
        title = f"Host CPU saturated ({pct(h.saturation)} of {h.usable_cores:g} cores)"
        why = f"""Every usable core of the host is busy, and the loop still waits for its data{waits_for}. The samples
        do not say whose work filled the cores: if it was this process's, more DataLoader workers cannot help (no
        free core for them) and less CPU work per batch is what helps; if other processes', workers would get a
        larger share of the cores, and step times will change with their load."""
    stages = host.loader_stages if iv.total(ctx.cat_union["dataloader"]) else None
    if stages:  # the loop waits for data: the slowest stage is where less CPU work per batch helps most
        numbers.update(slowest_stage=stages[0].name, slowest_stage_share=stages[0].share)
        fixes[:0] = stage_fixes(stages, gpu, ctx.workload == "training")
    return finding(
        severity=severity_for(gain),
        title=title,
        why=why,
        summary=f"Host CPU samples average {h.busy_cores:.2f} busy cores of {cores}, {pct(h.saturation)}, "
                f"over {h.sample_count} samples; the loop waits for {pct(wait_frac)} of the window."
                + (f" This process used {host['own_busy_cores']:.2f} cores, other processes {host['other_busy_cores']:.2f}."
                   if who != "unknown" else "") + (" " + stage_sentence(stages) if stages else ""),
        numbers=numbers,
        windows=windows(*recover, "cpu", label="waiting while the CPU is saturated"),
        est_gain=gain, gain_method=method,
        fixes=tuple(fixes),
        doc_url=DOC,
    )
