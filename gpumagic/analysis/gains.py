"""Gains that overlap, counted once: each finding's share of the idle time, and the report's
``combined_gain``.

Several findings can name the same idle moment (a data-loader wait is also a long gap and part
of the low utilisation). Each GPU-idle-type finding recovers a set of time windows
(:data:`CLAIMS`); walking them from the most specific cause to the most generic
(:data:`CLAIM_ORDER`), a finding keeps only the idle time no earlier finding claimed. So the
idle-type gains add up to at most the window's idle share (1 − ``gpu.busy_frac``), and none
exceeds ``combined_gain``.

``combined_gain``: the estimated share of step time saved by fixing every finding together.
Time-based fixes recover time windows: their union ``U`` counts each moment once. Fixes that
make GPU work shorter (mixed precision, pinned copies, a cold start that will not recur)
combine with it as ``1 − (1 − U) · Π(1 − g)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.allocator import churn_idle
from gpumagic.analysis.context import Context
from gpumagic.analysis.loaderrestart import worker_starts
from gpumagic.analysis.metrics import cap_by_critical_path, sync_costs
from gpumagic.analysis.optimizerimpl import optimizer_steps
from gpumagic.analysis.rules import STEADY_IDS
from gpumagic.analysis.rules.base import severity_for
from gpumagic.analysis.rules.chunks import small_transfer_windows
from gpumagic.analysis.rules.compute import too_small_windows
from gpumagic.analysis.rules.cpu import saturated_idle
from gpumagic.analysis.rules.dataloader import DATALOADER_FRAC
from gpumagic.analysis.rules.embeddings import embedding_update_time
from gpumagic.analysis.rules.launch import host_ops_in_wait, launch_wait
from gpumagic.analysis.rules.optimizer import judged_classes
from gpumagic.analysis.rules.transfers import exposed_copies
from gpumagic.analysis.rules.utilization import LONG_GAPS_FRAC, idle_outside_warmup, long_gap_intervals
from gpumagic.report.model import Finding

#: Findings whose gain is GPU idle time.
IDLE_TYPE = frozenset({"dataloader-worker-restarts", "dataloader-bound", "host-sync", "allocator-churn", "launch-bound",
                       "cpu-bound", "transfer-bound", "gpu-idle-gaps", "low-gpu-utilization", "host-cpu-saturated", "small-transfers",
                       "too-small-for-gpu"})
#: Most specific cause first: a moment goes to the first finding in this order that claims it.
#: ``host-cpu-saturated`` comes before ``dataloader-bound`` because when the cores are saturated
#: the loader wait is the symptom and less CPU work per batch is the fix.
#: ``too-small-for-gpu`` (the work itself is too small to keep any GPU busy) claims what the ways
#: to launch faster leave, so ``launch-bound`` keeps its own share when both fire.
CLAIM_ORDER = ("host-cpu-saturated", "dataloader-worker-restarts", "dataloader-bound", "host-sync", "allocator-churn",
               "transfer-bound", "small-transfers",
               "cpu-bound", "launch-bound", "gpu-idle-gaps", "too-small-for-gpu", "low-gpu-utilization")
#: Findings whose windows include copy time on the GPU (busy, not idle): not cut to the idle time,
#: but still within the idle budget.
COPY_TIME = frozenset({"transfer-bound", "small-transfers"})
#: Findings dropped when a more specific finding took their time and what is left falls below
#: their own threshold: idle gaps already told as data-loader waits, or data-loader waits
#: already told as a saturated CPU, are not a second story.
SYMPTOM_MIN_GAIN = {"gpu-idle-gaps": LONG_GAPS_FRAC, "dataloader-bound": DATALOADER_FRAC}
#: A ``gain_method`` starting with this is an estimate from a model (``analysis.loadergain``) that
#: may be smaller than the time the finding claims: apportioning never raises it to that time.
ESTIMATE_PREFIX = "estimate"
#: Time-based findings outside the idle budget: their windows join the union too.
#: (An optimizer's steps, which ``unfused-optimizer`` and ``dense-embedding-grad`` both claim, count
#: once: fixing both cannot save more than that time.)
OTHER_TIME_BASED = ("communication-heavy", "unfused-optimizer", "dense-embedding-grad")

#: What each finding's gain is (``gain_method`` starts with "estimate" exactly for an estimate;
#: ``render._format.fmt_gain`` words it "about N % (estimate)", else "up to N %"):
#: ``upper bound`` — recoverable time the fix cannot exceed (idle time, exposed copies or
#: collectives, a datasheet peak ratio); ``estimate`` — a model with its
#: assumption named (a fusion or fused-kernel speed-up, MFU raised to a threshold, a CPU's FLOP
#: rate, what workers would recover); ``either`` — an upper bound on one path, an estimate on
#: another (``dataloader-bound``, ``host-cpu-saturated``: ``analysis.loadergain``); ``none`` — no
#: speed gain is claimed (0; the warm-up in a
#: window is what the measurement overstates, not time the run would save). tests/test_gain_kinds.py holds every finding on the fixtures to it.
GAIN_KINDS: dict[str, str] = {
    "host-cpu-saturated": "either", "dataloader-bound": "either", "dataloader-bound-later": "upper bound",
    "pageable-memcpy": "upper bound",
    "host-sync": "upper bound", "launch-bound": "upper bound", "cpu-bound": "upper bound",
    "gpu-idle-gaps": "upper bound", "mixed-precision-off": "upper bound", "transfer-bound": "upper bound",
    "memory-pressure": "none", "communication-heavy": "upper bound", "warmup-in-window": "none",
    "small-transfers": "upper bound", "too-small-for-gpu": "either", "low-compute-efficiency": "estimate",
    "unfused-attention": "estimate", "elementwise-bound": "estimate", "model-on-cpu": "none",
    "low-gpu-utilization": "upper bound", "step-outliers": "none", "graph-breaks": "none",
    "recompiles": "upper bound", "host-cores-idle": "upper bound", "cpu-low-precision-slow": "upper bound",
    "frequent-checkpoints": "estimate", "dataloader-worker-restarts": "estimate", "unfused-optimizer": "upper bound",
    "host-contended": "estimate", "anomaly-detection-on": "estimate", "loop-host-work": "estimate",
    "cpu-op-overhead": "upper bound", "activation-recompute": "estimate",
    "allocator-churn": "upper bound", "layout-conversions": "estimate", "inference-grad-enabled": "none",
    "inference-train-mode": "none", "memory-growth": "none",
    "gradients-never-reset": "none", "optimizer-state-reset": "none",
    "updates-without-gradients": "none", "gradients-reset-mid-accumulation": "none", "unused-gradients": "estimate",
    "training-in-eval-mode": "none", "dense-embedding-grad": "upper bound",
    "threads-oversubscribed": "upper bound", "cpu-float64": "upper bound", "l2-penalty-in-loss": "estimate",
    "decoding-without-cache": "estimate", "frequent-evaluation": "estimate", "growing-concatenation": "estimate",
    "frozen-forward": "estimate",
}

CLAIMS: dict[str, Callable[[Context], iv.Intervals]] = {
    "dataloader-worker-restarts": lambda ctx: worker_starts(ctx).intervals,
    "host-cpu-saturated": saturated_idle,
    "dataloader-bound": lambda ctx: ctx.exclusive["dataloader"],
    "host-sync": lambda ctx: sync_costs(ctx).starved,
    "allocator-churn": churn_idle,
    "transfer-bound": exposed_copies,
    "cpu-bound": host_ops_in_wait,
    "launch-bound": launch_wait,
    "gpu-idle-gaps": long_gap_intervals,
    "small-transfers": small_transfer_windows,
    "too-small-for-gpu": too_small_windows,
    "low-gpu-utilization": idle_outside_warmup,
    "communication-heavy": lambda ctx: ctx.exclusive["communication"],
    "unfused-optimizer": lambda ctx: optimizer_steps(ctx, judged_classes(ctx)).intervals,
    "dense-embedding-grad": embedding_update_time,
}


def apportion(ctx: Context, findings: list[Finding], steady: Context | None = None,
              others: iv.Intervals | None = None) -> tuple[list[Finding], float]:
    """The findings with idle-type gains counted once, and ``combined_gain``. A steady-state
    finding (``rules.STEADY_IDS``) claims its time in ``steady``, the part of the window it
    judged, and in ``others``, the window's other steady segments (the same loop between
    evaluations or captures: what its claim finds there in the whole window); gains are shares
    of the whole window. ``combined_gain`` counts, of each idle-type
    finding's windows, only what its gain counts (the earliest part, :func:`intervals.head`, when
    an estimate or a cap keeps the gain below its time), and only the findings returned: never
    more than the returned gains combined (docs/metrics.md, "Gains counted once")."""
    by_id = {f.id: f for f in findings}

    def claim(fid: str) -> iv.Intervals:
        if steady is None or fid not in STEADY_IDS:
            return CLAIMS[fid](ctx)
        if others is None or not others[0].size:
            return CLAIMS[fid](steady)
        return iv.merge(CLAIMS[fid](steady), iv.intersect(CLAIMS[fid](ctx), others))

    idle = ctx.gaps.intervals if ctx.device >= 0 else iv.union(np.array([ctx.lo]), np.array([ctx.hi]))
    budget = iv.total(idle)
    claimed = iv.empty()
    claimed_by: dict[str, iv.Intervals] = {}
    granted_by: dict[str, iv.Intervals] = {}  # the part of its own time that a finding's gain counts
    for fid in CLAIM_ORDER:
        f = by_id.get(fid)
        if f is None:
            continue
        taken_by: list[str] = []
        if fid not in CLAIMS:  # an idle-type finding this module does not know: its own gain, capped
            ns = min(int(f.est_gain * ctx.window_ns), budget)
        else:
            wanted = claim(fid)
            if fid not in COPY_TIME:
                wanted = iv.intersect(wanted, idle)
            taken_by = [c for c, t in claimed_by.items() if iv.total(iv.intersect(wanted, t))]
            own = iv.subtract(wanted, claimed)
            claimed_by[fid] = own
            claimed = iv.merge(claimed, own)
            ns = min(iv.total(own), budget)
        ns = min(ns, int(cap_by_critical_path(ctx, fid, ctx.frac(ns)) * ctx.window_ns))
        if f.gain_method.startswith(ESTIMATE_PREFIX):  # a model's estimate below the time it claims stays
            ns = min(ns, int(f.est_gain * ctx.window_ns))
        budget -= ns
        if fid in CLAIMS:
            granted_by[fid] = iv.head(own, ns)
        by_id[fid] = _with_gain(f, ctx.frac(ns), before=taken_by)
    out = [by_id[f.id] for f in findings
           if not (f.id in SYMPTOM_MIN_GAIN and by_id[f.id].est_gain < min(f.est_gain, SYMPTOM_MIN_GAIN[f.id]))]
    # the time fixing all would save is what the listed findings' gains count: not all the time
    # they claimed (a gain that is an estimate, or capped by the critical path or the idle budget,
    # counts less than its time), nor the rest of a symptom dropped above; time outside the idle
    # budget (OTHER_TIME_BASED) joins it, counted once
    union = iv.empty()
    for f in out:
        if f.id in granted_by:
            union = iv.merge(union, granted_by[f.id])
        elif f.id in OTHER_TIME_BASED:
            union = iv.merge(union, claim(f.id))
    keep = 1.0 - min(1.0, ctx.frac(iv.total(union)))
    for f in out:
        if f.id not in IDLE_TYPE and f.id not in OTHER_TIME_BASED:
            keep *= 1.0 - f.est_gain
    combined = round(min(1.0, max(0.0, 1.0 - keep)), 4)
    return [replace(f, est_gain=min(f.est_gain, combined)) for f in out], combined


def _with_gain(f: Finding, gain: float, before: list[str]) -> Finding:
    gain = round(max(0.0, min(1.0, gain)), 4)
    if abs(gain - f.est_gain) < 5e-5:
        return f
    note = f", less the time already counted by {', '.join(before)}" if before and gain < f.est_gain else ""
    return replace(f, est_gain=gain, severity=severity_for(gain), gain_method=f.gain_method + note)
