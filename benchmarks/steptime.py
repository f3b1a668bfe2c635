"""The timing the step benchmarks share (``checkpoint_cost``, ``worker_restarts``, ``contention``,
``optimizer_fused``, ``anomaly_mode``): a loop's mean wall time per call."""

from __future__ import annotations

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
