"""``communication-heavy``: collectives that compute does not hide."""

from __future__ import annotations

from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: The issue's anchor: exposed collectives over 10 % of step time.
EXPOSED_FRAC = 0.10
DOC = "https://pytorch.org/docs/stable/notes/ddp.html"


@rule("communication-heavy")
def communication_heavy(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: collective kernel time (NCCL, RCCL, custom all-reduce: ``names.COLLECTIVE_RE``)
    on the primary GPU that no compute kernel overlaps. Threshold:
    > 10 % of the window. Gain: that exposed time (overlap by bucketing gradients, or fewer
    and larger collectives). False positives: a rank waiting in a collective for a slower rank
    (the time is then load imbalance, visible only across ranks)."""
    c = m.communication
    if not c.count or c.exposed_frac <= EXPOSED_FRAC:
        return None
    exposed = ctx.exclusive["communication"]
    return finding(
        severity=severity_for(c.exposed_frac), title="Collectives stall compute",
        why="""In data-parallel training every step ends with gradients being summed across GPUs (all-reduce).
        DDP overlaps that with the backward pass bucket by bucket; when the collectives run while no
        compute kernel does, every GPU waits on the network. Fewer small all-reduces (larger buckets,
        though a bigger bucket also starts the first all-reduce later in the backward pass), gradient
        accumulation with no_sync, or compression reduce the exposed time.""",
        summary=f"{c.count} NCCL kernels take {c.ms:.1f} ms ({pct(c.frac)} of the window); "
                f"{pct(c.overlap_frac or 0)} overlaps compute, {pct(c.exposed_frac)} of the window is exposed.",
        numbers={"nccl_kernels": c.count, "comm_ms": c.ms, "comm_frac": c.frac,
                 "overlap_frac": c.overlap_frac or 0.0, "exposed_frac": c.exposed_frac},
        windows=windows(exposed[0], exposed[1], "gpu", ctx.device, "exposed collective"),
        est_gain=c.exposed_frac, gain_method="NCCL time not overlapped by compute kernels",
        fixes=_fixes(ctx),
        doc_url=DOC,
    )


def _fixes(ctx: Context) -> tuple[Fix, ...]:
    if ctx.workload != "training":
        return (pytorch("Fewer, larger collectives: fewer tensor-parallel ranks for a small model, or batch more requests",
                        "# e.g. vLLM: LLM(model, tensor_parallel_size=1) when the model fits one GPU\n"
                        "# or raise the batch (max_num_seqs) so that each collective carries more work"),)
    return (
            pytorch("Try larger DDP buckets (measure: the first all-reduce starts later); skip the all-reduce on "
                    "accumulation steps",
                    """
model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=100, gradient_as_bucket_view=True)
with model.no_sync():          # on all but the last micro-batch of an accumulation
    loss.backward()"""),
    )
