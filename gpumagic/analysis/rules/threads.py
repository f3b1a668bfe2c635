"""``host-cores-idle`` and ``threads-oversubscribed``: a CPU-only loop's intra-op threads, too few
for the cores (one core computes while others sit idle) or too many (more threads than cores)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.cpuprecision import host_threads
from gpumagic.analysis.hostcpu import host_cpu
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for, windows
from gpumagic.analysis.rules.cpu import MIN_SAMPLES
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: The main thread computes: it kept at least this much of a core busy over the window.
MAIN_BUSY_CORES = 0.8
#: The intra-op threads did (almost) nothing: the process's other threads used less than this
#: much of a core ...
OTHER_THREADS_CORES = 0.25
#: ... and less than this share of what intra-op threads working on the long operator calls would
#: use (their share of the window × the idle cores they could take). With the default thread count
#: they engage on those calls: a loop of inflated small calls beside 2 threads showed 0.16 of a
#: core for an expected 0.22 (recorded here with stacks and memory); with one thread, 0.00.
OTHER_THREADS_SHARE = 0.25
#: A core is idle: the usable cores less every busy one (all processes) leave at least this much.
IDLE_CORES = 0.75
#: An operator call this long can use more than one thread. ATen splits a loop across its intra-op
#: threads only above a grain of 32,768 elements (``at::internal::GRAIN_SIZE``, ATen/Parallel.h),
#: tens of microseconds of work; calls under this run on one thread whatever the setting.
PARALLEL_MIN_NS = 50_000
#: A finding from this gain (TensorBoard profiler plugin's 5 % line for a bottleneck worth naming).
MIN_GAIN = 0.05
DOC = "https://pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html"


@rule("host-cores-idle")
def host_cores_idle(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a CPU-only trace whose CPU samples (a gpumagic capture, at least 3 in the window)
    show the main thread busy (≥ 0.8 core), the process's other threads — PyTorch's intra-op
    pool — nearly idle (< 0.25 core, and < a quarter of what threads working on the long calls
    below would use) and at least 0.75 of a usable core free (every process
    counted), while operator calls long enough to run in parallel take part of the window (the
    main thread's time inside an innermost call of ≥ 50 µs: ATen parallelises only above 32,768
    elements). PyTorch
    runs such operators on one thread per usable core by default, so their threads idling
    means ``torch.set_num_threads(1)`` or ``OMP_NUM_THREADS=1`` (torchrun sets it) is in force.
    Gain: an upper bound by Amdahl's law — those operators' share of the window × (1 − 1/k), k the
    cores the threads could use (the main thread's and the idle ones), as if they scaled
    perfectly. Never fires on a plain trace (no samples) or with a GPU. False positives: operators
    that do not parallelise though long (some ops hold a lock or run serial code); a window whose
    samples include time outside the loop. A capture that recorded ``torch.get_num_threads()``
    (``capture.intra_op_threads``) above 1 rules the cause out: the threads were allowed, and the
    long calls ran on one thread for another reason (bfloat16 on a CPU without bf16 instructions
    runs generic single-threaded kernels: ``cpu-low-precision-slow``)."""
    idle_threads = threads_for_idle_cores(ctx, m)
    if idle_threads is None:
        return None
    h = host_cpu(ctx)
    idle, share, k, gain, threads = (idle_threads.idle, idle_threads.share, idle_threads.cores, idle_threads.gain,
                                     idle_threads.threads)
    main, others, threads_set, par_windows = (idle_threads.main, idle_threads.others, idle_threads.threads_set,
                                              idle_threads.windows)
    return finding(
        severity=severity_for(gain),
        title=f"CPU operators run on one core while {idle:.1f} of {h.usable_cores:g} sit idle",
        why="""PyTorch runs an operator on large tensors in parallel on its intra-op threads, one per usable core
        by default. Here the main thread did the work alone and the other threads stayed idle: the thread count
        was set to 1, by torch.set_num_threads(1) or the OMP_NUM_THREADS=1 environment variable (torchrun sets
        it unless told otherwise). More threads spread each large operator over the idle cores.""",
        summary=(("torch.get_num_threads() was 1. " if threads_set == 1 else "")
                 + f"The main thread kept {main:.2f} of a core busy and the process's other threads {others:.2f}; "
                 f"{idle:.1f} of {h.usable_cores:g} usable cores were idle ({h.sample_count} CPU samples). Operator "
                 f"calls long enough to run in parallel (≥ {PARALLEL_MIN_NS / 1e3:.0f} µs) take {pct(share)} of "
                 f"the window."),
        numbers={"own_main_thread_cores": main, "own_other_threads_cores": others, "idle_cores": round(idle, 3),
                 "usable_cores": h.usable_cores, "cpu_samples": h.sample_count, "parallel_ops_frac": round(share, 4),
                 "suggested_num_threads": threads},
        windows=windows(par_windows[0], par_windows[1], "cpu", label="operators that could run in parallel"),
        est_gain=gain,
        gain_method=(f"upper bound (Amdahl): the share of the window in operator calls of ≥ "
                     f"{PARALLEL_MIN_NS / 1e3:.0f} µs × (1 − 1/{k}), as if they scaled perfectly over {k} cores"),
        fixes=(pytorch(f"Let the intra-op threads use the idle cores: {threads} threads",
                       "print(torch.__config__.parallel_info())   # at::get_num_threads() 1 here, and OMP_NUM_THREADS\n"
                       f"torch.set_num_threads({threads})   # before the loop; unset OMP_NUM_THREADS=1 where it is set\n"
                       "# torchrun: OMP_NUM_THREADS=<cores per process> torchrun ..."),),
        doc_url=DOC,
    )


