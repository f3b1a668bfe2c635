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
#: Horizontal resolution of a sparkline, in pixels: one point per 2 px column (120 points per
#: line) keeps a redraw of a 8-GPU node's 36 lines within a few ms (benchmarks/monitor_overhead.py).
COLUMN_PX = 2
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


def pixel_columns(t_s: list[float], span_s: float, width: int = SPARK_WIDTH, step: int = COLUMN_PX) -> list[int]:
    """The pixel column (0..width-1, a multiple of ``step``) of each time ``t_s`` (seconds, <= 0)
    over the last ``span_s`` seconds."""
    n = (width - 1) // step
    scale = n / span_s
    return [step * max(0, int(n + t * scale)) for t in t_s]


def sparkline_svg(columns: list[int], values: list[float | None], vmax: float | None,
                  marks: list[tuple[int, int, str]] = (), color: str = BLUE) -> str:
    """A sparkline of ``values`` placed at pixel ``columns`` (from :func:`pixel_columns`).

    Samples that fall in one pixel column are drawn as their highest value (a spike stays
    visible when five minutes are squeezed into a few hundred pixels); a value that was not read
    breaks the line. Coordinates are whole pixels, which keeps each redraw cheap.
    ``marks`` are ``(first column, last column, label)`` of profiled windows, shaded.
    """
    w, h = SPARK_WIDTH, SPARK_HEIGHT
    known = [v for v in values if v is not None]
    top = vmax or (max(known) if known else 1) or 1
    scale = (h - 2) / top
    shades = "".join(f'<rect x="{a}" y="0" width="{max(1, b - a)}" height="{h}" fill="{PALE_GREY}">'
                     f"<title>{escape(label or 'profiled')}</title></rect>" for a, b, label in marks)
    segments: list[list[str]] = []
    points: list[str] = []
    last_col, best = -1, None
    for col, v in zip(columns, values):
        if v is None:
            if best is not None:
                points.append(f"{last_col},{h - 1 - int(min(best, top) * scale)}")
            if points:
                segments.append(points)
            points, last_col, best = [], -1, None
            continue
        if col != last_col and best is not None:
            points.append(f"{last_col},{h - 1 - int(min(best, top) * scale)}")
            best = None
        last_col, best = col, v if best is None or v > best else best
    if best is not None:
        points.append(f"{last_col},{h - 1 - int(min(best, top) * scale)}")
    if points:
        segments.append(points)
    lines = "".join(f'<polyline fill="none" stroke="{color}" stroke-width="1.2" points="{" ".join(p)}"/>' for p in segments)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">'
            f'{shades}<line x1="0" y1="{h - 0.5}" x2="{w}" y2="{h - 0.5}" stroke="{PALE_GREY}"/>{lines}</svg>')


def mark_columns(marks: list[tuple[float, float | None, str]], span_s: float) -> list[tuple[int, int, str]]:
    """Profiled windows (seconds, <= 0; an open one ends now) as pixel columns, those in view only."""
    out = []
    for start, end, label in marks:
        end = 0.0 if end is None else end
        if end >= -span_s:
            a, b = pixel_columns([start, end], span_s)
            out.append((a, b, label))
    return out


def core_bars_svg(per_core: list[float]) -> str:
    """The latest per-core CPU busy, one thin bar per core (the busiest :data:`MAX_CORE_BARS`)."""
    cores = sorted(per_core, reverse=True)[:MAX_CORE_BARS]
    w, h = SPARK_WIDTH, SPARK_HEIGHT
    bw = w / max(1, len(cores))
    bars = "".join(f'<rect x="{i * bw:.1f}" y="{h - h * v / 100:.1f}" width="{max(1.0, bw - 1):.1f}" height="{h * v / 100:.1f}" '
                   f'fill="{ORANGE}"/>' for i, v in enumerate(cores))
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img">{bars}</svg>'


def unit_label(s: dict[str, Any], cores: int = 0) -> str:
    """What a series' number is of: ``'GPU util %'``, ``'CPU % of all 16 cores'``, ``'% of one core'``."""
    unit, name = s["unit"], s["name"]
    if unit == "%" and name == "utilisation":
        return "GPU util %"
    if unit == "%" and name.startswith("CPU (all"):
        return f"% of all {cores} cores" if cores else "% of all cores"
    if unit == "% of a core":
        return "% of one core (100 = one core busy)"
    if unit == "bytes":
        return "bytes" + (f", scale to {fmt_bytes(s['max'])}" if s.get("max") else "")
    return unit


