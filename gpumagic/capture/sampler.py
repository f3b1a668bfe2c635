"""A periodic sampler on a named daemon thread, recording columns of numbers.

Subclasses implement :meth:`PeriodicSampler.read`, which returns rows (dicts of field ->
value). Samples are taken at start, every ``interval_s`` on a fixed schedule (an overrun skips
ahead rather than bunching samples), and once more at stop, so even a short cell gets two.
A read that raises ends sampling and is kept as :attr:`error` for the report's notes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from gpumagic.errors import exception_text

#: Every gpumagic thread's name starts with this (the test fixtures look for it).
THREAD_PREFIX = "gpumagic-"
#: Fields whose value could not be read hold this (all sampled quantities are >= 0).
MISSING = -1


class PeriodicSampler:
    """Base class: call :meth:`start`, then :meth:`stop`; read :meth:`columns` afterwards."""

    name = "sampler"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.rows: list[dict[str, Any]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self, t_epoch_ns: int) -> list[dict[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def start(self) -> None:
        self._sample()
        self._thread = threading.Thread(target=self._loop, name=THREAD_PREFIX + self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and take a last sample. Safe to call more than once."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()

    def _loop(self) -> None:
        next_t = time.monotonic() + self.interval_s
        while self.error is None and not self._stop.wait(max(0.0, next_t - time.monotonic())):
            self._sample()
            now = time.monotonic()
            next_t += self.interval_s
            if next_t < now:  # the read overran one or more periods: skip ahead
                next_t = now + self.interval_s

    def _sample(self) -> None:
        if self.error is not None:
            return
        try:
            self.rows.extend(self.read(time.time_ns()))
        except Exception as exc:  # reported as a note by the capture, never raised into the cell
            self.error = f"{type(exc).__name__}: {exception_text(exc)}"

    def columns(self) -> dict[str, list]:
        """The rows as columns; a field absent from some rows is filled with :data:`MISSING`.
        A field that is missing in every row is dropped."""
        fields: list[str] = []
        for row in self.rows:
            fields.extend(k for k in row if k not in fields)
        cols = {f: [row.get(f, MISSING) for row in self.rows] for f in fields}
        return {f: v for f, v in cols.items() if f == "t_epoch_ns" or any(x != MISSING for x in v)}
