"""Render speed and size: the full report (HTML with the timeline) of the 216k-event fixture.

Targets (issue 4): building the full report in at most 1.5 s, and an exported HTML file of at
most 2 MB. "Building" is the render from an analysed Report: the timeline and memory charts
drawn (inline SVG), and the HTML written. Loading and analysing the trace are timed separately.

    python benchmarks/render.py [TRACE] [--repeat N]

The first render includes importing the render modules; the figure reported against the target
is the median of the warm renders that follow (what a notebook pays after its first report).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_TRACE = REPO / "tests" / "data" / "v100_large_216k_events.json.gz"
TARGET_BUILD_S = 1.5
TARGET_HTML_BYTES = 2 * 1024 * 1024


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=str(DEFAULT_TRACE))
    parser.add_argument("--repeat", type=int, default=5, help="warm renders to time (default 5)")
    args = parser.parse_args(argv)

    import gpumagic
    from gpumagic.render.html import html_document

    trace, load_s = _timed(lambda: gpumagic.load_trace(args.trace))
    report, analyze_s = _timed(lambda: gpumagic.analyze(trace))
    html, cold_s = _timed(lambda: html_document(report))
    warm = [_timed(lambda: html_document(report))[1] for _ in range(max(args.repeat, 1))]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.html"
        path.write_text(html, encoding="utf-8")
        size = path.stat().st_size

    build_s = statistics.median(warm)
    ok_time, ok_size = build_s <= TARGET_BUILD_S, size <= TARGET_HTML_BYTES
    print(f"trace            {Path(args.trace).name} ({len(trace.events):,} events)")
    print(f"load             {load_s:.2f} s")
    print(f"analyze          {analyze_s:.2f} s")
    print(f"render, first    {cold_s:.2f} s (includes the first imports)")
    print(f"render, warm     {build_s:.2f} s median of {len(warm)}  target <= {TARGET_BUILD_S} s  {'ok' if ok_time else 'MISSED'}")
    print(f"HTML size        {size / 1024:.0f} KiB  target <= {TARGET_HTML_BYTES // 1024} KiB  {'ok' if ok_size else 'MISSED'}")
    return 0 if ok_time and ok_size else 1


if __name__ == "__main__":
    sys.exit(main())