#: The monitor's table: sparklines on the rows' middle line, labels in the theme's colours.
MONITOR_CSS = (".gm-monitor table{border-collapse:collapse}.gm-monitor td{vertical-align:middle;padding:1px 8px 1px 0;"
               "line-height:16px}.gm-monitor td svg{display:block}.gm-monitor .gm-unit{opacity:.85;font-size:11px}")


#: The other processes' load is the mean over this many latest samples (one sample can catch a burst).
SHARED_SAMPLES = 10


def shared_machine_line(snapshot: dict[str, Any]) -> str:
    """"shared machine: other processes use 1.6 of 2 cores" over the latest samples, when they use
    enough to matter (``analysis.hostload``'s line: ≥ 0.5 core and ≥ ¼ of the cores); else ""."""
    from gpumagic.analysis.hostload import SHARED_MIN_CORES, SHARED_MIN_SHARE

    by = {(s["group"], s["name"]): s["values"] for s in snapshot["series"]}
    total, cores = by.get(("host", "CPU (all cores)")), len(snapshot["per_core"])
    if not total or not cores:
        return ""
    own = [sum(v or 0.0 for v in vs) for vs in zip(by.get(("process", "CPU (this process)"), [None] * len(total)),
                                                     by.get(("process", "CPU (DataLoader workers)"), [None] * len(total)))]
    other = [t / 100 * cores - o / 100 for t, o in zip(total, own) if t is not None][-SHARED_SAMPLES:]
    if not other:
        return ""
    mean = max(0.0, sum(other) / len(other))
    if mean < SHARED_MIN_CORES or mean < SHARED_MIN_SHARE * cores:
        return ""
    return f"shared machine: other processes use {mean:.1f} of {cores} cores"


def render_html(snapshot: dict[str, Any]) -> str:
    """The monitor as one HTML fragment: a row per quantity (group, name, sparkline, current value)."""
    span = snapshot["span_s"]
    columns = pixel_columns(snapshot["t_s"], span)
    marks = mark_columns(snapshot["marks"], span)
    rows = []
    for s in snapshot["series"]:
        spark = sparkline_svg(columns, s["values"], s["max"], marks,
                              ORANGE if s["group"] != "process" and not s["group"].startswith("GPU") else BLUE)
        rows.append(f"<tr><td>{escape(s['group'])}</td><td>{escape(s['name'])} "
                    f'<span class="gm-unit">({escape(unit_label(s, len(snapshot["per_core"])))})</span></td><td>{spark}</td>'
                    f'<td style="text-align:right">{escape(fmt_value(current(s), s["unit"]))}</td></tr>')
    if snapshot["per_core"]:
        n = len(snapshot["per_core"])
        busy = sum(v >= 50 for v in snapshot["per_core"])
        rows.append(f'<tr><td>host</td><td>per core <span class="gm-unit">(% busy, {n} cores, busiest first)</span></td>'
                    f"<td>{core_bars_svg(snapshot['per_core'])}</td>"
                    f'<td style="text-align:right">{busy} of {n} cores at least half busy</td></tr>')
    state = "live" if snapshot["running"] else "stopped"
    minutes = f"{span / 60:g} min" if span >= 60 else f"{span:g} s"
    notes = "".join(f"<li>{escape(n)}</li>" for n in snapshot["notes"])
    return (f'<div class="gm-monitor" style="font:12px system-ui,sans-serif"><style>{MONITOR_CSS}</style>'
            f"<div><b>gpumagic monitor</b> ({state}; last {minutes}, one sample every {snapshot['interval_s'] * 1000:g} ms; "
            f"shaded: profiled cells)</div>"
            + (f"<div><b>{escape(shared)}</b></div>" if (shared := shared_machine_line(snapshot)) else "") +
            f'<table>{"".join(rows)}</table>'
            + (f"<ul>{notes}</ul>" if notes else "") + "</div>")


class MonitorWidget:
    """An ipywidgets ``HTML`` whose value :meth:`update` replaces with the latest sparklines."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        import ipywidgets

        self.root = ipywidgets.HTML(value=render_html(snapshot))

    def update(self, snapshot: dict[str, Any]) -> None:
        self.root.value = render_html(snapshot)
