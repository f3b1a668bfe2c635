"""The job's findings: ``straggler-rank``, and the per-rank findings most ranks share, listed once."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from gpumagic.jobs.collectives import straggler_citation
from gpumagic.jobs.stragglers import Straggler
from gpumagic.jobs.summary import RankSummary
from gpumagic.report.model import Evidence, Finding, Fix, sort_findings

#: A per-rank finding shown on at least this share of the analysed ranks is listed once for the job.
COMMON_SHARE = 0.5
DOC = "https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications"


@dataclass(frozen=True)
class JobFinding:
    """A finding about the job. ``scope`` is ``"job"`` (seen only across ranks, like
    ``straggler-rank``) or ``"common"`` (a per-rank finding on at least half of the ranks, with the
    evidence of ``evidence_rank``, the rank with the median estimated gain)."""

    finding: Finding
    ranks: tuple[int, ...]
    scope: str
    evidence_rank: int | None = None

    def to_dict(self, analysed: int) -> dict:
        return {**self.finding.to_dict(), "scope": self.scope, "ranks": list(self.ranks),
                "rank_count": len(self.ranks), "of_ranks": analysed, "evidence_rank": self.evidence_rank}


def straggler_finding(found: list[Straggler], step_median_ms: float | None,
                      collectives: list[dict] | None = None) -> JobFinding | None:
    """``straggler-rank``. Signal: see :mod:`gpumagic.jobs.stragglers`. Gain: the others' wait inside
    collectives per step, over the median step (all ranks would finish each step that much sooner
    if the stragglers kept pace). False positives: a rank that is slower by design but shares its
    peers' kernels and collectives (uneven data per rank); ranks whose trace windows cover different
    steps are not compared."""
    if not found:
        return None
    lost = sum(s.lost_ms_per_step for s in found)
    gain = min(1.0, lost / step_median_ms) if step_median_ms else 0.0
    names = ", ".join(str(s.rank) for s in found)
    one = len(found) == 1
    detail = "; ".join(
        f"rank {s.rank}: the others wait {s.lost_ms_per_step:.1f} ms per step for it in {s.collectives} collectives "
        f"({100 * s.late_share:.0f} % of the waits), after {s.compute_excess_ms:.1f} ms more "
        + (f"time per step than its {len(s.peers)} peer{'s' if len(s.peers) != 1 else ''} before the collectives, "
           f"host-side: its GPU was busy only {max(s.gpu_excess_ms or 0.0, 0.0):.1f} ms of it (CPU work before the collective)"
           if s.host_side else
           f"GPU-side work per step than its {len(s.peers)} peer{'s' if len(s.peers) != 1 else ''}")
        + (f"; {cite}" if (cite := straggler_citation(collectives or [], s.rank)) else "") for s in found)
    host = all(s.host_side for s in found)
    return JobFinding(
        finding=Finding(
            id="straggler-rank", severity="high" if gain >= 0.2 else "medium" if gain >= 0.05 else "low",
            title=f"Rank{'' if one else 's'} {names} hold{'s' if one else ''} the others back: {lost:.1f} ms lost per step",
            why=("In a synchronous job every collective waits for the last rank to arrive. "
                 f"{'This rank does' if one else 'These ranks do'} more work before each collective than the ranks doing the same "
                 "job, so the others sit idle inside the collective (their NCCL kernels are long, the straggler's short). "
                 + ("Here that extra time is on the host: the straggler's GPU idles before the collective while its CPU "
                    "works (data loading, logging, Python), so look at its host side first. " if host else "")
                 +
                 "Look for work only that rank does (logging, checkpointing, evaluation on rank 0), a slower data "
                 "shard or input pipeline, another process on its GPU or CPU cores, or a slower or throttled GPU."),
            evidence=Evidence(summary=detail, numbers={
                "ranks": names, "lost_ms_per_step": round(lost, 3), "step_median_ms": step_median_ms or 0.0,
                **{f"rank{s.rank}_lost_ms_per_step": s.lost_ms_per_step for s in found},
                **{f"rank{s.rank}_compute_excess_ms": s.compute_excess_ms for s in found},
                **{f"rank{s.rank}_late_share": s.late_share for s in found},
                "steps_compared": max(s.steps for s in found)}),
            est_gain=round(gain, 4),
            gain_method="the other ranks' wait inside collectives per step, over the median step",
            fixes=(Fix("pytorch", "Keep rank-only work off the step, or out of the way of the collectives",
                       "if dist.get_rank() == 0 and step % log_every == 0:   # rank-only work waits for the others\n"
                       "    log_metrics(...)                                # move it after optimizer.step(), or to a thread"),
                   Fix("pytorch", "Give each rank the same amount of input work",
                       "sampler = DistributedSampler(dataset, drop_last=True)   # equal shards\n"
                       "loader = DataLoader(dataset, sampler=sampler, num_workers=8, pin_memory=True)")),
            doc_url=DOC),
        ranks=tuple(s.rank for s in found), scope="job")


def common_findings(ranks: list[RankSummary]) -> tuple[list[JobFinding], list[dict]]:
    """Per-rank findings on at least :data:`COMMON_SHARE` of the analysed ranks, each listed once,
    and the rest as ``{"id", "title", "ranks"}``."""
    ok = [r for r in ranks if r.ok]
    on: dict[str, list[tuple[RankSummary, Finding]]] = defaultdict(list)
    for r in ok:
        for f in r.findings:
            on[f.id].append((r, f))
    common, rest = [], []
    need = max(1, math.ceil(COMMON_SHARE * len(ok)))
    for fid, hits in on.items():
        rank_ids = tuple(sorted(r.rank for r, _ in hits if r.rank is not None))
        if len(hits) >= need:
            hits.sort(key=lambda h: h[1].est_gain)
            r, f = hits[(len(hits) - 1) // 2]
            common.append(JobFinding(finding=f, ranks=rank_ids, scope="common", evidence_rank=r.rank))
        else:
            rest.append({"id": fid, "title": hits[0][1].title, "ranks": list(rank_ids)})
    order = {f.id: i for i, f in enumerate(sort_findings([c.finding for c in common]))}
    common.sort(key=lambda c: order[c.finding.id])
    rest.sort(key=lambda d: (-len(d["ranks"]), d["id"]))
    return common, rest
