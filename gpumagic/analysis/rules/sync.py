"""``host-sync``: the host waits for the GPU, and the GPU then starves."""

from __future__ import annotations

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.metrics import cap_by_critical_path, harmful_syncs
from gpumagic.analysis.optimizerimpl import optimizer_steps
from gpumagic.analysis.rules.anomaly import anomaly_checks
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.report.metrics import KernelsMetrics, Metrics, SyncMetrics
from gpumagic.report.model import Finding, Fix

#: gpumagic default: harmful syncs must block the host for ≥ 2 % of the window — about the
#: run-to-run noise of step time, below which the advice is not worth a code change.
BLOCKED_FRAC = 0.02
DOC = "https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html"
#: The Hugging Face Trainer keeps the running loss on the device and reads it at logging steps,
#: but with ``logging_nan_inf_filter=True`` (the default) its training loop tests every step's
#: loss with ``torch.isnan(loss) or torch.isinf(loss)`` (transformers ``Trainer`` inner training
#: loop): ``or`` calls ``Tensor.__bool__``, a host sync on CUDA, twice a step whatever
#: ``logging_steps`` is. The setting only filters the logged loss ("Does not affect gradient
#: computation, only logging": its docstring). tests/test_snippets.py counts the checks.
TRAINER_NAN_CHECK_FIX = (
    "The Hugging Face Trainer tests each step's loss for NaN/inf on the host by default "
    "(logging_nan_inf_filter=True: two syncs a step, whatever logging_steps is); turning it off changes only "
    "the logged loss, not training. include_num_input_tokens_seen reads a count with .item() every step too")


