"""Teardown that Ctrl-C cannot cut short: held interrupts, and named checkpoints for tests.

A capture's teardown (stop the profiler, join the sampler threads, remove the step hook, shut
NVML down) must complete whatever arrives when; otherwise the profiler stays on and every later
capture is refused until the kernel restarts. Two mechanisms serve that:

- :func:`interrupts_held` replaces the SIGINT handler for the duration of a block (main thread
  only, where Python runs signal handlers) with one that only remembers the signal; on leaving
  the block the previous handler is put back and, if a SIGINT arrived, called (IPython's and
  ipykernel's handler is ``signal.default_int_handler``, which raises ``KeyboardInterrupt``).
- :func:`checkpoint` marks named moments of the teardown. Tests set :data:`checkpoint_hook` to
  raise ``KeyboardInterrupt`` at one of them, which is how an interrupt landing there looks to
  the code, and check that the teardown still completes. In normal use the hook is None.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: Set by tests: called with each checkpoint's name; whatever it raises is raised there.
checkpoint_hook: Callable[[str], None] | None = None


def checkpoint(name: str) -> None:
    """A named moment of the teardown (see :data:`gpumagic.capture.session.CHECKPOINTS`)."""
    hook = checkpoint_hook
    if hook is not None:
        hook(name)


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold SIGINT until the block ends, then deliver it through the previous handler.

    Outside the main thread, or when SIGINT is ignored or left to the system default, the block
    runs unchanged (there is no Python handler to defer).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):
        yield
        return
    arrived: list[tuple[int, object]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: arrived.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if arrived:
            previous(*arrived[0])
