"""``host-contended``: other processes take the cores a CPU-only loop computes on, and the loop's
own thread waits for one."""

from __future__ import annotations

import math

from gpumagic.analysis.context import Context
from gpumagic.analysis.cpuprecision import host_threads
from gpumagic.analysis.hostcpu import host_cpu
from gpumagic.analysis.hostload import BUSY_WAIT
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for
from gpumagic.analysis.rules.cpu import MIN_SAMPLES
from gpumagic.analysis.rules.dataloader import DATALOADER_FRAC
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: A finding from this share of the window spent runnable without a core: the share that makes a
#: machine busy (``analysis.hostload.BUSY_WAIT``, TensorBoard profiler plugin's 5 % line).
MIN_WAIT = BUSY_WAIT
DOC = "https://pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html"
#: benchmarks/contention.py on this project's 2-core machine: the loop beside spinning neighbours
#: with the default thread count against the count the finding suggests, and alone.
MEASURED = ("benchmarks/contention.py on 2 cores: beside one spinning process, one intra-op thread instead of two "
            "saved 0.45 of the step for an estimate of 0.45, a quiet machine 0.70; beside two, 0.84 and 0.94 for an "
            "estimate of 0.50")
PS_CODE = """
import subprocess

# the processes using the most CPU now (Linux ps): stop, pause or renice the ones you can
busiest = subprocess.check_output(["ps", "-eo", "pid,user,pcpu,etime,comm", "--sort=-pcpu"], text=True)
print("\\n".join(busiest.splitlines()[:8]))"""


@rule("host-contended")
def host_contended(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a CPU-only trace whose CPU samples (a gpumagic capture, ≥ 3 in the window) show
    other processes on the machine (``host.shared_machine``: ≥ 0.5 core and ≥ a quarter of the
    usable ones) and the main thread runnable but without a core for ≥ 5 % of the window
    (``host.main_runqueue_wait_frac``, ``/proc/<pid>/schedstat``), unless the loop's data-loader
    wait is over 5 % of the window and at least that run-queue wait (the loader's wait is then the
    larger story, ``dataloader-bound``'s or ``host-cpu-saturated``'s: a loop beside three spinning
    processes that waited 7.5 % for its batches and 60 % for a core read only "add a worker"). Gain, an
    estimate: that wait's share of the window, what a quiet machine gives the main thread back;
    intra-op threads that lose their core too stall each parallel region (an OpenMP region waits
    for its slowest thread), so the loss can be larger, and it changes with the neighbours' load.
    Fix: intra-op threads no more than the cores the others leave (when the recorded
    ``torch.get_num_threads()`` is above them), the busiest processes listed, and comparisons
    made on a quiet machine. False positives: a neighbour that stopped right after the window."""
    if ctx.device >= 0:
        return None
    h, host = host_cpu(ctx), m.host
    wait, other = host.get("main_runqueue_wait_frac"), host.get("other_busy_cores")
    if (h.sample_count < MIN_SAMPLES or not h.usable_cores or not host.get("shared_machine") or wait is None
            or other is None or wait < MIN_WAIT or (host.dataloader_frac or 0.0) > max(DATALOADER_FRAC, wait)):
        return None
    usable = float(h.usable_cores)
    free = max(1, math.floor(usable - other + 0.25))  # a core three-quarters free counts
    threads = host_threads(ctx)
    fewer = threads is not None and threads > free
    numbers: dict[str, float | int | str | None] = {
        "main_runqueue_wait_frac": wait, "other_busy_cores": other, "usable_cores": h.usable_cores,
        "cpu_samples": h.sample_count, "cores_left_by_others": free, "threshold_frac": MIN_WAIT}
    if threads is not None:
        numbers["intra_op_threads"] = threads
    if fewer:
        numbers["suggested_num_threads"] = free
    fixes: list[Fix] = []
    if fewer:
        fixes.append(pytorch(
            f"While the other processes run: {free} intra-op thread(s), the cores they leave, not {threads} (a "
            "parallel operator waits for its slowest thread, and a thread without a core holds all the others up)",
            f"torch.set_num_threads({free})   # back to {threads} when the machine is quiet"))
    fixes.append(pytorch("See which processes take the cores, and stop, pause or renice the ones you can",
                         PS_CODE, diagnostic=True))
    return finding(
        severity=severity_for(wait),
        title=f"Other processes took the cores: the loop's thread waited for one {pct(wait)} of the time",
        why=f"""Other processes kept {other:.1f} of the {usable:g} usable cores busy, and the Linux scheduler shares
        the cores between every runnable thread: the thread running this loop was ready to compute but had no core
        for {pct(wait)} of the window. Its step times include that wait, so they will change with the neighbours'
        load: compare runs, and judge the other findings' numbers, on a quiet machine."""
            + (f""" PyTorch ran {threads} intra-op threads: a parallel operator finishes when its slowest thread does,
        and with fewer free cores than threads one of them is always waiting.""" if fewer else ""),
        summary=(f"Main thread runnable without a core {pct(wait)} of the window; other processes used "
                 f"{other:.2f} of {usable:g} usable cores ({h.sample_count} CPU samples)"
                 + (f"; {threads} intra-op threads for the {free} core(s) they left." if fewer else ".")),
        numbers=numbers,
        est_gain=wait,
        gain_method=("estimate: the share of the window the main thread was runnable but had no core (schedstat), "
                     "what a quiet machine gives back; intra-op threads waiting too can make the loss larger, and "
                     f"it moves with the neighbours' load ({MEASURED})"),
        fixes=tuple(fixes),
        doc_url=DOC,
    )


__all__ = ["host_contended"]
