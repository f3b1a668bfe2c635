"""``dataloader-bound``: the training loop waits for the next batch."""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis import everystep
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.hostcpu import LOADER_CPU_SHARE, HostCpu, host_cpu, loading_in_main, suggested_workers
from gpumagic.analysis.hostload import COST_OPTIONS
from gpumagic.analysis.loadergain import saturated_by, worker_gain
from gpumagic.analysis.loaderwait import (
    HANDOFF_MS,
    MARGINAL_MS,
    LoaderWait,
    loader_wait,
    main_waits,
    worker_gain_share,
)
from gpumagic.analysis.metrics import cap_by_critical_path
from gpumagic.analysis.phases import phase_intervals
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.analysis.rules.cachefix import CACHE_CODE, CACHE_FIX
from gpumagic.analysis.rules.cpu import MIN_SAMPLES, SATURATION
from gpumagic.analysis.rules.stagefixes import (
    BATCHING_SOURCE,
    batch_sampler_code,
    makes_batch_at_once,
    stage_fixes,
    stage_sentence,
    tensor_dataset_item,
)
from gpumagic.analysis.rules.threads import threads_for_idle_cores
from gpumagic.report.metrics import HostMetrics, Metrics
from gpumagic.report.model import Finding, Fix

#: TensorBoard profiler plugin: recommend more DataLoader workers when the DataLoader share of
#: step time exceeds 5 %.
DATALOADER_FRAC = 0.05
#: Intra-op threads "in use" when the main process's threads other than the main one keep at
#: least half a core busy: then a CPU-bound worker competes with them for the same cores, and the
#: fix lowers ``torch.set_num_threads`` to leave the workers their cores (an OpenMP parallel region
#: waits for its slowest thread, so a thread that loses its core stalls the whole region).
INTRA_OP_CORES = 0.5
DOC = "https://pytorch.org/docs/stable/data.html#multi-process-data-loading"


