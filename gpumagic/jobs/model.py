"""The job report: one row per rank, the stragglers, the job's findings and notes.

:func:`build` makes a :class:`Job` from the ranks' :class:`~gpumagic.jobs.summary.RankSummary`
objects only — never from their events — so it costs next to nothing however large the traces were.
Like :class:`~gpumagic.report.model.Report`, the job knows its views by name only
(``view("job", "text")`` and so on, registered by :mod:`gpumagic.render.views`).
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from dataclasses import dataclass, field
from statistics import median
from typing import Any, ClassVar

from gpumagic.jobs.collectives import collective_table
from gpumagic.jobs.findings import JobFinding, common_findings, straggler_finding
from gpumagic.jobs.stragglers import Group, Straggler, find_stragglers, peer_groups
from gpumagic.jobs.summary import RankSummary
from gpumagic.report.views import Viewable, view


@dataclass
class Job(Viewable):
    """The analysis of a distributed job, one trace per rank.

    ``ranks`` are sorted by rank (ranks whose file failed keep their place, with ``error`` set);
    ``stragglers`` is the sorted list of straggler ranks; ``findings`` hold ``straggler-rank`` and
    the per-rank findings seen on at least half of the ranks; ``other_findings`` the rest, with
    their ranks; ``notes`` say what could not be compared and why. ``same_recording`` is True
    when every analysed file holds the same recording (identical content under different names):
    there is then nothing to tell stragglers apart by, and the views say so instead of "none".
    """

    ranks: list[RankSummary]
    world_size: int
    stragglers: list[int]
    findings: list[JobFinding]
    other_findings: list[dict]
    groups: list[Group]
    straggler_details: list[Straggler] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    collectives: list[dict] = field(default_factory=list)  # gpumagic.jobs.collectives.collective_table
    label: str = ""
    same_recording: bool = False

    _view_kind: ClassVar[str] = "job"

    @property
    def analysed(self) -> list[RankSummary]:
        return [r for r in self.ranks if r.ok]

    @property
    def errors(self) -> list[RankSummary]:
        return [r for r in self.ranks if not r.ok]

    @property
    def step_median_ms(self) -> float | None:
        steps = [r.step_median_ms for r in self.analysed if r.step_median_ms is not None]
        return round(median(steps), 4) if steps else None

    @property
    def finding_ids(self) -> list[str]:
        return [f.finding.id for f in self.findings]

    def finding(self, finding_id: str) -> JobFinding | None:
        return next((f for f in self.findings if f.finding.id == finding_id), None)

    def to_dict(self) -> dict[str, Any]:
        n = len(self.analysed)
        return {"job": {
            "label": self.label, "world_size": self.world_size, "rank_files": len(self.ranks), "analysed": n,
            "step_median_ms": self.step_median_ms, "stragglers": list(self.stragglers),
            "same_recording": self.same_recording,
            "ranks": [r.to_dict() for r in self.ranks],
            "findings": [f.to_dict(n) for f in self.findings],
            "other_findings": list(self.other_findings),
            "groups": [{"ranks": list(g.ranks), "device": g.device, "work": g.work} for g in self.groups],
            "collectives": list(self.collectives),
            "errors": [{"rank": r.rank, "path": r.path, "error": r.error} for r in self.errors],
            "notes": list(self.notes),
        }}

    def to_json(self, indent: int | None = 2) -> str:
        import json

        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def to_text(self, width: int | None = None) -> str:
        """The job as text ``width`` columns wide; ``None``: ``COLUMNS``, else the terminal's width, else 100."""
        return view("job", "text")(self, width=width)

    def _protected_paths(self) -> list[str]:
        return [r.path for r in self.ranks]  # the rank files (URLs resolved as the readers resolve them)

    def __repr__(self) -> str:
        return (f"<gpumagic Job: {len(self.analysed)} of {len(self.ranks)} ranks analysed, "
                f"stragglers {self.stragglers or 'none'}>")


def _order(r: RankSummary) -> tuple:
    return (r.rank is None, r.rank if r.rank is not None else 0, r.path)


def _rank_notes(ranks: list[RankSummary], world: int | None) -> list[str]:
    notes = []
    for r in ranks:
        if r.ok and r.rank is None:
            notes.append(f"{r.path}: its rank is unknown (no distributedInfo in the trace, no rankN in its name); "
                         "it is left out of the straggler comparison")
    for rank, count in Counter(r.rank for r in ranks if r.rank is not None).items():
        if count > 1:
            paths = ", ".join(os.path.basename(r.path) for r in ranks if r.rank == rank)
            notes.append(f"rank {rank} appears in {count} files ({paths}); the straggler comparison uses the first")
    if world and world > len(ranks):
        notes.append(f"the traces say the job ran {world} ranks; {len(ranks)} trace files were given")
    return notes


def same_recording(ranks: list[RankSummary]) -> bool:
    """Whether two or more rank files were analysed and all hold the same recording: their
    summaries are equal once the file name and the rank it gives are set aside (step and collective
    durations to the nanosecond, kernels, findings). Two real ranks never match to the nanosecond."""
    ok = [dataclasses.replace(r, path="", rank=None, rank_source="") for r in ranks if r.ok]
    return len(ok) >= 2 and all(r == ok[0] for r in ok[1:])


def build(ranks: list[RankSummary], label: str = "") -> Job:
    """The job report from its ranks' summaries (in any order)."""
    ranks = sorted(ranks, key=_order)
    worlds = {r.world_size for r in ranks if r.ok and r.world_size}
    world = worlds.pop() if len(worlds) == 1 else None
    notes = _rank_notes(ranks, world)
    if len(worlds) > 1:
        notes.append(f"the traces disagree on the world size ({', '.join(map(str, sorted(worlds)))})")
    first: dict[int, RankSummary] = {}
    for r in ranks:
        if r.ok and r.rank is not None:
            first.setdefault(r.rank, r)
    groups, group_notes = peer_groups(list(first.values()))
    found: list[Straggler] = []
    copies = same_recording(ranks)
    if copies:  # nothing to compare: no straggler can be told apart (and none is "none")
        notes.append(f"all {len(ranks)} files hold the same recording (identical content under different names), so "
                     "stragglers cannot be told apart: give one trace per rank, each recorded on its own rank")
    else:
        notes += group_notes
        for g in groups:
            stragglers, more = find_stragglers([first[x] for x in g.ranks])
            found += stragglers
            notes += more
    job = Job(ranks=ranks, world_size=world or len(ranks), stragglers=sorted(s.rank for s in found), findings=[],
              other_findings=[], groups=groups, straggler_details=found, notes=notes, label=label, same_recording=copies)
    job.collectives = collective_table(groups, first)
    straggler = straggler_finding(found, job.step_median_ms, job.collectives)
    common, rest = common_findings(ranks)
    job.findings = ([straggler] if straggler else []) + common
    job.other_findings = rest
    return job
