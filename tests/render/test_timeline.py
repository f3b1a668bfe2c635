"""The timeline: downsampling maths, and the figure's lanes on real and hand-built traces."""

import itertools
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from render_helpers import analysed
from tracebuilder import TraceBuilder

import gpumagic
from gpumagic.render.layout import MAX_GPU_ROWS
from gpumagic.render.timeline import (
    MAX_RECTS_PER_LANE,
    TimelineOptions,
    downsample,
    figure_png,
    timeline_figure,
    union_intervals,
)
from gpumagic.report.model import Report
from gpumagic.trace.kineto import load
from gpumagic.trace.model import Samples


def _lane_labels(fig):
    return [t.get_text() for t in fig.axes[0].get_yticklabels()]


def _legend_labels(fig):
    return [t.get_text() for t in fig.legends[0].get_texts()]


def _rects_per_row(fig):
    """Rectangles drawn per lane row (collections are grouped by the row of their first polygon)."""
    counts = {}
    for coll in fig.axes[0].collections:
        if coll.get_label().startswith(("GPU idle", "evidence")):
            continue
        for path in coll.get_paths():
            row = round(float(path.vertices[:, 1].mean()))
            counts[row] = counts.get(row, 0) + 1
    return counts


# -- interval maths -------------------------------------------------------------------------------


def test_union_merges_overlaps_and_nesting_but_keeps_gaps():
    s, e = union_intervals(np.array([0, 5, 2, 20]), np.array([10, 6, 12, 30]))
    assert s.tolist() == [0, 20] and e.tolist() == [12, 30]


def test_union_with_a_gap_tolerance_bridges_short_gaps_only():
    s, e = union_intervals(np.array([0, 15, 100]), np.array([10, 20, 110]), gap_ns=5)
    assert s.tolist() == [0, 100] and e.tolist() == [20, 110]


def test_downsample_reports_how_busy_each_merged_rectangle_is():
    # ten 1-ns events, one every 10 ns: merged at 20-ns resolution into one rectangle, 10 % busy
    starts = np.arange(0, 100, 10)
    r = downsample(starts, starts + 1, res_ns=20, max_rects=100)
    assert len(r) == 1
    assert r.start_ns[0] == 0 and r.end_ns[0] == 91
    assert r.density[0] == pytest.approx(10 / 91)


intervals = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 5000)), min_size=1, max_size=300)


@settings(max_examples=60, deadline=None)
@given(intervals, st.floats(1, 5e4), st.integers(1, 50))
def test_downsample_covers_every_interval_within_the_budget(ivs, res_ns, max_rects):
    start = np.array([s for s, _ in ivs], dtype=np.int64)
    end = start + np.array([d for _, d in ivs], dtype=np.int64)
    r = downsample(start, end, res_ns, max_rects)
    assert 1 <= len(r) <= max_rects
    assert np.all(np.diff(r.start_ns) > 0) and np.all(r.start_ns[1:] >= r.end_ns[:-1])
    assert np.all((r.density >= 0) & (r.density <= 1))
    # every input interval lies inside one output rectangle
    k = np.searchsorted(r.start_ns, start, side="right") - 1
    assert np.all(k >= 0) and np.all(end <= r.end_ns[k])


# -- the figure on recorded traces ----------------------------------------------------------------


def test_lanes_of_the_dataloader_trace(loader_report):
    fig = timeline_figure(loader_report)
    labels = _lane_labels(fig)
    assert labels[:2] == ["step phases", "main thread"]  # metrics.phases, then the events' lanes
    assert labels[-1] == "GPU0 · stream 7"
    legend = _legend_labels(fig)
    for expected in ("CPU ops", "data-loader wait", "GPU kernels", "memory copies", "GPU idle: waiting for the host",
                     "phase: data (waiting for the batch)", "phase: forward", "phase: backward", "phase: optimizer"):
        assert expected in legend
    steps = loader_report.metrics["steps"]["count"]
    step_texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(step_texts) == steps and all(t.startswith("step ") for t in step_texts)


def test_one_gpu_lane_per_stream_of_the_primary_device():
    report = analysed("a100_training_rank0")
    fig = timeline_figure(report)
    gpu_rows = [label for label in _lane_labels(fig) if label.startswith("GPU")]
    device = report.metrics["gpu"]["primary_device"]
    per_device = next(d for d in report.metrics["gpu"]["per_device"] if d["device"] == device)
    assert len(gpu_rows) == min(len(per_device["streams"]), MAX_GPU_ROWS)
    assert {int(r.split(" · ")[1].split()[-1]) for r in gpu_rows} <= set(per_device["streams"])
    assert "host sync (blocks on the GPU)" in _legend_labels(fig)


def test_the_216k_event_trace_stays_within_the_rectangle_budget():
    report = analysed("v100_large_216k_events")
    fig = timeline_figure(report)
    counts = _rects_per_row(fig)
    assert counts and max(counts.values()) <= MAX_RECTS_PER_LANE
    assert "communication (NCCL)" in _legend_labels(fig)
    assert figure_png(fig)[:8] == b"\x89PNG\r\n\x1a\n"


