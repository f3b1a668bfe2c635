"""Plain-text render of a Report, for terminals, logs and ``text/plain`` fallbacks."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Finding, Report

SEVERITY_MARK = {"high": "[!!] HIGH", "medium": "[! ] MEDIUM", "low": "[  ] LOW"}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def header_lines(report: Report) -> list[str]:
    """The five-second summary: wall time, steps, median step, GPU busy, top finding."""
    m = report.metrics
    steps, gpu, window = m["steps"], m["gpu"], m["window"]
    top = report.findings[0] if report.findings else None
    median = f"{steps['median_ms']:.1f} ms" if steps["median_ms"] is not None else "n/a"
    lines = [
        f"gpumagic report{' — ' + report.label if report.label else ''}",
        f"window {window['dur_ms']:.1f} ms · {steps['count']} steps · median step {median} · "
        f"GPU busy {_pct(gpu['busy_frac'])}",
    ]
    if top is not None:
        lines.append(f"top finding: {top.title} ({top.id}, up to {_pct(top.est_gain)} of step time)")
    else:
        lines.append("no findings: nothing in this trace crosses a threshold")
    return lines


def _finding_lines(i: int, f: Finding, width: int) -> list[str]:
    wrap = textwrap.TextWrapper(width=width, initial_indent="    ", subsequent_indent="    ")
    out = [f"{i}. {SEVERITY_MARK[f.severity]}  {f.title}  [{f.id}]",
           f"    estimated gain: up to {_pct(f.est_gain)} ({f.gain_method})"]
    out += wrap.wrap("evidence: " + f.evidence.summary)
    out += wrap.wrap("why: " + f.why)
    for fix in f.fixes:
        label = "PyTorch" if fix.flavor == "pytorch" else "Hugging Face"
        out.append(f"    fix ({label}): {fix.description}")
        out += ["        " + line for line in fix.code.splitlines()]
    out.append(f"    docs: {f.doc_url}")
    return out


def render_text(report: Report, width: int = 100) -> str:
    m = report.metrics
    lines = header_lines(report)
    lines.append("")
    lines.append("Checklist (sorted by estimated gain)")
    for i, f in enumerate(report.findings, 1):
        lines += _finding_lines(i, f, width)
        lines.append("")
    b = m["breakdown"]
    lines.append("Step-time breakdown: " + ", ".join(
        f"{c} {_pct(b['frac'][c])}" for c in b["order"] if b["frac"][c] >= 0.0005))
    idle = m["idle"]
    lines.append(f"GPU idle {idle['total_ms']:.1f} ms: host wait {idle['host_wait_ms']:.1f} ms, "
                 f"launch latency {idle['launch_latency_ms']:.1f} ms, other {idle['other_ms']:.1f} ms")
    k = m["kernels"]
    if k["count"]:
        lines.append(f"Kernels: {k['count']}, median {k['median_us']:.1f} µs, {_pct(k['short_frac'])} under "
                     f"{k['short_kernel_us']:.0f} µs, tensor cores {k['tensor_core_ms']:.1f} of {k['total_ms']:.1f} ms")
    for g in m["copies"]["groups"]:
        gbps = "n/a" if g["gbps"] is None else f"{g['gbps']:.1f} GB/s"
        lines.append(f"Copies {g['direction']} ({g['memory']}): {g['count']} × {g['bytes'] / 1e6:.2f} MB in {g['ms']:.2f} ms, {gbps}")
    mem = m["memory"]
    if mem["peak_frac"] is not None:
        lines.append(f"Memory peak: {_pct(mem['peak_frac'])} of device ({mem['source']})")
    if report.notes:
        lines.append("")
        lines.append("Notes")
        lines += [f"  - {n}" for n in report.notes]
    return "\n".join(lines) + "\n"
