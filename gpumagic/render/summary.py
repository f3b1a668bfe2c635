"""The header every render starts with: a few facts readable in five seconds.

Wall time, steps recorded, median step time, GPU busy share, the share of step time that
fixing every finding could save (``combined_gain``), achieved TFLOP/s and MFU when FLOPs are
known, and the top finding with its estimated gain. Text, HTML and the widget all read
:func:`header_facts`, so they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumagic.render._format import MISSING, fmt_gain, fmt_ms, fmt_pct, gain_basis, severity_label

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.metrics import Metrics
    from gpumagic.report.model import Finding, Report


NO_FINDINGS = "No findings: nothing in this trace crossed a rule's threshold."


@dataclass(frozen=True)
class Fact:
    """One labelled value of the header (``hint`` explains it, e.g. as a tooltip)."""

    label: str
    value: str
    hint: str = ""


def header_facts(report: Report) -> list[Fact]:
    """The numeric facts of the header, in reading order: four, a fifth (what fixing every finding
    could save) when there are findings, what bounds the steps (the largest share of
    ``metrics.critical_path``), and achieved TFLOP/s and MFU when the trace recorded the shapes or
    FLOPs that ``metrics.compute`` needs. Each reads as a phrase, label then value ("GPU busy 57 %",
    "Fixing all could save up to 51 %")."""
    m = report.metrics
    steps = None if m is None else m.steps.count
    cpu_only = m is not None and m.trace.cpu_only
    facts = [
        Fact("Wall time", fmt_ms(None if m is None else m.window.dur_ms), _window_hint(m)),
        Fact("Steps recorded", MISSING if steps is None else str(steps), "ProfilerStep# markers in the trace"),
        Fact("Median step", fmt_ms(None if m is None else m.steps.median_ms), "median duration of the recorded steps"),
        Fact("GPU", "not recorded", "the trace holds no GPU activity") if cpu_only else Fact(
            "GPU busy", fmt_pct(None if m is None else m.gpu.busy_frac),
            "share of wall time the main GPU ran kernels, copies or memsets",
        ),
    ]
    if report.findings:  # without findings the top-finding line says so, in a sentence of its own
        estimate = any(f.gain_method.startswith("estimate") for f in report.findings)
        saved = ("under 1 %" if report.combined_gain < 0.005 else
                 f"about {fmt_pct(report.combined_gain)} (estimate)" if estimate else f"up to {fmt_pct(report.combined_gain)}")
        facts.append(Fact("Fixing all could save", saved,
                          f"estimated share of {gain_basis(report)} saved by fixing every finding together, overlapping "
                          "time counted once"))
    shared = shared_machine_fact(m)
    if shared is not None:
        facts.append(shared)
    energy = energy_fact(m)
    if energy is not None:
        facts.append(energy)
    bound = None if m is None or m.critical_path is None else m.critical_path.bound
    if bound is not None and bound.frac:
        facts.append(Fact("Bounded by", f"{bound.what}, {fmt_pct(bound.frac, 0)}",
                          "the largest share of the steps' critical path: the chain of work that, made faster, "
                          "would make the step shorter"))
    compute = None if m is None else m.compute
    tflops, mfu = (None, None) if compute is None else (compute.achieved_tflops, compute.mfu)
    if tflops is not None:  # only when FLOPs were recorded (--shapes / --flops)
        lower = "\u2265 " if compute is not None and compute.mfu_lower_bound else ""
        cover = None if compute is None else compute.flops_coverage
        withheld = mfu is None and cover is not None and compute is not None and compute.peak_tflops is not None
        value = f"{tflops:.3g} TFLOP/s" + (
            f" \u00b7 MFU withheld: the FLOPs cover {fmt_pct(cover)} of matmul time" if withheld else
            "" if mfu is None else f" \u00b7 MFU {lower}{fmt_pct(mfu, 2 if mfu < 0.01 else 1 if mfu < 0.1 else 0)}")
        facts.append(Fact("Compute", value, "matmul/conv FLOPs per second of wall time; MFU: that over the "
                                            "device's dense peak for the dtype"))
    return facts


def shared_machine_fact(m: Metrics | None) -> Fact | None:
    """"Shared machine: other processes used 1.8 of 2 cores", when they used enough to matter
    (``metrics.host.shared_machine``, see :mod:`gpumagic.analysis.hostload`)."""
    if m is None or m.host.shared_machine is not True or m.host.other_busy_cores is None or not m.host.usable_cores:
        return None
    return Fact("Shared machine:", f"other processes used {m.host.other_busy_cores:.1f} of {m.host.usable_cores:g} cores",
                "mean busy cores of other processes over the window: step times measured now will not hold "
                "when their load changes")


def energy_fact(m: Metrics | None) -> Fact | None:
    """"Energy 6 J, 2 J/step, 0.25 J/sample, 20 % idle", with NVML energy
    (``metrics.gpu.energy_j``, :mod:`gpumagic.analysis.energy`); per sample with a batch size."""
    gpu = None if m is None else m.gpu
    if gpu is None or gpu.energy_j is None:
        return None
    parts = [f"{gpu.energy_j:.3g} J"]
    if gpu.energy_j_per_step is not None:
        parts.append(f"{gpu.energy_j_per_step:.3g} J/step")
    if gpu.energy_j_per_sample is not None:
        parts.append(f"{gpu.energy_j_per_sample:.3g} J/sample")
    if gpu.idle_energy_frac is not None:
        parts.append(f"{fmt_pct(gpu.idle_energy_frac)} idle")
    source = {"counter": "its total-energy counter", "power": "its power samples"}.get(gpu.energy_source or "", "NVML")
    return Fact("Energy", ", ".join(parts),
                f"the main GPU's energy over the window, from {source} (NVML); per sample: per step \u00f7 the "
                "batch size given (--batch-size); idle: the share used while no kernel, copy or memset ran")


def _window_hint(m: Metrics | None) -> str:
    if m is not None and m.window.source == "steps":
        return "from the first recorded step's start to the last one's end"
    return "the whole trace (no step markers found)"


def top_finding(report: Report) -> Finding | None:
    """The finding to act on first (findings are sorted by estimated gain, mistakes in what the code
    computes first: ``report.model.sort_findings``)."""
    return report.findings[0] if report.findings else None


def top_finding_line(report: Report) -> str:
    """``'Top finding: ⛔ High · Data loading stalls the GPU — up to 34 % of step time'``."""
    f = top_finding(report)
    if f is None:
        return NO_FINDINGS
    return (f"Top finding: {severity_label(f.severity)} \u00b7 {f.title} \u2014 "
            f"{fmt_gain(f.est_gain, f.gain_method, gain_basis(report))}")


def title_line(report: Report) -> str:
    """``'gpumagic report — <label>'`` plus the device name when the trace gives one."""
    parts = ["gpumagic report"]
    if report.label:
        parts.append(report.label)
    m = report.metrics
    devices = [] if m is None else m.trace.devices
    primary = None if m is None else m.gpu.primary_device
    names = [d.name for d in devices if d.id == primary and d.name]
    names = names or [n for n in [None if m is None else m.gpu.primary_name] if n]  # kernels name it otherwise (ROCm)
    if names:
        parts.append(str(names[0]))
    elif m is not None and m.trace.cpu_only:
        parts.append("CPU only")
    return " \u2014 ".join(parts)
