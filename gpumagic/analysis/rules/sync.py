"""``host-sync``: the host waits for the GPU, and the GPU then starves."""

from __future__ import annotations

from gpumagic.analysis.context import Context
from gpumagic.analysis.metrics import harmful_syncs
from gpumagic.analysis.rules.base import finding, pct, pytorch, severity_for, windows

#: gpumagic default: GPU time lost after syncs must reach 2 % of the window — about the
#: run-to-run noise of step time, below which the advice is not worth a code change.
STARVED_FRAC = 0.02
DOC = "https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html"


def host_sync(ctx: Context, m: dict):
    """Signal: host calls that block until the GPU is done (``cudaStreamSynchronize``,
    ``cudaDeviceSynchronize``, synchronous ``cudaMemcpy``; reached from ``.item()``,
    ``nonzero``, printing a CUDA tensor...) whose return finds the GPU idle, with more GPU work
    following in the window. Threshold: the idle time after such syncs ≥ 2 % of the window.
    Gain: that idle time (the GPU had no queued work because the host was blocked). A final
    sync that only waits for queued work costs nothing and is not counted."""
    harm, starved = harmful_syncs(ctx)
    s = m["syncs"]
    starved_ns = starved.total_ns()
    frac = ctx.frac(starved_ns)
    if harm.size == 0 or frac < STARVED_FRAC:
        return None
    ops = ", ".join(f"{n} ×{c}" for n, c in sorted(s["sync_ops"].items(), key=lambda kv: -kv[1])[:3])
    return finding(
        "host-sync", severity=severity_for(frac, 0.1, 0.02), title="The host blocks on the GPU, then the GPU starves",
        why="""CUDA work is queued asynchronously: the host normally runs ahead and the GPU never waits.
        Reading a GPU value on the host (.item(), printing a loss, a boolean test on a CUDA tensor,
        nonzero) forces a synchronisation: the host stops until the queue drains, and when it resumes
        the GPU has nothing to do until new work is launched.""",
        summary=f"{harm.size} of {s['count']} sync calls were followed by GPU idle time totalling "
                f"{starved_ns / 1e6:.2f} ms ({pct(frac)} of the window)" + (f"; sync ops: {ops}" if ops else "") + ".",
        numbers={"sync_calls": s["count"], "harmful_syncs": int(harm.size), "blocked_ms": s["blocked_ms"],
                 "starved_ms": round(starved_ns / 1e6, 3), "starved_frac": round(frac, 4)},
        windows=windows(*starved.intervals, "gpu", ctx.device, "GPU idle after sync"),
        est_gain=frac, gain_method="GPU idle time that follows the harmful syncs",
        fixes=(
            pytorch("Keep values on the GPU; read them rarely; find hidden syncs",
                    """
torch.cuda.set_sync_debug_mode("warn")   # warns at every synchronising call
running_loss += loss.detach()            # instead of loss.item() every step
if step % 50 == 0:
    print(running_loss.item() / 50)      # one sync per 50 steps
    running_loss.zero_()"""),
        ),
        doc_url=DOC,
    )
