"""The typed record of a job's JSON (``gpumagic analyze DIR --format json``, :meth:`Job.to_dict`),
from which ``gpumagic schema job`` is generated (:func:`job_schema`)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from gpumagic.report.model import Evidence, Fix, Severity
from gpumagic.report.schema import json_schema


class RankRow(msgspec.Struct, kw_only=True):
    """One rank file of the job."""

    rank: Annotated[int | None, Meta(description="the rank (from distributedInfo or the file name); null when unknown")]
    path: Annotated[str, Meta(description="the rank's trace file")]
    device: Annotated[str | None, Meta(description="its primary GPU's name")]
    step_median_ms: Annotated[float | None, Meta(description="median step duration (ms)")]
    step_p90_ms: Annotated[float | None, Meta(description="90th percentile of the step durations (ms)")]
    gpu_busy_frac: Annotated[float | None, Meta(description="share of the window its GPU was busy (0..1)")]
    comm_ms: Annotated[float | None, Meta(description="collective kernel time (ms)")]
    comm_exposed_ms: Annotated[float | None, Meta(description="collective time not overlapped by compute (ms)")]
    top_finding: Annotated[str | None, Meta(description="id of its finding with the largest gain")]
    findings: Annotated[list[str], Meta(description="ids of its findings")]
    error: Annotated[str | None, Meta(description="why the file could not be analysed; null when it was")]


class JobFindingRow(msgspec.Struct, kw_only=True):
    """A finding of the job: the fields of a report's finding, and the ranks it concerns."""

    id: str
    severity: Severity
    title: str
    why: str
    evidence: Evidence
    est_gain: Annotated[float, Meta(description="upper bound on the share of step time it could save (0..1)")]
    gain_method: str
    fixes: list[Fix]
    doc_url: str
    scope: Annotated[str, Meta(description="'job' (about the ranks together) or 'ranks' (seen on many ranks)")]
    ranks: Annotated[list[int], Meta(description="the ranks it concerns")]
    rank_count: Annotated[int, Meta(description="len(ranks) (count)")]
    of_ranks: Annotated[int, Meta(description="ranks analysed (count)")]
    evidence_rank: Annotated[int | None, Meta(description="the rank whose numbers the evidence shows")]


class OtherFinding(msgspec.Struct, kw_only=True):
    """A per-rank finding seen on fewer than half of the ranks."""

    id: str
    title: str
    ranks: list[int]


class RankGroup(msgspec.Struct, kw_only=True):
    """Ranks doing the same work on the same kind of GPU."""

    ranks: list[int]
    device: str
    work: Annotated[str, Meta(description="fingerprint of the collectives per step")]


class RankError(msgspec.Struct, kw_only=True):
    """A rank file that could not be analysed."""

    rank: int | None
    path: str
    error: str | None


class JobBody(msgspec.Struct, kw_only=True):
    """A multi-rank job: its ranks, the ranks that hold the others back, and its findings."""

    label: str
    world_size: Annotated[int | None, Meta(description="ranks in the job (from distributedInfo); null when unknown")]
    rank_files: Annotated[int, Meta(description="rank files given (count)")]
    analysed: Annotated[int, Meta(description="rank files analysed (count)")]
    step_median_ms: Annotated[float | None, Meta(description="median over the ranks of their median step (ms)")]
    stragglers: Annotated[list[int], Meta(description="ranks that hold the others back")]
    ranks: list[RankRow]
    findings: list[JobFindingRow]
    other_findings: list[OtherFinding]
    groups: list[RankGroup]
    errors: list[RankError]
    notes: list[str]


class JobRecord(msgspec.Struct, kw_only=True):
    """What ``gpumagic analyze DIR --format json`` prints (``Job.to_dict()``)."""

    job: JobBody


def job_schema() -> dict[str, Any]:
    """The schema of ``gpumagic analyze DIR --format json``."""
    return json_schema(JobRecord, title="gpumagic job")
