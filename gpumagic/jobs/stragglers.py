"""Stragglers: ranks the others wait for inside their collectives.

In a synchronous job (DDP, FSDP) a collective ends on every rank at about the same moment: when the
last rank has arrived and the data has moved. A rank that arrives late — it did more work before the
collective — spends little time inside it; every other rank spends that extra time waiting in it::

    rank 0  ██ compute ██▕░░░ wait ░░░▓ nccl ▓▏██ compute …
    rank 1  ██ compute ██▕░░░ wait ░░░▓ nccl ▓▏██ compute …
    rank 2  ██ compute ████ more work ██▓ nccl ▓▏██ compute …   <- straggler: short collective

So, for each collective matched across the ranks that do the same work (same step by its
``ProfilerStep#`` number, same position in the step — never by absolute time, since the hosts'
clocks differ), the rank with the shortest collective kernel arrived last and the others' extra
time in it is the wait it caused. Its extra time before the collectives is host-side when its GPU
was idle for most of it (the rank's CPU work before the collective), else GPU-side work. A rank is
a straggler when it is that last arrival consistently
(:data:`CONSISTENT_SHARE` of the collectives where anyone waited noticeably, in most steps), its
GPU time before those collectives is longer than its peers', and the wait it causes is a
noticeable part of the step (:data:`MIN_LOSS_FRAC`).

Ranks that do different work (pipeline stages, ranks on other devices) are uneven by design:
they are compared only with the ranks doing the same work: the same sequence of collectives per step
(:func:`~gpumagic.jobs.summary.work_fingerprint`) and mostly the same kernels
(:data:`SAME_KERNELS`, so that a rank-0-only logging kernel does not set rank 0 apart); a rank with
no such peer cannot be judged, and the job says so.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from statistics import median

from gpumagic.jobs.summary import RankSummary

#: A wait inside a collective shorter than this is noise (a few µs of launch jitter between ranks
#: is normal); gpumagic default.
MIN_WAIT_NS = 20_000
#: A rank is the late one "consistently" when it arrives last in at least this share of the
#: collectives where the others waited noticeably. With random jitter each of N ranks arrives last
#: about 1/N of the time (1/2 for two ranks), so 0.6 stays clear of chance; gpumagic default.
CONSISTENT_SHARE = 0.6
#: ... and in at least this share of the compared steps (a one-step hiccup is not a straggler).
STEP_SHARE = 0.5
#: A straggler must cost the job at least this share of the median step; gpumagic default, the
#: same 1 % under which the single-rank rules stay silent about idle time.
MIN_LOSS_FRAC = 0.01
#: Two ranks run the same model on the same kind of GPU when at least this share of their distinct
#: kernel names is common (Jaccard index); a few kernels only one rank runs (its logging, a cuDNN
#: algorithm chosen differently) stay under it, another architecture's or another stage's kernels
#: do not. gpumagic default.
SAME_KERNELS = 0.8


@dataclass(frozen=True)
class Straggler:
    """One straggler: the job's median step loss to it and the evidence behind it."""

    rank: int
    lost_ms_per_step: float  # median over steps of the others' wait for it
    compute_excess_ms: float  # its GPU time before those collectives minus its peers', per step
    late_share: float  # share of the noticeable waits where it arrived last
    collectives: int  # collectives where it arrived last and the others waited
    steps: int  # steps compared
    peers: tuple[int, ...]  # the ranks it was compared with
    gpu_excess_ms: float | None = None  # the part of compute_excess_ms its GPU was busy (None: not measured)

    @property
    def host_side(self) -> bool:
        """Its extra time before the collectives is mostly GPU idle time: host-side work (its CPU
        work before the collective), not more GPU work."""
        return self.gpu_excess_ms is not None and self.gpu_excess_ms < 0.5 * self.compute_excess_ms


@dataclass(frozen=True)
class Group:
    """Ranks that do the same work, compared with each other."""

    ranks: tuple[int, ...]
    device: str
    work: str


def _similar(a: frozenset[int], b: frozenset[int]) -> bool:
    return bool(a or b) and len(a & b) >= SAME_KERNELS * len(a | b)