@dataclass(frozen=True)
class IdleThreads:
    """What ``host-cores-idle`` sees (:func:`threads_for_idle_cores`)."""

    idle: float  # usable cores left idle by every process
    share: float  # the window's share in operator calls long enough to run in parallel
    cores: int  # the cores more threads could use: the main thread's and the idle ones
    gain: float  # the Amdahl bound: share × (1 − 1/cores)
    threads: int  # the count the fix suggests
    windows: iv.Intervals  # those operator calls
    main: float  # cores the main thread kept busy
    others: float  # cores the process's other threads kept busy
    threads_set: int | None  # ``torch.get_num_threads()`` a capture recorded (None: not recorded)


def threads_for_idle_cores(ctx: Context, m: Metrics) -> IdleThreads | None:
    """``host-cores-idle``'s signal (its docstring says when), or None, once per context;
    ``dataloader-bound`` asks it too, as the idle core it counts workers on is the one these
    threads would take."""
    return ctx.memo("threads.idle_cores", lambda c: _threads_for_idle_cores(c, m))


def _threads_for_idle_cores(ctx: Context, m: Metrics) -> IdleThreads | None:
    if ctx.device >= 0:
        return None
    threads_set = host_threads(ctx)
    if threads_set is not None and threads_set > 1:
        return None
    h, host = host_cpu(ctx), m.host
    main, others = host.get("own_main_thread_cores"), host.get("own_other_threads_cores")
    if (h.sample_count < MIN_SAMPLES or not h.usable_cores or h.busy_cores is None or main is None or others is None
            or main < MAIN_BUSY_CORES or others >= OTHER_THREADS_CORES):
        return None
    idle = float(h.usable_cores) - h.busy_cores
    if idle < IDLE_CORES:
        return None
    par, par_windows = _parallel_time(ctx)
    share = ctx.frac(par)
    k = 1 + int(np.floor(idle + 0.25))  # the main thread's core and the idle ones (0.75 of a core counts)
    gain = share * (1.0 - 1.0 / k)
    if gain < MIN_GAIN or others >= OTHER_THREADS_SHARE * share * (k - 1):
        return None  # too little to gain, or threads did engage on the long calls (the count is not 1)
    usable = int(np.floor(float(h.usable_cores) + 1e-6))
    workers = host.get("own_workers_cores") or 0.0
    threads = max(2, min(k, usable - int(np.ceil(workers - 0.25)))) if workers > 0.25 else k
    return IdleThreads(idle=idle, share=share, cores=k, gain=gain, threads=threads, windows=par_windows,
                       main=float(main), others=float(others), threads_set=threads_set)


#: ``threads-oversubscribed``: a finding when the calls long enough to run in parallel take at
#: least this share of the window (the TensorBoard profiler plugin's 5 % line for a bottleneck
#: worth naming, doubled: the loss is a part of their time, not all of it).
OVERSUBSCRIBED_MIN_FRAC = 0.10
#: benchmarks/threads_speedup.py on this project's 2-core machine (unprofiled, alternated rounds).
OVERSUBSCRIBED_MEASURED = ("benchmarks/threads_speedup.py --oversubscribe 16 on 2 cores: a step of two 1024 × 1024 "
                           "layers took 49.3 ms on 16 intra-op threads and 42.4 ms on 2 (0.14 saved)")


