"""How sure a speed-up is: a bootstrap interval of the ratio of two median step times, and
the verdict it supports.

``speedup`` is the median step *before* divided by the median step *after* (above 1: faster).
Its 95 % interval comes from a percentile bootstrap over steps (Efron & Tibshirani, *An
Introduction to the Bootstrap*, 1993, ch. 13): each run's steps are resampled with replacement
:data:`RESAMPLES` times, independently, and the 2.5th and 97.5th percentiles of the resampled
ratios bound the interval. The generator is seeded (:data:`SEED`), so the same steps always
give the same interval.

What the interval does not cover: steps of one run are not independent draws (a neighbour that
starts half-way through slows every later step), so it says how well *these* runs pin down their
medians, not how a rerun under other conditions would go — the comparison's ``conditions`` say
what else differed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: Resamples of the bootstrap: the 2.5th percentile of 2,000 resamples moves by well under 1 %
#: between seeds for the step counts a profile records (Efron & Tibshirani recommend 1,000-2,000
#: for percentile intervals).
RESAMPLES = 2000
SEED = 20261201
#: Fewer steps than this in either run give no interval: the median of 4 or fewer steps takes
#: only a handful of distinct values under resampling, so its percentiles mean little.
MIN_STEPS = 5
#: A change whose point estimate is within 3 % of no change is "no clear change" even when the
#: interval excludes 1: the run-to-run jitter of a training loop on a quiet machine is a few
#: percent (see ``comparison.SAME_STEP_TOLERANCE``), which two runs' own steps do not show.
MIN_CHANGE = 0.03
#: The three verdicts.
FASTER, SLOWER, NO_CLEAR_CHANGE = "faster", "slower", "no clear change"


def _medians(samples: np.ndarray) -> np.ndarray:
    """Median of each row (np.median imports numpy.ma on first use; a sort does not)."""
    s = np.sort(samples, axis=1)
    n = s.shape[1]
    return s[:, n // 2] if n % 2 else (s[:, n // 2 - 1] + s[:, n // 2]) / 2


def _median(x: np.ndarray) -> float:
    return float(_medians(x.reshape(1, -1))[0])


def clean(steps: Sequence[float] | None) -> np.ndarray:
    """The positive, finite step durations of ``steps``."""
    x = np.asarray([s for s in (() if steps is None else steps) if s is not None], dtype=np.float64)
    return x[np.isfinite(x) & (x > 0)]


def speedup_interval(before: Sequence[float], after: Sequence[float], *, level: float = 0.95,
                     resamples: int = RESAMPLES, seed: int = SEED, statistic: str = "median") -> tuple[float, float] | None:
    """The ``level`` percentile-bootstrap interval of median(before) / median(after), or None
    with fewer than :data:`MIN_STEPS` steps on either side. ``statistic="mean"`` compares means
    instead: the right one for throughput, where batches from workers arrive in bursts (the
    mean batch time is the inverse of the rate; the median of a bursty series is not)."""
    a, b = clean(before), clean(after)
    if a.size < MIN_STEPS or b.size < MIN_STEPS:
        return None
    rng = np.random.default_rng(seed)
    centre = _medians if statistic == "median" else (lambda x: x.mean(axis=1))
    ma = centre(a[rng.integers(0, a.size, size=(resamples, a.size))])
    mb = centre(b[rng.integers(0, b.size, size=(resamples, b.size))])
    ratios = np.sort(ma / mb)
    tail = (1 - level) / 2
    lo = ratios[math.floor(tail * (resamples - 1))]
    hi = ratios[math.ceil((1 - tail) * (resamples - 1))]
    return float(lo), float(hi)


def speedup_point(before: Sequence[float], after: Sequence[float]) -> float | None:
    a, b = clean(before), clean(after)
    if not a.size or not b.size:
        return None
    return _median(a) / _median(b)


def speedup_of(ratio: float) -> float:
    """The speed-up of a step-time ratio (after ÷ before), to the 4 significant digits
    ``Comparison.speedup`` and the interval hold: every view prints this one number (rounding
    the raw ratio and a rounded copy separately once showed 2.59× beside 2.58×)."""
    return float(f"{1 / ratio:.4g}")


def change_of(speedup: float | None, interval: tuple[float, float] | None, min_change: float = MIN_CHANGE) -> str:
    """"faster" when the whole interval lies above 1 (and the speed-up exceeds ``min_change``),
    "slower" when it lies below 1 (likewise), else "no clear change" (also without an interval)."""
    if speedup is None or interval is None:
        return NO_CLEAR_CHANGE
    lo, hi = interval
    if lo > 1 and speedup >= 1 + min_change:
        return FASTER
    if hi < 1 and 1 / speedup >= 1 + min_change:
        return SLOWER
    return NO_CLEAR_CHANGE


def decimals_for(interval: tuple[float, float] | None, most: int = 2) -> int:
    """Decimals that the interval supports: the first decimal place whose unit is no more than
    half the interval's width (0.4 wide: 1 decimal; 0.04 wide: 2), at most ``most``."""
    if interval is None:
        return most
    width = abs(interval[1] - interval[0])
    if width <= 0:
        return most
    return int(max(0, min(most, math.ceil(-math.log10(width / 2)))))


