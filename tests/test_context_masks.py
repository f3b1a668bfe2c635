"""The context's per-event name masks: a class that no name of the trace is in is all False
without a pass over the events, and every mask equals the per-event gather of its class."""

from __future__ import annotations

import os

import numpy as np
import pytest
from tracebuilder import DATA

from gpumagic.analysis.context import _flags, build_context
from gpumagic.trace import load


@pytest.mark.parametrize("name", ["v100_resnet_ns_timestamps.json.gz", "mi300_vllm_decode_fullgraph.json.gz",
                                  "a100_training_rank0.json.gz"])
def test_name_masks_are_the_gather_of_their_class(name):
    trace = load(os.path.join(DATA, name))
    ctx = build_context(trace)
    flags = _flags(trace)
    empty = [k for k, v in flags.items() if not v.any()]
    assert empty and len(empty) < len(flags)  # both kinds of class are exercised
    for k, v in flags.items():
        mask = ctx.masks[f"name_{k}"]
        assert mask.dtype == bool and mask.shape == trace.events.name.shape
        assert np.array_equal(mask, v[trace.events.name]), k
    zeros = [ctx.masks[f"name_{k}"] for k in empty]  # arrays of their own: writing one changes no other
    assert not any(np.shares_memory(a, b) for i, a in enumerate(zeros) for b in zeros[i + 1:])


def test_on_device_follows_the_primary_device():
    """``ctx.on_device`` is the events carrying the primary GPU's id, computed once, and
    recomputed when the device is set anew (build_context sets it after making the context)."""
    trace = load(os.path.join(DATA, "v100_resnet_ns_timestamps.json.gz"))
    ctx = build_context(trace)
    assert ctx.device >= 0
    first = ctx.on_device
    assert np.array_equal(first, trace.events.device == ctx.device) and first.any()
    assert ctx.on_device is first  # not recomputed
    ctx.device = -1
    assert np.array_equal(ctx.on_device, trace.events.device == -1)