@rule("host-sync")
def host_sync(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: host calls that block until the GPU is done — CUDA and HIP stream/device/event
    syncs and synchronous copies (``cudaMemcpy``, ROCm's ``hipMemcpyWithStream``, and
    asynchronous copies to pageable host memory, which return only when done; names and
    sources in ``analysis.names.SYNC_CALL_SOURCES``), reached from ``.item()``, ``.cpu()``,
    ``nonzero``, printing a CUDA tensor... A call is harmful when it blocked the host ≥ 10 µs
    while the GPU still had queued work and GPU work follows it in the window
    (``metrics.sync_costs``). Threshold: harmful syncs block the host for ≥ 2 % of the window
    (about run-to-run noise), and some GPU idle time follows them. Gain: the host-wait idle
    time after them that a host running ahead by the time it spent blocked would have hidden.
    A sync that returns at once into an already idle GPU and a final sync that only waits for
    the queue to drain cost nothing. False positives: a sync the program needs (early
    stopping on a loss) — then read it less often."""
    s = m.syncs
    harmful_frac = ctx.frac(s.harmful_blocked_ms * 1e6)
    harm, starved = harmful_syncs(ctx)
    starved_ns = iv.total(starved)
    frac = ctx.frac(starved_ns)
    if harm.size == 0 or harmful_frac < BLOCKED_FRAC or starved_ns <= 0 or _anomaly_mode_syncs(ctx, harm):
        return None
    ops = ", ".join(f"{n} ×{c}" for n, c in sorted(s.sync_ops.items(), key=lambda kv: -kv[1])[:3])
    scaler_frac = _grad_scaler_share(ctx, harm)
    scaler = scaler_frac >= SCALER_SHARE
    fixes: tuple[Fix, ...] = (TRAINING_FIX if ctx.workload == "training" else INFERENCE_FIX,)
    if scaler:
        fixes = (*_scaler_fixes(ctx, m.kernels), *fixes)
    return finding(
        severity=severity_for(frac),
        title=f"Syncs block the host: {_top_sync(s)}",
        why="""CUDA work is queued asynchronously: the host normally runs ahead and the GPU never waits.
        Anything that needs a GPU value or size on the host forces a synchronisation: .item(), .cpu()
        (and the .numpy() after it: .numpy() on a CUDA tensor raises), .tolist(), printing a CUDA tensor, an
        if on one, nonzero, boolean-mask indexing (x[mask]), torch.unique, and any .to("cuda") or .cpu()
        without non_blocking=True, from pinned or pageable memory (PyTorch follows the copy with a stream
        synchronise). The host stops until
        the queue drains; while blocked it cannot prepare or launch the next work, so the GPU then
        waits for it. torch.cuda.set_sync_debug_mode("warn") points at many of them, not all (its
        docstring: "not all synchronizing operations will trigger warning or error").""",
        summary=f"{s.harmful_count} of {s.count} sync calls blocked the host for {s.harmful_blocked_ms:.2f} ms "
                f"({pct(harmful_frac)} of the window) while the GPU still had work; those sync calls were followed by "
                f"GPU idle time of which {s.starved_ms:.2f} ms a host running ahead would have hidden"
                + (f"; sync ops: {ops}" if ops else "") + "."
                + (" Most of the blocked time is GradScaler's: scaler.step(optimizer) reads found_inf with .item() "
                   "before the step of an optimizer that is not fused." if scaler else ""),
        numbers={"sync_calls": s.count, "harmful_syncs": s.harmful_count,
                 "harmful_blocked_ms": s.harmful_blocked_ms, "starved_ms": s.starved_ms,
                 "starved_frac": round(frac, 4), "threshold_frac": BLOCKED_FRAC}
        | ({"grad_scaler_frac": round(scaler_frac, 4)} if scaler_frac else {}),  # GradScaler's reads' share
        windows=windows(*starved, "gpu", ctx.device, "GPU idle after sync"),
        est_gain=cap_by_critical_path(ctx, "host-sync", frac),
        gain_method="host-wait idle time after harmful syncs, up to the time they blocked the host",
        fixes=fixes
        + ((huggingface(TRAINER_NAN_CHECK_FIX, "TrainingArguments(..., logging_nan_inf_filter=False)"),)
           if ctx.workload == "training" else ()),
        doc_url=DOC,
    )


TRAINING_FIX = pytorch("Keep values on the GPU; read them rarely; find hidden syncs", """
torch.cuda.set_sync_debug_mode("warn")   # warns at many synchronising calls (not all)
running_loss += loss.detach()            # instead of loss.item() every step
if step % 50 == 0:
    print(running_loss.item() / 50)      # one sync per 50 steps
    running_loss.zero_()""")
#: Inference has no loss: results stay on the GPU and are read once (workload from what ran).
INFERENCE_FIX = pytorch("Keep results on the GPU and read them once; find hidden syncs", """
torch.cuda.set_sync_debug_mode("warn")   # warns at many synchronising calls (not all)
results = []
for x in batches:
    results.append(model(x).argmax(-1))  # stays on the GPU: no sync per batch
predictions = torch.cat(results).cpu()   # one sync for all of them""")


def _top_sync(s: SyncMetrics) -> str:
    """The sync call that blocked longest, e.g. ``cudaStreamSynchronize ×75``."""
    name, row = max(s.by_name.items(), key=lambda kv: kv[1].blocked_ms)
    return f"{name} ×{row.count}"


#: The harmful syncs are anomaly mode's when at least this share of their time lies inside its
#: NaN checks: ``anomaly-detection-on`` then tells the fix (turn the mode off), not this rule's
#: "read values rarely".
ANOMALY_SHARE = 0.5


#: GradScaler's own sync: ``scaler.step(optimizer)`` unscales the gradients
#: (``aten::_amp_foreach_non_finite_check_and_unscale_``), then, for an optimizer without
#: ``_step_supports_amp_scaling`` (torch.optim's fused Adam, AdamW, SGD and Adagrad set it),
#: calls ``optimizer.step()`` only ``if not sum(v.item() for v in found_inf_per_device.values())``
#: (torch/amp/grad_scaler.py, ``_maybe_opt_step``): an ``aten::item`` right before each
#: ``Optimizer.step#``. A fused optimizer gets ``found_inf`` as a tensor and skips the update on the
#: GPU. The harmful syncs are GradScaler's when at least this share of their time is in those reads.
SCALER_SHARE = 0.5
UNSCALE_OP = "aten::_amp_foreach_non_finite_check_and_unscale_"
#: The reads and the step they guard come back to back: nothing but Python's ``sum`` between them.
SCALER_GAP_NS = 2_000_000
FUSABLE = ("Adam", "AdamW", "SGD", "Adagrad")


def grad_scaler_reads(ctx: Context) -> iv.Intervals:
    """GradScaler's ``found_inf`` reads: each ``aten::item`` on the main thread whose next operator
    or annotation there (within 2 ms) is an ``Optimizer.step#`` span, after an unscale operator
    in the same step (before it, with no steps)."""
    def find(c: Context) -> iv.Intervals:
        ev = c.trace.events
        host = c.masks["host"] & (ev.lane == c.main_lane)
        unscale = np.flatnonzero(host & c.host_name_ids(UNSCALE_OP.__eq__)[ev.name])
        if not unscale.size:
            return iv.empty()
        items = np.flatnonzero(host & c.host_name_ids("aten::item".__eq__)[ev.name])
        top = np.flatnonzero(host & (c.masks["cpu_op"] | c.masks["annotation"]))
        top_s = ev.ts_ns[top]
        is_step = c.host_name_ids(lambda n: n.startswith("Optimizer.step#"))
        bounds = np.array(c.step_bounds, dtype=np.int64).reshape(-1, 2)
        u_s = ev.ts_ns[unscale]
        keep = []
        for i in items.tolist():
            end = int(ev.ts_ns[i] + ev.dur_ns[i])
            j = int(np.searchsorted(top_s, end, side="left"))
            if j >= top.size or not is_step[ev.name[top[j]]] or top_s[j] - end > SCALER_GAP_NS:
                continue
            k = int(np.searchsorted(u_s, ev.ts_ns[i], side="right")) - 1  # the last unscale before it
            if k < 0:
                continue
            b = int(np.searchsorted(bounds[:, 0], ev.ts_ns[i], side="right")) - 1 if bounds.size else -1
            if b >= 0 and u_s[k] < bounds[b, 0]:  # an unscale of an earlier step
                continue
            keep.append(i)
        rows = np.array(keep, dtype=np.int64)
        return iv.union(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows])
    return ctx.memo("grad_scaler_reads", find)


