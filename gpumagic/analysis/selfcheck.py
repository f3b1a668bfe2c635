"""What the trace can and cannot support: one precise note per limit, before any finding.

A counter-mode capture, a non-GPU accelerator, a trace without device properties, a window cut
from a longer trace, a window with (almost) nothing in it, a trace without GPU activity — each
gets its own note instead of the generic "CPU activity only", and an empty window is not
analysed at all (``analysis.analyze``).
"""

from __future__ import annotations

import numpy as np

from gpumagic.analysis.context import GAP_CAUSES, LONG_GAP_NS, QUEUED_CAUSES, Context
from gpumagic.trace.links import EVALUATE_PREFIX

#: Kineto activity categories of the CUPTI range (counter) profiler — ``ActivityType::
#: CUDA_PROFILER_RANGE``, written as ``cuda_profiler_range`` (libkineto ActivityType.cpp).
COUNTER_CATEGORIES = frozenset({"cuda_profiler_range"})
#: Kineto categories of accelerators that are not CUDA or ROCm GPUs (libkineto ActivityType.cpp:
#: ``mtia_runtime``, ``mtia_ccp_events``, ``mtia_insight`` for Meta's MTIA; ``hpu_op`` for
#: Gaudi; ``privateuse1_runtime``/``privateuse1_driver`` for out-of-tree backends; ``glow_runtime``).
OTHER_ACCELERATOR_CATEGORIES = frozenset({"mtia_runtime", "mtia_ccp_events", "mtia_insight", "hpu_op",
                                          "privateuse1_runtime", "privateuse1_driver", "glow_runtime"})
#: "(Almost) nothing recorded": no GPU event and fewer than this many operator or runtime events
#: (annotations, Python frames and step markers alone are the profiler's frame, not work).
EMPTY_MAX_EVENTS = 1
#: Rules whose signal sets host time against GPU activity (the GPU idle while the host loads data,
#: runs Python, launches, syncs; kernels too short for their launches; no kernels at all). A
#: counter-mode trace does not time its kernels, and a trace with no host event records nothing
#: of the host side: these rules are not run on either (:func:`host_rules_unjudged`), and a note
#: says so.
HOST_RULE_IDS = ("dataloader-bound", "host-cpu-saturated", "cpu-bound", "launch-bound", "host-sync",
                 "too-small-for-gpu", "model-on-cpu")
#: GPU events whose correlation id matches no launch call in the trace, as a share of them: above
#: this, the trace lost its launching side (a cut or a merge of partial files).
UNLINKED_FRAC = 0.10


def categories(ctx: Context) -> set[str]:
    return set(ctx.trace.meta.get("categories") or ())


def is_empty(ctx: Context) -> bool:
    """Almost nothing was recorded in the window: no GPU work and fewer than
    :data:`EMPTY_MAX_EVENTS` operators or runtime calls."""
    m = ctx.masks
    if ctx.events_in_window(m["gpu"]).any():
        return False
    return int(np.count_nonzero(ctx.events_in_window(m["cpu_op"] | m["runtime"]))) < EMPTY_MAX_EVENTS


def is_counter_mode(ctx: Context) -> bool:
    """The trace holds CUPTI range-profiler (counter) events: kernels are counted, not timed."""
    return bool(categories(ctx) & COUNTER_CATEGORIES)


def has_host_events(ctx: Context) -> bool:
    """Any operator, runtime call or Python frame recorded on the host in the window."""
    m = ctx.masks
    return bool(ctx.events_in_window(m["host"] & (m["cpu_op"] | m["runtime"] | m["python"])).any())


def host_rules_unjudged(ctx: Context) -> frozenset[str]:
    """The ids of :data:`HOST_RULE_IDS` when the trace cannot support them (counter mode, or no
    host event at all), else none."""
    return frozenset(HOST_RULE_IDS) if is_counter_mode(ctx) or not has_host_events(ctx) else frozenset()


def gpu_runtime_calls(ctx: Context) -> int:
    """CUDA/HIP runtime and driver calls in the trace (the GPU side of the host was recorded)."""
    return int(np.count_nonzero(ctx.masks["runtime"]))


