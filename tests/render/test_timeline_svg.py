"""The vector timeline (issue 26): text labels, aggregation and its size cap, zoom, window links,
hover titles, one unit per sampled panel. The browser tests measure what a person sees."""

import re
from itertools import pairwise

import numpy as np
import pytest
from render_helpers import analysed
from tracebuilder import TraceBuilder

import gpumagic
from gpumagic.render.timeline_svg import MAX_RECTS, MAX_TITLED, MAX_WINDOWS_PER_FINDING, timeline_svg, window_id
from gpumagic.report.model import Report
from gpumagic.trace.kineto import load
from gpumagic.trace.model import Kind, Samples


def _rect_count(svg: str) -> int:
    """Rectangles drawn in the lanes: one ``M…z`` per rectangle in the paths."""
    return sum(d.count("z") for d in re.findall(r'<path class="gm-f-[^"]*"[^>]*d="([^"]*)"', svg))


def test_the_largest_fixture_is_aggregated_under_the_cap_and_says_so():
    report = analysed("v100_large_216k_events")
    chart = timeline_svg(report)
    assert chart.rects == _rect_count(chart.svg) <= MAX_RECTS
    assert chart.events > 100_000 and chart.events > 50 * chart.rects  # merged below a pixel
    assert len(chart.svg.encode()) < 400_000  # its share of the 2 MB export
    assert f"{chart.events:,} events drawn as {chart.rects:,} rectangles" in chart.caption()


def test_lane_labels_ticks_and_steps_are_text_elements():
    report = analysed("a100_training_rank0")
    svg = timeline_svg(report).svg
    lanes = re.findall(r'<text class="gm-tl-lane" x="2"[^>]*>([^<]*)</text>', svg)
    assert lanes[:2] == ["step phases", "main thread"]
    assert any(lab.endswith("\u00b7 NCCL") and lab.startswith("GPU0 \u00b7 stream") for lab in lanes)  # never cut
    assert re.findall(r'<text class="gm-tl-steplabel[^"]*"[^>]*>(step \d+)</text>', svg)
    assert len(re.findall(r'<text class="gm-tl-ticklabel', svg)) >= 3
    assert "ms since the first step" in svg
    assert 'viewBox' not in svg.split("<svg", 2)[1].split(">", 1)[0]  # the outer chart is not scaled: text keeps its size


def test_zooming_to_a_window_draws_fewer_events_and_names_single_ones_on_hover():
    report = analysed("resnet50_v100_workers0")
    full = timeline_svg(report)
    ev = report.trace.events
    kernel = int(ev.ts_ns[np.flatnonzero(ev.kind == Kind.KERNEL)[100]])
    zoomed = timeline_svg(report, window_ns=(kernel - 500_000, kernel + 500_000))  # one millisecond around a kernel
    assert zoomed.events < full.events and zoomed.view.end_ns - zoomed.view.start_ns == 1_000_000
    titles = re.findall(r'<rect class="gm-hit"[^>]*><title>([^<]*)</title>', zoomed.svg)
    assert 0 < len(titles) <= zoomed.rects <= MAX_TITLED  # the rectangles of a zoomed view are named on hover
    for t in titles:
        name, duration, *_ = t.split(" \u00b7 ")
        assert name and re.fullmatch(r"[\d.,]+ (µs|ms)", duration), t
    kernels = [t for t in titles if " \u00b7 GPU0 \u00b7 stream " in t and "GPU kernels" in t]  # stream and category
    assert kernels, titles
    assert timeline_svg(report).svg.count('class="gm-hit"') == 0 or full.rects <= MAX_TITLED  # not on a crowded overview


def test_every_finding_window_is_a_band_with_an_id_and_only_the_highlighted_one_is_shown():
    report = analysed("resnet50_v100_workers0")
    chart = timeline_svg(report, highlight="dataloader-bound")
    f = report.finding("dataloader-bound")
    for k in range(min(len(f.evidence.windows), MAX_WINDOWS_PER_FINDING)):
        assert re.search(rf'<rect id="{window_id(chart.anchor, f.id, k)}" class="gm-hl gm-hl-on"', chart.svg)
    others = [m for m in re.findall(r'<rect id="([^"]+)" class="gm-hl( gm-hl-on)?"', chart.svg) if f.id not in m[0]]
    assert all(on == "" for _, on in others)
    ids = re.findall(r'<rect id="([^"]+)"', chart.svg)
    assert len(ids) == len(set(ids))
    assert "evidence of the highlighted finding" in chart.legend


def test_categories_differ_by_band_as_well_as_colour():
    report = analysed("resnet50_v100_workers0")
    svg = timeline_svg(report).svg
    heights = {}
    for cls, d in re.findall(r'<path class="gm-f-(k|c|s)"[^>]*d="([^"]*)"', svg):
        heights.setdefault(cls, set()).update(float(v) for v in re.findall(r"v([\d.]+)", d))
    assert heights["k"] and heights["c"] and heights["k"].isdisjoint(heights["c"])  # kernels and copies: other heights


