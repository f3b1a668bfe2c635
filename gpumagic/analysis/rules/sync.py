"""``host-sync``: the host waits for the GPU, and the GPU then starves."""

from __future__ import annotations

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.metrics import cap_by_critical_path, harmful_syncs
from gpumagic.analysis.rules.anomaly import anomaly_checks
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.report.metrics import Metrics, SyncMetrics
from gpumagic.report.model import Finding

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
                + (f"; sync ops: {ops}" if ops else "") + ".",
        numbers={"sync_calls": s.count, "harmful_syncs": s.harmful_count,
                 "harmful_blocked_ms": s.harmful_blocked_ms, "starved_ms": s.starved_ms,
                 "starved_frac": round(frac, 4), "threshold_frac": BLOCKED_FRAC},
        windows=windows(*starved, "gpu", ctx.device, "GPU idle after sync"),
        est_gain=cap_by_critical_path(ctx, "host-sync", frac),
        gain_method="host-wait idle time after harmful syncs, up to the time they blocked the host",
        fixes=(TRAINING_FIX if ctx.workload == "training" else INFERENCE_FIX,)
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


def _anomaly_mode_syncs(ctx: Context, harm: np.ndarray) -> bool:
    checks = anomaly_checks(ctx)
    if checks is None:
        return False
    ev = ctx.trace.events
    start = ev.ts_ns[harm]
    end = start + ev.dur_ns[harm]
    inside = float(iv.measure_in(checks.spans, start, end).sum())
    return inside >= ANOMALY_SHARE * float((end - start).sum())
