"""The JSON Schema (draft 2020-12) of gpumagic's JSON outputs, generated from typed records.

Each kind of output has a record type whose fields are the keys of that JSON: :class:`ReportRecord`
here (``gpumagic analyze TRACE --format json``, :meth:`Report.to_dict`), and above this layer the
job, comparison and run records (:mod:`gpumagic.jobs.records`, :mod:`gpumagic.tuning.records`).
:func:`json_schema` turns one into a schema with :func:`msgspec.json.schema_components`; nothing
is written by hand. The metrics sections are the records of :mod:`gpumagic.report.metrics`, each
field described with its unit. docs/schema.md says what is stable and how versions change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from gpumagic.report.metrics import Metrics
from gpumagic.report.model import SCHEMA_VERSION, Finding

DRAFT = "https://json-schema.org/draft/2020-12/schema"
REF_TEMPLATE = "#/$defs/{name}"
#: The keyword carrying the report layout's version in every schema (an annotation: validators ignore it).
VERSION_KEYWORD = "x-gpumagic-schema-version"


class RegressionRecord(msgspec.Struct, kw_only=True):
    """A labelled run slower than the label's latest earlier run beyond both runs' noise (tuning/regression.py)."""

    compared_with: Annotated[str, Meta(description="the earlier run, as r<id>")]
    change: Annotated[str, Meta(description="'slower' (a run that is not slower has no regression)")]
    speedup: Annotated[float | None, Meta(description="median step before ÷ now (below 1: slower)")]
    speedup_ci: Annotated[list[float] | None, Meta(description="95 % bootstrap interval of speedup, [low, high]")]
    conditions: Annotated[list[str], Meta(description="what differed between the runs that can change step times")]
    explained_by: Annotated[str | None, Meta(description="a difference in conditions that alone can explain the slow-down")]


class ReportRecord(msgspec.Struct, kw_only=True):
    """A gpumagic report: what ``gpumagic analyze TRACE --format json`` prints (``Report.to_dict()``)."""

    schema_version: Annotated[int, Meta(description="version of this layout and of the keys' meanings; bumped when a "
                                                    "key's meaning changes (CHANGELOG.md)",
                                        extra_json_schema={"const": SCHEMA_VERSION})]
    label: Annotated[str, Meta(description="the run's label ('' when none was given)")]
    combined_gain: Annotated[float, Meta(ge=0, le=1, description="estimated share of step time saved by fixing every "
                                                                 "finding together, overlapping time counted once (0..1)")]
    regression: Annotated[RegressionRecord | None, Meta(description="null, or how this labelled run is slower than the label's earlier one")]
    metrics: Annotated[Metrics, Meta(description="everything measured; {} when nothing was (the notes say why)")]
    findings: Annotated[list[Finding], Meta(description="diagnoses, largest estimated gain first (warm-up that fills "
                                                        "at least half the window leads)")]
    notes: Annotated[list[str], Meta(description="what was and was not captured, or tolerated in the input")]


def json_schema(record: type, *, title: str, patch: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The draft 2020-12 schema of ``record``'s JSON, with every referenced record under ``$defs``;
    ``patch`` may adjust the definitions (for what a type cannot say, e.g. an empty object)."""
    (root,), defs = msgspec.json.schema_components([record], ref_template=REF_TEMPLATE)
    if patch is not None:
        patch(defs)
    return {"$schema": DRAFT, "title": title, VERSION_KEYWORD: SCHEMA_VERSION, **root, "$defs": defs}


def allow_empty_metrics(defs: dict[str, Any], record: str, key: str = "metrics") -> None:
    """``record.key`` is a :class:`Metrics` object or ``{}`` (a report that measured nothing)."""
    prop = defs[record]["properties"][key]
    empty = {"type": "object", "maxProperties": 0, "description": "nothing was measured (the notes say why)"}
    defs[record]["properties"][key] = {"description": prop.get("description", ""),
                                       "anyOf": [{"$ref": REF_TEMPLATE.format(name="Metrics")}, empty]}


def report_schema() -> dict[str, Any]:
    """The schema of ``gpumagic analyze TRACE --format json``."""
    return json_schema(ReportRecord, title="gpumagic report", patch=lambda d: allow_empty_metrics(d, "ReportRecord"))
