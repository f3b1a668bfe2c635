"""gpumagic._arrays.median_of is numpy's median to the bit (it replaces np.median on the analysis
path, where np.median would import numpy.ma), and distinct is np.unique."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumagic._arrays import distinct, median_of


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=30))
def test_median_of_ints_is_numpys(values):
    assert median_of(np.array(values, dtype=np.int64)) == float(np.median(np.array(values, dtype=np.int64)))
    assert distinct(np.array(values)).tolist() == np.unique(np.array(values)).tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=30))
def test_median_of_floats_is_numpys(values):
    with np.errstate(over="ignore"):  # the mean of two values near the float maximum overflows to inf, in both
        got, want = median_of(values), float(np.median(values))
    assert got == want or (math.isnan(got) and math.isnan(want))


def test_median_of_nan_and_empty():
    assert math.isnan(median_of([1.0, float("nan"), 2.0]))
    assert math.isnan(median_of(np.array([], dtype=np.int64)))
    assert median_of([0.1, 0.2]) == float(np.median([0.1, 0.2]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2**40), max_size=20))
def test_fprod_is_numpys_prod(sizes):
    from gpumagic.analysis.flops import fprod

    assert fprod(sizes) == float(np.prod(sizes, dtype=np.float64))


def test_in_threads_keeps_order_raises_the_first_error_and_leaves_no_thread():
    import threading

    from gpumagic._arrays import in_threads

    before = threading.active_count()
    assert in_threads(lambda x: x * x, list(range(9)), 3) == [x * x for x in range(9)]
    assert in_threads(lambda x: x + 1, [1], 4) == [2]  # one item: no thread
    seen = []
    assert in_threads(lambda x: seen.append(threading.current_thread()) or x, [1, 2], 1) == [1, 2]
    assert seen == [threading.main_thread()] * 2  # threads=1: this thread

    def fails(x):
        if x == 2:
            raise ValueError("item 2")
        return x

    with pytest.raises(ValueError, match="item 2"):
        in_threads(fails, [1, 2, 3], 2)
    assert threading.active_count() == before  # the pool's threads have ended
