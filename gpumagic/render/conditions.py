"""The machine's state during the capture, as the notes' "conditions" section: how much CPU other
processes used, the load average, other processes on the GPU, clock slowdowns
(``metrics.host``, :mod:`gpumagic.analysis.hostload`). Shown whenever the bundle recorded it, not
only when it crosses the header's "shared machine" line: a reader comparing two runs needs it."""

from __future__ import annotations

from html import escape

from gpumagic.report.model import Report


def condition_lines(report: Report) -> list[str]:
    """One short sentence per recorded fact; empty for a plain trace (nothing was sampled)."""
    m = report.metrics
    if m is None:
        return []
    h = m.host
    out: list[str] = []
    if h.other_busy_cores is not None and h.usable_cores:
        own = "" if h.own_busy_cores is None else f"; this process and its workers {h.own_busy_cores:.1f}"
        out.append(f"Other processes used {h.other_busy_cores:.1f} of {h.usable_cores:g} usable cores{own}"
                   + (" (a shared machine: step times will change with their load)" if h.shared_machine else "") + ".")
    if h.load_average_1m is not None:
        out.append(f"Load average (1 min): {h.load_average_1m:g}.")
    if h.gpu_other_processes:
        out.append(f"{h.gpu_other_processes} other process{'es' if h.gpu_other_processes != 1 else ''} ran on the GPU.")
    if h.gpu_throttle_reasons:
        out.append(f"GPU clocks slowed down: {', '.join(h.gpu_throttle_reasons)}.")
    return out


def conditions_html(report: Report) -> str:
    """The section as HTML ("" when nothing was recorded)."""
    lines = condition_lines(report)
    if not lines:
        return ""
    items = "".join(f"<li>{escape(s)}</li>" for s in lines)
    return f"<h4>Machine state during the capture</h4><ul>{items}</ul>"
