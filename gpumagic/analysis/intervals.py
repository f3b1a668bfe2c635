"""Interval maths over numpy arrays of integer nanoseconds.

An *interval set* is a pair ``(starts, ends)`` of int64 arrays. A *normalised* set is sorted,
disjoint and without empty intervals (what :func:`union` returns); the functions below accept
any set and return normalised ones. Everything is vectorised: :func:`union` sweeps the spans
sorted by start with a running furthest end; :func:`intersect` and :func:`subtract` pair the
intervals of two normalised sets by binary search, with no sort at all. 10^5 intervals cost
milliseconds.

::

    a:      [====)   [=======)
    b:         [=======)
    union:  [==================)
    inter:     [=)   [=)
    a - b:  [==)       [====)
"""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import distinct

Intervals = tuple[np.ndarray, np.ndarray]

_EMPTY = np.zeros(0, dtype=np.int64)


def empty() -> Intervals:
    return _EMPTY, _EMPTY


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Merge overlapping or touching intervals into a normalised set."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return empty()
    s, e = starts, ends
    # spans often come in order (a normalised set, a sweep's segments, one lane's spans), which a
    # stable sort would return as they are: an O(n) test spares the O(n log n) sort and two copies
    if s.size > 1 and not (s[1:] >= s[:-1]).all():
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new_group = np.empty(s.size, dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new_group)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def _intersect_normalised(a: Intervals, b: Intervals) -> Intervals:
    """``a`` ∩ ``b`` for two normalised sets, without a sort: each interval of ``a`` overlaps a
    run of ``b``'s (found by binary search, since ``b``'s starts and ends are both sorted), and
    every overlapping pair gives one piece ``[max of starts, min of ends)``. The pieces come out
    normalised: taken pair by pair in order, and two pieces never touch, because the intervals
    of each set are apart (a normalised set has a gap between any two of its intervals)."""
    (a_s, a_e), (b_s, b_e) = a, b
    if a_s.size == 0 or b_s.size == 0:
        return empty()
    first = np.searchsorted(b_e, a_s, side="right")  # b's first interval ending after a's start
    stop = np.searchsorted(b_s, a_e, side="left")  # b's first interval starting at or after a's end
    count = np.maximum(stop - first, 0)
    pairs = int(count.sum())
    if pairs == 0:
        return empty()
    i = np.repeat(np.arange(a_s.size), count)
    # j runs first[i], first[i] + 1, ... within each a interval's group of pairs
    j = np.arange(pairs) - np.repeat(np.cumsum(count) - count, count) + np.repeat(first, count)
    return np.maximum(a_s[i], b_s[j]), np.minimum(a_e[i], b_e[j])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Time covered by both sets."""
    return _intersect_normalised(union(*a), union(*b))


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Time covered by ``a`` and not by ``b``: ``a`` ∩ the gaps of ``b`` over ``a``'s span."""
    a = union(*a)
    if a[0].size == 0:
        return a
    b = union(*b)
    if b[0].size == 0:
        return a
    return _intersect_normalised(a, gaps(b, int(a[0][0]), int(a[1][-1])))


def merge(a: Intervals, b: Intervals) -> Intervals:
    """Union of two sets."""
    return union(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def union_of(sets: list[Intervals]) -> Intervals:
    """Union of any number of sets (empty for none)."""
    if not sets:
        return empty()
    return union(np.concatenate([a[0] for a in sets]), np.concatenate([a[1] for a in sets]))


def clip(a: Intervals, lo: int, hi: int) -> Intervals:
    """The part of a normalised set inside ``[lo, hi)``."""
    s = np.maximum(a[0], lo)
    e = np.minimum(a[1], hi)
    keep = e > s
    return s[keep], e[keep]


def total(a: Intervals) -> int:
    """Covered length of a normalised set."""
    return int(np.sum(a[1] - a[0]))


def head(a: Intervals, length: int) -> Intervals:
    """The earliest ``length`` of a normalised set: its intervals in time order, the last one cut
    where their covered length reaches ``length`` (the whole set when it is no longer)."""
    s, e = a
    if length <= 0 or s.size == 0:
        return empty()
    covered = np.cumsum(e - s)
    if covered[-1] <= length:
        return a
    k = int(np.searchsorted(covered, length, side="left"))  # the interval where ``length`` is reached
    before = int(covered[k - 1]) if k else 0
    s, e = s[:k + 1].copy(), e[:k + 1].copy()
    e[k] = s[k] + (length - before)
    keep = e > s
    return s[keep], e[keep]


def gaps(a: Intervals, lo: int, hi: int) -> Intervals:
    """The complement of a normalised set inside ``[lo, hi)``."""
    s, e = clip(a, lo, hi)
    g_s = np.concatenate([[lo], e])
    g_e = np.concatenate([s, [hi]])
    keep = g_e > g_s
    return g_s[keep].astype(np.int64), g_e[keep].astype(np.int64)


def outermost(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spans of one thread by nesting: ``(order, outer)``, ``order`` sorting them by start with the
    enclosing span first (the longest), and ``outer`` saying which of them, in that order, start
    when every earlier one has ended (the outermost operators, where the others are nested)."""
    order = np.lexsort((-ends, starts))
    s, e = starts[order], ends[order]
    outer = np.ones(order.size, bool)
    if order.size:
        outer[1:] = np.maximum.accumulate(e)[:-1] <= s[1:]
    return order, outer


def contains(a: Intervals, t: np.ndarray) -> np.ndarray:
    """For each time in ``t``, whether normalised ``a`` holds it (``start <= t < end``)."""
    s, e = a
    if s.size == 0:
        return np.zeros(np.shape(t), dtype=bool)
    k = np.searchsorted(s, t, side="right") - 1
    out: np.ndarray = (k >= 0) & (t < e[np.maximum(k, 0)])
    return out


def measure_in(a: Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each window ``[lo[i], hi[i])``, the length of normalised ``a`` inside it."""
    s, e = a
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    if s.size == 0:
        return np.zeros(lo.shape, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(e - s)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        # intervals fully before t contribute their length; the one containing t contributes part
        k = np.searchsorted(s, t, side="right")  # intervals starting at or before t
        base = cum[np.maximum(k - 1, 0)]
        partial = np.where(k > 0, np.minimum(e[np.maximum(k - 1, 0)], t) - s[np.maximum(k - 1, 0)], 0)
        return np.where(k > 0, base + partial, 0)

    out: np.ndarray = np.maximum(covered_before(hi) - covered_before(lo), 0)
    return out


def weight_in_ranges(ts: np.ndarray, lanes: np.ndarray, weights: np.ndarray | None, starts: np.ndarray,
                     ends: np.ndarray, range_lanes: np.ndarray) -> np.ndarray:
    """Per range ``[starts[i], ends[i])`` on lane ``range_lanes[i]``: the sum of ``weights`` of the
    points (times ``ts`` on ``lanes``) inside it, or their count with ``weights`` None (int64).
    Ranges may nest or overlap; each is summed on its own."""
    out = np.zeros(starts.size, dtype=np.int64)
    if not starts.size or not ts.size:
        return out
    for ln in distinct(range_lanes).tolist():
        sel = lanes == ln
        if not sel.any():
            continue
        order = np.argsort(ts[sel], kind="stable")
        t = ts[sel][order]
        w = np.ones(t.size, np.int64) if weights is None else weights[sel][order]
        cs = np.concatenate([[0], np.cumsum(w, dtype=np.int64)])
        which = range_lanes == ln
        out[which] = cs[np.searchsorted(t, ends[which], "left")] - cs[np.searchsorted(t, starts[which], "left")]
    return out
