"""Issue 31: a window that is not all steady is judged twice (the whole window, then its steady
part for the steady-state rules); the second context reuses what does not depend on the window
(name classes, masks, launch links, steps) and is otherwise the same as one built afresh."""

import numpy as np
from recorded import DATA

from gpumagic.analysis import metrics as _metrics
from gpumagic.analysis import segments
from gpumagic.analysis.context import build_context
from gpumagic.trace import load


def test_the_steady_part_reuses_the_trace_facts_and_means_the_same():
    trace = load(f"{DATA}/volta_resnet50_coldstart_nw4.json.gz")
    whole = build_context(trace)
    _metrics.compute(whole)
    span = segments.segments(whole).steady_span
    assert span is not None  # this cold start has a steady part after it
    reused, fresh = build_context(trace, window=span, like=whole), build_context(trace, window=span)
    assert reused.masks is whole.masks and reused.launch_row is whole.launch_row
    assert (reused.lo, reused.hi, reused.step_bounds, reused.device) == (fresh.lo, fresh.hi, fresh.step_bounds, fresh.device)
    assert np.array_equal(reused.gaps.start_ns, fresh.gaps.start_ns) and reused.idle_ns == fresh.idle_ns
    assert _metrics.compute(reused).to_dict() == _metrics.compute(fresh).to_dict()