@rule("threads-oversubscribed")
def threads_oversubscribed(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a CPU-only gpumagic capture that recorded ``torch.get_num_threads()``
    (``capture.intra_op_threads``) above the cores the process may use (``machine.usable_cores``:
    its CPU affinity, or a cgroup CPU quota, rounded up), while operator calls long enough to run
    in parallel (innermost calls ≥ 50 µs on the main thread, as ``host-cores-idle`` counts them)
    take ≥ 10 % of the window. A parallel region hands each thread a share of the work and waits
    for the last: threads beyond the cores take turns on them, so the region lasts until the
    turns are done, and OpenMP's spinning threads keep the cores from the ones with work.
    Silent on a shared machine (``host-contended`` sizes the threads to what the other processes
    leave). Gain: an upper bound, those calls' share of the window (fewer threads shorten them,
    never remove them); measured in ``benchmarks/threads_speedup.py --oversubscribe``. Fix:
    ``torch.set_num_threads`` with the usable cores. False positives: operators that do not
    parallelise though long; a quota whose cores the process never needed at once."""
    if ctx.device >= 0 or m.host.get("shared_machine"):
        return None
    threads, h = host_threads(ctx), host_cpu(ctx)
    if threads is None or not h.usable_cores or h.usable_source not in ("affinity", "cgroup quota"):
        return None
    cores = max(1, int(np.ceil(float(h.usable_cores) - 1e-6)))
    if threads <= cores:
        return None
    par, par_windows = _parallel_time(ctx)
    share = ctx.frac(par)
    if share < OVERSUBSCRIBED_MIN_FRAC:
        return None
    suggested = max(1, int(np.floor(float(h.usable_cores) + 1e-6)))
    source = "its CPU affinity" if h.usable_source == "affinity" else "the container's CPU quota (cgroup)"
    wait = m.host.get("main_runqueue_wait_frac")
    return finding(
        severity=severity_for(share, high=0.4, medium=0.1),
        title=f"{threads} intra-op threads share {h.usable_cores:g} usable cores",
        why=f"""PyTorch splits an operator on a large tensor over its intra-op threads and waits for the last of
        them. This process may use {h.usable_cores:g} cores ({source}) but ran {threads} threads: they take
        turns on the cores, so every parallel operator lasts until the turns are done, and the threads that
        spin while they wait keep the cores from those with work. PyTorch sizes its pool from the cores the
        machine shows; a CPU quota limits the time a container gets, not the cores it sees, and a setting or an
        OMP_NUM_THREADS copied from a larger machine does the same. One thread per usable core is the most that
        can run at once.""",
        summary=(f"torch.get_num_threads() was {threads}; the process may use {h.usable_cores:g} cores ({source}). "
                 f"Operator calls long enough to run in parallel (≥ {PARALLEL_MIN_NS / 1e3:.0f} µs) take "
                 f"{pct(share)} of the window."
                 + (f" The main thread waited for a core {pct(wait)} of the window." if wait else "")),
        numbers={"intra_op_threads": threads, "usable_cores": h.usable_cores, "usable_cores_source": h.usable_source,
                 "parallel_ops_frac": round(share, 4), "main_runqueue_wait_frac": wait,
                 "suggested_num_threads": suggested},
        windows=windows(par_windows[0], par_windows[1], "cpu", label="operators that could run in parallel"),
        est_gain=share,
        gain_method=("upper bound: the share of the window in operator calls long enough to run in parallel; "
                     f"fewer threads shorten them, never remove them ({OVERSUBSCRIBED_MEASURED})"),
        fixes=(pytorch(f"One intra-op thread per usable core: {suggested}, not {threads}",
                       f"torch.set_num_threads({suggested})   # the cores this process may use ({source})\n"
                       f"# or before Python starts: OMP_NUM_THREADS={suggested}"),),
        doc_url=DOC,
    )


def _parallel_time(ctx: Context) -> tuple[int, iv.Intervals]:
    """The main thread's time whose innermost operator call lasts at least :data:`PARALLEL_MIN_NS`,
    counted once; and those intervals. Calls on one thread nest, and a shorter call never holds a
    longer one, so that time is the long calls' union less the short calls' union: an ``addmm``
    keeps its time beside a 2 µs ``resolve_conj`` inside it, a composite call made of many short
    ones keeps almost none."""
    ev, m = ctx.trace.events, ctx.masks
    rows = np.flatnonzero(ctx.events_in_window((ev.lane == ctx.main_lane) & m["cpu_op"]))
    if not rows.size:
        return 0, iv.empty()
    starts = ev.ts_ns[rows].astype(np.int64)
    ends = starts + ev.dur_ns[rows].astype(np.int64)
    long = ends - starts >= PARALLEL_MIN_NS
    found = iv.clip(iv.subtract(iv.union(starts[long], ends[long]), iv.union(starts[~long], ends[~long])),
                    ctx.lo, ctx.hi)
    return iv.total(found), found