def peer_groups(ranks: list[RankSummary]) -> tuple[list[Group], list[str]]:
    """The analysed ranks grouped by the work they do, and notes on ranks that cannot be compared.

    Ranks with the same collectives per step are grouped by kernels: each joins the first group
    whose first rank runs mostly the same kernels (:data:`SAME_KERNELS`)."""
    clusters: list[list[RankSummary]] = []
    notes = []
    for r in sorted((r for r in ranks if r.ok and r.rank is not None), key=lambda r: r.rank):
        if not r.steps:
            notes.append(f"rank {r.rank}: no step markers or no collectives on its GPU, so it cannot be aligned with the others")
            continue
        home = next((c for c in clusters if c[0].work == r.work and _similar(c[0].kernels, r.kernels)), None)
        if home is None:
            clusters.append([r])
        else:
            home.append(r)
    groups = [Group(tuple(x.rank for x in c), c[0].device, f"{c[0].work}/{i}") for i, c in enumerate(clusters)]
    alone = [g.ranks[0] for g in groups if len(g.ranks) == 1]
    if len(groups) > 1:
        notes.append(f"the ranks do {len(groups)} different kinds of work (pipeline stages, other models or devices): "
                     "each rank is compared only with the ranks doing the same work")
    if alone and len(alone) == len(groups):
        notes.append("no two ranks do the same work, so the job's shape makes it impossible to tell a straggler "
                     "from a rank that is uneven by design")
    elif alone:
        notes.append(f"rank{'s' if len(alone) > 1 else ''} {', '.join(map(str, alone))}: no other rank does the same work, "
                     "so straggling cannot be judged there")
    return groups, notes


def _aligned_steps(members: list[RankSummary]) -> list[list]:
    """Per compared step, each member's StepCollectives; steps are matched by their key and kept
    when every member ran the same number of collectives in them."""
    keyed = [{s.key: s for s in m.steps} for m in members]
    common = [k for k in (s.key for s in members[0].steps) if all(k in d for d in keyed)]
    out = []
    for k in common:
        row = [d[k] for d in keyed]
        if len({len(s.dur_ns) for s in row}) == 1 and row[0].dur_ns:
            out.append(row)
    return out


def find_stragglers(members: list[RankSummary]) -> tuple[list[Straggler], list[str]]:
    """Stragglers among ranks doing the same work; notes where they could not be compared."""
    if len(members) < 2:
        return [], []
    steps = _aligned_steps(members)
    if not steps:
        return [], [f"ranks {', '.join(str(m.rank) for m in members)}: no step with the same collectives on every rank, "
                    "so they could not be aligned"]
    n = len(members)
    late_count = [0] * n
    lost = [defaultdict(float) for _ in range(n)]
    excess: list[list[float]] = [[] for _ in range(n)]
    busy_excess: list[list[float]] = [[] for _ in range(n)]
    measured = all(len(s.busy_before_ns) == len(s.before_ns) for row in steps for s in row)
    noticeable = 0
    for k, row in enumerate(steps):
        for j in range(len(row[0].dur_ns)):
            durs = [s.dur_ns[j] for s in row]
            last = min(range(n), key=durs.__getitem__)
            wait = median(d - durs[last] for i, d in enumerate(durs) if i != last)
            if wait < MIN_WAIT_NS:
                continue
            noticeable += 1
            late_count[last] += 1
            lost[last][k] += wait
            before = [s.before_ns[j] for s in row]
            excess[last].append(before[last] - median(b for i, b in enumerate(before) if i != last))
            if measured:
                busy = [s.busy_before_ns[j] for s in row]
                busy_excess[last].append(busy[last] - median(b for i, b in enumerate(busy) if i != last))
    step_ms = median(s.dur_ms for row in steps for s in row)
    found = []
    for i, m in enumerate(members):
        if not noticeable or late_count[i] / noticeable < CONSISTENT_SHARE or len(lost[i]) < STEP_SHARE * len(steps):
            continue
        per_step = [lost[i].get(k, 0.0) for k in range(len(steps))]
        lost_ms = median(per_step) / 1e6
        extra_ms = sum(excess[i]) / len(steps) / 1e6
        if lost_ms < MIN_LOSS_FRAC * step_ms or extra_ms <= 0:
            continue
        found.append(Straggler(rank=m.rank, lost_ms_per_step=round(lost_ms, 3), compute_excess_ms=round(extra_ms, 3),
                               late_share=round(late_count[i] / noticeable, 3), collectives=late_count[i],
                               steps=len(steps), peers=tuple(x.rank for x in members if x is not m),
                               gpu_excess_ms=round(sum(busy_excess[i]) / len(steps) / 1e6, 3) if measured else None))
    return found, []
