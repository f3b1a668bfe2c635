"""Number, name and severity formatting shared by every renderer (text, HTML, widget), and the
format-neutral pieces of a finding (its fix flavours' labels, its windows as text).

Metrics may hold ``None`` where the trace cannot give a value (see docs/metrics.md); every
formatter here turns ``None`` into :data:`MISSING` instead of failing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gpumagic.report.model import MISTAKES

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.metrics import CriticalPathMetrics, PhasesMetrics
    from gpumagic.report.model import Finding, Report, Window

#: What a renderer prints for a value the trace could not give.
MISSING = "n/a"
#: Evidence windows listed as text under a finding (the timeline shows them all).
MAX_LISTED_WINDOWS = 5
FIX_FLAVOR_LABEL = {"pytorch": "PyTorch", "huggingface": "Hugging Face Trainer"}

#: Severity shown by icon *and* word, so that it never depends on colour alone.
#: The icons differ in shape (heavy cross, triangle, "i") and are in common text fonts (DejaVu).
SEVERITY_ICON = {"high": "\u2716", "medium": "\u26a0", "low": "\u2139"}
SEVERITY_WORD = {"high": "High", "medium": "Medium", "low": "Low"}
#: ASCII badges for the text render, equal width so that titles line up.
SEVERITY_BADGE = {"high": "[HIGH]", "medium": "[MED] ", "low": "[LOW] "}

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _bad(x: object) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def fmt_ms(ms: float | None) -> str:
    """A duration given in milliseconds, with a unit that keeps 2-3 significant digits."""
    if _bad(ms):
        return MISSING
    if ms == 0:
        return "0 ms"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.1f} ms"
    return f"{ms * 1000:.0f} \u00b5s"


def fmt_us(us: float | None) -> str:
    """A duration given in microseconds."""
    return MISSING if _bad(us) else fmt_ms(us / 1000)


def fmt_pct(frac: float | None, digits: int = 0) -> str:
    """A 0..1 fraction as a percentage (``0.423 -> '42 %'``)."""
    if _bad(frac):
        return MISSING
    return f"{frac * 100:.{digits}f} %"


def fmt_bytes(n: float | None) -> str:
    """A byte count in binary units (``1536 -> '1.5 KiB'``)."""
    if _bad(n) or n < 0:
        return MISSING
    value = float(n)
    for unit in _BYTE_UNITS:
        if value < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_number(x: float | int | str | None) -> str:
    """An evidence number: integers as is, floats with 3 significant digits."""
    if isinstance(x, str):
        return x
    if _bad(x):
        return MISSING
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"


#: What a gain is a share of: the recorded steps when there are any, else the whole profiled window
#: (an inference loop, a cell without an optimizer step).
STEP_TIME, PROFILED_TIME = "step time", "the profiled time"


def gain_basis(report) -> str:
    """:data:`STEP_TIME` for a report with recorded steps, else :data:`PROFILED_TIME`."""
    steps = getattr(getattr(report, "metrics", None), "steps", None)
    return STEP_TIME if steps is None or getattr(steps, "count", 0) else PROFILED_TIME


def fmt_gain(est_gain: float | None, method: str = "", basis: str = STEP_TIME) -> str:
    """A finding's estimated gain, phrased as what it is: ``"up to 33 % of step time"`` for an
    upper bound, ``"about 33 % of step time (estimate)"`` when its ``gain_method`` says it is an
    estimate from a model (it starts with "estimate"); ``"gain not estimated"`` when the method
    says the trace cannot bound it (it starts with "not estimated": ``graph-breaks``);
    ``"no speed gain estimated"`` for a finding that claims none (``model-on-cpu``,
    ``memory-pressure``: the method starts with "not" and the gain is 0). ``basis``: what the
    share is of (:func:`gain_basis`: "the profiled time" for a report without steps)."""
    if _bad(est_gain):
        return "gain unknown"
    if method.startswith("not estimated"):
        return "gain not estimated"
    if method.startswith("not ") and est_gain == 0:
        return "no speed gain estimated"
    if est_gain < 0.005:
        return f"under 1 % of {basis}"
    if method.startswith("estimate"):
        return f"about {est_gain * 100:.0f} % of {basis} (estimate)"
    return f"up to {est_gain * 100:.0f} % of {basis}"


def fmt_gain_detail(est_gain: float | None, method: str, basis: str = STEP_TIME) -> tuple[str, str]:
    """(the gain, what it is) for a finding's detail: ``("up to 33 % of step time", "data-loader
    wait ...")`` or ``("about 33 % of step time", "estimate: ...")``: the method names the kind."""
    text = fmt_gain(est_gain, method, basis).removesuffix(" (estimate)")
    return text, method