def speedup_decimals(speedup: float, interval: tuple[float, float] | None) -> int:
    """Decimals to print a speed-up (or slow-down) with: what its interval supports, and enough
    that a bound of an interval that excludes no change does not print as 1."""
    if interval is None:
        return 2
    bounds = (1 / interval[1], 1 / interval[0]) if speedup < 1 else interval
    d = decimals_for(bounds)
    while change_of(speedup, interval) != NO_CLEAR_CHANGE and d < 2 and round(bounds[0], d) <= 1:
        d += 1  # a bound printed as 1.0 would read as "maybe no change" where the interval excludes it
    return d


def _first_digit(x: float) -> int:
    """Decimals that show the first significant digit of ``0 < x < 1`` (0.38: 1; 0.05: 2); 0 from 1 up."""
    return 0 if not 0 < x < 1 else -math.floor(math.log10(x))


def fmt_speedup(speedup: float | None, interval: tuple[float, float] | None) -> str:
    """``'1.4× faster (1.2–1.6×)'``, ``'1.40× slower (1.38–1.42×)'``, ``'1.0× (no clear change,
    0.9–1.1×)'``; slower figures are after ÷ before. Without an interval: two decimals and
    "(too few steps for an interval)"."""
    if speedup is None or not speedup > 0:
        return "—"
    lo, hi = interval if interval is not None else (None, None)
    slower = speedup < 1
    value = 1 / speedup if slower else speedup
    bounds = None if lo is None else ((1 / hi, 1 / lo) if slower else (lo, hi))
    d = speedup_decimals(speedup, interval)
    change = change_of(speedup, interval)
    word = "slower" if slower else "faster"
    if bounds is None:
        return f"{value:.2f}\u00d7 {word} (too few steps for an interval)"
    span = f"{bounds[0]:.{d}f}\u2013{bounds[1]:.{d}f}\u00d7"
    if change == NO_CLEAR_CHANGE:
        # a wide interval below 1 keeps a significant digit: "0.4× speed, 0.1–1.1×", not "0× speed, 0–1×"
        d = max(d, min(2, max(_first_digit(speedup), _first_digit(lo))))
        return f"no clear change ({speedup:.{d}f}\u00d7 speed, 95 % interval {lo:.{d}f}\u2013{hi:.{d}f}\u00d7)"
    return f"{value:.{d}f}\u00d7 {word} ({span})"


def spread(steps: Sequence[float] | None) -> dict[str, float | int | None]:
    """A run's step spread: ``count``, ``median_ms``, ``p10_ms``, ``p90_ms`` and ``mad_frac``
    (median absolute deviation ÷ median)."""
    x = clean(steps)
    if not x.size:
        return {"count": 0, "median_ms": None, "p10_ms": None, "p90_ms": None, "mad_frac": None}
    med = _median(x)
    s = np.sort(x)
    return {"count": int(x.size), "median_ms": round(med, 4),
            "p10_ms": round(float(np.interp(0.1 * (x.size - 1), np.arange(x.size), s)), 4),
            "p90_ms": round(float(np.interp(0.9 * (x.size - 1), np.arange(x.size), s)), 4),
            "mad_frac": round(_median(np.abs(x - med)) / med, 4) if med > 0 else None}


#: A ``%gputimeit`` measurement is tight once its 95 % interval is at most this wide relative to
#: its centre: narrow enough to tell apart the smallest change the comparisons call a change
#: (:data:`MIN_CHANGE`).
TIGHT_WIDTH = MIN_CHANGE


def median_interval(samples: Sequence[float], *, level: float = 0.95, resamples: int = RESAMPLES,
                    seed: int = SEED) -> tuple[float, float] | None:
    """The ``level`` percentile-bootstrap interval of the median of ``samples`` (the same
    bootstrap as :func:`speedup_interval`), or None with fewer than :data:`MIN_STEPS` samples."""
    x = clean(samples)
    if x.size < MIN_STEPS:
        return None
    rng = np.random.default_rng(seed)
    meds = np.sort(_medians(x[rng.integers(0, x.size, size=(resamples, x.size))]))
    tail = (1 - level) / 2
    return float(meds[math.floor(tail * (resamples - 1))]), float(meds[math.ceil((1 - tail) * (resamples - 1))])


def median_of(samples: Sequence[float]) -> float | None:
    """The median of the positive, finite values of ``samples`` (None when there are none)."""
    x = clean(samples)
    return _median(x) if x.size else None


def is_tight(centre: float | None, interval: tuple[float, float] | None, width: float = TIGHT_WIDTH) -> bool:
    """Whether ``interval`` is at most ``width`` wide relative to ``centre``."""
    return bool(centre and interval is not None and (interval[1] - interval[0]) / centre <= width)
