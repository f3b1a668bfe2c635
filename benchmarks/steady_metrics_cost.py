"""What the second metrics pass of a window that is not all steady costs (issue 31).

``analysis.analyze`` computes the metrics of the whole window, and, when the window is not all
steady, builds a context for its longest steady stretch and computes its metrics again for the
steady-state rules (``analysis._steady_part``), reusing the whole window's trace-level facts
(``build_context(..., like=ctx)``: name classes, masks, launch links, steps). This times,
interleaved over rounds, the whole ``analyze``, the steady part's context + metrics as analyze
builds them, and the same without the reuse, on the non-steady traces of tests/data. Run: ``python benchmarks/steady_metrics_cost.py [rounds]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from gpumagic.analysis import analyze, segments
from gpumagic.analysis import metrics as _metrics
from gpumagic.analysis.context import build_context
from gpumagic.trace import load

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")


def main(rounds: int) -> None:
    names = [n for n in sorted(os.listdir(DATA), key=lambda n: -os.path.getsize(os.path.join(DATA, n)))
             if n.endswith(".json.gz")]
    for name in names:
        trace = load(os.path.join(DATA, name))
        ctx = build_context(trace)
        _metrics.compute(ctx)
        seg = segments.segments(ctx)
        if seg.all_steady or seg.steady_span is None:
            continue
        whole, second, fresh = [], [], []
        for _ in range(rounds):  # interleaved: A B C A B C
            t0 = time.perf_counter()
            analyze(trace)
            whole.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _metrics.compute(build_context(trace, window=seg.steady_span, like=ctx))
            second.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _metrics.compute(build_context(trace, window=seg.steady_span))
            fresh.append(time.perf_counter() - t0)
        w, s, f = (statistics.median(x) for x in (whole, second, fresh))
        print(f"{name}: {trace.meta.get('event_count', len(trace.events))} events, analyze {w * 1e3:.1f} ms; "
              f"steady part's context + metrics {s * 1e3:.1f} ms ({100 * s / w:.0f} % of analyze), "
              f"{f * 1e3:.1f} ms without reusing the trace's facts ({s / f:.2f}×)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
