"""The analysis layer: metrics (interval maths over columns) and rules. Never imports torch."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from gpumagic._env import env_flag
from gpumagic.analysis import aside, segments, selfcheck
from gpumagic.analysis import intervals as iv
from gpumagic.analysis import metrics as _metrics
from gpumagic.analysis.context import Context, build_context
from gpumagic.analysis.gains import IDLE_TYPE, apportion
from gpumagic.analysis.names import long_names_note
from gpumagic.analysis.oom import out_of_memory
from gpumagic.analysis.operators import TOP_OPERATORS
from gpumagic.analysis.rules import CAUSE_RULES, RESIDUAL_RULE, STEADY_IDS, STEADY_RULES
from gpumagic.analysis.rules.base import Rule
from gpumagic.analysis.rules.warmup import lead_with_warmup
from gpumagic.errors import exception_text
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Report, sort_findings
from gpumagic.trace import Trace, load


def analyze(source: str | os.PathLike[str] | dict[str, Any] | Trace, *, label: str = "", top_ops: int = TOP_OPERATORS,
            workers: int = 1) -> Report:
    """Analyse a trace (a path to Kineto JSON / ``.json.gz`` / gpumagic bundle, a parsed dict, or
    a loaded :class:`~gpumagic.trace.Trace`) into a :class:`~gpumagic.report.model.Report`.
    ``"example"`` is the bundled example trace (``gpumagic analyze example``).

    The window is segmented first (:mod:`gpumagic.analysis.segments`): the steady-state rules
    (``rules.STEADY_RULES``) judge its steady part only; the others judge the whole window.
    ``top_ops``: how many operators ``metrics.operators.top`` lists (by GPU time).
    ``workers`` > 1 lets forked processes decode a large trace file in pieces side by side
    (:func:`gpumagic.trace.kineto.from_bytes`) and a forked child compute the costliest metrics
    while this process computes the rest (:mod:`gpumagic.analysis.aside`; Linux, the command
    line's choice): the same report, sooner. Keep the default 1 where other threads run (a
    notebook kernel).
    Raises :class:`~gpumagic.errors.TraceError` when the input is not a readable trace.
    """
    if isinstance(top_ops, bool) or not isinstance(top_ops, int) or top_ops < 0:
        raise ValueError(f"top_ops must be a whole number >= 0, not {top_ops!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a whole number >= 1, not {workers!r}")
    trace = source if isinstance(source, Trace) else load(source, workers=workers)
    ctx = build_context(trace)
    ctx.cache["top_ops"] = top_ops
    empty = selfcheck.is_empty(ctx)
    try:
        aside.start(ctx, _metrics.ASIDE, workers, _metrics.before_aside)
        metrics = _metrics.compute(ctx)
        steady, steady_m, seg_notes = _steady_part(ctx, metrics, workers)
        others = segments.steady_others(ctx) if steady is not None and steady is not ctx else iv.empty()
        findings, failed = _findings(ctx, metrics, steady, steady_m, empty, others)
    finally:  # a child whose values were not taken (an error on the way) is stopped
        aside.finish(ctx)
    findings, combined = apportion(ctx, findings, steady=steady, others=others)
    if ctx.workload == "serving":  # a serving engine: its arguments, not training-loop code (advice/serving.py)
        from gpumagic.analysis.advice.serving import for_serving

        findings = for_serving(findings)
    checks = selfcheck.notes(ctx, model_on_cpu=any(f.id == "model-on-cpu" for f in findings))
    notes = list(trace.notes) + checks + ([] if empty else seg_notes) + failed
    if ctx.window_source == "trace":
        notes.append("No ProfilerStep# markers: the window is the whole trace.")
    notes += filter(None, [long_names_note(trace.names)])  # names past MAX_NAME_CHARS: classified on a prefix
    oom = out_of_memory(trace.meta, metrics)  # from the code's error alone, after everything that may drop findings
    return Report(metrics=metrics, findings=([oom] if oom else []) + lead_with_warmup(sort_findings(findings)), notes=notes, trace=trace,
                  label=label or str(trace.meta.get("label") or ""), combined_gain=combined)


def _findings(ctx: Context, metrics: Metrics, steady: Context | None, steady_m: Metrics | None,
              empty: bool, others: iv.Intervals | None = None) -> tuple[list[Finding], list[str]]:
    """What the cause rules and the residual rule find: the steady-state rules on ``steady``
    (``None``: not judged), the others on the whole window; nothing when the window is ``empty``
    (:func:`selfcheck.is_empty`). Also a note for each rule that failed (:func:`_judge`).
    A steady-state finding's gain, a share of ``steady``, becomes a share of the whole window
    that counts ``others`` too: the window's other steady segments, the same loop between
    evaluations or captures (:func:`segments.steady_others`)."""
    steady_ns = (steady.window_ns if steady is not None else 0) + (iv.total(others) if others is not None else 0)
    findings: list[Finding] = []
    failed: list[str] = []
    unjudged = selfcheck.host_rules_unjudged(ctx)  # counter mode, no host events: a note says so
    for rule in () if empty else CAUSE_RULES:
        if getattr(rule, "finding_id", "") in unjudged:
            f = None
        elif rule not in STEADY_RULES:
            f = _judge(rule, ctx, metrics, failed)
        elif steady is None or steady_m is None:
            f = None
        else:
            f = _judge(rule, steady, steady_m, failed)
            if f is not None and steady is not ctx and f.id not in IDLE_TYPE:  # a share of the whole window
                f = replace(f, est_gain=round(min(1.0, f.est_gain * steady_ns / ctx.window_ns), 4))
        if f is not None:
            findings.append(f)
    low = None if empty else _judge(RESIDUAL_RULE, ctx, metrics, failed)
    if low is not None:
        findings.append(low)
    return findings, failed


def _judge(rule: Rule, ctx: Context, metrics: Metrics, failed: list[str]) -> Finding | None:
    """One rule's finding. A rule that raises on a trace nobody foresaw costs its own finding,
    not the report: a note names it and the error. With ``GPUMAGIC_STRICT_RULES=1`` (the test
    suite sets it) the error propagates, so that no rule's failure goes unseen in a test."""
    try:
        found: Finding | None = rule(ctx, metrics)
        return found
    except Exception as exc:
        if env_flag("GPUMAGIC_STRICT_RULES", False):
            raise
        name = getattr(rule, "finding_id", getattr(rule, "__name__", "a rule"))
        failed.append(f"{name} was not judged: the rule failed on this trace ({type(exc).__name__}: {exception_text(exc)}). "
                      "This is a gpumagic bug; please report it, with the trace if you can share it.")
        return None


