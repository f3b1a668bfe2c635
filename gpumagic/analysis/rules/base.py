"""Shared helpers for rules: building findings, windows and fixes with less ceremony."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpumagic.analysis.context import Context
from gpumagic.report.model import Evidence, Finding, Fix, Window

Rule = Callable[[Context, dict[str, Any]], "Finding | None"]
MAX_WINDOWS = 20


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def windows(starts, ends, lane: str, device: int = -1, label: str = "", limit: int = MAX_WINDOWS) -> tuple[Window, ...]:
    """The longest ``limit`` windows, in time order."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = np.sort(np.argsort(starts - ends, kind="stable")[:limit])
    return tuple(Window(int(starts[i]), int(ends[i]), lane, device, label) for i in keep.tolist())


def pytorch(description: str, code: str) -> Fix:
    return Fix("pytorch", description, code.strip("\n"))


def huggingface(description: str, code: str) -> Fix:
    return Fix("huggingface", description, code.strip("\n"))


def finding(id: str, *, severity: str, title: str, why: str, summary: str, numbers: dict,
            windows: tuple[Window, ...] = (), est_gain: float, gain_method: str, fixes: tuple[Fix, ...],
            doc_url: str) -> Finding:
    return Finding(id=id, severity=severity, title=title, why=" ".join(why.split()),
                   evidence=Evidence(summary=summary, numbers=numbers, windows=windows),
                   est_gain=round(max(0.0, min(1.0, est_gain)), 4), gain_method=gain_method,
                   fixes=fixes, doc_url=doc_url)


def severity_for(gain: float, high: float = 0.2, medium: float = 0.05) -> str:
    """high when the finding could save ≥ 20 % of step time, medium ≥ 5 %, else low."""
    return "high" if gain >= high else "medium" if gain >= medium else "low"
