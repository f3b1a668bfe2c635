"""Typed records of the comparison's JSON (``gpumagic compare A B --format json``) and of a line of
``gpumagic runs export``, from which ``gpumagic schema comparison|run`` are generated."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from gpumagic.report.schema import ReportRecord, allow_empty_metrics, json_schema


class RunFacts(msgspec.Struct, kw_only=True):
    """One side of the comparison."""

    label: str
    source: Annotated[str | None, Meta(description="its trace")]
    device: Annotated[str | None, Meta(description="its primary GPU's name")]
    steps: Annotated[int, Meta(description="recorded steps; 0 when the window is not bounded by step markers (count)")]
    step_median_ms: Annotated[float | None, Meta(description="median step duration (ms)")]
    step_p90_ms: Annotated[float | None, Meta(description="90th percentile of the step durations (ms)")]
    step_mean_ms: Annotated[float | None, Meta(description="mean step duration (ms)")]
    window_ms: Annotated[float | None, Meta(description="analysis window duration (ms)")]
    findings: Annotated[list[str], Meta(description="its finding ids, in the report's order (mistakes in what the code "
                                                    "computes, then largest gain first)")]


class GpuBusyChange(msgspec.Struct, kw_only=True):
    """GPU busy before and after (shares 0..1 of each window)."""

    before: float | None
    after: float | None
    delta: Annotated[float | None, Meta(description="after − before (0..1)")]


class CategoryChange(msgspec.Struct, kw_only=True):
    """One breakdown category before and after."""

    category: str
    before_ms: Annotated[float | None, Meta(description="ms per step (ms in the window without steps)")]
    after_ms: Annotated[float | None, Meta(description="ms per step (ms in the window without steps)")]
    delta_ms: Annotated[float | None, Meta(description="after − before (ms)")]
    before_frac: Annotated[float | None, Meta(description="share of the window before (0..1)")]
    after_frac: Annotated[float | None, Meta(description="share of the window after (0..1)")]


class BreakdownChange(msgspec.Struct, kw_only=True):
    """Each breakdown category's time before and after."""

    unit: Annotated[str, Meta(description="'ms per step' or 'ms in the window'")]
    categories: list[CategoryChange]


class HeadlineChange(msgspec.Struct, kw_only=True):
    """A headline metric before and after."""

    key: str
    name: str
    unit: Annotated[str, Meta(description="'ms', 'count', 'frac' (0..1) or 'bytes'")]
    better: Annotated[str, Meta(description="'lower', 'higher' or ''")]
    before: float | None
    after: float | None


class FindingSide(msgspec.Struct, kw_only=True):
    """A finding on one side."""

    severity: str
    est_gain: Annotated[float, Meta(description="upper bound on the share of step time it could save (0..1)")]


class FindingChange(msgspec.Struct, kw_only=True):
    """A finding on either side."""

    title: str
    before: FindingSide | None
    after: FindingSide | None


class ConditionDetail(msgspec.Struct, kw_only=True):
    """One difference between the runs that can change step times."""

    key: Annotated[str, Meta(description="what differed, e.g. 'other_busy_cores', 'device', 'torch'")]
    before: Annotated[Any, Meta(description="its value in the run before")]
    after: Annotated[Any, Meta(description="its value in the run after")]
    sentence: Annotated[str, Meta(description="the difference in words, with both values")]
    explains: Annotated[bool, Meta(description="the difference alone pushes step time the way the change went")]


class ComparisonRecord(msgspec.Struct, kw_only=True):
    """What ``gpumagic compare A B --format json`` prints (``Comparison.to_dict()``)."""

    before: RunFacts
    after: RunFacts
    step_time_ratio: Annotated[float | None, Meta(description="after ÷ before median step (ratio)")]
    speedup: Annotated[float | None, Meta(description="before ÷ after median step (ratio)")]
    step_time_change_frac: Annotated[float | None, Meta(description="step_time_ratio − 1 (fraction)")]
    speedup_ci: Annotated[list[float] | None, Meta(description="95 % bootstrap interval of speedup over the steps, "
                                                               "[low, high]; null with too few steps")]
    change: Annotated[str, Meta(description="'faster', 'slower' or 'no clear change', from speedup_ci")]
    steps_for_interval: Annotated[int, Meta(description="steps each run needs for an interval (count)")]
    contention_factor: Annotated[float | None, Meta(
        description="when either run was recorded on a busy machine (its loop thread waiting for a core ≥ 5 % of its "
                    "window, or a shared machine): the larger run's 90th-percentile step over its 10th, what the "
                    "machine did to a run's own steps (ratio); a change must clear it; null when both were quiet")] = None
    conditions: Annotated[list[str], Meta(description="what differed between the runs that can change the result, in words")]
    conditions_detail: list[ConditionDetail]
    caution: Annotated[str | None, Meta(description="leads the view when a difference in conditions alone can explain the change")]
    gpu_busy: GpuBusyChange
    breakdown: BreakdownChange
    metrics: list[HeadlineChange]
    resolved: Annotated[list[str], Meta(description="finding ids before only")]
    new: Annotated[list[str], Meta(description="finding ids after only")]
    persisting: Annotated[list[str], Meta(description="finding ids on both sides")]
    findings: Annotated[dict[str, FindingChange], Meta(description="finding id -> both sides")]
    same_tolerance_frac: Annotated[float | None, Meta(description="relative step-time change within which the runs "
                                                                  "count as equally fast (fraction)")]
    verdict: str
    notes: list[str]


class RunRecord(msgspec.Struct, kw_only=True):
    """One line of ``gpumagic runs export``: a stored run and its report."""

    id: int
    label: str
    created_ns: Annotated[int, Meta(description="when it was stored (ns since the Unix epoch)")]
    source: str
    workdir: str
    notebook: str
    options: Annotated[dict[str, Any], Meta(description="the capture options")]
    bundle: Annotated[str, Meta(description="the bundle --save wrote ('' when none)")]
    device: str
    median_step_ms: Annotated[float | None, Meta(description="median step duration (ms)")]
    gpu_busy_frac: Annotated[float | None, Meta(description="share of the window the GPU was busy (0..1)")]
    top_finding: str
    ref: Annotated[str, Meta(description="the run's id as typed: r<id>")]
    when: Annotated[str, Meta(description="local time, YYYY-MM-DD HH:MM:SS")]
    report: ReportRecord


def comparison_schema() -> dict[str, Any]:
    """The schema of ``gpumagic compare A B --format json``."""
    return json_schema(ComparisonRecord, title="gpumagic comparison")


def run_schema() -> dict[str, Any]:
    """The schema of one line of ``gpumagic runs export``."""
    return json_schema(RunRecord, title="gpumagic run", patch=lambda d: allow_empty_metrics(d, "ReportRecord"))