def notes(ctx: Context, model_on_cpu: bool) -> list[str]:
    """The self-check notes, in order: empty window, counter mode, other accelerators, no GPU
    activity, no device properties, partial window, training without an optimizer step,
    communication undercounted."""
    out: list[str] = []
    cats = categories(ctx)
    if is_empty(ctx):
        out.append("Almost nothing was recorded in the window (no GPU work, no operator, no runtime call: only "
                   "markers and frames): the profiler may have started after the work "
                   "ran, or its schedule skipped every step (wait + warmup longer than the loop). Nothing was "
                   "analysed.")
        return out
    if cats & COUNTER_CATEGORIES:
        out.append("Counter-mode trace (CUPTI range profiler: cuda_profiler_range events): kernels are counted, "
                   "not timed as activities, so GPU busy time, idle gaps and kernel findings are not judged; runtime "
                   "calls and context creation are. Nor are the rules that set host time against GPU activity: "
                   f"{', '.join(HOST_RULE_IDS)} were not run.")
    elif not has_host_events(ctx):
        out.append("No host event in the trace (no operator, runtime call or Python frame): the host side was not "
                   f"recorded, so {', '.join(HOST_RULE_IDS)} were not run.")
    other = sorted(cats & OTHER_ACCELERATOR_CATEGORIES)
    if other:
        out.append(f"The trace records a non-GPU accelerator ({', '.join(other)} events): gpumagic judges CUDA "
                   "and ROCm GPUs; that device's work is not analysed.")
    said = any("CPU activity only" in n for n in ctx.trace.notes)
    if ctx.device < 0 and not model_on_cpu and not cats & COUNTER_CATEGORIES and not other and not said:
        if gpu_runtime_calls(ctx) == 0:
            out.append("No GPU runtime events, CPU activity only: the trace was recorded without GPU activity "
                       "(ProfilerActivity.CUDA missing from activities=[...]) or on a machine without a GPU; only the "
                       "CPU side is analysed.")
        else:
            out.append("CUDA/HIP runtime calls were recorded but no GPU kernel or copy: the GPU side of the "
                       "trace is missing; only the CPU side is analysed.")
    if ctx.device >= 0 and not ctx.trace.devices:
        info = ctx.device_info
        arch = (f"; compute capability {info.compute_capability:.1f} or later is read from kernel names"
                if info is not None else "")
        out.append("No deviceProperties in the trace: the GPU's model and memory are unknown (no peak "
                   f"FLOP/s, no MFU, no memory share){arch}.")
    out += _partial(ctx)
    if _trains_without_optimizer(ctx):
        out.append("The code ran backward passes but no torch.optim optimizer step (a weight update written by hand, "
                   "such as p -= lr * p.grad for each parameter, or an optimizer of another library): gpumagic finds "
                   "training steps at optimizer.step(), so this window has none, and the rules that judge a step "
                   "(the loop's own code, operator overhead, step outliers) were not run. "
                   "torch.optim.SGD(model.parameters(), lr=lr) makes the same update as p -= lr * p.grad, with "
                   "optimizer.zero_grad() for the zeroing, and marks each step.")
    if _comm_undercounted(ctx):
        out.append("The program communicates (collective operators on the host or several ranks) but no GPU "
                   "kernel is recognised as a collective by name: communication time may be undercounted "
                   "(a library whose kernels gpumagic does not know).")
    return out


def _trains_without_optimizer(ctx: Context) -> bool:
    """A gpumagic capture's window without steps whose operators ran backward passes (the
    autograd engine's nodes) and no ``Optimizer.step#`` annotation: training that torch.optim
    does not step (a trace from elsewhere has its own step markers, or says it has none)."""
    if ctx.step_bounds or not isinstance(ctx.trace.meta.get("capture"), dict):
        return False
    ev, m = ctx.trace.events, ctx.masks
    host = ctx.events_in_window(m["host"])
    engine = host & ctx.host_name_ids(lambda n: n.startswith(EVALUATE_PREFIX))[ev.name]
    stepped = host & ctx.host_name_ids(lambda n: n.startswith(("Optimizer.step#", "optimizer.step")))[ev.name]
    return bool(engine.any()) and not stepped.any()


def _comm_undercounted(ctx: Context) -> bool:
    """``communication.maybe_undercounted``, from the same facts (a world of one rank moves nothing)."""
    m = ctx.masks
    if ctx.device < 0 or (m["kernel"] & m["name_nccl"]).any():
        return False
    world = (ctx.trace.meta.get("distributed") or {}).get("world_size")
    if world == 1:
        return False
    return bool(ctx.events_in_window(m["name_comm_host"] & m["host"]).any()) or (world or 0) > 1


def _partial(ctx: Context) -> list[str]:
    """A window cut from a longer trace: GPU events whose launch is missing, or a leading GPU gap
    of work queued long before it ran with nothing recorded in between."""
    out: list[str] = []
    if ctx.device < 0:
        return out
    m = ctx.masks
    gpu = ctx.events_in_window(m["gpu"] & ctx.on_device)
    n = int(np.count_nonzero(gpu))
    unlinked = int(np.count_nonzero(gpu & (ctx.launch_row < 0)))
    if n and unlinked / n > UNLINKED_FRAC and gpu_runtime_calls(ctx):
        out.append(f"{unlinked} of {n} GPU events have no launching call in the trace: it may be cut from a "
                   "longer one or merged from partial files (a partial window); host-side causes of their gaps "
                   "cannot be told.")
    g = ctx.gaps
    if len(g) and g.start_ns[0] == ctx.lo and g.dur_ns[0] >= LONG_GAP_NS \
            and GAP_CAUSES[g.cause[0]] in QUEUED_CAUSES and g.next_event[0] >= 0:
        waited = int(g.end_ns[0] - max(int(ctx.launch_ts[g.next_event[0]]), ctx.lo))
        out.append(f"The GPU's first work in the window was queued {waited / 1e6:.1f} ms before it ran, with "
                   "nothing recorded on the GPU before it: the window was probably cut from a longer trace (a "
                   "partial window); the work the queue waited on is not in it.")
    return out