def severity_label(severity: str, *, icon: bool = True) -> str:
    """``'high' -> '⛔ High'`` (or ``'High'`` without the icon)."""
    word = SEVERITY_WORD.get(severity, severity.title())
    return f"{SEVERITY_ICON.get(severity, '')} {word}".strip() if icon else word


def short_kernel_name(name: str, max_chars: int = 60) -> str:
    """A readable kernel name: no ``void``, no parameter list, no namespace path, truncated.

    ``void at::native::(anonymous namespace)::foo<float>(int, float*)`` -> ``foo<float>``.
    """
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    s = s.replace("(anonymous namespace)::", "")
    s = s[: _top_level_index(s, "(")] or s
    cut = _last_top_level_scope(s)
    s = s[cut:] if cut > 0 else s
    return s if len(s) <= max_chars else s[: max_chars - 1] + "\u2026"


def _top_level_index(s: str, char: str) -> int:
    """Index of ``char`` outside any ``<...>``/``(...)`` nesting, or ``len(s)``."""
    depth = 0
    for i, c in enumerate(s):
        if c == char and depth == 0 and i > 0:
            return i
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth = max(0, depth - 1)
    return len(s)


def _last_top_level_scope(s: str) -> int:
    """Index just after the last ``::`` outside template brackets (0 when none)."""
    depth, cut = 0, 0
    for i, c in enumerate(s):
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth = max(0, depth - 1)
        elif c == ":" and depth == 0 and s[i + 1 : i + 2] == ":":
            cut = i + 2
    return cut


# -- evidence numbers -----------------------------------------------------------------------------

#: Words written the way people read them in a label (``gpu`` -> ``GPU``).
_LABEL_WORDS = {"gpu": "GPU", "cpu": "CPU", "nccl": "NCCL", "util": "utilisation", "comm": "communication",
                "gbps": "GB/s", "frac": "share",
                "mfu": "MFU", "tflops": "TFLOP/s", "dataloader": "data-loader", "pct": "%", "us": "µs", "ms": "ms"}
#: Labels that the word rule above would phrase badly.
_LABEL_OVERRIDE = {
    "compute_capability": "compute capability",
    "first_over_median": "first step / median step",
    "gpu_idle_during_wait_frac": "GPU idle while waiting",
    "cpu_busy_share_of_wait": "CPU busy while waiting",
    "host_wait": "GPU idle waiting for the host",
    "launch_latency": "GPU idle in launch latency",
    "other": "GPU idle, other causes",
    "source": "source",
    "dataloader_ms": "data-loader wait",
    "wait_per_batch_ms": "data-loader wait per batch (median)",
    "pageable_bytes": "pageable copies",
    "pageable_count": "pageable copies (count)",
    "pageable_ms": "pageable copy time",
    "pageable_gbps": "pageable copy speed",
    "capacity_bytes": "GPU memory capacity",
    "median_kernel_us": "median kernel duration",
    "per_call_us": "time per operator call",
    "calls_per_step": "operator calls per step",
    "per_evaluation_ms": "time per evaluation (mean)",
    "save_ms_mean": "time per save (mean)",
    "train_ms_per_step": "training time per step (mean)",
    "save_frac_of_steps": "saves' share of the steps",
    "save_frac_recorded": "saves' share of the recorded steps",
    "kernel_ms_per_step": "kernel time per step",
    "training_per_step_ms": "training time per step (mean)",
    "suggested_every_steps": "suggested interval (steps)",
    "matmuls_per_accumulation": "matrix products per parameter gradient",
    "loop_work_step_ms": "loop's own code per step (median)",
    "no_operator_frac": "share of it with no operator running",
    "recompute_frac": "forward run again in the backward",
    "churn_steps": "steps that freed and re-allocated",
    "grad_scaler_frac": "blocked time in GradScaler's found_inf reads",
    "conversion_kernels": "layout transposes",
    "conversion_ms": "layout transpose time",
    "conversion_frac": "layout transposes' share of kernel time",
    "mallocs_per_step": "driver allocations per step (median)",
    "frees_per_step": "driver frees per step (median)",
    "recompute_kept_bytes": "activations rebuilt per step",
    "projected_peak_frac": "peak without checkpointing (projected)",
    "host_cpu_util_mean_pct": "host CPU utilisation (mean)",
    "workers_cpu_util_mean_pct": "worker CPU utilisation (mean)",
}
#: The noun a unit suffix adds to a label (``comm_ms`` -> ``'communication time'``).
_SUFFIX_NOUN = {"_ms": "time", "_bytes": "size", "_gbps": "bandwidth"}
#: Unit suffixes of evidence keys, longest first, and how each value is shown.
_UNIT_SUFFIXES = ("_frac", "_ms", "_us", "_bytes", "_pct", "_gbps")


