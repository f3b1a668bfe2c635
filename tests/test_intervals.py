"""Interval maths checked against a brute-force model on a small integer grid (Hypothesis)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumagic.analysis import intervals as iv

GRID = 60
spans = st.lists(st.tuples(st.integers(0, GRID), st.integers(0, 20)), max_size=12)


def arr(pairs):
    s = np.array([a for a, _ in pairs], dtype=np.int64)
    e = np.array([a + d for a, d in pairs], dtype=np.int64)
    return s, e


def cover(pairs):
    """The set of unit cells [t, t+1) covered."""
    return {t for a, d in pairs for t in range(a, a + d)}


def cells(ivs):
    s, e = ivs
    return {t for a, b in zip(s.tolist(), e.tolist()) for t in range(a, b)}


def normalised(ivs):
    s, e = ivs
    return bool((e > s).all() and (s[1:] > e[:-1]).all())


@given(spans)
def test_union(a):
    u = iv.union(*arr(a))
    assert normalised(u)
    assert cells(u) == cover(a)
    assert iv.total(u) == len(cover(a))


@given(spans)
def test_union_of_spans_already_in_order(a):
    """Spans sorted by start (nested, touching and repeated ones included) skip the sort: the
    same set as from the same spans reversed (which takes the sort)."""
    in_order = sorted(a, key=lambda p: p[0])
    u = iv.union(*arr(in_order))
    assert normalised(u)
    assert cells(u) == cover(a)
    from_reversed = iv.union(*arr(in_order[::-1]))
    assert np.array_equal(u[0], from_reversed[0]) and np.array_equal(u[1], from_reversed[1])


@given(spans, spans)
@settings(max_examples=200)
def test_intersect_subtract_merge(a, b):
    A, B = arr(a), arr(b)
    assert cells(iv.intersect(A, B)) == cover(a) & cover(b)
    assert cells(iv.subtract(A, B)) == cover(a) - cover(b)
    assert cells(iv.merge(A, B)) == cover(a) | cover(b)
    for r in (iv.intersect(A, B), iv.subtract(A, B), iv.merge(A, B)):
        assert normalised(r)


@given(spans, st.integers(0, GRID), st.integers(0, GRID))
def test_clip_and_gaps(a, lo, width):
    hi = lo + width + 1
    u = iv.union(*arr(a))
    window = set(range(lo, hi))
    assert cells(iv.clip(u, lo, hi)) == cover(a) & window
    g = iv.gaps(u, lo, hi)
    assert normalised(g)
    assert cells(g) == window - cover(a)


@given(spans, st.integers(-5, GRID * 2))
def test_head_is_the_earliest_part_of_that_length(a, length):
    u = iv.union(*arr(a))
    h = iv.head(u, length)
    assert normalised(h)
    covered = sorted(cells(u))
    assert sorted(cells(h)) == covered[:max(0, length)]  # the earliest cells, as many as asked (or all)
    assert iv.total(h) == min(max(0, length), iv.total(u))


@given(spans, st.lists(st.tuples(st.integers(0, GRID), st.integers(0, 30)), min_size=1, max_size=5))
def test_measure_in(a, windows):
    u = iv.union(*arr(a))
    lo = np.array([w[0] for w in windows])
    hi = np.array([w[0] + w[1] for w in windows])
    got = iv.measure_in(u, lo, hi).tolist()
    assert got == [len(cover(a) & set(range(x, y))) for x, y in zip(lo.tolist(), hi.tolist())]


@given(spans, st.lists(st.integers(-5, GRID + 25), max_size=20))
def test_contains(a, times):
    got = iv.contains(iv.union(*arr(a)), np.array(times, dtype=np.int64)).tolist()
    assert got == [t in cover(a) for t in times]


def test_empty_inputs():
    e = iv.empty()
    assert iv.total(iv.union(*e)) == 0
    assert iv.total(iv.intersect(e, e)) == 0
    assert iv.gaps(e, 0, 10)[0].tolist() == [0]
    assert iv.measure_in(e, np.array([0]), np.array([5])).tolist() == [0]
    assert iv.contains(e, np.array([0, 3])).tolist() == [False, False]


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30), st.floats(0, 100))
def test_percentile_matches_numpy(values, q):
    from gpumagic._arrays import distinct, percentile

    a = np.array(values)
    assert percentile(a, q) == pytest.approx(float(np.percentile(a, q)), rel=1e-9, abs=1e-6)
    assert distinct(a).tolist() == np.unique(a).tolist()


def _sweep(a, b, keep_level):
    """The boundary sweep intersect and subtract used before (sort every boundary, keep the
    segments whose level passes): the reference for large random sets."""
    a, b = iv.union(*a), iv.union(*b)
    pts = np.concatenate([a[0], a[1], b[0], b[1]])
    if pts.size == 0:
        return iv.empty()
    w = np.concatenate([np.ones(a[0].size, np.int64), -np.ones(a[1].size, np.int64),
                        np.full(b[0].size, 2, np.int64), np.full(b[1].size, -2, np.int64)])
    order = np.argsort(pts, kind="stable")
    pts, level = pts[order], np.cumsum(w[order])
    keep = keep_level(level[:-1]) & (pts[1:] > pts[:-1])
    return iv.union(pts[:-1][keep], pts[1:][keep])


@given(st.integers(0, 2**32 - 1), st.integers(1, 3000), st.integers(1, 3000), st.sampled_from([10, 1000, 10**9]))
@settings(max_examples=60, deadline=None)
def test_intersect_subtract_match_the_sweep_on_large_sets(seed, n, m, scale):
    """Thousands of random spans (nested, touching, repeated, empty and reversed ones among
    them, on grids coarse and fine): the binary-search pairing gives the sweep's exact sets."""
    rng = np.random.default_rng(seed)

    def spans(k):
        s = rng.integers(0, scale * 50, k)
        return s, s + rng.integers(-2, scale, k)  # some ends before their starts: empty spans

    A, B = spans(n), spans(m)
    for got, want in ((iv.intersect(A, B), _sweep(A, B, lambda v: v == 3)),
                      (iv.subtract(A, B), _sweep(A, B, lambda v: v == 1)),
                      (iv.subtract(B, A), _sweep(B, A, lambda v: v == 1))):
        assert normalised(got)
        assert got[0].dtype == np.int64 and got[1].dtype == np.int64
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_outermost_orders_by_start_enclosing_first_and_marks_the_outer_spans():
    # a span holding two, one starting where it ends (adjacent, outer), an equal-start child after its parent
    s = np.array([10, 0, 2, 5, 0], dtype=np.int64)
    e = np.array([12, 10, 4, 7, 3], dtype=np.int64)
    order, outer = iv.outermost(s, e)
    assert order.tolist() == [1, 4, 2, 3, 0]
    assert outer.tolist() == [True, False, False, False, True]
    empty_order, empty_outer = iv.outermost(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert empty_order.size == 0 and empty_outer.size == 0
