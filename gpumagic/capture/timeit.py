"""What ``%gputimeit`` measures: a statement's time on the device it runs on, with an interval.

Python's and IPython's ``timeit`` read the host's clock around a call. On a GPU that times the
*launch*: CUDA kernels run asynchronously, so the call returns as soon as its work is queued
(CUDA C++ Programming Guide, "Asynchronous Concurrent Execution"); CuPy's documentation on
benchmarking says the same and offers ``cupyx.profiler.benchmark`` instead. Here, once the
statement uses CUDA, each repetition is bracketed by ``torch.cuda.synchronize()`` (so earlier
work is not counted and the repetition's own work is) and timed with a pair of CUDA events
recorded on the current stream (``torch.cuda.Event(enable_timing=True)``; their resolution is
about half a microsecond, CUDA Runtime API, ``cudaEventElapsedTime``). On the CPU the wall
clock (``time.perf_counter``) is the right one.

The run: warm-up calls first (timed on their own: the first call pays for CUDA context creation,
library handles, ``torch.compile``, autotuning), then repetitions until the 95 % interval of the
median is tight (at most :data:`gpumagic.tuning.stats.TIGHT_WIDTH` of the median wide) or the
time budget is spent. The interval is the percentile bootstrap of the comparisons
(:mod:`gpumagic.tuning.stats`), and ``--compare`` times two statements interleaved, alternating
their order each round so that a drift in the machine's speed falls on both alike, with the same
verdict rule as ``gpumagic compare`` (a change needs an interval that excludes 1 *and* at least
:data:`gpumagic.tuning.stats.MIN_CHANGE`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpumagic.tuning import stats

#: The time budget when none is given (s): warm-up, calibration and repetitions together.
DEFAULT_MAX_SECONDS = 5.0
#: Warm-up calls before anything is timed as a sample.
DEFAULT_WARMUP = 1
#: A repetition runs the statement enough times to last at least this long (s), so that the
#: timer's resolution and the loop's own cost (a fraction of a microsecond) stay below 0.1 %.
MIN_REPETITION_S = 1e-3
#: At most this many calls per repetition (a statement that takes nanoseconds).
MAX_NUMBER = 10**6
#: At most this many repetitions: the bootstrap of 2,000 medians of 2,000 samples takes about
#: 0.2 s, and more samples narrow an interval only as 1/sqrt(n).
MAX_REPETITIONS = 2000
#: The interval is checked after 5 samples, then each time the count has grown by a quarter
#: (the bootstrap's cost stays a small share of the run).
CHECK_GROWTH = 1.25
DEVICES = ("auto", "cpu", "cuda")


class WallClock:
    """The host's clock: right for code that runs on the CPU."""

    device = "cpu"

    def time(self, fn: Callable[[], Any], number: int) -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return time.perf_counter() - t0

    def settle(self) -> None:
        """Nothing to wait for on the CPU."""


class CudaEventClock:
    """CUDA events on the current stream, with a synchronise before and after each repetition.
    ``cuda`` is ``torch.cuda`` (a stand-in in tests)."""

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda
        self.device = f"cuda:{cuda.current_device()}"
        self._start = cuda.Event(enable_timing=True)
        self._end = cuda.Event(enable_timing=True)

    def time(self, fn: Callable[[], Any], number: int) -> float:
        self.cuda.synchronize()  # work queued before the repetition is not its time
        self._start.record()
        for _ in range(number):
            fn()
        self._end.record()
        self.cuda.synchronize()  # the repetition's work has finished: both events have times
        return float(self._start.elapsed_time(self._end)) / 1000.0  # ms -> s

    def settle(self) -> None:
        self.cuda.synchronize()


def cuda_in_use(torch: Any = None) -> bool:
    """Whether this process has started CUDA (torch imported and its CUDA initialised). torch is
    never imported here: a statement that does not use it is timed on the wall clock."""
    torch = torch if torch is not None else sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # a torch without a usable CUDA runtime
        return False


def choose_clock(device: str = "auto", torch: Any = None) -> WallClock | CudaEventClock:
    """The clock for ``device``: ``"cuda"`` (CUDA events; ValueError without CUDA), ``"cpu"``
    (wall clock), or ``"auto"`` (CUDA events once the process uses CUDA, else the wall clock)."""
    if device not in DEVICES:
        raise ValueError(f"the device is one of {', '.join(DEVICES)}, not {device!r}")
    if device == "cpu":
        return WallClock()
    torch = torch if torch is not None else sys.modules.get("torch")
    if device == "cuda":
        if torch is None:
            import torch  # asked for by name: worth the import
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")
        return CudaEventClock(torch.cuda)
    return CudaEventClock(torch.cuda) if cuda_in_use(torch) else WallClock()