def _steady_part(ctx: Context, metrics: Metrics, workers: int = 1) -> tuple[Context | None, Metrics | None, list[str]]:
    """The context and metrics the steady-state rules judge: the whole window when it is all
    steady, else its longest steady stretch, else ``None`` (and a note saying what was not judged)."""
    seg = segments.segments(ctx)
    if seg.all_steady:
        return ctx, metrics, []
    names = ", ".join(sorted(STEADY_IDS))
    shares = ", ".join(f"{k.replace('_', ' ')} {100 * v:.0f} %" for k, v in
                       sorted(seg.share(segments.SEGMENT_KINDS[1:]).items(), key=lambda kv: -kv[1]))
    if seg.steady_span is None:
        steady = [x.dur_ns for x in seg.items if x.kind == "steady"]
        if not steady:
            return None, None, [f"No steady part in the window ({shares} of it): {names} were not judged."]
        return None, None, [
            f"No steady part long enough to judge in the window ({shares} of it; the longest steady stretch, "
            f"{max(steady) / 1e6:.1f} ms, is under {segments.STEADY_MIN_NS / 1e6:g} ms or "
            f"{100 * segments.STEADY_MIN_FRAC:g} % of the window): {names} were not judged."]
    sub = build_context(ctx.trace, window=seg.steady_span, like=ctx)  # the trace's own facts reused
    sub.cache["top_ops"] = ctx.cache.get("top_ops", TOP_OPERATORS)
    aside.start(sub, _metrics.ASIDE, workers, _metrics.before_aside)
    try:
        sub_metrics = _metrics.compute(sub)
    finally:  # taken by now, unless an error came first
        aside.finish(sub)
    a, b = ((sub.lo - ctx.lo) / 1e6, (sub.hi - ctx.lo) / 1e6)
    others = segments.steady_others(ctx)
    if not others[0].size:
        return sub, sub_metrics, [
            f"The window is not all steady ({shares} of it): {names} judged its steady part only, "
            f"+{a:.1f} to +{b:.1f} ms."]
    return sub, sub_metrics, [
        f"The window is not all steady ({shares} of it): {names} judged its longest steady stretch, "
        f"+{a:.1f} to +{b:.1f} ms; their gains count the "
        f"{'other steady stretch' if others[0].size == 1 else f'{others[0].size} other steady stretches'} too "
        f"({100 * (sub.window_ns + iv.total(others)) / ctx.window_ns:.0f} % of the window in all)."]


__all__ = ["analyze"]
