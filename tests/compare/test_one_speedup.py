"""One comparison, one speed-up: the verdict, the rendered table and ``Comparison.speedup`` print
the same number (the review of issue 23 found 2.59× in a headline beside 2.58× from the property)."""

from __future__ import annotations

import re

import pytest
from tracebuilder import TraceBuilder

import gpumagic


def _run(step_us: float):
    tb = TraceBuilder()
    for i in range(5):
        t = i * step_us
        tb.step(i + 1, t, step_us)
        tb.kernel("k", t + 10, step_us / 2, launch_ts=t + 5)
    return gpumagic.analyze(tb.to_dict())


@pytest.mark.parametrize("after_us", [119_130.0, 119_000.0, 220_512.0, 61_600.0])
def test_the_headline_the_table_and_the_property_agree(after_us):
    comparison = gpumagic.compare(_run(308_000.0), _run(after_us))
    shown = f"{comparison.speedup:.2f}×"
    text = comparison.to_text()
    headline = re.search(r"([\d.]+×) faster(?: \([^)]*\))?: the median step", text).group(1)  # its interval after it
    table = re.search(r"median step .*\(([\d.]+×) faster\)", text).group(1)
    assert headline == table == shown, (headline, table, shown)