def _grad_scaler_share(ctx: Context, harm: np.ndarray) -> float:
    """The share of the harmful syncs' blocked time inside GradScaler's reads."""
    reads = grad_scaler_reads(ctx)
    if not reads[0].size:
        return 0.0
    ev = ctx.trace.events
    start = ev.ts_ns[harm]
    end = start + ev.dur_ns[harm]
    total = float((end - start).sum())
    return float(iv.measure_in(reads, start, end).sum()) / total if total else 0.0


#: The matmuls already run in bfloat16 when kernels naming bf16 hold this share of the time of those
#: naming bf16 or fp16 (``metrics.kernels.matmul_bf16_ms``, ``matmul_fp16_ms``): GradScaler is then
#: there for nothing (PyTorch's AMP examples scale gradients for float16, whose narrow exponent range
#: underflows; bfloat16 keeps float32's).
BF16_SHARE = 0.9


def _scaler_fixes(ctx: Context, kernels: KernelsMetrics) -> tuple[Fix, ...]:
    """Fused optimizer (its class when the trace names one that has a fused step), and bf16
    without a scaler where the device has bf16 tensor cores (compute capability 8.0); where the
    matmuls already run in bf16 (:data:`BF16_SHARE`), first: drop the scaler."""
    half = kernels.matmul_bf16_ms + kernels.matmul_fp16_ms
    if kernels.matmul_bf16_ms > 0 and kernels.matmul_bf16_ms >= BF16_SHARE * half:
        return (pytorch("Drop the GradScaler: the matmuls already run in bfloat16, which keeps float32's exponent range "
                        "and needs no loss scaling; the scaler only adds its unscale pass and the found_inf read",
                        BF16_NO_SCALER_CODE),)
    classes = [c for c in optimizer_steps(ctx).classes if c in FUSABLE]
    cls = classes[0] if classes else "AdamW"
    note = "" if classes else "   # Adam, AdamW, SGD and Adagrad have fused=True"
    fused = pytorch("Give GradScaler a fused optimizer: it then checks found_inf on the GPU, with no .item()", f"""
# scaler.step(optimizer) reads found_inf on the host before each step of an unfused optimizer;
# a fused one takes it as a tensor and skips the update on the GPU
optimizer = torch.optim.{cls}(model.parameters(), lr=lr, fused=True){note}""")
    cc = ctx.device_info.compute_capability if ctx.device_info is not None else None
    if not cc or cc < 8.0:
        return (fused,)
    bf16 = pytorch("Or autocast to bfloat16, which needs no GradScaler (bf16 keeps fp32's exponent range)",
                   BF16_NO_SCALER_CODE)
    return (fused, bf16)


BF16_NO_SCALER_CODE = """
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = loss_fn(model(x), y)
loss.backward()            # no scaler.scale / scaler.step / scaler.update
optimizer.step()
optimizer.zero_grad()"""


def _anomaly_mode_syncs(ctx: Context, harm: np.ndarray) -> bool:
    checks = anomaly_checks(ctx)
    if checks is None:
        return False
    ev = ctx.trace.events
    start = ev.ts_ns[harm]
    end = start + ev.dur_ns[harm]
    inside = float(iv.measure_in(checks.spans, start, end).sum())
    return inside >= ANOMALY_SHARE * float((end - start).sum())
