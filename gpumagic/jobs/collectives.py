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

Each rank's figures are medians over the instances of that collective. A row is one kernel name
with one message: the collective, its size and its group's size where the trace records them
(:mod:`gpumagic.jobs.messages`), so that an all-reduce of 1 MB and one of 1 GB that run the same
kernel are two rows. Each rank's ``alg_gbps`` and ``bus_gbps`` are nccl-tests' algorithm and bus
bandwidths (doc/PERFORMANCE.md) of its own calls: ``None`` when the trace lacks the size (or, for
the bus bandwidth of an all-reduce, all-gather, reduce-scatter or all-to-all, the group size).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import median
from typing import Any

from gpumagic.jobs.messages import UNKNOWN, Message
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
        per: dict[tuple, dict[str, Any]] = defaultdict(lambda: {
            "dur": defaultdict(list), "wait": defaultdict(list), "skew": defaultdict(list),
            "alg": defaultdict(list), "bus": defaultdict(list), "last": Counter(), "n": 0})
        for row in _aligned_steps(members):
            base = members[0]
            for j in range(len(row[0].dur_ns)):
                names = {m.collective_names[s.names[j]] for m, s in zip(members, row)}
                if len(names) != 1:  # the ranks disagree on what this collective is: not comparable
                    continue
                d = [s.dur_ns[j] for s in row]
                msgs = [s.messages[j] if len(s.messages) == len(s.dur_ns) else UNKNOWN for s in row]
                lo, hi = min(d), max(d)
                kind, size, group_size = _shared(msgs)
                c = per[base.collective_names[row[0].names[j]], kind, size, group_size]
                c["n"] += 1
                c["last"][members[d.index(lo)].rank] += 1
                for m, x, msg in zip(members, d, msgs):
                    c["dur"][m.rank].append(x)
                    c["wait"][m.rank].append(x - lo)
                    c["skew"][m.rank].append(hi - x)
                    c["alg"][m.rank].append(msg.alg_gbps(x))
                    c["bus"][m.rank].append(msg.bus_gbps(x))
        for (name, kind, size, group_size), c in per.items():
            last, times = c["last"].most_common(1)[0]
            rows.append({
                "name": name, "group": g.work, "count": c["n"], "collective": kind, "size_bytes": size,
                "group_size": group_size, "last_rank": last, "last_share": round(times / c["n"], 3),
                "total_wait_ms": round(sum(sum(v) for v in c["wait"].values()) / 1e6, 4),
                "ranks": [{"rank": r, "dur_ms": _med(c["dur"][r]), "wait_ms": _med(c["wait"][r]),
                           "skew_ms": _med(c["skew"][r]), "last_count": c["last"].get(r, 0),
                           "alg_gbps": _med_gbps(c["alg"][r]), "bus_gbps": _med_gbps(c["bus"][r])}
                          for r in sorted(c["dur"])],
            })
    rows.sort(key=lambda r: -r["total_wait_ms"])
    return rows[:MAX_COLLECTIVES]


def _med(v: list[int]) -> float:
    return round(median(v) / 1e6, 4) if v else 0.0


def _med_gbps(v: list[float | None]) -> float | None:
    """The median bandwidth of a rank's calls; None unless every call has one."""
    return float(f"{median(v):.4g}") if v and None not in v else None  # type: ignore[type-var]


def _shared(msgs: list[Message]) -> tuple[str | None, int | None, int | None]:
    """The collective, size and group size the ranks agree on for one call (None where they
    differ or do not say: an all-to-all with uneven splits has one size per rank)."""
    def same(values: list) -> object:
        return values[0] if len(set(values)) == 1 else None
    return (same([m.collective for m in msgs]), same([m.size_bytes for m in msgs]),  # type: ignore[return-value]
            same([m.group_size for m in msgs]))


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