@rule("dataloader-bound")
def dataloader_bound(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: time the main thread spends inside ``enumerate(DataLoader)#...__next__``.
    Threshold: > 5 % of the window (TensorBoard plugin). Gain: the part of that wait during
    which the GPU was also idle (the breakdown's exclusive data-loader time) — time that worker
    processes preparing batches in parallel could hide — less what the cores cannot absorb: with
    CPU samples, the step cannot get shorter than this run's own CPU work spread over the cores it
    can get (``analysis.loadergain``; an estimate, its assumptions named in ``gain_method``).
    When loading is CPU work and intra-op threads keep cores busy, the fix also lowers
    ``torch.set_num_threads`` so that the workers get their cores. The worker count follows the evidence
    (``analysis.hostcpu``): when loading is CPU work, never more workers than the usable cores
    recorded at capture allow (none at all when they are saturated: ``host-cpu-saturated``; nor
    when the workers running already take every core the samples leave: the cheaper-batch fixes
    then, with the wait as an upper bound; the core the main process loads on with
    ``num_workers=0`` counts as the workers', ``hostcpu.suggested_workers``);
    when it is mostly not CPU (I/O, sleeps), more workers than cores, saying why; for a plain
    trace, a count computed from the machine it runs on, saying it is an assumption.
    Workers cost the main process a hand-off per batch (``analysis.loaderwait.HANDOFF_MS``): when
    the trace's loader is the single-process one and the median wait per batch is no longer than
    that, no workers (3× slower steps measured for a ``TensorDataset`` of small samples,
    ``benchmarks/loader_handoff.py``): the batch is indexed at once instead, the wait the upper
    bound; otherwise the gain leaves the hand-off out, and a batch up to ``MARGINAL_MS`` (twice the
    hand-off) gets the count with a warning, the stage's fix first and ``gpumagic.tune_dataloader``
    as a diagnostic; so does a dearer single-process batch from a ``TensorDataset`` (the batched
    index needs no code of the user's) whose loading is CPU work and whose slowest stage a batch
    made in one call removes (``stagefixes.makes_batch_at_once``), when the workers' estimate is
    below that stage's share of the wait (a model whose intra-op threads keep the cores busy: one worker with
    one thread measured 0.45× slower, the batched index 3 % faster, ``benchmarks/loader_handoff.py``),
    the wait then the upper bound. A multi-process loader in the trace counts
    as one worker running at least when the samples do not count them, and workers that deliver
    each batch within a hand-off get no more.
    ``pin_memory`` only with a GPU; ``shuffle`` and ``TrainingArguments`` only when training.
    With the pipeline's stages timed at capture (``metrics.host.loader_stages``), the finding names
    the dominant stage with its share and adds the fix that fits it (``rules.stagefixes``); when
    no core is free, that fix replaces the generic "cache the tensors".
    False positives: a loader slowed by I/O stalls that more workers cannot fix; an iterable
    dataset with one shard."""
    dl = ctx.cat_union["dataloader"]
    frac = ctx.frac(iv.total(dl))
    if frac <= DATALOADER_FRAC:
        return None  # dataloader-bound-later judges the steps after the recorded ones
    gain = exclusive = ctx.frac(iv.total(ctx.exclusive["dataloader"]))
    h = host_cpu(ctx)
    numbers: dict[str, float | int | str | None] = {"dataloader_ms": m.host.dataloader_ms, "dataloader_frac": m.host.dataloader_frac,
               "gpu_idle_during_wait_frac": round(gain, 4), "threshold_frac": DATALOADER_FRAC}
    cpu_note = ""
    host, samples = m.host, m.samples
    if host.cpu_busy_cores is not None:
        numbers["cpu_busy_cores"] = host.cpu_busy_cores
        cpu_note = f" Host CPU samples: {host.cpu_busy_cores:.2f} cores busy on average"
        if host.usable_cores:
            numbers["usable_cores"] = host.usable_cores
            cpu_note += f" of {host.usable_cores:g} usable"
        if samples is not None and samples.workers_util_mean is not None:
            numbers["workers_cpu_util_mean_pct"] = samples.workers_util_mean
            cpu_note += f"; loader workers used {samples.workers_util_mean:.0f} % of a core"
        cpu_note += "."
    w = loader_wait(ctx)
    if w.median_ms is not None:
        numbers["wait_per_batch_ms"] = w.median_ms
    ahead = _workers_ahead(host, _running(h, w), w)
    advice, workers, enough = _worker_advice(h, host, loading_in_main(h, host.get("own_busy_cores"), frac), w, ahead)
    no_more = enough or _saturated(h, host)
    if workers is not None:
        numbers["suggested_num_workers"] = workers
    threads = _intra_op_threads(h, host, workers)
    method = "data-loader wait that does not overlap GPU work or other host activity"
    unjudged = _unjudged_idle(h, host, w)
    if unjudged:
        method = ("upper bound: the data-loader wait that does not overlap other work, what more workers could "
                  "hide; whether they can, the window is too short to tell: measure")
    elif not no_more:
        capture = (m.get("conditions") or {}).get("capture_options") or []
        wg = worker_gain(gain, host, workers, profiler_cost=any(o in COST_OPTIONS for o in capture),
                         handoff_share=worker_gain_share(w.median_ms, w.in_workers),
                         running=h.worker_count or (1 if w.in_workers else 0), threads_after=threads)
        gain, method = wg.gain, wg.method
        if wg.cores_available is not None:
            numbers["cores_available_with_workers"] = wg.cores_available
    stages = host.loader_stages
    # the batch made in one call removes the per-sample work where a worker only moves it, and
    # costs no core: it leads for a batch close to a hand-off, and for a TensorDataset (where it
    # needs no code of the user's) whose loading is CPU work, wherever the workers' estimate is
    # below what the slowest stage alone takes of the window
    removed = stages[0].share * exclusive if stages else 0.0
    drop_in = any(tensor_dataset_item(st.name) for st in stages or ())
    # the workers' fix takes intra-op threads the model was using, and they cost more than the wait
    # the workers would hide: the batch made at once (no core needed) and a measurement lead
    workers_lose = threads is not None and not no_more and not unjudged and gain < WORKERS_LOSE_GAIN
    stage_first = makes_batch_at_once(stages) and not no_more and not unjudged and (
        _marginal(w) or workers_lose
        or (drop_in and h.loader_cpu_bound is not False and w.in_workers is False and gain < removed))
    # the idle core the workers' estimate counts on is the one host-cores-idle's threads would take
    # (a loop on one intra-op thread): both cannot have it
    claim = threads_for_idle_cores(ctx, m)
    contested = (claim is not None and workers is not None and not no_more and not unjudged
                 and w.in_workers is False and h.loader_cpu_bound is not False and not _cheap_batch(w))
    if contested and claim is not None:
        numbers["idle_core_threads_gain"] = round(claim.gain, 4)
        advice += (f" The idle core this count relies on is also what more intra-op threads would use "
                   f"(host-cores-idle: {claim.threads} threads, up to {pct(claim.gain)} of the window): a CPU-bound "
                   "worker beside them takes a core from them, and a parallel operator waits for its slowest thread. "
                   "Set the threads first, then measure workers against none (benchmarks/threads_speedup.py "
                   "--loader, 2 cores: two threads saved 0.32–0.41 of the step; a worker beside them took 1.00–1.15× "
                   "as long as none).")
        method += "; assumes the idle core stays free for the workers, which more intra-op threads would take"
    if stage_first and exclusive > gain:
        workers_less = (f"workers would save less still, as each batch costs the main process a hand-off (about "
                        f"{HANDOFF_MS:g} ms)" if _marginal(w) else
                        "workers were estimated to save nothing: the fewer intra-op threads their fix sets slow the "
                        "model's operators more than the wait they would hide" if workers_lose else
                        f"workers were estimated to save {pct(gain)}, as the cores leave them little room")
        gain, method = exclusive, (
            "data-loader wait that does not overlap other work: the most the slowest stage's fix (the batch made "
            "in one call, not sample by sample) can save; it removes the per-sample indexing and stacking, not "
            "the batch's own copy, and each of the loader's many small operators carries the profiler's cost too, "
            f"so less is saved without the profiler; {workers_less}")
    if enough and ahead is not None and makes_batch_at_once(stages):
        gain, method = exclusive, (
            "estimate: the data-loader wait that does not overlap other work, which is the main process receiving "
            "each batch from a worker ahead of it: the batch made at once in the main process (its stage's fix, "
            "no workers) costs a fraction of that for data in memory; it runs low: the workers' own CPU, which "
            f"then returns to the model's threads, is not counted ({AHEAD_MEASURED})")
    if threads is not None:
        numbers["suggested_num_threads"] = threads
    loop = "training loop" if ctx.workload == "training" else "loop"
    if stages:
        top = stages[0]
        numbers.update(slowest_stage=top.name, slowest_stage_share=top.share,
                       slowest_stage_ms_per_batch=top.ms_per_batch, slowest_stage_where=top.where)
        advice += " " + stage_sentence(stages)
    later = later_share(ctx)
    if later is not None:
        numbers.update(later_wait_frac=round(later[0], 4), later_steps=later[1])
        if later[0] >= LATER_MORE * frac:
            advice += (f" After the recorded steps the loop waited longer: {pct(later[0])} of the time of the "
                       f"{later[1]:,} steps after them (every step timed), against {pct(frac)} here: the recorded "
                       "steps had batches made ahead of them, so the estimate here is low.")
    staged = stage_fixes(stages, ctx.device >= 0, ctx.workload == "training", waits=h.loader_cpu_bound is False)
    if unjudged:  # no count to give: measure, then the stage's fix
        fixes: tuple[Fix, ...] = (pytorch("Measure more workers than run now on this machine and keep the fastest "
                                          "(the tuner tries more than the cores while that pays)", TUNE_CODE,
                                          diagnostic=True), *staged)
    else:
        fixes = _with_stage_fixes(_fixes(ctx, h, workers, host, threads, no_more, _cheap_batch(w)), staged, no_more,
                                  _measure(w, workers, stage_first, contested, workers_lose))
    gathered = _batches_per_step(ctx)
    if gathered >= MIN_BATCHES_PER_STEP:
        n = round(gathered)
        advice += (f" The loop takes {n} batches from the loader for each optimizer step with one backward pass: "
                   "it stacks them into the step's batch itself, paying the loader's per-batch cost each time.")
        numbers["loader_batches_per_step"] = round(gathered, 1)
        fixes = (pytorch(f"Let the loader make the step's batch: batch_size {n} times what it is now, no stacking by "
                         "hand", GATHERED_CODE.format(n=n)), *fixes)
    return finding(
        severity=severity_for(gain), title=f"The {loop} waits for the data loader",
        why="""Each step asks the DataLoader for the next batch on the main Python thread. With few or
        no worker processes, loading and augmenting the batch happens right there, while """
            + ("the GPU has nothing queued and sits idle" if ctx.device >= 0 else "the model waits") + """.
        Worker processes prepare the next batches in parallel, so the batch is ready when the step asks
        for it — if there are free cores for them, and if a batch takes longer to make than to hand over
        from a worker.""",
        summary=f"{pct(frac)} of the window is spent waiting in the DataLoader "
                f"({m.host.dataloader_ms:.1f} ms); for {pct(exclusive)} of the window nothing else runs"
                f"{', GPU included' if ctx.device >= 0 else ''}." + cpu_note + " " + advice,
        numbers=numbers,
        windows=windows(dl[0], dl[1], "cpu", label="DataLoader wait"),
        est_gain=cap_by_critical_path(ctx, "dataloader-bound", gain), gain_method=method,
        fixes=fixes,
        doc_url=DOC,
    )


#: From this many DataLoader batches a training step (median) with at most one backward pass, the
#: loop gathers its step's batch from the loader's batches itself (a loader of ``batch_size=1``
#: and the samples stacked by hand), paying ``next()`` and the collation per piece: the loader
#: can make the whole batch. Gradient accumulation takes many batches too, each with its own
#: backward pass, and is left out.
MIN_BATCHES_PER_STEP = 8
GATHERED_CODE = """
# the loop stacks {n} of the loader's batches into each step's batch: let the loader make it
loader = DataLoader(dataset, batch_size={n} * batch_size, shuffle=True)   # batch_size: what it is now; keep your other arguments
for xb, yb in loader:
    ...   # the forward, backward and optimizer step on (xb, yb), with no stacking by hand
"""


def _batches_per_step(ctx: Context) -> float:
    """The median number of DataLoader ``next()`` calls in a training step with at most one
    backward pass (0 where no such step waits: inference, gradient accumulation)."""
    waits = main_waits(ctx)
    if not waits.size or ctx.workload != "training":
        return 0.0
    counts = [int(np.count_nonzero((waits >= lo) & (waits < hi)))
              for (lo, hi), p in zip(ctx.step_bounds, phase_intervals(ctx), strict=True) if p["backward"][0].size == 1]
    return median_of(counts) if counts else 0.0


#: Workers whose fix sets fewer intra-op threads are estimated to lose when they save less than
#: this share of the step (the slowdown of the model's operators outweighs the wait they hide).
WORKERS_LOSE_GAIN = 0.01
#: The steps after the recorded ones are said to wait longer when their share in the loader's
#: next() is at least this many times the window's (our choice: beyond the step-to-step spread of
#: a loader's waits, which come in bursts).
LATER_MORE = 2.0
#: gpumagic's tuner measures each setting's batches per second on this machine.
TUNE_CODE = """
import gpumagic

result = gpumagic.tune_dataloader(loader)   # batches per second for each num_workers, in bounded time
print(result.recommended_kwargs)            # then build the loader with them
"""


def later_share(ctx: Context) -> tuple[float, int] | None:
    """The share of the steps after the recorded ones spent waiting in the loader's next() (their
    own restarts left out), and how many; None without a step timer's waits."""
    block = everystep.block_of(ctx)
    found = None if block is None else everystep.later_waits(block)
    if found is None or found[1] <= 0:
        return None
    return found[0] / found[1], found[2]


def _with_stage_fixes(fixes: tuple[Fix, ...], staged: list[Fix], saturated: bool,
                      measure: tuple[Fix, ...] = ()) -> tuple[Fix, ...]:
    """The worker fixes, then those fitting the dominant stage; with no core free, the stage's fixes
    replace the generic "cache the tensors" (they make each batch cheaper where its time goes); for
    a batch close to a worker's hand-off (:func:`_marginal`, which ``measure`` comes with: the
    measurement that settles it), the stage's fixes come first, as they pay wherever the batch is
    made, then the measurement, then the workers, which may not pay."""
    if measure:
        return (*staged, *measure, *fixes) if not saturated else (*staged, *measure)
    if not staged:
        return fixes
    if saturated:
        return tuple(staged)
    return (*fixes, *staged)


def _intra_op_threads(h: HostCpu, host: HostMetrics, workers: int | None) -> int | None:
    """``torch.set_num_threads`` to leave CPU-bound workers their cores, when intra-op threads
    are in use (None: leave the threads alone)."""
    busy = host.get("own_other_threads_cores")
    if workers is None or not h.usable_cores or h.loader_cpu_bound is not True or busy is None or busy < INTRA_OP_CORES:
        return None
    return max(1, int(float(h.usable_cores)) - workers)


def _worker_advice(h: HostCpu, host: HostMetrics, moving: float = 0.0,
                   w: LoaderWait | None = None, ahead: float | None = None) -> tuple[str, int | None, bool]:
    """The sentence that says where the worker count comes from, the count (None: the fix
    computes it on the machine that runs it, or there is none to give), and whether workers
    cannot shorten the wait (no count then): a batch that loads in the main process faster than
    a worker's hand-off (:func:`_cheap_batch`), workers that deliver each batch as fast as it can
    be received, or workers running that already take what the spare cores allow
    (:func:`_enough_workers`). ``moving``: the loading the main process does itself now, which
    the workers would take over (:func:`~gpumagic.analysis.hostcpu.loading_in_main`). ``w``: the
    wait per batch and the loader's kind, from the trace (:mod:`~gpumagic.analysis.loaderwait`).
    ``ahead``: a batch's time in the workers running when they are ahead of the loop
    (:func:`_workers_ahead`), whose wait is then the hand-off."""
    w = w or LoaderWait(0, None, None)
    if _cheap_batch(w):
        return (f"A batch takes {w.median_ms:.2f} ms to load in the main process (num_workers=0; the median wait), "
                f"less than receiving it from a worker process costs the main process (about {HANDOFF_MS:g} ms "
                "measured for a batch of two tensors: each tensor's shared memory is fetched from the worker and "
                "mapped): workers would not shorten the wait; make each batch cheaper."), None, True
    if w.in_workers and w.median_ms is not None and w.median_ms <= HANDOFF_MS:
        return (f"Workers already deliver each batch about as fast as the main process can receive it (median wait "
                f"{w.median_ms:.2f} ms a batch; receiving one costs about {HANDOFF_MS:g} ms): more would not "
                "shorten the wait; make each batch cheaper, or larger so that fewer are handed over."), None, True
    running = _running(h, w)
    if ahead is not None and w.median_ms is not None and w.between_ms is not None:
        who = f"The {running} worker(s)" if h.worker_count is not None else "The workers (at least one)"
        return (f"{who} make a batch every {ahead:.2f} ms between them (their timed stages), while the loop asks for "
                f"one every {w.between_ms:.2f} ms: they are ahead, and the {w.median_ms:.2f} ms the loop still waits "
                "per batch is the main process receiving it from a worker (the batch's pickled handles come through "
                "a queue, and each tensor's shared memory is fetched from the worker and mapped): more workers would "
                "not shorten it; make each batch cheaper to hand over (fewer, larger batches), or, for data already "
                "in memory, make the batch in the main process at once."), None, True
    if _saturated(h, host):
        return (f"The usable cores are saturated ({pct(h.saturation or 0.0)} of {h.usable_cores:g}) by this process's own "
                "threads and loading is CPU work: more workers will not help; see host-cpu-saturated."), None, False
    if _crowded(h, host):
        n = max(1, int(float(h.usable_cores or 1)) - 1)  # the main process needs a core too
        return (f"Other processes keep {host['other_busy_cores']:.1f} of {h.usable_cores:g} usable cores busy and loading "
                f"is CPU work: {n} worker(s) would get a larger share of the cores (the scheduler splits them between "
                "runnable threads), at the neighbours' expense; step times will change when their load does."), n, False
    if h.loader_cpu_bound is False and h.usable_cores:
        n = 2 * int(max(1, float(h.usable_cores)))
        return (f"The wait is mostly not CPU work ({h.loader_cpu_source}): workers waiting on I/O need no core "
                f"each, so {n} workers (2 per usable core) can help."), n, False
    suggested = suggested_workers(h, moving)
    busy = "" if h.busy_cores is None else f", {h.busy_cores:.1f} busy on average"
    if _enough_workers(running, suggested) and _unjudged_idle(h, host, w):
        used = host.get("own_workers_cores")
        seen = (f"used {used:.2f} core(s) in all ({h.busy_cores:.1f} of the {h.usable_cores:g} usable busy on average)"
                if used is not None else
                f"leave {float(h.usable_cores or 0) - (h.busy_cores or 0):.1f} of the {h.usable_cores:g} usable cores "
                f"idle ({h.busy_cores:.1f} busy on average)")
        return (f"The {h.worker_count} worker(s) running {seen} while the loop waited for them: loading that computed "
                "would keep a core busy per worker, so it may wait (reads from disk or the network), and workers that "
                "wait need no core each; the window is too short for the CPU samples to tell. Measure more workers "
                "before choosing."), None, False
    if _enough_workers(running, suggested):
        who = (f"The {h.worker_count} worker(s) running" if h.worker_count is not None else
               "The workers running (the trace's loader is the multi-process one; how many it does not record)")
        return (f"{who} already take what the cores allow ({h.usable_cores:g} usable{busy}, "
                "recorded at capture): more would not help; make each batch cheaper."), None, True
    if _marginal(w) and suggested is not None and not moving:
        return (f"{suggested} worker(s): what the spare cores allow ({h.usable_cores:g} usable{busy}, recorded at "
                f"capture); but a batch takes only {w.median_ms:.2f} ms to load in the main process (the median "
                f"wait), close to what receiving one from a worker costs it (about {HANDOFF_MS:g} ms): workers may "
                "save little or cost more; measure before you switch."), suggested, False
    unknown = ("; the loader already runs workers, how many the trace does not record: more help only if fewer "
               "than that run") if h.worker_count is None and w.in_workers else ""
    if suggested is not None:
        if moving > 0:  # loading_in_main: only with CPU samples (busy cores known)
            return (f"{suggested} worker(s): what the cores allow once the loading leaves the main process "
                    f"({h.usable_cores:g} usable{busy}, {moving:.1f} of it the main process loading batches itself, "
                    "work the workers take over; recorded at capture)."), suggested, False
        return (f"{suggested} worker(s): what the spare cores allow ({h.usable_cores:g} usable{busy}, "
                f"recorded at capture{unknown})."), suggested, False
    return ("The trace does not record how many cores the run could use: the worker count in the fix is "
            "computed on the machine that runs it (an assumption: one core per worker, one for the main process"
            f"{unknown})."), None, False


#: A core is idle when the busy cores leave at least this much of the usable ones.
IDLE_CORE = 1.0


def _unjudged_idle(h: HostCpu, host: HostMetrics, w: LoaderWait | None = None) -> bool:
    """Workers run, the samples cannot say whether their loading computes (too short a window),
    and while the loop waited for them either a whole usable core stayed idle, or the workers
    themselves used under half a core each (``host.own_workers_cores``) though their timed stages
    say they are what the loop waits for (:func:`_workers_pace`): CPU-bound workers would have kept
    their cores busy, so "the cores allow no more" is not shown (the busy cores may be the main
    process's, the profiler's own work included)."""
    if h.loader_cpu_bound is not None or not h.worker_count or h.busy_cores is None or not h.usable_cores:
        return False
    if float(h.usable_cores) - h.busy_cores >= IDLE_CORE:
        return True
    workers_cores = host.get("own_workers_cores")
    return (workers_cores is not None and workers_cores < LOADER_CPU_SHARE * h.worker_count
            and _workers_pace(host, h.worker_count, w))


def _workers_pace(host: HostMetrics, running: int, w: LoaderWait | None) -> bool:
    """The workers set the loop's pace: their timed stages take at least half the loop's wait per
    batch, shared between them (each worker's batch ÷ the workers ≥ half the wait). Otherwise the
    wait is the main process receiving each batch (a small batch's hand-off: a TensorDataset's
    workers make theirs in a fraction of the wait), which more workers do not shorten."""
    stages = host.loader_stages
    if not stages or w is None or w.median_ms is None or running <= 0 or _workers_ahead(host, running, w):
        return False
    in_workers = sum(s.ms_per_batch for s in stages if s.where == "worker")
    return in_workers / running >= 0.5 * w.median_ms


def _running(h: HostCpu, w: LoaderWait) -> int | None:
    """The workers running: the CPU samples' count, else 1 when the trace's loader is the
    multi-process one (at least one), else None."""
    return h.worker_count if h.worker_count is not None else (1 if w.in_workers else None)


#: benchmarks/loader_handoff.py case 2c on this project's 2-core machine (2026-12-07, 5 alternated rounds).
AHEAD_MEASURED = ("benchmarks/loader_handoff.py case 2c: 64 images of 3×64×64 a batch from a TensorDataset in two "
                  "workers ahead of a small CNN; the batch made at once in the main process saved 0.53 of the step "
                  "where the estimate was 0.28, and four workers 0.08")
#: Workers are ahead when they make a batch (their timed stages' time per batch, shared between
#: them) in at most this share of the loop's own work per batch: with the profiler's cost on the
#: stages' timing and the batches' jitter, half leaves room either way. At that pace they fill
#: DataLoader's prefetch queue (``prefetch_factor`` batches a worker) and the loop waits only for
#: the hand-off (a 0.8 MB batch of two tensors: 1.6 ms a batch here with two workers that had
#: every batch ready, against 1.2 ms recorded for a small CNN's loop).
AHEAD_SHARE = 0.5


def _workers_ahead(host: HostMetrics, running: int | None, w: LoaderWait) -> float | None:
    """The ms a batch takes the workers running, shared between them (their timed stages in the
    worker processes ÷ the workers), when it is at most :data:`AHEAD_SHARE` of the loop's own
    work per batch (the median time between two waits): they make batches faster than the loop
    asks for them, and the wait is receiving each one. None otherwise, or without the stages, the
    multi-process loader or two batches in the window, or with workers restarted in it (each
    epoch's new workers start behind: ``dataloader-worker-restarts``)."""
    stages = host.loader_stages
    if not stages or not running or not w.in_workers or w.between_ms is None or w.restarts:
        return None
    per_batch = sum(s.ms_per_batch for s in stages if s.where == "worker") / running
    return per_batch if 0 < per_batch <= AHEAD_SHARE * w.between_ms else None


def _enough_workers(running: int | None, suggested: int | None) -> bool:
    """Workers are running (``running``: how many, at least; from the CPU samples, else 1 when the
    trace's loader is the multi-process one) and the cores allow no more than there are (the
    recorded busy cores leave no spare one): a count at or below theirs would be no fix."""
    return bool(running) and suggested is not None and suggested <= (running or 0)


def _marginal(w: LoaderWait) -> bool:
    """A single-process batch that loads in more than a hand-off but not much more
    (:data:`~gpumagic.analysis.loaderwait.MARGINAL_MS`): workers may not pay."""
    return w.in_workers is False and w.median_ms is not None and HANDOFF_MS < w.median_ms <= MARGINAL_MS


def _measure(w: LoaderWait, workers: int | None, stage_first: bool = False, contested: bool = False,
             losing: bool = False) -> tuple[Fix, ...]:
    """For a marginal batch, one whose stage fix leads (``stage_first``: the workers' estimate is
    below what that stage takes), one whose workers would take the idle core more intra-op
    threads want (``contested``), or whose workers' fix takes threads the model uses (``losing``),
    the measurement that settles it: gpumagic's DataLoader tuner times ``num_workers=0`` against
    worker processes on this machine."""
    if not (_marginal(w) or stage_first or contested or losing):
        return ()
    why = ("the batch is close to a worker's hand-off" if _marginal(w) else
           "a worker's core comes from the intra-op threads the model uses" if losing else
           "the busy cores leave a worker little room" if stage_first else
           "after setting the intra-op threads (host-cores-idle), which want the same idle core")
    grid = f"num_workers=[0, {workers}]" if workers else "num_workers=None"
    return (pytorch(f"Measure num_workers=0 against workers on this machine before switching: {why}",
                    "import gpumagic\n\n"
                    f"result = gpumagic.tune_dataloader(loader, {grid})   # batches per second, each setting\n"
                    "print(result.recommended_kwargs)", diagnostic=True),)


def _cheap_batch(w: LoaderWait) -> bool:
    """The loop loads in the main process (the trace's loader is the single-process one) and a
    batch takes no longer to load there than a worker's hand-off costs the main process
    (:data:`~gpumagic.analysis.loaderwait.HANDOFF_MS`): workers cannot shorten the wait."""
    return w.in_workers is False and w.median_ms is not None and w.median_ms <= HANDOFF_MS


def _full(h: HostCpu) -> bool:
    """No core is free, by as many samples as ``host-cpu-saturated`` needs (one sample, after a
    window shorter than the sampling period, is not an average)."""
    return h.saturation is not None and h.saturation >= SATURATION and h.sample_count >= MIN_SAMPLES


def _saturated(h: HostCpu, host: HostMetrics) -> bool:
    """No core is free, loading is CPU work and the busy cores are not mostly other processes'
    (the case where ``host-cpu-saturated`` says workers cannot help)."""
    return _full(h) and h.loader_cpu_bound is True and saturated_by(host) != "others"


def _crowded(h: HostCpu, host: HostMetrics) -> bool:
    """No core is free, loading is CPU work, and other processes did most of the busy time."""
    return _full(h) and h.loader_cpu_bound is True and saturated_by(host) == "others" and bool(h.usable_cores)


def _fixes(ctx: Context, h: HostCpu, workers: int | None, host: HostMetrics, threads: int | None = None,
           no_more: bool = False, cheap_batch: bool = False) -> tuple[Fix, ...]:
    if cheap_batch:  # the per-sample indexing and stacking is what a cheap batch costs: index it at once
        return (pytorch("Workers cannot beat a batch this cheap: load it in one indexing call instead of one per "
                        "sample, automatic batching off (source: " + BATCHING_SOURCE + ")",
                        batch_sampler_code(ctx.workload == "training")),)
    if no_more or _saturated(h, host):
        why = ("No core is free for workers (see host-cpu-saturated)" if _saturated(h, host)
               else "No core is free for more workers than those running")
        return (pytorch(why + ": make each batch cheaper; " + CACHE_FIX[0].lower() + CACHE_FIX[1:], CACHE_CODE),)
    gpu, training = ctx.device >= 0, ctx.workload == "training"
    head = "" if workers is not None else (
        "import os\nusable_cores = len(os.sched_getaffinity(0)) if hasattr(os, \"sched_getaffinity\") else os.cpu_count()\n")
    count = str(workers) if workers is not None else "max(1, usable_cores - 1)"
    lines = ["dataset, batch_size=batch_size" + (", shuffle=True" if training else "") + ",",
             f"num_workers={count}," + ("" if workers is not None else "   # assumption: one core per worker"),
             "persistent_workers=True,"] + (["pin_memory=True,"] if gpu else [])
    code = head + "loader = torch.utils.data.DataLoader(\n" + "".join(f"    {ln}\n" for ln in lines) + ")"
    if threads is not None:  # CPU-bound workers beside busy intra-op threads: leave the workers their cores
        code = (f"torch.set_num_threads({threads})   # intra-op threads: the cores the {workers} worker(s) leave\n"
                + code)
    fixes = [pytorch("Load batches in worker processes" + (", into pinned memory," if gpu else "")
                     + " and keep the workers alive", code)]
    if training:
        fixes.append(huggingface("The same through TrainingArguments",
                                 head + f"TrainingArguments(..., dataloader_num_workers={count}"
                                 + (", dataloader_pin_memory=True" if gpu else "")
                                 + ", dataloader_persistent_workers=True)"))
    return tuple(fixes)