def test_zoom_to_a_step_sets_the_x_range_to_that_step(loader_report):
    m = loader_report.metrics
    start, end = m["steps"]["bounds_ns"][2]
    fig = timeline_figure(loader_report, TimelineOptions(step=2))
    lo, hi = fig.axes[0].get_xlim()
    origin = m["window"]["start_ns"]
    assert lo <= (start - origin) / 1e6 < lo + 0.05 * (hi - lo)
    assert hi - 0.05 * (hi - lo) < (end - origin) / 1e6 <= hi
    assert "step" in fig.texts[0].get_text() and "3 of" in fig.texts[0].get_text()


def test_highlighting_a_finding_draws_its_windows(loader_report):
    finding = loader_report.finding("dataloader-bound")
    assert finding is not None and finding.evidence.windows
    fig = timeline_figure(loader_report, TimelineOptions(finding="dataloader-bound"))
    marked = [c for c in fig.axes[0].collections if c.get_label() == "evidence: dataloader-bound"]
    assert len(marked) == 1
    assert len(marked[0].get_paths()) == len(finding.evidence.windows)
    assert finding.title in fig.texts[0].get_text()


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_figure_follows_its_theme_with_readable_text(loader_report, theme):
    """Issue 26: the Figure is no white slab in a dark notebook. Every text drawn (title, lanes,
    ticks, step labels, legends, axis labels) has a WCAG contrast of at least 4.5:1 on the
    figure's background, and the bars use the theme's tints of the one palette."""
    from matplotlib.colors import to_hex
    from matplotlib.text import Text

    from gpumagic.render import palette

    th = palette.figure_theme(theme)
    fig = loader_report.timeline(finding="dataloader-bound", theme=theme)
    assert to_hex(fig.get_facecolor()) == th.background and all(to_hex(ax.get_facecolor()) == th.background for ax in fig.axes)
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    assert len(texts) > 20  # the figure really was measured
    low = [(t.get_text(), to_hex(t.get_color())) for t in texts if palette.contrast(to_hex(t.get_color()), th.background) < 4.5]
    assert low == []
    kernels = next(c for c in fig.axes[0].collections if c.get_label() == "GPU kernels")
    assert to_hex(kernels.get_facecolors()[0], keep_alpha=False) == th.color(palette.BLUE).lower()
    png = figure_png(fig)
    from io import BytesIO

    from matplotlib.image import imread

    corner = imread(BytesIO(png))[2, 2, :3]
    assert to_hex(corner) == th.background  # the saved image's background, too


def test_the_themes_text_colours_pass_wcag_aa_and_an_unknown_theme_is_refused(loader_report):
    from gpumagic.render import palette

    for th in palette.FIGURE_THEMES.values():
        assert palette.contrast(th.text, th.background) >= 4.5 and palette.contrast(th.muted, th.background) >= 4.5
        assert palette.contrast(th.edge, th.background) >= 3  # the highlight's outline (a graphic: WCAG's 3:1)
    assert palette.FIGURE_THEMES["dark"].color(palette.BLUE) != palette.BLUE
    assert palette.FIGURE_THEMES["light"].color(palette.BLUE) == palette.BLUE
    with pytest.raises(ValueError, match="theme must be 'light' or 'dark'"):
        loader_report.timeline(theme="solarized")


def test_the_report_methods_draw_the_same_timeline(loader_report):
    fig = loader_report.timeline(step=1, finding="dataloader-bound")
    direct = timeline_figure(loader_report, TimelineOptions(step=1, finding="dataloader-bound"))
    assert fig.axes[0].get_xlim() == direct.axes[0].get_xlim()
    assert [c.get_label() for c in fig.axes[0].collections] == [c.get_label() for c in direct.axes[0].collections]
    assert loader_report.timeline_png(step=1)[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="out of range"):
        loader_report.timeline(step=99)


def test_bad_requests_get_clear_errors(loader_report):
    with pytest.raises(ValueError, match="out of range"):
        timeline_figure(loader_report, TimelineOptions(step=99))
    bare = Report(metrics=loader_report.metrics, findings=[], notes=[], trace=None)
    with pytest.raises(ValueError, match="no trace"):
        timeline_figure(bare)


# -- hand-built traces ----------------------------------------------------------------------------


