"""``launch-bound`` and ``cpu-bound``: the host cannot issue work fast enough."""

from __future__ import annotations

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, severity_for, windows

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
GRAPHS_DOC = "https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs"
COMPILE_DOC = "https://pytorch.org/docs/stable/torch.compiler.html"


def launch_bound(ctx: Context, m: dict):
    """Signal: most kernels last under 10 µs, the GPU is busy < 50 % of the window, and the host
    is busy launching (runtime calls ≥ 25 % of the window, or host wait + launch latency ≥ 50 %
    of GPU idle time). Gain: GPU idle time classified host wait or launch latency (what fewer,
    larger launches — CUDA graphs, torch.compile fusion — can recover). False positives: small
    inference batches where latency, not throughput, is the goal (the fix still applies)."""
    k, _idle = m["kernels"], m["idle"]
    if not k["count"] or k["short_frac"] < SHORT_KERNEL_SHARE or (m["gpu"]["busy_frac"] or 0) >= BUSY_MAX:
        return None
    runtime_frac = ctx.frac(iv.total(ctx.cat_union["runtime"]))
    launch_idle_ns = ctx.idle_ns["host_wait"] + ctx.idle_ns["launch_latency"]
    idle_ns = sum(ctx.idle_ns.values()) or 1
    if runtime_frac < RUNTIME_FRAC and launch_idle_ns / idle_ns < LAUNCH_IDLE_SHARE:
        return None
    gain = ctx.frac(launch_idle_ns)
    gaps = ctx.gaps.of_cause("host_wait", "launch_latency")
    return finding(
        "launch-bound", severity=severity_for(gain), title="Tiny kernels: the GPU waits for launches",
        why="""Every kernel costs the host several microseconds to launch (Python, the PyTorch
        dispatcher, the CUDA driver). When most kernels finish faster than that, the GPU completes each
        one before the next arrives and idles in between. Fusing operations (torch.compile) or replaying
        a recorded sequence of launches at once (CUDA graphs) removes most of the per-kernel cost.""",
        summary=f"{pct(k['short_frac'])} of {k['count']} kernels run under {k['short_kernel_us']:.0f} µs "
                f"(median {k['median_us']:.1f} µs); the GPU is busy {pct(m['gpu']['busy_frac'])} of the window; "
                f"CUDA runtime calls cover {pct(runtime_frac)} of it.",
        numbers={"kernels": k["count"], "short_kernel_frac": k["short_frac"], "median_kernel_us": k["median_us"],
                 "gpu_busy_frac": m["gpu"]["busy_frac"], "runtime_frac": round(runtime_frac, 4),
                 "launch_wait_ms": round(launch_idle_ns / 1e6, 3)},
        windows=windows(*gaps.intervals, "gpu", ctx.device, "waiting for launch"),
        est_gain=gain, gain_method="GPU idle time classified as host wait or launch latency (HTA definitions)",
        fixes=(
            pytorch("Fuse kernels with torch.compile (mode='reduce-overhead' also uses CUDA graphs)",
                    "model = torch.compile(model, mode=\"reduce-overhead\")"),
            pytorch("Or capture a static step in a CUDA graph",
                    """
g = torch.cuda.CUDAGraph()
static_x = torch.randn(batch_shape, device="cuda")
with torch.cuda.graph(g):
    static_y = model(static_x)
# each step: static_x.copy_(x); g.replay()"""),
            pytorch("Use fused optimizers (one kernel for all parameters)",
                    "opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)"),
            huggingface("Through TrainingArguments", "TrainingArguments(..., torch_compile=True, optim=\"adamw_torch_fused\")"),
        ),
        doc_url=GRAPHS_DOC,
    )


def cpu_bound(ctx: Context, m: dict):
    """Signal: the GPU waits on the host (HTA host wait) for ≥ 20 % of the window while the
    main thread runs operators or Python (≥ 50 % of that wait), not the data loader, and the
    kernels are not tiny (that case is ``launch-bound``). Gain: the host-wait time covered by
    main-thread operator work. False positives: deliberate CPU work (metrics, logging) that
    could be moved out of the loop rather than sped up."""
    host_wait = ctx.gaps.of_cause("host_wait")
    hw_ns = host_wait.total_ns()
    if ctx.frac(hw_ns) < HOST_WAIT_FRAC or (m["kernels"]["short_frac"] or 0) >= SHORT_KERNEL_SHARE:
        return None
    ev, msk = ctx.trace.events, ctx.masks
    main = ev.lane == ctx.main_lane
    ops = ctx.intervals(ctx.events_in_window(main & (msk["cpu_op"] | msk["python"] | msk["runtime"])))
    ops = iv.subtract(ops, ctx.cat_union["dataloader"])
    gaps = host_wait.intervals
    busy_in_wait = iv.intersect(ops, gaps)
    share = iv.total(busy_in_wait) / max(hw_ns, 1)
    if share < CPU_OP_SHARE:
        return None
    gain = ctx.frac(iv.total(busy_in_wait))
    return finding(
        "cpu-bound", severity=severity_for(gain), title="Host-side Python and operators keep the GPU waiting",
        why="""The GPU can only run what the host has queued. Here the main thread spends long stretches in
        Python and operator code between launches, so the queue runs dry and the GPU idles. Less host
        work per step (compiling the model, larger batches, moving bookkeeping out of the loop) lets the
        host stay ahead of the GPU.""",
        summary=f"The GPU waits on the host for {pct(ctx.frac(hw_ns))} of the window; the main thread runs "
                f"operators/Python for {pct(share)} of that wait.",
        numbers={"host_wait_ms": round(hw_ns / 1e6, 3), "host_wait_frac": round(ctx.frac(hw_ns), 4),
                 "cpu_busy_share_of_wait": round(share, 4)},
        windows=windows(gaps[0], gaps[1], "gpu", ctx.device, "GPU waiting for host"),
        est_gain=gain, gain_method="host-wait idle time during which the main thread ran operators or Python",
        fixes=(
            pytorch("Compile the model to cut Python and dispatcher overhead", "model = torch.compile(model)"),
            pytorch("Give the GPU more work per launch", "loader = DataLoader(dataset, batch_size=2 * batch_size, ...)"),
            huggingface("Through TrainingArguments", "TrainingArguments(..., torch_compile=True, per_device_train_batch_size=64)"),
        ),
        doc_url=COMPILE_DOC,
    )
