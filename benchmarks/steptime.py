"""What the step benchmarks share (``checkpoint_cost``, ``worker_restarts``, ``contention``,
``optimizer_fused``, ``anomaly_mode``, ``loop_work``, ``op_overhead``, ``threads_speedup --loader``):
a loop's mean wall time per call, several loops timed in alternated rounds, and a loop's steps
recorded by gpumagic."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def mean_ms(call: Callable[[], object], times: int, warm: int = 1) -> float:
    """Mean wall-clock time (ms) of ``call()`` over ``times`` calls, after ``warm`` untimed ones."""
    for _ in range(warm):
        call()
    t = time.perf_counter()
    for _ in range(times):
        call()
    return (time.perf_counter() - t) / times * 1e3


def alternated(loops: dict[str, Callable[[], object]], rounds: int, times: int) -> dict[str, list[float]]:
    """Each loop's :func:`mean_ms` once a round, the loops alternated within each round (a machine
    that slows down slows them all), ``rounds`` times: name → the rounds' means (ms)."""
    got: dict[str, list[float]] = {k: [] for k in loops}
    for _ in range(rounds):
        for k, call in loops.items():
            got[k].append(mean_ms(call, times))
    return got


def medians(got: dict[str, list[float]]) -> tuple[dict[str, float], str]:
    """The medians of :func:`alternated`'s rounds, and a line that gives each with its range."""
    med = {k: statistics.median(v) for k, v in got.items()}
    return med, " · ".join(f"{k} {med[k]:.3f} ms a step [{min(v):.3f}-{max(v):.3f}]" for k, v in got.items())


def profile_steps(step: Callable[[], object], steps: int, path: str | None = None, warm: int = 3):
    """The report of ``gpumagic.profile(steps=steps)`` over ``step``: ``warm`` calls first, then
    ``steps + 2`` under the profiler (gpumagic skips the first, records ``steps``, and one more
    ends the last); the bundle saved to ``path`` when given."""
    import gpumagic

    for _ in range(warm):
        step()
    with gpumagic.profile(steps=steps, save=path, display=False) as run:
        for _ in range(steps + 2):
            step()
    return run.report
