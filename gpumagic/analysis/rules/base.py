"""Shared helpers for rules: registering them, building findings, windows and fixes with less ceremony."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gpumagic.analysis.context import Context
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Evidence, Finding, Fix, Severity, Window

#: A rule: ``rule(ctx, metrics) -> Finding | None``, pure.
Rule = Callable[[Context, Metrics], "Finding | None"]
MAX_WINDOWS = 20
#: Every rule, by the id of the finding it makes, in the order they were registered: the one
#: place a finding id is written (:func:`rule`).
RULES: dict[str, Rule] = {}


def rule(finding_id: str) -> Callable[[Rule], Rule]:
    """Register a rule under the id of the finding it makes. Its body builds the finding with
    :func:`finding` (which takes no id); the registered function stamps ``finding_id`` on it."""
    def register(fn: Rule) -> Rule:
        if finding_id in RULES:
            raise ValueError(f"two rules for the finding id {finding_id!r}")

        @functools.wraps(fn)
        def run(ctx: Context, m: Metrics) -> Finding | None:
            found = fn(ctx, m)
            return None if found is None else dataclasses.replace(found, id=finding_id)

        run.finding_id = finding_id  # type: ignore[attr-defined]
        RULES[finding_id] = run
        return run
    return register


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def windows(starts: Any, ends: Any, lane: str, device: int = -1, label: str = "",
            limit: int = MAX_WINDOWS) -> tuple[Window, ...]:
    """The longest ``limit`` windows, in time order."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = np.sort(np.argsort(starts - ends, kind="stable")[:limit])
    return tuple(Window(int(starts[i]), int(ends[i]), lane, device, label) for i in keep.tolist())


def pytorch(description: str, code: str, *, diagnostic: bool = False) -> Fix:
    """A plain-PyTorch fix; ``diagnostic=True`` for a snippet that finds the cause instead of a change."""
    return Fix("pytorch", description, code.strip("\n"), diagnostic)


def huggingface(description: str, code: str, *, diagnostic: bool = False) -> Fix:
    """A Hugging Face ``TrainingArguments`` fix; ``diagnostic`` as for :func:`pytorch`."""
    return Fix("huggingface", description, code.strip("\n"), diagnostic)


def finding(*, severity: Severity, title: str, why: str, summary: str, numbers: Mapping[str, float | int | str | None],
            windows: tuple[Window, ...] = (), est_gain: float, gain_method: str, fixes: tuple[Fix, ...],
            doc_url: str) -> Finding:
    """A finding of the rule that returns it (:func:`rule` gives it its id)."""
    return Finding(id="", severity=severity, title=title, why=" ".join(why.split()),
                   evidence=Evidence(summary=summary, numbers=dict(numbers), windows=windows),
                   est_gain=round(max(0.0, min(1.0, est_gain)), 4), gain_method=gain_method,
                   fixes=fixes, doc_url=doc_url)


def severity_for(gain: float, high: float = 0.2, medium: float = 0.05) -> Severity:
    """high when the finding could save ≥ 20 % of step time, medium ≥ 5 %, else low."""
    return "high" if gain >= high else "medium" if gain >= medium else "low"
