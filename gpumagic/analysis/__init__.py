"""The analysis layer: metrics (interval maths over columns) and rules. Never imports torch."""

from __future__ import annotations

import os
from typing import Any

from gpumagic.analysis import metrics as _metrics
from gpumagic.analysis.context import build_context
from gpumagic.analysis.gains import apportion
from gpumagic.analysis.names import long_names_note
from gpumagic.analysis.operators import TOP_OPERATORS
from gpumagic.analysis.rules import CAUSE_RULES, RESIDUAL_RULE
from gpumagic.report.model import Report, sort_findings
from gpumagic.trace import Trace, load


def analyze(source: str | os.PathLike[str] | dict[str, Any] | Trace, *, label: str = "", top_ops: int = TOP_OPERATORS) -> Report:
    """Analyse a trace (a path to Kineto JSON / ``.json.gz`` / gpumagic bundle, a parsed dict, or
    a loaded :class:`~gpumagic.trace.Trace`) into a :class:`~gpumagic.report.model.Report`.
    ``"example"`` is the bundled example trace (``gpumagic analyze example``).

    ``top_ops``: how many operators ``metrics.operators.top`` lists (by GPU time).
    Raises :class:`~gpumagic.errors.TraceError` when the input is not a readable trace.
    """
    trace = source if isinstance(source, Trace) else load(source)
    ctx = build_context(trace)
    if isinstance(top_ops, bool) or not isinstance(top_ops, int) or top_ops < 0:
        raise ValueError(f"top_ops must be a whole number >= 0, not {top_ops!r}")
    ctx.cache["top_ops"] = top_ops
    metrics = _metrics.compute(ctx)
    findings = [f for f in (rule(ctx, metrics) for rule in CAUSE_RULES) if f is not None]
    low = RESIDUAL_RULE(ctx, metrics)
    if low is not None:
        findings.append(low)
    findings, combined = apportion(ctx, findings)
    notes = list(trace.notes)
    if ctx.device < 0 and not any("CPU activity only" in n for n in notes):
        notes.append("No GPU activity in the trace: CPU activity only.")
    if ctx.window_source == "trace":
        notes.append("No ProfilerStep# markers: the window is the whole trace.")
    notes += filter(None, [long_names_note(trace.names)])  # names past MAX_NAME_CHARS: classified on a prefix
    return Report(metrics=metrics, findings=sort_findings(findings), notes=notes, trace=trace,
                  label=label or str(trace.meta.get("label") or ""), combined_gain=combined)


__all__ = ["analyze"]
