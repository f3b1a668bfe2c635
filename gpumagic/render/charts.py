"""Small figures besides the timeline: the GPU memory curve.

matplotlib's object-oriented API only (``Figure`` + ``FigureCanvasAgg``), like the timeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpumagic.render import palette
from gpumagic.render.layout import origin_label
from gpumagic.render.timeline import DPI, FIG_WIDTH_IN, FONT_LANE, FONT_LEGEND, FONT_TICK, FONT_TITLE, LEFT_IN, RIGHT_IN

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from gpumagic.report.model import Report

#: Points drawn per curve at most: about one per pixel column of the figure.
MAX_CURVE_POINTS = 1200
GIB = 2**30
MEMORY_HEIGHT_IN = 2.6
CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA


def memory_series(report: Report) -> tuple[str, np.ndarray, np.ndarray] | None:
    """``(source, t_ns, bytes)`` of the primary GPU's memory over time, or None when not recorded.

    Prefers the allocator's records (``allocated`` after each event); falls back to NVML's
    ``mem_used_bytes`` samples (which also count the CUDA context and other processes).
    """
    trace = report.trace
    if trace is None:
        return None
    device = None if report.metrics is None else report.metrics.gpu.primary_device
    mem = trace.memory
    sel = (mem.device_type == CUDA_DEVICE_TYPE) & (mem.allocated >= 0)
    if device is not None:
        sel &= mem.device == device
    if sel.any():
        order = np.argsort(mem.ts_ns[sel], kind="stable")
        return "allocator (allocated)", mem.ts_ns[sel][order], mem.allocated[sel][order]
    gpu = trace.samples.gpu if trace.samples is not None else {}
    if "t_ns" in gpu and "mem_used_bytes" in gpu and len(gpu["t_ns"]):
        t, used = np.asarray(gpu["t_ns"], np.int64), np.asarray(gpu["mem_used_bytes"], np.int64)
        if "device" in gpu and device is not None and (np.asarray(gpu["device"]) == device).any():
            keep = np.asarray(gpu["device"]) == device
            t, used = t[keep], used[keep]
        return "NVML (used)", t, used
    return None


def envelope(t: np.ndarray, y: np.ndarray, max_points: int = MAX_CURVE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Downsample a curve to ``max_points`` buckets keeping each bucket's maximum (peaks survive)."""
    if t.size <= max_points:
        return t, y
    edges = np.linspace(t[0], t[-1], max_points + 1)
    bucket = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, max_points - 1)
    peak = np.full(max_points, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(peak, bucket, y.astype(np.int64))
    keep = peak > np.iinfo(np.int64).min
    return ((edges[:-1] + edges[1:]) / 2)[keep], peak[keep]


def memory_figure(report: Report, width_in: float = FIG_WIDTH_IN, dpi: int = DPI) -> Figure | None:
    """GPU memory (GiB) over the analysis window with the device capacity, or None."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = memory_series(report)
    if series is None:
        return None
    source, t_ns, nbytes = series
    origin = 0 if report.metrics is None else report.metrics.window.start_ns
    t, y = envelope(t_ns, nbytes)
    fig = Figure(figsize=(width_in, MEMORY_HEIGHT_IN), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((LEFT_IN / width_in, 0.25, 1 - (LEFT_IN + RIGHT_IN) / width_in, 0.6))
    ax.plot((t - origin) / 1e6, y / GIB, color=palette.PURPLE, linewidth=1.3, drawstyle="steps-post", label=source)
    capacity = None if report.metrics is None else report.metrics.memory.capacity_bytes
    if capacity:
        ax.axhline(capacity / GIB, color=palette.VERMILLION, linestyle="--", linewidth=1, label="device capacity")
    ax.set_ylim(0, max(float(y.max()) / GIB, (capacity or 0) / GIB) * 1.25 or 1)
    ax.set_ylabel("GiB", fontsize=FONT_LANE)
    ax.set_xlabel(f"time since {origin_label(report)} (ms)", fontsize=FONT_LANE)
    ax.tick_params(labelsize=FONT_TICK)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(loc="upper right", fontsize=FONT_LEGEND, frameon=False, ncol=2, borderaxespad=0.1)
    ax.set_title("GPU memory over time", fontsize=FONT_TITLE - 1, fontweight="bold")
    return fig


def memory_svg(report: Report) -> str | None:
    """:func:`memory_figure` as inline SVG in the page's theme (:mod:`gpumagic.render.svg_chart`), or
    None. The scale is the curve's own (GiB or MiB, whichever its peak reads in); the capacity is
    drawn when it lies within twice the peak, and otherwise named in the key as off the scale."""
    from gpumagic.render._format import fmt_bytes
    from gpumagic.render.svg_chart import Line, line_chart_svg
    from gpumagic.render.timeline_svg import axis_ticks

    series = memory_series(report)
    if series is None:
        return None
    source, t_ns, nbytes = series
    origin = 0 if report.metrics is None else report.metrics.window.start_ns
    t, y = envelope(t_ns, nbytes)
    x = (np.asarray(t, np.float64) - origin) / 1e6
    peak = float(np.max(y)) if len(y) else 0.0
    unit, div = ("GiB", float(GIB)) if peak >= GIB else ("MiB", float(2**20))
    capacity = None if report.metrics is None else report.metrics.memory.capacity_bytes
    hlines = []
    label = source
    if capacity and capacity <= 2 * max(peak, 1):
        hlines.append((capacity / div, f"device capacity {fmt_bytes(capacity)}", "cap"))
    elif capacity:
        label += f" (device capacity {fmt_bytes(capacity)}, off the scale)"
    x_range = (float(x.min()), float(x.max()) if x.max() > x.min() else float(x.min()) + 1)
    return line_chart_svg(
        "GPU memory over time", [Line(label, x, np.asarray(y, np.float64) / div, "m", steps=True)], x_range=x_range,
        y_unit=f"GPU memory, {unit}", y_fmt=lambda v: f"{v:,g} {unit}", x_ticks=axis_ticks(*x_range),
        x_label=f"ms since {origin_label(report)}", hlines=hlines,
    )
