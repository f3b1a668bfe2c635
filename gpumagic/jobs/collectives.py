"""The job's collectives across ranks: one row per collective (kernel name) with each rank's
arrival skew, wait and duration, and which rank arrives last (``job.collectives``).

Collectives are matched as :mod:`gpumagic.jobs.stragglers` matches them: among ranks doing the
same work, in the same step (by its ``ProfilerStep#`` number) at the same position — never by
absolute time, since the hosts' clocks differ. A synchronous collective ends on every rank at
about the same moment, when the last rank has arrived, so for one instance with durations
``d_r`` (the time each rank spent inside the kernel):

- the last rank to arrive is the one with the shortest ``d_r``;
- a rank's **wait** is ``d_r − min d``: the time it sat in the collective for the last rank;
- a rank's **arrival skew** is ``max d − d_r``: how long after the first rank it arrived.

Each rank's figures are medians over the instances of that collective. Message sizes (and with
them bus bandwidth, NCCL's ``busBw`` of nccl-tests' PERFORMANCE.md) need the byte counts that
newer PyTorch versions record on collective kernels; the rank summaries do not carry them, so
``size_bytes`` and ``bus_gbps`` stay ``None`` here.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import median
from typing import Any

from gpumagic.jobs.stragglers import Group, _aligned_steps
from gpumagic.jobs.summary import RankSummary

MAX_COLLECTIVES = 20


def collective_table(groups: list[Group], by_rank: dict[int, RankSummary]) -> list[dict[str, Any]]:
    """Per group of peer ranks and collective name, the row described in the module docstring,
    the collectives with the most total wait first (at most :data:`MAX_COLLECTIVES`)."""
    rows = []
    for g in groups:
        members = [by_rank[r] for r in g.ranks if r in by_rank]
        if len(members) < 2:
            continue
        per: dict[str, dict[str, Any]] = defaultdict(lambda: {"dur": defaultdict(list), "wait": defaultdict(list),
                                                              "skew": defaultdict(list), "last": Counter(), "n": 0})
        for row in _aligned_steps(members):
            base = members[0]
            for j in range(len(row[0].dur_ns)):
                names = {m.collective_names[s.names[j]] for m, s in zip(members, row)}
                if len(names) != 1:  # the ranks disagree on what this collective is: not comparable
                    continue
                d = [s.dur_ns[j] for s in row]
                lo, hi = min(d), max(d)
                c = per[base.collective_names[row[0].names[j]]]
                c["n"] += 1
                c["last"][members[d.index(lo)].rank] += 1
                for m, x in zip(members, d):
                    c["dur"][m.rank].append(x)
                    c["wait"][m.rank].append(x - lo)
                    c["skew"][m.rank].append(hi - x)
        for name, c in per.items():
            last, times = c["last"].most_common(1)[0]
            rows.append({
                "name": name, "group": g.work, "count": c["n"], "size_bytes": None,
                "last_rank": last, "last_share": round(times / c["n"], 3),
                "total_wait_ms": round(sum(sum(v) for v in c["wait"].values()) / 1e6, 4),
                "ranks": [{"rank": r, "dur_ms": _med(c["dur"][r]), "wait_ms": _med(c["wait"][r]),
                           "skew_ms": _med(c["skew"][r]), "last_count": c["last"].get(r, 0), "bus_gbps": None}
                          for r in sorted(c["dur"])],
            })
    rows.sort(key=lambda r: -r["total_wait_ms"])
    return rows[:MAX_COLLECTIVES]


def _med(v: list[int]) -> float:
    return round(median(v) / 1e6, 4) if v else 0.0


def straggler_citation(table: list[dict[str, Any]], rank: int) -> str:
    """One sentence from the table for a straggler: the collective where it arrives last with
    the most wait, its skew and the others' median wait."""
    mine = [r for r in table if r["last_rank"] == rank]
    if not mine:
        return ""
    top = max(mine, key=lambda r: r["total_wait_ms"])
    others = [x["wait_ms"] for x in top["ranks"] if x["rank"] != rank]
    me = next(x for x in top["ranks"] if x["rank"] == rank)
    return (f"in {_short(top['name'])} (×{top['count']}) rank {rank} arrives last {100 * top['last_share']:.0f} % of the "
            f"time, {me['skew_ms']:.2f} ms (median) after the first rank; the others "
            f"wait {median(others):.2f} ms (median) and it waits {me['wait_ms']:.2f} ms")


def _short(name: str) -> str:
    return name.split("(")[0][:60]