def fmt_seconds(s: float | None) -> str:
    """``'1.23 ms'``, ``'845 ns'``, ``'2.50 s'``: three significant digits in the unit that fits."""
    if s is None:
        return "—"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


@dataclass(frozen=True)
class TimeitResult:
    """One statement's timing (``-o NAME`` stores it). Times are per call, in seconds.

    ``median_s`` of ``samples_s`` (one per repetition, each the repetition's time ÷ ``number``),
    ``ci_s`` its 95 % interval (None with fewer than 5 samples), ``warmup_s`` the warm-up calls'
    own times, ``device`` ``'cpu'`` (wall clock) or ``'cuda:N'`` (CUDA events), ``stopped`` why
    the repetitions ended (``'tight'``, ``'budget'`` or ``'repetitions'``), and ``comparison``
    the ``--compare`` verdict."""

    statement: str
    device: str
    median_s: float | None
    ci_s: tuple[float, float] | None
    samples_s: tuple[float, ...]
    warmup_s: tuple[float, ...]
    number: int
    stopped: str
    comparison: TimeitComparison | None = field(default=None, compare=False)

    @property
    def p10_s(self) -> float | None:
        return _quantile(self.samples_s, 0.1)

    @property
    def p90_s(self) -> float | None:
        return _quantile(self.samples_s, 0.9)

    def line(self, name: str = "") -> str:
        """One line: median, interval, spread, how many samples and why they stopped."""
        head = f"{name}: " if name else ""
        if self.ci_s is None:
            ci = "too few repetitions for an interval"
        else:
            ci = f"95 % interval {fmt_seconds(self.ci_s[0])}–{fmt_seconds(self.ci_s[1])}"
        loops = f" × {self.number} calls" if self.number > 1 else ""
        why = {"tight": "interval tight", "budget": "time budget spent",
               "repetitions": f"{MAX_REPETITIONS} repetitions"}.get(self.stopped, self.stopped)
        return (f"{head}{fmt_seconds(self.median_s)} per call on {self.device} (median; {ci}; "
                f"p10–p90 {fmt_seconds(self.p10_s)}–{fmt_seconds(self.p90_s)}; "
                f"{len(self.samples_s)} repetitions{loops}, {why})")

    def warmup_line(self, name: str = "") -> str:
        head = f"{name} " if name else ""
        if not self.warmup_s:
            return f"{head}warm-up: none"
        runs = ", ".join(fmt_seconds(w) for w in self.warmup_s)
        return f"{head}warm-up: {runs} (not in the samples)"

    def to_text(self) -> str:
        if self.comparison is None:
            return f"{self.line()}\n{self.warmup_line()}"
        c = self.comparison
        return "\n".join([f"A  {_short(self.statement)}", f"B  {_short(c.other.statement)}", self.line("A"),
                          c.other.line("B"), self.warmup_line("A"), c.other.warmup_line("B"), c.sentence()])

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())


@dataclass(frozen=True)
class TimeitComparison:
    """A (the result holding this) against B (``other``), timed interleaved. ``speedup`` is
    B's median ÷ A's (above 1: A is faster) with its 95 % bootstrap ``interval``; ``verdict``
    is ``'faster'``, ``'slower'`` or ``'no clear change'`` (:func:`gpumagic.tuning.stats.change_of`)."""

    other: TimeitResult
    speedup: float | None
    interval: tuple[float, float] | None
    verdict: str

    def sentence(self) -> str:
        """``'A is 1.4× faster than B (1.3–1.5×)'`` or ``'no clear difference between A and B …'``."""
        if self.speedup is None:
            return "no comparison: a statement has no samples"
        if self.interval is None:
            return (f"no clear difference between A and B (too few repetitions for an interval; "
                    f"B ÷ A {self.speedup:.2f}×)")
        if self.verdict == stats.NO_CLEAR_CHANGE:
            d = max(stats.decimals_for(self.interval), 2)  # a wide interval still shows its ratio
            lo, hi = self.interval
            return (f"no clear difference between A and B (B ÷ A {self.speedup:.{d}f}×, "
                    f"95 % interval {lo:.{d}f}–{hi:.{d}f}×)")
        head, _, span = stats.fmt_speedup(self.speedup, self.interval).partition(" (")
        return f"A is {head} than B ({span}"


