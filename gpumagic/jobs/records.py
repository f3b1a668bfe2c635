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


class CollectiveRank(msgspec.Struct, kw_only=True):
    """One rank's part in a collective (medians over its calls)."""

    rank: int
    dur_ms: Annotated[float | None, Meta(description="median duration of its calls (ms)")]
    wait_ms: Annotated[float | None, Meta(description="median time it waited for the last rank to arrive (ms)")]
    skew_ms: Annotated[float | None, Meta(description="median lateness of its arrival after the first rank's (ms)")]
    last_count: Annotated[int, Meta(description="calls in which it arrived last (count)")]
    bus_gbps: Annotated[float | None, Meta(description=(
        "median bus bandwidth of its calls, nccl-tests' busbw: algbw × 2(n-1)/n for all-reduce, × (n-1)/n for "
        "all-gather, reduce-scatter and all-to-all, × 1 for broadcast, reduce, send/receive (GB/s = 1e9 B/s); "
        "null: the trace lacks the size or the group size"))]
    alg_gbps: Annotated[float | None, Meta(description=(
        "median algorithm bandwidth of its calls, message size over its kernel's duration, waiting included "
        "(GB/s = 1e9 B/s); null: the trace lacks the size"))] = None


class CollectiveRow(msgspec.Struct, kw_only=True):
    """One collective of a group of peer ranks, matched across ranks by step and position."""

    name: Annotated[str, Meta(description="the collective's kernel name")]
    group: Annotated[str, Meta(description="the group of peer ranks (their work fingerprint)")]
    count: Annotated[int, Meta(description="calls matched on every rank (count)")]
    size_bytes: Annotated[int | None, Meta(description=(
        "message size, nccl-tests' S: the buffer of an all-reduce, broadcast, reduce or send/receive, the whole "
        "array of an all-gather, reduce-scatter or all-to-all (bytes); null: not recorded, or different per rank"))]
    collective: Annotated[str | None, Meta(description=(
        "the collective (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, send_recv, "
        "or the name the trace records); null: not recorded"))] = None
    group_size: Annotated[int | None, Meta(description="ranks in the collective's process group (count); null: not recorded")] = None
    last_rank: Annotated[int | None, Meta(description="the rank that arrived last most often")]
    last_share: Annotated[float, Meta(description="share of the calls in which it was last (0..1)")]
    total_wait_ms: Annotated[float, Meta(description="wait of all ranks in it, summed (ms)")]
    ranks: list[CollectiveRank]


class JobBody(msgspec.Struct, kw_only=True):
    """A multi-rank job: its ranks, the ranks that hold the others back, and its findings."""

    label: str
    world_size: Annotated[int | None, Meta(description="ranks in the job (from distributedInfo); null when unknown")]
    rank_files: Annotated[int, Meta(description="rank files given (count)")]
    analysed: Annotated[int, Meta(description="rank files analysed (count)")]
    step_median_ms: Annotated[float | None, Meta(description="median over the ranks of their median step (ms)")]
    stragglers: Annotated[list[int], Meta(description="ranks that hold the others back")]
    same_recording: Annotated[bool, Meta(description="every rank file holds the same recording: stragglers cannot be told")]
    ranks: list[RankRow]
    findings: list[JobFindingRow]
    other_findings: list[OtherFinding]
    groups: list[RankGroup]
    collectives: Annotated[list[CollectiveRow], Meta(description="each collective across the ranks, most wait first")]
    errors: list[RankError]
    notes: list[str]


class JobRecord(msgspec.Struct, kw_only=True):
    """What ``gpumagic analyze DIR --format json`` prints (``Job.to_dict()``)."""

    job: JobBody


def job_schema() -> dict[str, Any]:
    """The schema of ``gpumagic analyze DIR --format json``."""
    return json_schema(JobRecord, title="gpumagic job")