def _sampled_report():
    tb = TraceBuilder()
    for i in range(3):
        t = i * 1000.0
        tb.step(i + 1, t, 1000.0)
        tb.dataloader(t + 10, 300)
        tb.kernel("k_gemm", t + 400, 500, launch_ts=t + 350)
    trace = load(tb.to_dict())
    t_ns = np.arange(0, 3_000_000, 100_000, dtype=np.int64)
    trace.samples = Samples(
        gpu={"t_ns": t_ns, "device": np.zeros_like(t_ns), "gpu_util": np.full(t_ns.size, 50.0),
             "mem_used_bytes": np.full(t_ns.size, 2**30), "mem_total_bytes": np.full(t_ns.size, 2**32)},
        cpu={"t_ns": t_ns, "total": np.full(t_ns.size, 25.0), "workers": np.full(t_ns.size, 80.0)},
    )
    return gpumagic.analyze(trace)


def test_samples_add_gpu_and_cpu_curves_beneath_the_lanes():
    fig = timeline_figure(_sampled_report())
    assert len(fig.axes) == 3
    assert [ax.get_ylabel() for ax in fig.axes[1:]] == ["GPU (NVML) %", "host CPU %"]
    gpu_lines = [line.get_label() for line in fig.axes[1].get_lines() if not line.get_label().startswith("_")]
    assert gpu_lines == ["GPU utilisation", "GPU memory used"]
    used = next(line for line in fig.axes[1].get_lines() if line.get_label() == "GPU memory used")
    assert np.allclose(used.get_ydata(), 25.0)  # 1 GiB of 4 GiB


def test_without_samples_only_the_lanes_are_drawn(loader_report):
    assert len(timeline_figure(loader_report).axes) == 1


def test_rendering_never_imports_pyplot():
    code = (
        "import sys, gpumagic\n"
        "from gpumagic.render.timeline import timeline_png\n"
        "r = gpumagic.analyze('tests/data/h100_bert_small_inference.json.gz')\n"
        "assert timeline_png(r)[:4] == b'\\x89PNG'\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'\n"
    )
    from render_helpers import DATA

    subprocess.run([sys.executable, "-c", code], check=True, cwd=DATA.parents[1])


def test_one_colour_per_category_across_timeline_and_bars():
    from gpumagic.render import palette

    colours = list(palette.CATEGORY_COLOR.values()) + list(palette.IDLE_COLOR.values()) + [palette.HOST_SYNC]
    assert len(colours) == len(set(colours))  # no colour means two things


def test_a_highlight_is_outlined_and_hatched_not_filled(loader_report):
    fig = timeline_figure(loader_report, TimelineOptions(finding="dataloader-bound"))
    [coll] = [c for c in fig.axes[0].collections if c.get_label() == "evidence: dataloader-bound"]
    assert (coll.get_hatch() and len(coll.get_facecolor()) == 0) or coll.get_facecolor()[0][3] == 0
    assert "evidence: dataloader-bound" in _legend_labels(fig)


def test_sample_axes_keep_the_0_and_100_percent_lines_off_the_frame():
    fig = timeline_figure(_sampled_report())
    assert len(fig.axes) == 3
    for ax in fig.axes[1:]:
        low, high = ax.get_ylim()
        assert low < 0 and high > 100  # a line at 0 % or 100 % is drawn inside the axes, not on the frame


def test_the_title_gives_the_duration_as_the_header_does(loader_report):
    from gpumagic.render._format import fmt_ms

    fig = timeline_figure(loader_report)
    title = fig.texts[0].get_text()
    assert title.endswith(fmt_ms(loader_report.metrics["window"]["dur_ms"]))


def test_lanes_are_named_for_people_worker_and_nccl():
    tb = TraceBuilder()
    for i in range(2):
        t = i * 1000.0
        tb.step(i + 1, t, 1000.0)
        tb.op("aten::mm", t + 10, 300)
        tb.add(cat="cpu_op", name="worker_fetch", ts=t + 20, dur=600, pid=999, tid=999)  # another process
        tb.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t + 100, 600, stream=13)
        tb.kernel("k_gemm", t + 400, 200, stream=7)
    report = gpumagic.analyze(load(tb.to_dict()))
    labels = _lane_labels(timeline_figure(report))
    assert labels[:2] == ["step phases", "main thread"]
    assert "DataLoader worker · pid 999" in labels
    assert "GPU0 · stream 13 · NCCL" in labels and "GPU0 · stream 7" in labels


def test_the_phase_lane_draws_each_steps_phases_from_the_metrics(loader_report):
    from matplotlib.collections import PolyCollection

    fig = timeline_figure(loader_report)
    spans = loader_report.metrics["phases"]["spans_ns"]
    drawn = {c.get_label(): len(c.get_paths()) for c in fig.axes[0].collections if isinstance(c, PolyCollection)}
    for phase in ("data", "forward", "backward", "optimizer"):
        label = f"phase: {'data (waiting for the batch)' if phase == 'data' else phase}"
        assert drawn[label] == sum(len(s[phase]) for s in spans)
    # each span lies inside its step, and the phases of a step do not overlap
    for (lo, hi), step in zip(loader_report.metrics["steps"]["bounds_ns"], spans):
        pieces = sorted(p for v in step.values() for p in v)
        assert all(lo <= s < e <= hi for s, e in pieces)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(pieces))
