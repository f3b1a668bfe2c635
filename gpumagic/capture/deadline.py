"""Run a callback on the capturing thread once a time cap has passed, between two bytecodes.

The torch profiler can only be stopped from the thread that started it, and a cell without
optimizer steps offers no hook to do it from. A watchdog thread (``gpumagic-deadline``) waits
for the cap, then asks CPython to run the callback on the main thread at its next safe point
(``Py_AddPendingCall``, the mechanism behind Python-level signal handlers, without sending a
signal, so no system call of the cell is interrupted). The main thread runs it as soon as it
executes Python code again; a long C call delays it until it returns.

Where that is impossible (not CPython, or the capture runs off the main thread) the deadline
reports ``armed = False`` and the capture applies its cap when it finishes instead.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections.abc import Callable

#: Name of the watchdog thread; every gpumagic thread starts with ``gpumagic-``.
THREAD_NAME = "gpumagic-deadline"

_PENDING: dict[int, Callable[[], None]] = {}
_KEYS = itertools.count(1)
_CALLBACK_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


def _run_pending(key: int | None) -> int:
    callback = _PENDING.pop(key or 0, None)
    if callback is not None:
        callback()
    return 0  # never raise into the interpreter loop: the callback reports its own errors


#: Kept at module level: CPython calls it after the watchdog thread has gone.
_C_CALLBACK = _CALLBACK_TYPE(_run_pending)


def _add_pending_call():
    """``Py_AddPendingCall`` bound through ctypes, or None where it is not available."""
    api = getattr(ctypes, "pythonapi", None)
    fn = getattr(api, "Py_AddPendingCall", None) if api is not None else None
    if fn is None:
        return None
    fn.argtypes = [_CALLBACK_TYPE, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


class Deadline:
    """Calls ``callback`` on the main thread ``seconds`` after :meth:`start`, unless cancelled.

    The callback must not raise (exceptions from a pending call cannot reach the cell); it
    should record what went wrong instead.
    """

    def __init__(self, seconds: float, callback: Callable[[], None]) -> None:
        self.seconds = seconds
        self._callback = callback
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._key = next(_KEYS)
        self.fired = False

    @property
    def armed(self) -> bool:
        return self._thread is not None

    def start(self) -> bool:
        """Start the watchdog; False when a mid-cell stop is not possible here."""
        add = _add_pending_call()
        if add is None or threading.current_thread() is not threading.main_thread():
            return False
        self._thread = threading.Thread(target=self._wait, args=(add,), name=THREAD_NAME, daemon=True)
        self._thread.start()
        return True

    def cancel(self) -> None:
        """Stop the watchdog and drop a callback not yet run. Safe to call more than once."""
        with self._lock:
            self._cancel.set()
            _PENDING.pop(self._key, None)
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _wait(self, add) -> None:
        if self._cancel.wait(self.seconds):
            return
        with self._lock:
            if self._cancel.is_set():
                return
            _PENDING[self._key] = self._fire
            if add(_C_CALLBACK, self._key) != 0:  # the pending-call queue is full
                _PENDING.pop(self._key, None)

    def _fire(self) -> None:
        self.fired = True
        self._callback()
