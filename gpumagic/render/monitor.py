"""Views of the live monitor: sparklines (inline SVG, no JavaScript), a one-line summary, the widget.

They read the plain snapshot that :meth:`gpumagic.capture.monitor.MonitorSampler.snapshot` makes
(``t_s``, ``series``, ``per_core``, ``marks``, ``notes``), so nothing here knows about samplers.
Profiled windows (a ``%%gpuprofile`` cell that ran) are shaded on every sparkline.
"""

from __future__ import annotations

from html import escape
from typing import Any

from gpumagic.render._format import MISSING, fmt_bytes
from gpumagic.render.palette import BLUE, ORANGE, PALE_GREY

SPARK_WIDTH = 240
SPARK_HEIGHT = 28
#: Per-core bars: at most this many are drawn (a 256-thread host would not fit), busiest first.
MAX_CORE_BARS = 64


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return MISSING
    if unit == "bytes":
        return fmt_bytes(value)
    if unit.startswith("%"):
        return f"{value:.0f} %"
    return f"{value:.0f} {unit}"


def current(s: dict[str, Any]) -> float | None:
    """The latest reading of a series (None when it was not read)."""
    return next((v for v in reversed(s["values"]) if v is not None), None)


def summary(snapshot: dict[str, Any]) -> str:
    """One line: each GPU's utilisation, memory, power and clock; host CPU; this process; workers; memory."""
    by = {(s["group"], s["name"]): s for s in snapshot["series"]}
    parts = []
    for group in dict.fromkeys(s["group"] for s in snapshot["series"] if s["group"].startswith("GPU")):
        mem = by[(group, "memory used")]
        used, total = current(mem), mem["max"]
        memory = fmt_bytes(used) + (f"/{fmt_bytes(total)}" if total else "")
        parts.append(f"{group} {fmt_value(current(by[(group, 'utilisation')]), '%')} · {memory} · "
                     f"{fmt_value(current(by[(group, 'power')]), 'W')} · {fmt_value(current(by[(group, 'SM clock')]), 'MHz')}")
    if ("host", "CPU (all cores)") in by:
        parts.append(f"CPU {fmt_value(current(by[('host', 'CPU (all cores)')]), '%')}"
                     f" (this process {fmt_value(current(by[('process', 'CPU (this process)')]), '%')}"
                     f", workers {fmt_value(current(by[('process', 'CPU (DataLoader workers)')]), '%')})")
    else:
        parts.append("CPU: waiting for a second sample")
    parts.append(f"process memory {fmt_value(current(by[('process', 'memory (resident)')]), 'bytes')}")
    return "gpumagic monitor: " + " | ".join(parts)


def sparkline_svg(t_s: list[float], values: list[float | None], span_s: float, vmax: float | None,
                  marks: list[tuple[float, float | None, str]] = (), color: str = BLUE) -> str:
    """A sparkline of ``values`` at times ``t_s`` (seconds, <= 0) over the last ``span_s`` seconds."""
    w, h = SPARK_WIDTH, SPARK_HEIGHT
    known = [v for v in values if v is not None]
    top = vmax or (max(known) if known else 1) or 1

    def x(t: float) -> float:
        return round(w * (1 + max(t, -span_s) / span_s), 1)

    shades = "".join(
        f'<rect x="{x(s):g}" y="0" width="{max(1.0, x(0 if e is None else e) - x(s)):g}" height="{h}" fill="{PALE_GREY}">'
        f"<title>{escape(label or 'profiled')}</title></rect>" for s, e, label in marks if (0 if e is None else e) >= -span_s)
    segments, points = [], []
    for t, v in zip(t_s, values):
        if v is None:
            if points:
                segments.append(points)
            points = []
            continue
        points.append(f"{x(t):g},{round(h - 1 - (h - 2) * min(v, top) / top, 1):g}")
    if points:
        segments.append(points)
    lines = "".join(f'<polyline fill="none" stroke="{color}" stroke-width="1.2" points="{" ".join(p)}"/>' for p in segments)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">'
            f'{shades}<line x1="0" y1="{h - 0.5}" x2="{w}" y2="{h - 0.5}" stroke="{PALE_GREY}"/>{lines}</svg>')


def core_bars_svg(per_core: list[float]) -> str:
    """The latest per-core CPU busy, one thin bar per core (the busiest :data:`MAX_CORE_BARS`)."""
    cores = sorted(per_core, reverse=True)[:MAX_CORE_BARS]
    w, h = SPARK_WIDTH, SPARK_HEIGHT
    bw = w / max(1, len(cores))
    bars = "".join(f'<rect x="{i * bw:.1f}" y="{h - h * v / 100:.1f}" width="{max(1.0, bw - 1):.1f}" height="{h * v / 100:.1f}" '
                   f'fill="{ORANGE}"/>' for i, v in enumerate(cores))
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img">{bars}</svg>'


def render_html(snapshot: dict[str, Any]) -> str:
    """The monitor as one HTML fragment: a row per quantity (group, name, sparkline, current value)."""
    span = snapshot["span_s"]
    rows = []
    for s in snapshot["series"]:
        spark = sparkline_svg(snapshot["t_s"], s["values"], span, s["max"], snapshot["marks"],
                              ORANGE if s["group"] != "process" and not s["group"].startswith("GPU") else BLUE)
        rows.append(f"<tr><td>{escape(s['group'])}</td><td>{escape(s['name'])}</td><td>{spark}</td>"
                    f'<td style="text-align:right">{escape(fmt_value(current(s), s["unit"]))}</td></tr>')
    if snapshot["per_core"]:
        n = len(snapshot["per_core"])
        rows.append(f"<tr><td>host</td><td>per core ({n}, busiest first)</td><td>{core_bars_svg(snapshot['per_core'])}</td>"
                    f'<td style="text-align:right">{sum(v >= 50 for v in snapshot["per_core"])} ≥ 50 %</td></tr>')
    state = "live" if snapshot["running"] else "stopped"
    minutes = f"{span / 60:g} min" if span >= 60 else f"{span:g} s"
    notes = "".join(f"<li>{escape(n)}</li>" for n in snapshot["notes"])
    return ('<div class="gm-monitor" style="font:12px system-ui,sans-serif">'
            f"<div><b>gpumagic monitor</b> ({state}; last {minutes}, one sample every {snapshot['interval_s'] * 1000:g} ms; "
            f"shaded: profiled cells)</div>"
            f'<table style="border-collapse:collapse">{"".join(rows)}</table>'
            + (f"<ul>{notes}</ul>" if notes else "") + "</div>")


class MonitorWidget:
    """An ipywidgets ``HTML`` whose value :meth:`update` replaces with the latest sparklines."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        import ipywidgets

        self.root = ipywidgets.HTML(value=render_html(snapshot))

    def update(self, snapshot: dict[str, Any]) -> None:
        self.root.value = render_html(snapshot)
