"""What DataLoader workers would actually recover, and who keeps the cores busy.

Workers hide a data-loader wait only as far as the cores can absorb the work: moving the loading
into worker processes adds no CPU work, but it does not remove any either. So the step cannot get
shorter than this run's own CPU work (``own_busy_cores`` × step, ``analysis.hostload``) spread over
the cores it can get::

    step_after ≈ max(step − wait, wait / workers, own_cpu / cores_available)
    gain       = 1 − step_after / step            (0 ≤ gain ≤ wait share)

(``wait / workers``: each worker takes about as long for a batch as the main process does now —
the same sleeps, reads and waits for a core — so ``w`` of them deliver one every ``wait / w``.
With ``r`` workers running already, the loop waiting on them gets a batch every step, so one
worker takes about ``r × step`` for a batch, and ``w`` of them deliver one every ``r / w`` of
today's step: that term is ``step × r / w``. ``benchmarks/dataloader_advice.py``'s io-workers
case, two sleeping workers to four: 26.3 → 13.1 ms a step, the ``r / w`` = 0.5 it predicts.)

``cores_available`` is the usable cores less other processes' load. When other processes fill
the cores and the loading is CPU work, more runnable threads get a larger share: Linux's CFS
divides CPU time between runnable threads by weight, equal by default (kernel docs,
scheduler/sched-design-CFS.rst), so with ``n`` CPU-bound neighbour threads, the main thread and
``w`` workers get about ``usable × (1 + w) / (1 + w + n)`` cores. Both are estimates: the loading
work is assumed to stay the same, the neighbours to keep their load, and ``n`` is read as the
other processes' busy cores (each busy core one CPU-bound thread). Without CPU samples (a plain
trace) the gain is the wait itself, and says it assumes free cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpumagic.report.metrics import HostMetrics

#: Who saturates the cores: "own" when this process tree did at least 3/4 of the busy time,
#: "others" when other processes did at least half, else "both" ("unknown" without the split).
OWN_SHARE = 0.75
OTHERS_SHARE = 0.5


@dataclass(frozen=True)
class WorkerGain:
    gain: float  # share of step time workers would save (0..wait share)
    method: str  # what the number is, with its assumption named
    cores_available: float | None  # cores this run could get with the workers (None: unknown)


def saturated_by(host: HostMetrics) -> str:
    """"own", "others", "both" or "unknown": whose work kept the usable cores busy."""
    own, other = host.get("own_busy_cores"), host.get("other_busy_cores")
    if own is None or other is None or own + other <= 0:
        return "unknown"
    if own >= OWN_SHARE * (own + other):
        return "own"
    if other >= OTHERS_SHARE * (own + other):
        return "others"
    return "both"


def cores_with_workers(usable: float, other: float, workers: int, cpu_bound: bool) -> float:
    """Cores this run can get with ``workers`` workers: what other processes leave, or, beside
    neighbours, its equal share of the cores (CFS) — for the main thread and, when the loading is
    CPU work, the workers too (sleeping workers compete for nothing)."""
    left = max(0.0, usable - other)
    if other < 0.5:
        return max(left, min(usable, 1.0) * 0.05)
    neighbours = max(1, round(other))
    runnable = 1 + workers if cpu_bound else 1
    share = usable * runnable / (runnable + neighbours)
    return max(left, min(usable, share))


def compute_slowdown(host: HostMetrics, wait_frac: float, threads_after: int | None) -> tuple[float, float]:
    """How many times longer the rest of the step (the model's operators) runs on ``threads_after``
    intra-op threads, and the cores it used now: the main thread's and, while it computed, the
    process's other threads' (``own_other_threads_cores`` over the share of the window that is
    not the data-loader wait) — as if the operators scaled with the threads (an estimate).
    ``(1.0, 1.0)`` when the fix leaves the threads alone or the samples do not say."""
    other = host.get("own_other_threads_cores")
    compute = 1.0 - wait_frac
    if threads_after is None or other is None or compute <= 0:
        return 1.0, 1.0
    cores = 1.0 + float(other) / compute
    return max(1.0, cores / max(1, threads_after)), cores


def worker_gain(wait_frac: float, host: HostMetrics, workers: int | None, profiler_cost: bool = False,
                handoff_share: float = 1.0, running: int = 0, threads_after: int | None = None) -> WorkerGain:
    """The share of step time ``workers`` DataLoader workers would save (see the module docstring);
    ``wait_frac`` is the data-loader wait with nothing else running (the GPU idle too);
    ``running``: the workers the loop runs now (0: it loads in the main process).
    ``handoff_share``: the part of that wait left once each batch's hand-off from a worker is paid
    on the main thread (``analysis.loaderwait.worker_gain_share``; 1 when not known).
    ``threads_after``: the intra-op threads the fix sets to leave the workers their cores (None:
    left alone): the model's operators, which used more cores, then run on fewer
    (:func:`compute_slowdown`; ``benchmarks/loader_handoff.py`` case 2b, a small CNN whose intra-op
    threads kept both cores busy: the fix as given, one worker and one thread, measured 0.45× as
    fast, and this estimate reads nothing saved on that recording, ``cpu_tensordataset_images``)."""
    slowdown, cores_now = compute_slowdown(host, wait_frac, threads_after)
    longer = (1.0 - wait_frac) * (slowdown - 1.0)  # what the operators add on fewer threads
    handoff = ""
    if handoff_share < 1.0:
        wait_frac *= handoff_share
        handoff = (f"; less the hand-off each batch still costs the main process when a worker makes it "
                   f"({(1 - handoff_share) * 100:.0f} % of the wait per batch)")
    own, other, usable = host.get("own_busy_cores"), host.get("other_busy_cores"), host.get("usable_cores")
    inflated = ("; the profiler's per-operator cost (shapes, stacks or memory recorded) inflates the host time, "
                "so it may be overstated") if profiler_cost else ""
    if own is None or other is None or not usable:
        return WorkerGain(wait_frac, "estimate: the data-loader wait with nothing else running, assuming the workers "
                                     "have every batch ready and free cores to do it (the trace records no CPU load "
                                     "to check)" + handoff + inflated, None)
    cpu_bound = host.get("loader_cpu_bound") is True
    w = max(1, workers or 1)
    cores = cores_with_workers(float(usable), float(other), w, cpu_bound)
    floor = own / cores if cores > 0 else math.inf
    # each worker takes about as long for a batch as the main process did (the same sleeps, reads and
    # waits for a core): w of them deliver one every wait / w; with r running, a worker's batch takes
    # about r steps now, so w of them deliver one every r / w of the step
    per_worker = min(1.0, running / w) if running > 0 else wait_frac / w
    # the rest of the step stays (with the hand-off the main process still pays) and grows by
    # what fewer intra-op threads add
    gain = max(0.0, min(wait_frac, 1.0 - max(1.0 - wait_frac + longer, floor, per_worker)))
    shared = (f", its share beside other processes' {other:.1f} busy cores (the scheduler splits cores equally "
              "between runnable threads; assumes the neighbours keep their load)") if other >= 0.5 else (
        f" (of {float(usable):g} usable, {other:.1f} busy with other processes)")
    each = (f"each taking {running} of today's steps for a batch, as now" if running > 0 else
            "each taking as long for a batch as the main process does now")
    method = (f"estimate: the data-loader wait that {w} worker(s) would hide — {each} — less what the cores "
              f"cannot absorb: this run's own CPU work "
              f"({own:.2f} cores' worth) spread over the {cores:.2f} cores it can get{shared}; assumes the loading "
              "work itself stays the same" + handoff
              + (f"; and the model's operators on the {threads_after} intra-op thread(s) the fix sets instead of the "
                 f"{cores_now:.1f} cores they used, about {slowdown:.2f}× as long (as if they scaled with the threads)"
                 if slowdown > 1.0 else "") + inflated)
    return WorkerGain(round(gain, 4), method, round(cores, 3))
