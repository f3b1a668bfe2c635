"""The header every render starts with: a few facts readable in five seconds.

Wall time, steps recorded, median step time, GPU busy share, the share of step time that
fixing every finding could save (``combined_gain``), achieved TFLOP/s and MFU when FLOPs are
known, and the top finding with its estimated gain. Text, HTML and the widget all read
:func:`header_facts`, so they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpumagic.render._format import MISSING, fmt_gain, fmt_ms, fmt_pct, severity_label
from gpumagic.report.model import metric

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Finding, Report


NO_FINDINGS = "No findings: nothing in this trace crossed a rule's threshold."


@dataclass(frozen=True)
class Fact:
    """One labelled value of the header (``hint`` explains it, e.g. as a tooltip)."""

    label: str
    value: str
    hint: str = ""


def header_facts(report: Report) -> list[Fact]:
    """The numeric facts of the header, in reading order: five, and a sixth (achieved TFLOP/s and
    MFU) when the trace recorded the shapes or FLOPs that ``metrics.compute`` needs."""
    m = report.metrics
    steps = metric(m, "steps", "count")
    cpu_only = bool(metric(m, "trace", "cpu_only"))
    facts = [
        Fact("Wall time", fmt_ms(metric(m, "window", "dur_ms")), _window_hint(m)),
        Fact("Steps recorded", MISSING if steps is None else str(steps), "ProfilerStep# markers in the trace"),
        Fact("Median step", fmt_ms(metric(m, "steps", "median_ms")), "median duration of the recorded steps"),
        Fact(
            "GPU busy",
            "no GPU" if cpu_only else fmt_pct(metric(m, "gpu", "busy_frac")),
            "share of wall time the main GPU ran kernels, copies or memsets",
        ),
        Fact("Fixing all", "nothing found" if not report.findings else f"up to {fmt_pct(report.combined_gain)}",
             "estimated share of step time saved by fixing every finding together, overlapping time counted once"),
    ]
    tflops, mfu = metric(m, "compute", "achieved_tflops"), metric(m, "compute", "mfu")
    if tflops is not None:  # only when FLOPs were recorded (--shapes / --flops)
        lower = "\u2265 " if metric(m, "compute", "mfu_lower_bound") else ""
        cover = metric(m, "compute", "flops_coverage")
        withheld = mfu is None and cover is not None and metric(m, "compute", "peak_tflops") is not None
        value = f"{tflops:.3g} TFLOP/s" + (
            f" \u00b7 MFU withheld: the FLOPs cover {fmt_pct(cover)} of matmul time" if withheld else
            "" if mfu is None else f" \u00b7 MFU {lower}{fmt_pct(mfu, 2 if mfu < 0.01 else 1 if mfu < 0.1 else 0)}")
        facts.append(Fact("Compute", value, "matmul/conv FLOPs per second of wall time; MFU: that over the "
                                            "device's dense peak for the dtype"))
    return facts


def _window_hint(m: dict[str, Any]) -> str:
    if metric(m, "window", "source") == "steps":
        return "from the first recorded step's start to the last one's end"
    return "the whole trace (no step markers found)"


def top_finding(report: Report) -> Finding | None:
    """The finding to act on first (findings are sorted by estimated gain)."""
    return report.findings[0] if report.findings else None


def top_finding_line(report: Report) -> str:
    """``'Top finding: ⛔ High · Data loading stalls the GPU — up to 34 % of step time'``."""
    f = top_finding(report)
    if f is None:
        return NO_FINDINGS
    return f"Top finding: {severity_label(f.severity)} \u00b7 {f.title} \u2014 {fmt_gain(f.est_gain)}"


def title_line(report: Report) -> str:
    """``'gpumagic report — <label>'`` plus the device name when the trace gives one."""
    parts = ["gpumagic report"]
    if report.label:
        parts.append(report.label)
    devices = metric(report.metrics, "trace", "devices") or []
    primary = metric(report.metrics, "gpu", "primary_device")
    names = [d.get("name") for d in devices if d.get("id") == primary and d.get("name")]
    names = names or [n for n in [metric(report.metrics, "gpu", "primary_name")] if n]  # kernels name it otherwise (ROCm)
    if names:
        parts.append(str(names[0]))
    elif metric(report.metrics, "trace", "cpu_only"):
        parts.append("CPU only")
    return " \u2014 ".join(parts)
