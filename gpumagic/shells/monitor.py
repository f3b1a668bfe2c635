"""``%gpumonitor`` and ``gpumagic.monitor()``: a live view of the GPUs, the CPU and this process.

::

    %gpumonitor                     # start (one sample a second) and show the live widget
    %gpumonitor --interval-ms 500   # start again with another period
    %gpumonitor stop                # end it
    mon = gpumagic.monitor(); mon.summary(); mon.stop()

Sampling runs on a daemon thread (:mod:`gpumagic.capture.monitor`) and updates the widget from
there, so other cells run as usual and the kernel never waits for the monitor. One monitor runs
at a time: starting another stops the first. It also stops when the process exits (kernel
shutdown or restart): IPython 8 has no shutdown hook any more (``IPython.core.hooks`` lists
``editor``, ``synchronize_with_editor``, ``show_in_pager``, ``pre_prompt_hook`` and
``clipboard_get``), and both IPython (``InteractiveShell.atexit_operations``) and ipykernel
(``Kernel._at_shutdown``) do their own clean-up from :mod:`atexit`, so the monitor registers
there too. Without a widget frontend (a terminal, ipywidgets missing, ``GPUMAGIC_WIDGETS=0``) it
says so and prints a one-line summary; ``%gpumonitor`` prints the latest one again.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from gpumagic.capture.monitor import DEFAULT_INTERVAL_MS, MAX_INTERVAL_MS, MIN_INTERVAL_MS, MonitorSampler

#: Redraws of the widget at most this often (s): a faster period adds samples, not redraws, since
#: a redraw costs ten times a sample (benchmarks/monitor_overhead.py).
REDRAW_S = 0.9
_lock = threading.Lock()
_current: Monitor | None = None
_atexit_registered = False


class Monitor:
    """A running monitor: :meth:`stop` ends it; in a notebook it displays as the live widget."""

    def __init__(self, interval_ms: int) -> None:
        from gpumagic.render.display import widgets_live

        self.interval_ms = interval_ms
        self.sampler = MonitorSampler(interval_ms / 1000)
        self._widgets: list[Any] = []
        self._drawn_at = -REDRAW_S
        self.live = widgets_live()

    @property
    def running(self) -> bool:
        return self.sampler.running

    def start(self) -> Monitor:
        self.sampler.on_sample = self._update
        self.sampler.start()
        return self

    def stop(self) -> None:
        """End sampling (the widget keeps its last picture). Safe to call more than once."""
        self.sampler.stop()
        self._update(self.sampler)

    def summary(self) -> str:
        """The latest values on one line."""
        from gpumagic.render.monitor import summary

        return summary(self.sampler.snapshot())

    def snapshot(self) -> dict[str, Any]:
        return self.sampler.snapshot()

    def widget(self):
        """A new live view (an ipywidgets ``HTML``) that every later sample updates."""
        from gpumagic.render.monitor import MonitorWidget

        view = MonitorWidget(self.sampler.snapshot())
        self._widgets.append(view)
        return view.root

    def _update(self, sampler: MonitorSampler) -> None:
        """Redraw the widgets: after a sample at most once per :data:`REDRAW_S`, and once at the end."""
        now = time.monotonic()
        if not self._widgets or (sampler.running and now - self._drawn_at < REDRAW_S):
            return
        self._drawn_at = now
        snapshot = sampler.snapshot()
        for view in list(self._widgets):
            view.update(snapshot)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, Any]:
        from gpumagic.render.monitor import render_html

        snapshot = self.sampler.snapshot()
        bundle: dict[str, Any] = {"text/plain": self.summary(), "text/html": render_html(snapshot)}
        if self.live:
            view = self.widget()._repr_mimebundle_()
            if "application/vnd.jupyter.widget-view+json" in view:
                bundle["application/vnd.jupyter.widget-view+json"] = view["application/vnd.jupyter.widget-view+json"]
        return bundle

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<gpumagic Monitor: {state}, every {self.interval_ms} ms>"


def monitor(interval_ms: int = DEFAULT_INTERVAL_MS, *, display: bool = True) -> Monitor:
    """Start the live monitor (stopping one already running) and, in a notebook, show it.

    ``interval_ms``: the sampling period ({MIN}..{MAX} ms). ``display=False``: start it without
    showing anything (display the returned object later).
    """
    if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or not MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS:
        raise ValueError(f"interval_ms must be a whole number of milliseconds from {MIN_INTERVAL_MS} to {MAX_INTERVAL_MS}, "
                         f"not {interval_ms!r}")
    global _current
    with _lock:
        old, _current = _current, None
        if old is not None:
            old.stop()
        mon = Monitor(interval_ms).start()
        _current = mon
        _register_atexit()
    if display:
        show(mon)
    return mon


monitor.__doc__ = monitor.__doc__.format(MIN=MIN_INTERVAL_MS, MAX=MAX_INTERVAL_MS)


def show(mon: Monitor) -> None:
    """The widget in a live notebook; elsewhere a sentence saying why not, and the summary line."""
    if mon.live:
        from IPython.display import display

        display(mon)
    else:
        print("gpumagic: no widget frontend here (not a Jupyter kernel with ipywidgets, or GPUMAGIC_WIDGETS=0), so no live view; "
              "the monitor samples in the background: `%gpumonitor` prints the latest values, `%gpumonitor stop` ends it.")
        print(mon.summary())


def stop() -> bool:
    """Stop the running monitor; False when none was running."""
    global _current
    with _lock:
        mon, _current = _current, None
    if mon is None:
        return False
    mon.stop()
    return True


def current() -> Monitor | None:
    return _current


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(stop)
        _atexit_registered = True


@magics_class
class MonitorMagics(Magics):
    """Holds ``%gpumonitor``."""

    @line_magic
    def gpumonitor(self, line: str = "") -> None:
        """``%gpumonitor [--interval-ms MS]`` starts the live monitor (default 1000 ms);
        ``%gpumonitor stop`` ends it. Run again while it runs: shows it again."""
        words = line.split()
        if words == ["stop"]:
            if not stop():
                print("gpumagic: no monitor is running")
            return
        interval_ms = _parse_interval(words)
        mon = _current
        if mon is not None and mon.running and (interval_ms is None or interval_ms == mon.interval_ms):
            show(mon)
            return
        try:
            monitor(interval_ms or DEFAULT_INTERVAL_MS)
        except ValueError as exc:
            raise UsageError(f"%gpumonitor: {exc}") from None


def _parse_interval(words: list[str]) -> int | None:
    usage = "%gpumonitor [--interval-ms MS] | %gpumonitor stop"
    if not words:
        return None
    if len(words) == 1 and words[0].startswith("--interval-ms="):
        words = ["--interval-ms", words[0].split("=", 1)[1]]
    if len(words) != 2 or words[0] != "--interval-ms":
        raise UsageError(f"%gpumonitor: unexpected {' '.join(words)!r}; usage: {usage}")
    # ASCII digits only: str.isdigit() also accepts "²", which int() then refuses
    if not (words[1].isascii() and words[1].isdigit()) or not MIN_INTERVAL_MS <= int(words[1]) <= MAX_INTERVAL_MS:
        raise UsageError(f"%gpumonitor: --interval-ms needs a whole number of milliseconds from {MIN_INTERVAL_MS} "
                         f"to {MAX_INTERVAL_MS}, not {words[1]!r}")
    return int(words[1])
