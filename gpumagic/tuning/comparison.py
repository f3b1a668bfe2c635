"""Before/after: what one change bought, measured on two runs (``gpumagic.compare``).

(The module is not called ``compare``: a submodule of that name would replace the function
``gpumagic.compare`` on the package as soon as it is imported.)

::

    cmp = gpumagic.compare("before.json.gz", "after.json.gz")   # or Reports, runs, or labels
    cmp.to_dict()["step_time_ratio"]    # after / before, median step time
    cmp                                 # in a notebook: the HTML table; in a terminal: text

``a`` is the run *before* the change, ``b`` the run *after* it. Each may be a
:class:`~gpumagic.report.model.Report`, anything with a ``.report`` (a run from
``gpumagic.profile()``), a trace path (Kineto JSON, ``.json.gz`` or a gpumagic bundle) or a run of
the history (:mod:`gpumagic.tuning.runs`), also from an earlier kernel: ``LABEL`` (its latest run),
``LABEL@N`` (its N-th most recent) or ``r<id>``.

Step time is the median of the recorded steps (``ProfilerStep#`` markers), so runs with a
different number of steps still compare. The breakdown is per step for the same reason.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpumagic.errors import GpumagicError
from gpumagic.report.metrics import Metrics
from gpumagic.report.views import Viewable
from gpumagic.tuning import stats

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Report

#: A change of the median step under 3 % is called "about the same" (more when the runs' own
#: steps vary more: see :func:`same_tolerance`). Our choice: the step-to-step jitter of a training
#: loop on a quiet machine is a few percent (MAD/median of the steps in four of the five
#: fixture traces with steps: 0.3-2 %).
SAME_STEP_TOLERANCE = 0.03
#: Standard error of a sample median relative to σ/√n for normal data: √(π/2) ≈ 1.2533.
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
#: Fewer recorded steps than this make the median step a weak estimate (torch.profiler's
#: examples record 3-5 active steps).
FEW_STEPS = 3
#: Other processes' load "differs" between two runs when it moved by at least half a core and a
#: quarter of the usable cores (``analysis.hostload``'s threshold for a shared machine).
LOAD_CHANGE_CORES = 0.5
LOAD_CHANGE_SHARE = 0.25
#: A GPU clock that moved by 10 % or more (our choice: boost clocks wander by a few percent
#: under steady load; a cap or thermal slowdown moves them by more).
CLOCK_CHANGE_FRAC = 0.10
#: The headline metrics compared beside step time: (key, name, path in metrics, kind, better).
#: kind: "ms_per_step"/"count_per_step" divide a window total by the step count (when both runs
#: have steps); "frac" is a share of the window; "bytes". better: "lower", "higher" or "".
HEADLINE: tuple[tuple[str, str, Callable[[Metrics], float | None], str, str], ...] = (
    ("gpu_idle_ms", "GPU idle", lambda m: m.idle.total_ms, "ms_per_step", "lower"),
    ("dataloader_frac", "data-loader wait", lambda m: m.host.dataloader_frac, "frac", "lower"),
    ("kernel_count", "kernels", lambda m: m.kernels.count, "count_per_step", ""),
    ("memcpy_ms", "memory copies", lambda m: m.copies.total_ms, "ms_per_step", "lower"),
    ("sync_blocked_ms", "host blocked in syncs", lambda m: m.syncs.blocked_ms, "ms_per_step", "lower"),
    ("peak_allocated_bytes", "peak GPU memory", lambda m: m.memory.peak_allocated_bytes, "bytes", ""),
)
TRACE_SUFFIXES = (".gz", ".json", ".pt.trace", ".trace")


def compare(a: Any, b: Any) -> Comparison:
    """Compare run ``a`` (before) with run ``b`` (after); see the module docstring for inputs.

    Raises :class:`~gpumagic.errors.TraceError` for a missing or unreadable trace file,
    :class:`~gpumagic.tuning.runs.UnknownRunError` for a string that is neither a file nor a remembered
    label while some labels are remembered, :class:`GpumagicError` for a run without a report,
    and :class:`TypeError` for anything else.
    """
    report_a, label_a = _as_report(a)
    report_b, label_b = _as_report(b)
    label_a, label_b = _distinct_labels(label_a or "before", label_b or "after")
    return Comparison(report_a, report_b, label_a, label_b)


def _as_report(x: Any) -> tuple[Report, str]:
    """The Report behind ``x`` and a label for it (the report's, else the file name)."""
    from gpumagic.report.model import Report

    if isinstance(x, Report):
        return x, x.label
    if isinstance(x, (str, os.PathLike)):
        return _report_from_path_or_label(x)
    if hasattr(x, "report"):
        report = x.report
        if report is None:
            raise GpumagicError(f"{x!r} has no report: nothing was recorded, so it cannot be compared")
        return _as_report(report)
    raise TypeError(f"compare() takes Reports, runs (with .report), trace paths or run labels, not {type(x).__name__}")


def _report_from_path_or_label(x: str | os.PathLike) -> tuple[Report, str]:
    from gpumagic.analysis import analyze
    from gpumagic.tuning import runs

    text = os.fspath(x)
    if isinstance(x, str) and not os.path.exists(text):  # a run of the history: LABEL, LABEL@N or r<id>
        try:
            row = runs.find(text)
        except runs.UnknownRunError:
            known = runs.labels()
            if known:
                listed = ", ".join(repr(k) for k in known[-20:])
                raise runs.UnknownRunError(f"{text!r} is neither a trace file nor a remembered run; known labels: {listed}") from None
        else:
            report = runs.get(text)
            return report, (report.label or text) if text == row.label else text
    report = analyze(text)
    return report, report.label or trace_stem(text)


def trace_stem(path: str) -> str:
    """``'runs/resnet50_workers0.json.gz'`` → ``'resnet50_workers0'``."""
    name = Path(path).name
    stripped = True
    while stripped:
        stripped = False
        for suffix in TRACE_SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, stripped = name[: -len(suffix)], True
    return name


def _distinct_labels(a: str, b: str) -> tuple[str, str]:
    return (f"{a} (before)", f"{b} (after)") if a == b else (a, b)


@dataclass
class Comparison(Viewable):
    """Two reports side by side. :meth:`to_dict` holds every number; the renderers read it."""

    before: Report
    after: Report
    label_before: str = "before"
    label_after: str = "after"
    data: dict[str, Any] = field(init=False, repr=False)

    _view_kind: ClassVar[str] = "comparison"

    def __post_init__(self) -> None:
        self.data = summarise(self.before, self.after, self.label_before, self.label_after)

    @property
    def step_time_ratio(self) -> float | None:
        return self.data["step_time_ratio"]

    @property
    def speedup(self) -> float | None:
        return self.data["speedup"]

    @property
    def change(self) -> str:
        """"faster", "slower" or "no clear change", from the 95 % interval of the speed-up."""
        return self.data["change"]

    @property
    def speedup_ci(self) -> list[float] | None:
        """[low, high]: the 95 % bootstrap interval of :attr:`speedup`; None with too few steps."""
        ci = self.data["speedup_ci"]
        return None if ci is None else list(ci)

    @property
    def conditions(self) -> list[str]:
        """What differed between the runs, besides the change, that can move step times."""
        return list(self.data["conditions"])

    @property
    def resolved(self) -> list[str]:
        return list(self.data["resolved"])

    @property
    def new(self) -> list[str]:
        return list(self.data["new"])

    @property
    def persisting(self) -> list[str]:
        return list(self.data["persisting"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``step_time_ratio``, ``speedup``, ``speedup_ci``, ``change``, ``conditions``,
        ``caution``, ``gpu_busy``, ``breakdown``, ``metrics``, ``resolved``/``new``/``persisting``
        (finding ids), ``findings`` (details), ``notes``."""
        import copy

        return copy.deepcopy(self.data)

    def to_json(self, indent: int | None = 2) -> str:
        import json

        return json.dumps(self.data, indent=indent, allow_nan=False)

    def _view_subject(self) -> dict[str, Any]:
        return self.data  # the views read the numbers only

    def _protected_paths(self) -> list[str]:
        return [getattr(r.trace, "source", "") or "" for r in (self.before, self.after)]  # the traces compared

    def __repr__(self) -> str:
        return f"<gpumagic Comparison {self.label_before!r} → {self.label_after!r}: {self.data['verdict']}>"


# -- the numbers ----------------------------------------------------------------------------------


def summarise(a: Report, b: Report, label_a: str, label_b: str) -> dict[str, Any]:
    """Every number of the comparison, as plain JSON-ready data."""
    ma, mb = a.metrics, b.metrics
    steps_a, steps_b = _step_count(ma), _step_count(mb)
    ratio = _significant(_step_ratio(None if mb is None else mb.steps.median_ms, None if ma is None else ma.steps.median_ms))
    busy_a, busy_b = (None if ma is None else ma.gpu.busy_frac), (None if mb is None else mb.gpu.busy_frac)
    data: dict[str, Any] = {
        "before": _run_facts(a, label_a),
        "after": _run_facts(b, label_b),
        "step_time_ratio": ratio,
        # from the stored ratio, to 4 significant digits; the verdict and the renders print this same
        # number (rounding the raw ratio and its inverse separately once showed 2.59× beside 2.58×)
        "speedup": stats.speedup_of(ratio) if ratio else None,
        "step_time_change_frac": _round(None if ratio is None else ratio - 1),
        "gpu_busy": {"before": busy_a, "after": busy_b, "delta": _round(difference(busy_b, busy_a))},
        "breakdown": _breakdown(ma, mb, steps_a, steps_b),
        "metrics": [_headline_row(row, ma, mb, steps_a, steps_b) for row in HEADLINE],
    }
    data.update(_findingsdifference(a, b))
    data["same_tolerance_frac"] = _round(same_tolerance(a, b))
    data.update(step_change(ma, mb, steps_a, steps_b, ratio))
    found = differing_conditions(ma, mb, data["before"], data["after"], data["change"])
    data["conditions"] = [c["sentence"] for c in found]
    data["conditions_detail"] = found
    explaining = [c["sentence"] for c in found if c["explains"]]
    data["caution"] = (f"Read with care: {explaining[0][0].lower()}{explaining[0][1:]} That alone can make "
                       f"a run {'slower' if data['change'] == stats.SLOWER else 'faster'}; "
                       "measure both again under the same conditions before you trust the change.") if explaining else None
    data["verdict"] = verdict(data, data["same_tolerance_frac"])
    data["notes"] = comparability_notes(a, b, data)
    return data


def _get(rec: Any, key: str) -> Any:
    """``rec.key``, or None where ``rec`` is None (a report that measured nothing, an older one)."""
    return None if rec is None else getattr(rec, key, None)


def step_change(ma: Metrics | None, mb: Metrics | None, steps_a: int, steps_b: int, ratio: float | None) -> dict[str, Any]:
    """``speedup_ci`` (the 95 % bootstrap interval of the speed-up over the recorded steps, or
    None with fewer than :data:`~gpumagic.tuning.stats.MIN_STEPS` in either run) and ``change``."""
    da = _get(_get(ma, "steps"), "durations_ms") if steps_a else None
    db = _get(_get(mb, "steps"), "durations_ms") if steps_b else None
    ci = stats.speedup_interval(da or [], db or []) if ratio is not None else None
    speedup = None if ratio is None else 1 / ratio
    change = stats.change_of(speedup, ci)
    factor = contention_factor(ma, mb)
    if factor is not None and ci is not None and not (ci[0] > factor or ci[1] < 1 / factor):
        change = stats.NO_CLEAR_CHANGE  # within what the busy machine did to a run's own steps
    return {"speedup_ci": None if ci is None else [_significant(ci[0]), _significant(ci[1])],
            "change": change, "steps_for_interval": stats.MIN_STEPS,
            "contention_factor": None if factor is None else _significant(factor)}


def core_wait(m: Metrics | None) -> float | None:
    """The share of a run's window its loop thread was runnable without a core (None unrecorded)."""
    value = _get(_get(m, "host"), "main_runqueue_wait_frac")
    return None if value is None else float(value)


def busy(m: Metrics | None) -> bool:
    """Whether a run was recorded on a busy machine (``analysis.hostload.busy_machine``: its loop
    thread waited for a core 5 % of its window or more, or the machine was shared); its step times
    then move with the neighbours' load in stretches (see :func:`contention_factor`)."""
    from gpumagic.analysis.hostload import busy_machine

    return busy_machine(_get(m, "host"))


def step_spread(m: Metrics | None) -> float | None:
    """A run's 90th-percentile step over its 10th (``stats.spread``; ≥ 1; None with fewer than two steps)."""
    s = stats.spread(_get(_get(m, "steps"), "durations_ms"))
    if s["count"] < 2 or not s["p10_ms"]:
        return None
    return max(s["p90_ms"] / s["p10_ms"], 1.0)


def contention_factor(ma: Metrics | None, mb: Metrics | None) -> float | None:
    """When either run was recorded on a busy machine (:func:`busy`): the larger of the two runs'
    :func:`step_spread`, how far the machine moved one run's own steps; a change between the runs
    must clear it to be called one. None when both machines were quiet (or unrecorded).

    The neighbours' load moves step times in stretches (a burst covers many steps in a row), so the
    bootstrap over steps, which takes them as independent, gives too narrow an interval: beside a
    test run on this project's 2-core machine the same loop read 22× faster (interval 2–34×; its
    steps 1.6–232 ms in one run) and 2.9× slower (2.2–3.0×; one run's steps 2.1–3.9 ms, the other's
    2.7–8.3 ms, p90/p10 2.6). The recorded load does not bound the effect either: 1.3–2.0 of 2 cores
    of other work stretched one loop's steps 100× and left another's within 10 %, and neighbours
    sharing the memory bus slow a whole run without any wait for a core. What a run's own steps
    show is what the machine did to them; a difference smaller than that is not called a change."""
    if not busy(ma) and not busy(mb):
        return None
    spreads = [x for x in (step_spread(ma), step_spread(mb)) if x is not None]
    return max(spreads) if spreads else None


def _times(x: float) -> str:
    """A factor to read: ``117``, ``2.5``."""
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


def _load_said(m: Metrics | None, side: str) -> str:
    """``before: other processes used 0.6 of 2 cores, the loop's thread waited for a core 28 % of the time``."""
    host = _get(m, "host")
    other, usable, w = _get(host, "other_busy_cores"), _get(host, "usable_cores"), core_wait(m)
    parts = []
    if other is not None:
        parts.append(f"other processes used {other:.1f}" + (f" of {usable:g} cores" if usable else " cores"))
    if w is not None:
        parts.append(f"the loop's thread waited for a core {w * 100:.0f} % of the time")
    return f"{side}: " + (", ".join(parts) if parts else "not recorded")


def _cores(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.1f}"


def differing_conditions(ma: Metrics | None, mb: Metrics | None, fa: dict[str, Any], fb: dict[str, Any],
                         change: str) -> list[dict[str, Any]]:
    """What differed between the runs that can change step times, each as ``{"key", "before",
    "after", "sentence", "explains"}``; ``explains`` when the difference alone pushes step time
    the way the change went (more load from other processes and a slower run, ...). Only
    differences both runs recorded are listed."""
    slower, faster = change == stats.SLOWER, change == stats.FASTER
    out: list[dict[str, Any]] = []

    def add(key: str, before: Any, after: Any, sentence: str, explains: bool) -> None:
        out.append({"key": key, "before": before, "after": after, "sentence": sentence, "explains": bool(explains)})

    ha, hb = _get(ma, "host"), _get(mb, "host")
    oa, ob = _get(ha, "other_busy_cores"), _get(hb, "other_busy_cores")
    usable = max([u for u in (_get(ha, "usable_cores"), _get(hb, "usable_cores")) if u] or [0])
    if oa is not None and ob is not None and abs(ob - oa) >= max(LOAD_CHANGE_CORES, LOAD_CHANGE_SHARE * usable):
        add("other_busy_cores", oa, ob,
            f"Other processes kept {_cores(oa)} cores busy before and {_cores(ob)} after"
            + (f" (of {usable:g} usable)." if usable else "."), (slower and ob > oa) or (faster and ob < oa))
    ua, ub = _get(ha, "usable_cores"), _get(hb, "usable_cores")
    if ua and ub and ua != ub:
        add("usable_cores", ua, ub, f"The run could use {ua:g} cores before and {ub:g} after.",
            (slower and ub < ua) or (faster and ub > ua))
    if fa["device"] != fb["device"]:
        add("device", fa["device"], fb["device"],
            f"The runs used different devices ({fa['device'] or 'no GPU'} before, {fb['device'] or 'no GPU'} after): "
            "step times compare the hardware as well as the change.", change != stats.NO_CLEAR_CHANGE)
    ga, gb = _get(ha, "gpu_other_processes"), _get(hb, "gpu_other_processes")
    if ga is not None and gb is not None and (ga > 0) != (gb > 0):
        add("gpu_other_processes", ga, gb, f"Other processes on the GPU: {ga} before, {gb} after.",
            (slower and gb > ga) or (faster and gb < ga))
    ta, tb = _get(ha, "gpu_throttle_reasons"), _get(hb, "gpu_throttle_reasons")
    if ta is not None and tb is not None and set(ta) != set(tb):
        add("gpu_throttle_reasons", ta, tb, f"GPU clocks slowed by {', '.join(ta) or 'nothing'} before and by "
            f"{', '.join(tb) or 'nothing'} after.", (slower and set(tb) - set(ta)) or (faster and set(ta) - set(tb)))
    ca, cb = _get(ha, "gpu_sm_clock_mhz"), _get(hb, "gpu_sm_clock_mhz")
    if ca and cb and abs(cb - ca) / max(ca, cb) >= CLOCK_CHANGE_FRAC:
        add("gpu_sm_clock_mhz", ca, cb, f"The GPU's median SM clock was {ca:.0f} MHz before and {cb:.0f} MHz after.",
            (slower and cb < ca) or (faster and cb > ca))
    va, vb = _get(ma, "conditions"), _get(mb, "conditions")
    for key, name in (("torch", "torch"), ("cuda", "CUDA")):
        xa, xb = _get(va, key), _get(vb, key)
        if xa and xb and xa != xb:
            add(key, xa, xb, f"{name} {xa} before, {xb} after.", False)
    oa_, ob_ = _get(va, "capture_options"), _get(vb, "capture_options")
    if oa_ is not None and ob_ is not None and set(oa_) != set(ob_):
        more_after = set(ob_) - set(oa_)
        add("capture_options", oa_, ob_, f"Capture options that add profiler cost per operator: "
            f"{', '.join(oa_) or 'none'} before, {', '.join(ob_) or 'none'} after.",
            (slower and more_after) or (faster and set(oa_) - set(ob_)))
    return out


def _step_count(m: Metrics | None) -> int:
    """Recorded steps, or 0 when the window is not bounded by step markers."""
    if m is None or m.window.source != "steps":
        return 0
    return m.steps.count


def _step_ratio(after_ms: float | None, before_ms: float | None) -> float | None:
    """``after_ms / before_ms``; None unless both median steps last some time (a trace whose
    step markers have zero length has no step time to compare)."""
    if after_ms is None or before_ms is None or not after_ms > 0 or not before_ms > 0:
        return None
    ratio = after_ms / before_ms
    return ratio if math.isfinite(ratio) and ratio > 0 else None


def difference(x: float | None, y: float | None) -> float | None:
    """``x - y``, or None when either is missing."""
    return None if x is None or y is None else x - y


def _significant(x: float | None, digits: int = 4) -> float | None:
    """``x`` to ``digits`` significant digits (a ratio of 1e-9 stays above zero)."""
    return None if x is None else float(f"{x:.{digits}g}")


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def _run_facts(r: Report, label: str) -> dict[str, Any]:
    m = r.metrics
    devices = [] if m is None else m.trace.devices
    primary = None if m is None else m.gpu.primary_device
    names = [d.name for d in devices if d.id == primary] or [d.name for d in devices[:1]]
    return {
        "label": label,
        "source": None if m is None else m.trace.source,
        "device": names[0] if names else None,
        "steps": _step_count(m),
        "step_median_ms": None if m is None else m.steps.median_ms,
        "step_p90_ms": None if m is None else m.steps.p90_ms,
        "step_mean_ms": _mean_step_ms(m),
        "window_ms": None if m is None else m.window.dur_ms,
        "findings": r.finding_ids,
    }


def _mean_step_ms(m: Metrics | None) -> float | None:
    durations = [] if m is None else m.steps.durations_ms
    return round(statistics.fmean(durations), 4) if durations and _step_count(m) else None


def _per_step(value: float | None, steps: int) -> float | None:
    return None if value is None else (value / steps if steps else value)


def _breakdown(ma: Metrics | None, mb: Metrics | None, steps_a: int, steps_b: int) -> dict[str, Any]:
    """Each category's time per step (per window when either run has no step markers)."""
    per_step = bool(steps_a and steps_b)
    sa, sb = (steps_a, steps_b) if per_step else (0, 0)
    ba, bb = (None if ma is None else ma.breakdown), (None if mb is None else mb.breakdown)
    order = list((ba.order if ba is not None else None) or (bb.order if bb is not None else None) or [])
    rows = []
    for cat in order:
        x = _per_step(None if ba is None else ba.total_ms.get(cat), sa)
        y = _per_step(None if bb is None else bb.total_ms.get(cat), sb)
        rows.append({"category": cat, "before_ms": _round(x, 3), "after_ms": _round(y, 3), "delta_ms": _round(difference(y, x), 3),
                     "before_frac": None if ba is None else ba.frac.get(cat),
                     "after_frac": None if bb is None else bb.frac.get(cat)})
    return {"unit": "ms per step" if per_step else "ms in the window", "categories": rows}


def _headline_row(row: tuple[str, str, Callable[[Metrics], float | None], str, str], ma: Metrics | None,
                  mb: Metrics | None, steps_a: int, steps_b: int) -> dict[str, Any]:
    key, name, read, kind, better = row
    x, y = (None if ma is None else read(ma)), (None if mb is None else read(mb))
    per_step = kind.endswith("_per_step") and steps_a and steps_b
    if per_step:
        x, y = _per_step(x, steps_a), _per_step(y, steps_b)
    unit = {"ms_per_step": "ms", "count_per_step": "count", "frac": "frac", "bytes": "bytes"}[kind]
    return {"key": key, "name": name + (" per step" if per_step else ""), "unit": unit, "better": better,
            "before": _round(x, 4), "after": _round(y, 4)}


def _findingsdifference(a: Report, b: Report) -> dict[str, Any]:
    """Finding ids resolved (before only), new (after only) and persisting (both), each in its
    report's order (largest estimated gain first; mistakes in what the code computes, then warm-up that
    fills the window, lead)."""
    ids_a, ids_b = a.finding_ids, b.finding_ids
    details = {}
    for fid in dict.fromkeys(ids_a + ids_b):
        fa, fb = a.finding(fid), b.finding(fid)
        details[fid] = {"title": (fb or fa).title,
                        "before": None if fa is None else {"severity": fa.severity, "est_gain": fa.est_gain},
                        "after": None if fb is None else {"severity": fb.severity, "est_gain": fb.est_gain}}
    return {
        "resolved": [f for f in ids_a if f not in ids_b],
        "new": [f for f in ids_b if f not in ids_a],
        "persisting": [f for f in ids_b if f in ids_a],
        "findings": details,
    }


def same_tolerance(before: Report, after: Report) -> float:
    """The relative step-time change below which the runs count as equally fast.

    Each run's median step has a standard error of about 1.25 × σ / √n, with σ estimated robustly
    as 1.4826 × MAD (the median absolute deviation ignores one slow step). The tolerance is two
    combined standard errors of the two medians, relative to each median (about 95 % confidence
    for normal noise), and at least :data:`SAME_STEP_TOLERANCE`. A noisy run thus widens the band
    only as much as its step count leaves the median uncertain."""
    variances = []
    for r in (before, after):
        durations = [] if r.metrics is None else r.metrics.steps.durations_ms
        median = None if r.metrics is None else r.metrics.steps.median_ms
        if len(durations) >= 2 and median:
            mad = statistics.median(abs(d - median) for d in durations)
            se_rel = MEDIAN_SE_FACTOR * 1.4826 * mad / median / math.sqrt(len(durations))
            variances.append(se_rel**2)
    return max(SAME_STEP_TOLERANCE, 2 * math.sqrt(sum(variances)))


def verdict(data: dict[str, Any], tolerance: float = SAME_STEP_TOLERANCE) -> str:
    """One sentence: faster, slower or no clear change, as ``data["change"]`` decided it from
    the interval of the speed-up; with too few steps for an interval, the measured ratio and that
    it cannot be told from noise. (``tolerance`` is kept for callers of the older signature: a
    ``data`` without ``change`` is judged by it.)"""
    ratio = data["step_time_ratio"]
    if ratio is None:
        if data["before"]["steps"] and data["after"]["steps"]:
            return "Step times cannot be compared: a run's median step lasts no time."
        return "Step times cannot be compared: a run has no ProfilerStep# markers."
    change_pct = (ratio - 1) * 100
    ci = data.get("speedup_ci")
    interval = None if ci is None else (ci[0], ci[1])
    if "change" not in data:  # the older call: a ratio and a tolerance
        if abs(ratio - 1) <= tolerance:
            return f"About the same: the median step changed by {change_pct:+.1f} %, within the step-to-step variation."
        return stats.fmt_speedup(stats.speedup_of(ratio), None).split(" (")[0] + (
            f": the median step is {abs(change_pct):.0f} % {'shorter' if ratio < 1 else 'longer'}.")
    if interval is None:
        steps = f"{data['before']['steps']} and {data['after']['steps']}"
        return (f"No clear change: the median step changed by {change_pct:+.0f} % "
                f"({stats.fmt_speedup(stats.speedup_of(ratio), None).split(' (')[0]}), but the runs have too few steps ({steps}; "
                f"{stats.MIN_STEPS} each are needed) to tell that from noise.")
    shown = stats.fmt_speedup(stats.speedup_of(ratio), interval)
    factor = data.get("contention_factor")
    if data["change"] == stats.NO_CLEAR_CHANGE and factor is not None and not interval[0] <= 1 <= interval[1]:
        # shown reads "2.9× slower (2–7×)": the interval in the direction it names
        return (f"No clear change: the median step changed by {change_pct:+.1f} % ({shown.replace(' (', ', 95 % interval ')}"
                f", but the machine was busy, and it moved one run's own steps "
                f"{_times(factor)}× (90th percentile over 10th) apart.")
    if data["change"] == stats.NO_CLEAR_CHANGE:
        return (f"No clear change: the median step changed by {change_pct:+.1f} %; the 95 % interval of the speed-up "
                f"({shown.split('interval ')[-1].rstrip(')')}) includes no change.")
    return f"{shown}: the median step is {abs(change_pct):.0f} % {'shorter' if ratio < 1 else 'longer'}."


def comparability_notes(a: Report, b: Report, data: dict[str, Any]) -> list[str]:
    """Reasons to read the comparison with care (few steps, no steps, the same trace); what
    differed between the runs is in ``data["conditions"]``."""
    notes = []
    for side in ("before", "after"):
        facts = data[side]
        if not facts["steps"]:
            notes.append(f"{facts['label']}: no ProfilerStep# markers, so its numbers cover the whole trace.")
        elif facts["steps"] < FEW_STEPS:
            notes.append(f"{facts['label']}: only {facts['steps']} recorded step(s): the median step is a weak estimate.")
    if data["breakdown"]["unit"] != "ms per step":
        notes.append("The breakdown compares totals over each trace, not time per step.")
    if data.get("contention_factor") is not None:
        said = "; ".join(_load_said(r.metrics, side) for r, side in ((a, "before"), (b, "after")))
        notes.append(f"The machine was busy ({said}), and it moved a run's own steps up to "
                     f"{_times(data['contention_factor'])}× apart (90th percentile over 10th): only a change beyond that is "
                     "called one. Compare runs made on a quiet machine.")
    src_a, src_b = data["before"]["source"], data["after"]["source"]
    if src_a and src_a == src_b and a.metrics == b.metrics:
        notes.append("Both sides are the same trace.")
    return notes
