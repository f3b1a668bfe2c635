"""The memory curve: allocator records first, NVML samples as the fallback, peaks kept."""

import numpy as np
from tracebuilder import TraceBuilder

import gpumagic
from gpumagic.render.charts import GIB, envelope, memory_figure, memory_series
from gpumagic.trace.kineto import load
from gpumagic.trace.model import Samples


def _report(with_memory: bool):
    tb = TraceBuilder(total_mem=8 * GIB)
    for i in range(3):
        t = i * 1000.0
        tb.step(i + 1, t, 1000.0)
        tb.kernel("k_gemm", t + 100, 700, launch_ts=t + 50)
        if with_memory:
            tb.memory(t + 10, allocated=(i + 1) * GIB, reserved=4 * GIB)
    return gpumagic.analyze(load(tb.to_dict()))


def test_allocator_records_give_the_curve_and_the_capacity_line():
    report = _report(with_memory=True)
    source, t_ns, nbytes = memory_series(report)
    assert source.startswith("allocator")
    assert nbytes.tolist() == [GIB, 2 * GIB, 3 * GIB]
    assert t_ns.tolist() == [10_000, 1_010_000, 2_010_000]  # 10 µs into each step
    ax = memory_figure(report).axes[0]
    curve, capacity = ax.get_lines()
    assert np.allclose(curve.get_ydata(), [1, 2, 3])
    assert np.allclose(capacity.get_ydata(), 8)


def test_nvml_samples_are_the_fallback():
    report = _report(with_memory=False)
    assert memory_series(report) is None and memory_figure(report) is None
    t = np.array([0, 1_000_000], dtype=np.int64)
    report.trace.samples = Samples(gpu={"t_ns": t, "device": np.zeros(2), "mem_used_bytes": np.array([GIB, 2 * GIB])})
    source, _, nbytes = memory_series(report)
    assert source.startswith("NVML") and nbytes.tolist() == [GIB, 2 * GIB]


def test_envelope_keeps_every_bucket_peak():
    t = np.arange(10_000, dtype=np.int64)
    y = np.zeros(10_000, dtype=np.int64)
    y[4321] = 99
    te, ye = envelope(t, y, max_points=100)
    assert te.size <= 100 and ye.max() == 99


def test_memory_by_category_is_a_stacked_svg_in_the_page_theme():
    import os
    import re

    from test_memory_categories import _bundle_with, _recorded_block
    from tracebuilder import DATA

    from gpumagic.render.chart_css import SVG_DARK_VARS, SVG_LIGHT_VARS, svg_css
    from gpumagic.render.html import Images, render_images, report_html
    from gpumagic.render.memory_categories import SVG_CLASS, categories_figure, categories_svg
    from gpumagic.trace import load as load_path
    from gpumagic.trace.kineto import from_bytes

    path = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
    plain = load_path(path)
    lo = gpumagic.analyze(path).metrics.window.start_ns
    report = gpumagic.analyze(from_bytes(_bundle_with(path, {"memory_categories": _recorded_block(plain.origin_ns, lo + 1000)}), "b"))
    svg = categories_svg(report)
    # one polygon per category that holds memory, stacked bottom to top: parameter, gradient, activation, unknown
    fills = re.findall(r'<polygon class="gm-f-(\w+)"', svg)
    assert fills == [SVG_CLASS[c] for c in ("parameter", "gradient", "activation", "unknown")]
    assert svg.count('fill="url(#gm-stripes)"') == 2 + 2  # every other band, and its key swatch
    # the largest band (activation, 700 of 805 bytes at the peak) is named inside itself; the key lists them top down
    assert re.search(r'<text class="gm-stack-label"[^>]*>activation</text>', svg)
    keys = re.findall(r"</svg>([a-z ]+)</li>", svg)
    assert keys[:4] == ["unknown", "activation", "gradient", "parameter"]
    # one unit per axis, the peak marked, text sized by the page's CSS (12 px), no image
    assert "live memory (cuda:0), bytes" in svg and "ms since " in svg and "peak of live bytes, 1.0 ms into the window</li>" in svg
    assert all(f"{v:,} bytes</text>" in svg for v in (250, 500, 750, 1000))
    assert "font-size:12px" in svg_css() and "font-size" not in svg and "<image" not in svg
    for cls in set(fills):  # each colour class has a light and a dark value
        var = re.search(rf"gm-f-{cls}\{{fill:var\((--[\w-]+)\)", svg_css()).group(1)
        assert var + ":" in SVG_LIGHT_VARS and var + ":" in SVG_DARK_VARS
    html = report_html(report, render_images(report))
    assert render_images(report) == Images() and "data:image/png" not in html
    assert '<div class="gm-memory-categories"><div class="gm-tl-wrap"><svg' in html
    assert categories_figure(report) is not None  # the matplotlib figure stays available
    assert categories_svg(gpumagic.analyze(path)) is None  # no memory profile: no chart (the tab says why)