def _short(statement: str, width: int = 70) -> str:
    text = " ".join(statement.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _quantile(xs: tuple[float, ...], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


class _Side:
    """One statement being timed."""

    def __init__(self, statement: str, fn: Callable[[], Any]) -> None:
        self.statement, self.fn = statement, fn
        self.warmup: list[float] = []
        self.samples: list[float] = []
        self.number = 1

    def result(self, device: str, stopped: str, comparison: TimeitComparison | None = None) -> TimeitResult:
        median = stats.median_of(self.samples)
        return TimeitResult(statement=self.statement, device=device, median_s=median,
                            ci_s=stats.median_interval(self.samples), samples_s=tuple(self.samples),
                            warmup_s=tuple(self.warmup), number=self.number, stopped=stopped, comparison=comparison)


def _warm_up(side: _Side, runs: int, torch: Any) -> None:
    """``runs`` calls, each timed on the wall clock and, once CUDA is in use, to the end of its GPU
    work (a synchronise before and after)."""
    for _ in range(runs):
        cuda = cuda_in_use(torch)
        if cuda:
            (torch or sys.modules["torch"]).cuda.synchronize()
        t0 = time.perf_counter()
        side.fn()
        if cuda or cuda_in_use(torch):
            (torch or sys.modules["torch"]).cuda.synchronize()
        side.warmup.append(time.perf_counter() - t0)


#: Each calibration step times this many repetitions and keeps the shortest: one repetition
#: slowed by another process would otherwise pick too few calls (and two statements compared
#: would get repetitions of different lengths, which a busy machine slows differently).
CALIBRATION_TRIES = 3


def _calibrate(side: _Side, clock: WallClock | CudaEventClock) -> None:
    """Calls per repetition: 1, 10, 100, … until a repetition lasts :data:`MIN_REPETITION_S`
    (the shortest of :data:`CALIBRATION_TRIES`)."""
    number = 1
    while number < MAX_NUMBER:
        t = clock.time(side.fn, number)
        if t >= MIN_REPETITION_S:  # a second and third try only where they can change the answer
            t = min([t] + [clock.time(side.fn, number) for _ in range(CALIBRATION_TRIES - 1)])
        if t >= MIN_REPETITION_S:
            break
        number *= 10
    side.number = number


def measure(statement: str, fn: Callable[[], Any], *, max_seconds: float = DEFAULT_MAX_SECONDS,
            warmup: int = DEFAULT_WARMUP, device: str = "auto", other: tuple[str, Callable[[], Any]] | None = None,
            torch: Any = None, clock: WallClock | CudaEventClock | None = None) -> TimeitResult:
    """Time ``fn`` (the compiled ``statement``); with ``other`` (a second statement and its
    function), time both interleaved and compare them. ``torch`` and ``clock`` are injectable for
    tests. What ``fn`` raises propagates (the statement's own error)."""
    if not max_seconds > 0:
        raise ValueError(f"--max-seconds must be positive, not {max_seconds:g}")
    if warmup < 0:
        raise ValueError(f"--warmup must be 0 or more, not {warmup}")
    started = time.perf_counter()
    sides = [_Side(statement, fn)] + ([_Side(*other)] if other is not None else [])
    for side in sides:
        _warm_up(side, warmup, torch)
    chosen = clock or choose_clock(device, torch)  # after the warm-up, which is when CUDA starts
    for side in sides:
        _calibrate(side, chosen)
    if clock is None and device == "auto" and isinstance(chosen, WallClock) and cuda_in_use(torch):
        chosen = choose_clock(device, torch)  # without warm-up, CUDA started during the calibration
        for side in sides:
            _calibrate(side, chosen)
    clock = chosen
    stopped = _repeat(sides, clock, started + max_seconds)
    if len(sides) == 1:
        return sides[0].result(clock.device, stopped)
    a, b = sides
    b_result = b.result(clock.device, stopped)
    speedup = stats.speedup_point(b.samples, a.samples)
    interval = stats.speedup_interval(b.samples, a.samples)
    comparison = TimeitComparison(other=b_result, speedup=speedup, interval=interval,
                                  verdict=stats.change_of(speedup, interval))
    return a.result(clock.device, stopped, comparison)


def _repeat(sides: list[_Side], clock: WallClock | CudaEventClock, deadline: float) -> str:
    """Repetitions (interleaved, their order alternating each round) until tight, the deadline or
    :data:`MAX_REPETITIONS`; returns why they stopped."""
    check_at = stats.MIN_STEPS
    rounds = 0
    while True:
        order = sides if rounds % 2 == 0 else sides[::-1]
        for side in order:
            side.samples.append(clock.time(side.fn, side.number) / side.number)
        rounds += 1
        if rounds >= check_at:
            if _tight(sides):
                return "tight"
            check_at = max(rounds + 1, int(rounds * CHECK_GROWTH))
        if rounds >= MAX_REPETITIONS:
            return "repetitions"
        if time.perf_counter() >= deadline:
            return "budget"


def _tight(sides: list[_Side]) -> bool:
    if len(sides) == 1:
        s = sides[0].samples
        return stats.is_tight(stats.median_of(s), stats.median_interval(s))
    a, b = sides
    return stats.is_tight(stats.speedup_point(b.samples, a.samples), stats.speedup_interval(b.samples, a.samples))