def test_cpu_samples_are_drawn_in_cores_on_one_axis():
    tb = TraceBuilder()
    for i in range(3):
        tb.step(i + 1, i * 1000.0, 1000.0)
        tb.kernel("k_gemm", i * 1000.0 + 400, 500, launch_ts=i * 1000.0 + 350)
    trace = load(tb.to_dict())
    t_ns = np.arange(0, 3_000_000, 100_000, dtype=np.int64)
    trace.samples = Samples(gpu={}, cpu={"t_ns": t_ns, "total": np.full(t_ns.size, 50.0), "main": np.full(t_ns.size, 100.0),
                                         "per_core": np.full((t_ns.size, 8), 50.0)})
    chart = timeline_svg(gpumagic.analyze(trace))
    assert "host CPU, cores busy of 8 (0\u20138 cores)" in chart.svg
    assert "host, all 8 cores (cores busy)" in chart.legend and "this process (cores busy)" in chart.legend
    assert "% of one core" not in chart.svg + chart.legend  # no second unit on the same axis


def test_a_report_without_a_trace_has_no_svg():
    with pytest.raises(ValueError, match="no trace"):
        timeline_svg(Report(metrics=None, findings=[], notes=[]))


# -- labels at any width (issue 26: "step 5" sat partly outside a 244 px chart) ---------------------

_ROW_LABEL = re.compile(r'<text class="(gm-tl-steplabel|gm-tl-ticklabel) gm-w(\d+)" x="([\d.]+)%" dx="(-?[\d.]+)" '
                        r'y="([\d.]+)">([^<]*)</text>')
_LANE_LABEL = re.compile(r'<text class="gm-tl-lane(?: gm-([wn])(\d+))?" x="2" y="[\d.]+">([^<]*)(?:<title>|</text>)')


def _row_boxes(svg: str, chart_px: float) -> dict[tuple[str, str], list[tuple[float, float, str]]]:
    """(row class, y) -> the boxes ``(left, right, text)`` of the labels a chart ``chart_px`` wide
    shows, from the SVG's own geometry (``x`` in %, ``dx`` in px) and the width estimate."""
    from gpumagic.render.timeline_svg import text_px

    rows: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    for cls, min_px, x, dx, y, text in _ROW_LABEL.findall(svg):
        if chart_px < int(min_px):
            continue  # hidden by its container query
        left = float(x) / 100 * chart_px + float(dx)
        rows.setdefault((cls, y), []).append((left, left + text_px(text), text))
    return rows


WIDTHS = (200, 230, 244, 300, 360, 500, 620, 800, 1100, 1400)


def _views(report):
    """The whole window, each step, and windows that put a step's middle near either edge."""
    yield None
    bounds = report.metrics.steps.bounds_ns
    for s, e in bounds:
        yield (s, e)
        yield (s + (e - s) // 2 - (e - s) // 40, s + (e - s) // 2 + 2 * (e - s))  # a step's middle at the left edge
        yield (s - 2 * (e - s), s + (e - s) // 2 + (e - s) // 40)  # ... and at the right edge
    full = (bounds[0][0], bounds[-1][1])
    rng = np.random.default_rng(26)
    for _ in range(12):
        a, b = sorted(rng.integers(full[0], full[1], 2))
        yield (int(a), int(max(b, a + 5000)))


@pytest.mark.parametrize("fixture", ["resnet50_v100_workers0", "a100_training_rank0"])
def test_step_tick_and_lane_labels_lie_inside_the_chart_and_never_overlap_at_any_width(fixture):
    report = analysed(fixture)
    seen_edge_step = False
    for window in _views(report):
        svg = timeline_svg(report, window_ns=window).svg
        assert "gm-tl-steplabel" in svg or window is not None
        for px in WIDTHS:
            for (cls, _), boxes in _row_boxes(svg, px).items():
                boxes.sort()
                assert boxes, cls
                for left, right, text in boxes:
                    assert left >= -0.01 and right <= px + 0.01, (fixture, window, px, cls, text, left, right)
                    seen_edge_step |= cls == "gm-tl-steplabel" and (left < 30 or right > px - 30) and px < 250
                for (_, r1, t1), (l2, _, t2) in pairwise(boxes):
                    assert l2 - r1 >= 5.9, (fixture, window, px, t1, t2)  # LABEL_GAP_PX apart
            if px >= 300:  # wide enough for a step label and ticks: some are shown
                rows = {cls for cls, _ in _row_boxes(svg, px)}
                assert "gm-tl-ticklabel" in rows, (window, px)
        from gpumagic.render.timeline_svg import text_px

        for kind, min_px, text in _LANE_LABEL.findall(svg):
            shown_from = int(min_px) if kind == "w" else 0
            for px in WIDTHS:
                visible = px >= shown_from if kind != "n" else px < int(min_px)
                if visible:
                    assert 2 + text_px(text) <= px, (text, px)
    assert seen_edge_step  # the views really put a step label against an edge of a narrow chart


def test_a_long_lane_label_has_a_shortened_twin_in_a_narrow_chart():
    from gpumagic.render.timeline_svg import MIN_CHART_PX, lane_label, text_px

    name = "GPU0 \u00b7 stream 84 \u00b7 NCCL all-reduce on the gradient buckets of the decoder"
    markup = lane_label(name, 20)
    (kf, bpf, full), (kn, bpn, short) = _LANE_LABEL.findall(markup)
    assert (kf, kn) == ("w", "n") and bpf == bpn and full == name and int(bpf) >= text_px(name)
    assert short.endswith("\u2026") and name.startswith(short[:-1]) and 2 + text_px(short) <= MIN_CHART_PX
    assert f"<title>{name}</title>" in markup  # the full name on hover
    assert lane_label("main thread", 20).count("<text") == 1