def evidence_label(key: str) -> str:
    """A readable label for an evidence key: ``'gpu_idle_during_wait_frac'`` -> ``'GPU idle while waiting'``."""
    text = _LABEL_OVERRIDE.get(key)
    if text is None:
        stem = key
        for suffix in _UNIT_SUFFIXES:
            if stem.endswith(suffix):
                stem = stem[: -len(suffix)]
                if stem.endswith(("_ms", "_time")) or suffix not in _SUFFIX_NOUN:
                    stem += "_frac" if suffix == "_frac" else ""
                else:
                    stem += "_" + _SUFFIX_NOUN[suffix]
                break
        text = " ".join(_LABEL_WORDS.get(w, w) for w in stem.split("_") if w) or key
    return text[:1].upper() + text[1:]


#: Evidence keys that are shares (0..1) though no ``_frac`` ends them: ``warmup-in-window``'s
#: segment kinds among them.
_SHARE_KEYS = ("mfu", "cpu_saturation", "cpu_busy_share_of_wait", "cold_start", "graph_capture", "compile",
               "one_off_host", "evaluation", "idle_tail")


def evidence_value(key: str, value: float | int | str | None) -> str:
    """An evidence number with its unit, read from the key's suffix (``_frac`` -> ``'33.4 %'``,
    ``_cores`` -> ``'3.5 cores'``, a ``ratio`` -> ``'7.96×'``, ``_samples`` -> ``'40 samples'``)."""
    if isinstance(value, (str, bool)) or _bad(value):
        return fmt_number(value)
    if key in _SHARE_KEYS or key.endswith("_saturation"):
        return fmt_pct(value, 1)
    if key.endswith("_cores"):
        return f"{value:,.1f} cores".replace(".0 cores", " cores")
    if key.endswith("tflops"):
        return f"{value:,.2f} TFLOP/s"
    if key.endswith("_samples"):
        return f"{fmt_number(value)} samples"
    if "ratio" in key or key == "first_over_median" or key.endswith("growth"):  # growth: the last part over the first
        return f"{value:.2f}\u00d7"
    if key == "compute_capability":
        return f"{float(value):.1f}"
    if key.endswith(("_frac", "_share", "_gain")) or "_frac_" in key:  # save_frac_of_steps, slowest_stage_share
        return fmt_pct(value, 1)
    if key == "main_thread_core_use":
        return f"{fmt_pct(value, 1)} of a core"
    if key.endswith("gflops_per_step"):
        return f"{value:,.3g} GFLOP"
    if key.endswith("_gflops"):
        return f"{value:,.3g} GFLOP/s"
    if key.endswith(("_ms", "_ms_mean")) or "_ms_per_" in key or key in ("host_wait", "launch_latency", "other"):
        return fmt_ms(value)
    if key.endswith("_us"):
        return fmt_us(value)
    if key.endswith("_bytes"):
        return fmt_bytes(value)
    if key.endswith("_pct"):
        return f"{value:.0f} %"
    if key.endswith("_gbps"):
        return f"{value:.1f} GB/s"
    return fmt_number(value)


def evidence_items(numbers: dict) -> list[tuple[str, str]]:
    """``(label, formatted value)`` for each evidence number, in the finding's order. A threshold
    is shown in the unit of the number it bounds: ``threshold_mfu`` in MFU's, a bare ``threshold``
    in the first number's (the rule's measured value comes first)."""
    keys = [str(k) for k in numbers]
    out = []
    for k, v in numbers.items():
        key = str(k)
        bound = ""
        if key == "threshold" and keys[0] != key:
            bound = keys[0]
        elif key.startswith("threshold_") and "_" + key[len("threshold_"):] not in _UNIT_SUFFIXES:
            bound = key[len("threshold_"):]
        if bound:
            out.append((f"Threshold ({evidence_label(bound)})", evidence_value(bound, v)))
        else:
            out.append((evidence_label(key), evidence_value(key, v)))
    return out


