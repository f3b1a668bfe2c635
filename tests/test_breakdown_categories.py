"""The step-time breakdown computed on first use (gpumagic.analysis.context.Categories): each
category's union alone when only it is read, the exclusive split a partition of the window."""

from __future__ import annotations

import os

import numpy as np
import pytest
from tracebuilder import DATA

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import BREAKDOWN_ORDER, Categories, build_context
from gpumagic.trace import load


@pytest.fixture(scope="module")
def trace():
    return load(os.path.join(DATA, "resnet50_v100_workers0.json.gz"))


def same(a: iv.Intervals, b: iv.Intervals) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def test_one_category_is_computed_alone(trace):
    ctx = build_context(trace)
    assert ctx.cat_union.computed == [] and "breakdown" not in ctx.cache
    loader = ctx.cat_union["dataloader"]
    assert ctx.cat_union.computed == ["dataloader"] and "breakdown" not in ctx.cache
    m = ctx.masks
    assert same(loader, ctx.intervals(ctx.events_in_window(m["name_dataloader"] & m["host"])))
    assert iv.total(loader) > 0  # this trace waits on its loader (num_workers=0)


def test_the_exclusive_split_partitions_the_window(trace):
    ctx = build_context(trace)
    totals = {c: iv.total(ctx.exclusive[c]) for c in BREAKDOWN_ORDER}
    assert ctx.cat_union.computed == list(BREAKDOWN_ORDER[:-1])  # "other" is the exclusive split's
    assert sum(totals.values()) == ctx.hi - ctx.lo
    for cat in BREAKDOWN_ORDER[:-1]:  # exclusive time within the category's own union
        assert iv.total(iv.subtract(ctx.exclusive[cat], ctx.cat_union[cat])) == 0
    assert same(ctx.cat_union["other"], ctx.exclusive["other"])
    # reading again computes nothing: the same objects
    assert ctx.exclusive["kernel"] is ctx.exclusive["kernel"]


def test_categories_is_a_read_only_mapping_of_the_known_categories():
    made: list[str] = []
    cats = Categories(lambda c: made.append(c) or iv.empty())
    with pytest.raises(KeyError):
        cats["gpu"]
    assert cats.get("gpu") is None and made == []
    assert cats.get("kernel") is not None and cats.get("kernel") is not None and made == ["kernel"]
    assert list(cats) == list(BREAKDOWN_ORDER) and len(cats) == len(BREAKDOWN_ORDER)
    assert "memcpy" in cats and "gpu" not in cats and made == ["kernel"]  # `in` computes nothing
    assert cats.computed == ["kernel"]
