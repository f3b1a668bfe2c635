"""``launch-bound`` and ``cpu-bound``: the host cannot issue work fast enough."""

from __future__ import annotations

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis import names as nm
from gpumagic.analysis.context import Context
from gpumagic.analysis.generation import GENERATE_GPU_CODE, generation
from gpumagic.analysis.metrics import cap_by_critical_path
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: Most kernels tiny: at least half of them under 10 µs (context.SHORT_KERNEL_NS).
SHORT_KERNEL_SHARE = 0.5
#: The GPU must also be under-used for launch overhead to matter (issue anchor: < 50 % busy).
BUSY_MAX = 0.5
#: Host launch pressure: CUDA runtime/driver calls cover ≥ 25 % of the window, or the GPU's
#: idle time is mostly waiting for launches (HTA host wait + kernel wait ≥ 50 % of idle).
RUNTIME_FRAC = 0.25
LAUNCH_IDLE_SHARE = 0.5
#: cpu-bound: the GPU waits on the host (HTA host wait) for ≥ 20 % of the window, mostly while
#: the main thread runs operators (≥ 50 % of that wait), not the data loader.
HOST_WAIT_FRAC = 0.20
CPU_OP_SHARE = 0.5
#: A step whose kernels are mostly (≥ half) replayed by graph launches (cudaGraphLaunch /
#: hipGraphLaunch) already pays one launch per graph, not per kernel: it is not launch-bound
#: (CUDA Programming Guide, "CUDA Graphs": a graph launch submits all its nodes at once).
GRAPH_REPLAY_SHARE = 0.5
GRAPHS_DOC = "https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs"
COMPILE_DOC = "https://pytorch.org/docs/stable/torch.compiler.html"
#: After PyTorch's CUDA Graphs notes: warm up on a side stream before capture (the notes require
#: it, so lazy initialisation and autotuning happen outside the graph), capture under no_grad for
#: inference, and read outputs before the next replay overwrites them.
GRAPH_INFERENCE_CODE = """
model.eval()
static_x = torch.randn(batch_shape, device="cuda")   # replays always read this tensor
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.no_grad(), torch.cuda.stream(side):        # warm up on a side stream first
    for _ in range(3):
        model(static_x)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.no_grad(), torch.cuda.graph(graph):
    static_y = model(static_x)
for x in batches:                  # same shape every time
    static_x.copy_(x)
    graph.replay()
    out = static_y.clone()         # the next replay overwrites static_y"""
#: Training: ``make_graphed_callables`` graphs a module's forward and backward (CUDA Graphs
#: notes, "Partial-network capture"); under autocast it needs ``cache_enabled=False`` (its
#: docstring: "The automatic mixed precision is supported in make_graphed_callables only with
#: disabled caching"). ``torch.compile(model, mode="reduce-overhead")`` likewise graphs forward and
#: backward (AOTAutograd), not ``optimizer.step()``, which is compiled on its own (PyTorch recipe
#: "(beta) Compiling the optimizer with torch.compile"); capturing the whole step by hand is the
#: notes' "Whole-network capture", with a ``capturable=True`` optimizer. Checked on an H200 (torch
#: 2.11): with a forward pass still awaiting its backward, the capture fails with
#: cudaErrorStreamCaptureInvalidated, hence the comment.
GRAPH_TRAINING_CODE = """
# once, before the training loop: a forward pass whose backward has not run yet (a live
# autograd graph) invalidates the capture
sample_x = torch.randn(batch_shape, device="cuda", requires_grad=False)
model = torch.cuda.make_graphed_callables(model, (sample_x,))   # forward + backward replayed
# under autocast: torch.autocast("cuda", dtype=..., cache_enabled=False) around the graphed model
# or let torch.compile graph forward and backward, and compile the optimizer step on its own:
# model = torch.compile(model, mode="reduce-overhead")
# step = torch.compile(opt.step)   # call step() where you called opt.step()
# whole-step capture by hand (CUDA Graphs notes): an optimizer made with capturable=True"""


