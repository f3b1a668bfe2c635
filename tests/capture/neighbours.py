"""Busy neighbours for the shared-machine tests: CPU-bound processes a test starts and always stops."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

#: Each neighbour spins in pure Python for at most this long, so that even a test killed before
#: its ``finally`` leaves nothing running for more than a minute.
MAX_LIFE_S = 60
SPIN = f"import time\nend = time.monotonic() + {MAX_LIFE_S}\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def busy_neighbours(n: int, settle_s: float = 0.3) -> Iterator[list[subprocess.Popen]]:
    """``n`` spinning processes for the duration of the block; killed (and reaped) on the way out."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(settle_s)  # let them get onto the cores before the measurement starts
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=10)
