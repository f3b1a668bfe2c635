"""Small numpy helpers shared by the trace and analysis layers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


def distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values, like ``np.unique(values)``.

    Plain ``np.unique`` imports ``numpy.ma`` on first use (tens of milliseconds, paid by every
    ``gpumagic analyze`` process); a sort and a comparison give the same answer without it.
    """
    s = np.sort(np.asarray(values).ravel())
    if s.size == 0:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def percentile(values: np.ndarray, q: float) -> float:
    """The ``q``-th percentile with linear interpolation (numpy's default method).

    ``np.median``/``np.percentile`` also import ``numpy.ma`` on first use; this does not.
    """
    s = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if s.size == 0:
        raise ValueError("percentile of an empty array")
    pos = (s.size - 1) * q / 100.0
    lo = int(np.floor(pos))
    hi = min(lo + 1, s.size - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def median(values: np.ndarray) -> float:
    return percentile(values, 50.0)


def median_of(values) -> float:
    """``float(np.median(values))``, the same number (numpy's own mean of the middle one or two
    values of the sorted data; NaN when there are none, or when one is NaN), without the
    ``numpy.ma`` import ``np.median`` makes on first use. :func:`median` interpolates instead,
    which can differ from numpy's in the last bit."""
    s = np.sort(np.asarray(values).ravel())
    n = s.size
    if n == 0 or (s.dtype.kind in "fc" and np.isnan(s[-1])):
        return float("nan")
    return float(np.mean(s[(n - 1) // 2:n // 2 + 1]))


def in_threads(fn: Callable[[Any], T], items: Sequence[Any], threads: int) -> list[T]:
    """``[fn(x) for x in items]``, on up to ``threads`` threads when that is more than one. Worth
    it for work that releases the GIL: numpy's gathers, scatters and element-wise loops over
    large arrays of numbers (and the page faults of the fresh memory they fill). The threads
    have ended when this returns (a fork afterwards copies no other thread); the first error
    raised by ``fn`` is raised here."""
    if threads < 2 or len(items) < 2:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="gpumagic") as pool:
        return list(pool.map(fn, items))