@rule("launch-bound")
def launch_bound(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: most kernels last under 10 µs, the GPU is busy < 50 % of the window, the host
    is busy launching (runtime calls ≥ 25 % of the window, or host wait + launch latency ≥ 50 %
    of GPU idle time), and fewer than half the kernels are replayed by graph launches (a graph
    replay is already one launch for the whole step). Gain: GPU idle time classified host wait
    or launch latency (what fewer, larger launches — CUDA graphs, torch.compile fusion — can
    recover). False positives: small inference batches where latency, not throughput, is the
    goal (the fix still applies)."""
    k, busy = m.kernels, m.gpu.busy_frac
    if not k.count or k.short_frac is None or k.short_frac < SHORT_KERNEL_SHARE or busy is None or busy >= BUSY_MAX:
        return None
    if (k.graph_frac or 0) >= GRAPH_REPLAY_SHARE:
        return None
    runtime_frac = ctx.frac(iv.total(ctx.cat_union["runtime"]))
    launch_idle_ns = ctx.idle_ns["host_wait"] + ctx.idle_ns["launch_latency"]
    idle_ns = sum(ctx.idle_ns.values()) or 1
    if runtime_frac < RUNTIME_FRAC and launch_idle_ns / idle_ns < LAUNCH_IDLE_SHARE:
        return None
    gain = ctx.frac(launch_idle_ns)
    return finding(
        severity=severity_for(gain),
        title="The GPU waits for launches of tiny kernels",
        why="""Every kernel costs the host several microseconds to launch (Python, the PyTorch
        dispatcher, the CUDA driver). When most kernels finish faster than that, the GPU completes each
        one before the next arrives and idles in between. Fusing operations (torch.compile) or replaying
        a recorded sequence of launches at once (CUDA graphs) removes most of the per-kernel cost.""",
        summary=f"{pct(k.short_frac)} of {k.count} kernels run under {k.short_kernel_us:.0f} µs "
                f"(median {k.median_us:.1f} µs); the GPU is busy {pct(busy)} of the window; "
                f"CUDA runtime calls cover {pct(runtime_frac)} of it.",
        numbers={"kernels": k.count, "short_kernel_frac": k.short_frac, "median_kernel_us": k.median_us,
                 "gpu_busy_frac": busy, "runtime_frac": round(runtime_frac, 4),
                 "launch_wait_ms": round(launch_idle_ns / 1e6, 3)},
        windows=windows(*launch_wait(ctx), "gpu", ctx.device, "waiting for launch"),
        est_gain=cap_by_critical_path(ctx, "launch-bound", gain),
        gain_method="GPU idle time classified as host wait or launch latency (HTA definitions)",
        fixes=_launch_fixes(ctx),
        doc_url=GRAPHS_DOC,
    )


def launch_wait(ctx: Context) -> iv.Intervals:
    """The time ``launch-bound`` recovers: host-wait parts of gaps and launch-latency gaps."""
    return iv.merge(ctx.gaps.host_wait(), ctx.gaps.of_cause("launch_latency").intervals)


def _launch_fixes(ctx: Context) -> tuple[Fix, ...]:
    compile_fix = pytorch("Fuse kernels with torch.compile; mode='reduce-overhead' also replays CUDA graphs (its "
                          "outputs are overwritten by the next call: clone what you keep across steps)",
                          "model = torch.compile(model, mode=\"reduce-overhead\")")
    if ctx.workload != "training":
        if ctx.workload == "inference" and generation(ctx).decoding:  # generate() runs the module's own forward
            return (_generate_fix(), compile_fix)
        return (compile_fix, pytorch("Or replay a recorded forward pass with a CUDA graph", GRAPH_INFERENCE_CODE))
    return (
        compile_fix,
        pytorch("Training: graph forward and backward (the optimizer stays eager unless compiled on its own)",
                GRAPH_TRAINING_CODE),
        pytorch("Use a fused optimizer: a few multi-tensor kernels for all parameters (foreach, the CUDA default, "
                "already groups tensors; fused also fuses the update math)",
                "opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)"),
        huggingface("Through TrainingArguments (torch_compile alone uses the default mode, without CUDA graphs)",
                    "TrainingArguments(..., torch_compile=True, torch_compile_mode=\"reduce-overhead\")"),
    )


def _generate_fix() -> Fix:
    """The compile fix for token-by-token generation (``analysis.generation``): ``generate()`` calls
    the model's own forward, which ``torch.compile(model)`` leaves uncompiled; a static cache
    makes transformers compile it on a GPU."""
    return huggingface("Token-by-token generation: give generate() a static key/value cache, and it compiles the "
                       "model's forward itself, with CUDA graphs (torch.compile(model) does not reach what generate() "
                       "runs; for a decoding loop of your own, the next fix)", GENERATE_GPU_CODE)


@rule("cpu-bound")
def cpu_bound(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the GPU waits on the host (the host-wait parts of idle gaps, split at the launch)
    for ≥ 20 % of the window while the main thread runs operators or Python (≥ 50 % of that
    wait), not the data loader, and the kernels are not tiny (that case is ``launch-bound``).
    The title names the innermost frame that covers most of it. Gain: the host-wait time covered
    by main-thread operator work. False positives: deliberate CPU work (metrics, logging) that
    could be moved out of the loop rather than sped up."""
    gaps = ctx.gaps.host_wait()
    hw_ns = iv.total(gaps)
    if ctx.frac(hw_ns) < HOST_WAIT_FRAC or (m.kernels.short_frac or 0) >= SHORT_KERNEL_SHARE:
        return None
    busy_in_wait = host_ops_in_wait(ctx)
    share = iv.total(busy_in_wait) / max(hw_ns, 1)
    if share < CPU_OP_SHARE:
        return None
    gain = ctx.frac(iv.total(busy_in_wait))
    where = busiest_frame(ctx, busy_in_wait)
    creation = host_creation_share(ctx, busy_in_wait)
    fixes = [pytorch("Compile the model to cut Python and dispatcher overhead", "model = torch.compile(model)"),
             pytorch("Give the GPU more work per launch",
                     "loader = DataLoader(dataset, batch_size=2 * batch_size)  # keep your other arguments")]
    if creation >= CREATION_SHARE:  # the host builds tensors on the CPU and copies them: not compile's job
        fixes = [pytorch("Create the tensors on the GPU (or prefetch them): the host builds them on the CPU and "
                         "copies them over, and compiling the model does not change that", CREATE_ON_DEVICE_CODE),
                 fixes[1]]
        where = where or "CPU-side tensor creation"
    if ctx.workload == "training" and creation < CREATION_SHARE:
        fixes.append(huggingface("Through TrainingArguments",
                                 "TrainingArguments(..., torch_compile=True)"))
    elif ctx.workload == "inference" and creation < CREATION_SHARE and generation(ctx).decoding:
        fixes.insert(0, _generate_fix())
    return finding(
        severity=severity_for(gain),
        title=f"GPU idle while the host is in {where}" if where else "Host-side Python and operators keep the GPU waiting",
        why="""The GPU can only run what the host has queued. Here the main thread spends long stretches in
        Python and operator code between launches, so the queue runs dry and the GPU idles. Less host
        work per step (compiling the model, larger batches, moving bookkeeping out of the loop) lets the
        host stay ahead of the GPU.""",
        summary=f"The GPU waits on the host for {pct(ctx.frac(hw_ns))} of the window; the main thread runs "
                f"operators/Python for {pct(share)} of that wait" + (f", most of it in {where}" if where else "") + ".",
        numbers={"host_wait_ms": m.idle.host_wait_ms, "host_wait_frac": round(ctx.frac(hw_ns), 4),
                 "cpu_busy_share_of_wait": round(share, 4), "host_tensor_creation_share": round(creation, 4)},
        windows=windows(gaps[0], gaps[1], "gpu", ctx.device, "GPU waiting for host"),
        est_gain=cap_by_critical_path(ctx, "cpu-bound", gain),
        gain_method="host-wait idle time during which the main thread ran operators or Python",
        fixes=tuple(fixes),
        doc_url=COMPILE_DOC,
    )


#: Host tensor creation (``names.TENSOR_CREATION_OPS`` running on the CPU, with host-to-device
#: copies in the window) covering at least 30 % of the operator time in the GPU's wait.
CREATION_SHARE = 0.3
CREATE_ON_DEVICE_CODE = """
noise = torch.randn(batch_shape, device="cuda")           # built on the GPU: no CPU work, no copy
positions = torch.arange(batch_shape[-1], device="cuda")
# data that must come from the host: pinned, copied without blocking, while the GPU works
host_x = torch.randn(batch_shape).pin_memory()
x = host_x.to("cuda", non_blocking=True)"""


def host_creation_share(ctx: Context, during: iv.Intervals) -> float:
    """Share of ``during`` covered by tensor-creation operators on the main thread that launched
    no GPU work (they ran on the CPU), when the window also copies host to device."""
    ev, msk = ctx.trace.events, ctx.masks
    total = iv.total(during)
    if not total:
        return 0.0
    htod = ctx.trace.name_ids(lambda n: n.startswith("Memcpy HtoD"))[ev.name] & msk["memcpy"]
    if not ctx.events_in_window(htod).any():
        return 0.0
    main = ev.lane == ctx.main_lane
    made = np.flatnonzero(ctx.events_in_window(main & msk["cpu_op"] & ctx.host_name_ids(
        nm.TENSOR_CREATION_OPS.__contains__)[ev.name]))
    if made.size == 0:
        return 0.0
    launches = np.sort(ev.ts_ns[main & msk["runtime"] & ctx.host_name_ids(lambda n: "Launch" in n)[ev.name]])
    s, e = ev.ts_ns[made], ev.ts_ns[made] + ev.dur_ns[made]
    on_cpu = np.searchsorted(launches, e) - np.searchsorted(launches, s) == 0
    return iv.total(iv.intersect(during, iv.union(s[on_cpu], e[on_cpu]))) / total


def host_ops_in_wait(ctx: Context) -> iv.Intervals:
    """The time ``cpu-bound`` recovers: host-wait idle time while the main thread ran operators,
    Python or runtime calls (not the data loader)."""
    ev, msk = ctx.trace.events, ctx.masks
    main = ev.lane == ctx.main_lane
    ops = ctx.intervals(ctx.events_in_window(main & (msk["cpu_op"] | msk["python"] | msk["runtime"])))
    return iv.intersect(iv.subtract(ops, ctx.cat_union["dataloader"]), ctx.gaps.host_wait())


def busiest_frame(ctx: Context, during: iv.Intervals) -> str:
    """The innermost informative main-thread frame that covers most of ``during``: among the
    names whose events cover ≥ half as much of it as the best one, the one with the shortest
    events (inner frames are shorter than the frames that call them)."""
    ev, msk = ctx.trace.events, ctx.masks
    cand = np.flatnonzero((ev.lane == ctx.main_lane) & msk["host"] & ~msk["name_step"] & ~msk["runtime"]
                          & ctx.events_in_window(np.ones(len(ev), bool)))
    if cand.size == 0 or iv.total(during) == 0:
        return ""
    cover = iv.measure_in(during, ev.ts_ns[cand], ev.ts_ns[cand] + ev.dur_ns[cand])
    names = ev.name[cand]
    tot = np.bincount(names, weights=cover, minlength=len(ctx.trace.names))
    dur = np.bincount(names, weights=ev.dur_ns[cand], minlength=len(ctx.trace.names))
    cnt = np.bincount(names, minlength=len(ctx.trace.names))
    ok = np.array([tot[n] > 0 and nm.is_informative_frame(ctx.trace.names[n]) for n in range(tot.size)], dtype=bool)
    if not ok.any():
        return ""
    best = tot[ok].max()
    pool = np.flatnonzero(ok & (tot >= 0.5 * best))
    inner = pool[int(np.argmin(dur[pool] / np.maximum(cnt[pool], 1)))]
    return f"`{ctx.trace.names[inner][:28]}`"