def fmt_span_ms(start_ms: float, end_ms: float) -> str:
    """A time window in ms: ``'120.3–131.0 ms'``; one too short to show two different ends at
    0.1 ms is given by its start and length: ``'71.10 ms for 4 µs'`` (never ``'1.0–1.0 ms'``)."""
    if f"{start_ms:,.1f}" == f"{end_ms:,.1f}":
        return f"{start_ms:,.2f} ms for {fmt_ms(end_ms - start_ms)}"
    return f"{start_ms:,.1f}\u2013{end_ms:,.1f} ms"


# -- where a finding is on the timeline (text and HTML alike) ----------------------------------------


def timeline_origin_ns(report: Report) -> int:
    """Where the timeline's x axis puts zero: the start of the analysis window."""
    return 0 if report.metrics is None else int(report.metrics.window.start_ns)


def windows_text(f: Finding, origin_ns: int = 0) -> str:
    """The first evidence windows as text, e.g. ``'120.3–131.0 ms (GPU0: gap) and 4 more'``."""
    windows = f.evidence.windows
    items = ", ".join(window_text(w, origin_ns) for w in windows[:MAX_LISTED_WINDOWS])
    more = f" and {len(windows) - MAX_LISTED_WINDOWS} more" if len(windows) > MAX_LISTED_WINDOWS else ""
    return items + more


def window_text(w: Window, origin_ns: int = 0) -> str:
    """``'120.3–131.0 ms (GPU0: gap)'``: a window in ms from ``origin_ns``."""
    where = {"gpu": f"GPU{w.device}" if w.device >= 0 else "GPU", "cpu": "main thread"}.get(w.lane, "")
    tag = ": ".join(x for x in (where, w.label) if x)
    span = fmt_span_ms((w.start_ns - origin_ns) / 1e6, (w.end_ns - origin_ns) / 1e6)
    return span + (f" ({tag})" if tag else "")


def phase_medians(report: Report) -> tuple[PhasesMetrics, dict[str, float], dict[str, float]] | None:
    """``metrics.phases`` with its median host time and median GPU time per phase (ms; the GPU's
    empty without a GPU), or None when the trace has no steps: what the text and HTML views draw."""
    ph = None if report.metrics is None else report.metrics.phases
    if ph is None:
        return None
    gpu = {} if ph.gpu_median_ms is None else dict(ph.gpu_median_ms.items())
    return ph, dict(ph.median_ms.items()), gpu


def path_shares(report: Report) -> tuple[CriticalPathMetrics, dict[str, float], dict[str, float]] | None:
    """``metrics.critical_path`` with its share and its time (ms) per kind of link, or None when
    there is no path to show (none recorded, or every share zero)."""
    cp = None if report.metrics is None else report.metrics.critical_path
    if cp is None:
        return None
    frac = dict(cp.frac.items())
    return (cp, frac, dict(cp.ms.items())) if any(frac.values()) else None


#: What a loader stage's ``where`` means, as the views name it.
STAGE_WHERE_LABEL = {"main": "main process", "worker": "DataLoader workers"}
#: How the stages' times are to be read (text and HTML alike).
STAGES_NOTE = ("Self time per batch (time in the stages a stage calls not counted), summed over the processes "
               "that ran it: with workers, time spent in parallel, not the time the loop waited.")


def loader_stage_rows(report: Report) -> list[tuple[str, str, str, float, str]]:
    """``metrics.host.loader_stages`` as ``(name, time per batch, share, share 0..1, where)``
    strings, largest first; empty when the capture timed no stage (a plain trace)."""
    host = None if report.metrics is None else report.metrics.host
    stages = None if host is None else host.loader_stages
    return [(s.name, fmt_ms(s.ms_per_batch), fmt_pct(s.share, 1), s.share, STAGE_WHERE_LABEL.get(s.where, s.where))
            for s in stages or ()]


def checklist_order(findings: list[Finding]) -> str:
    """How the checklist is ordered, for its heading: by gain, except that mistakes in what the code
    computes (``report.model.MISTAKES``) lead, then warm-up filling the window (which claims no
    speed gain: ``analysis.rules.warmup.lead_with_warmup``)."""
    mistakes = next((i for i, f in enumerate(findings) if f.id not in MISTAKES), len(findings))
    rest = findings[mistakes:]
    warmup = len(rest) > 1 and rest[0].id == "warmup-in-window" and rest[0].est_gain == 0
    leads = (["mistakes"] if mistakes and rest else []) + (["warm-up"] if warmup else [])
    return ", then ".join([f"{leads[0]} first", *leads[1:], "biggest gain"]) if leads else "biggest gain first"
