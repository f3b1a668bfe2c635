"""The Python API: profile code from scripts and notebooks without the magic.

::

    with gpumagic.profile(steps=3) as run:      # also a decorator: @gpumagic.profile()
        train()
    run.report, run.trace, run.save("run.json.gz")

    prof = gpumagic.Profiler(label="baseline")  # across notebook cells
    prof.start()   # ... later cells ...
    run = prof.stop()

Outside a notebook nothing is displayed unless ``display=True``; in a notebook the report is
displayed when the run finishes unless ``display=False``. A run with a ``label`` that completes
goes into the run history (``gpumagic runs``, ``gpumagic.history()``).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from gpumagic.capture import CaptureError, CaptureOptions, CaptureSession, Run
from gpumagic.capture.session import finish_after
from gpumagic.errors import exception_text

F = TypeVar("F", bound=Callable[..., Any])


class Profiler:
    """A capture you start and stop yourself; the keyword options are those of :func:`profile`."""

    def __init__(self, *, display: bool | None = None, **options: Any) -> None:
        self.options = _options(options)
        self.display = display
        #: Whether a labelled run goes into the run history when it completes (see :func:`record_run`).
        self.record = True
        self.run: Run | None = None
        self._session: CaptureSession | None = None

    @property
    def is_running(self) -> bool:
        return self._session is not None

    def start(self) -> Run:
        """Start recording; returns the :class:`~gpumagic.capture.Run` that :meth:`stop` completes."""
        if self._session is not None:
            raise CaptureError("this Profiler is already running")
        session = CaptureSession(self.options)
        self.run = session.start()
        self._session = session
        return self.run

    def stop(self, error: BaseException | None = None) -> Run:
        """Stop recording, build the report (displayed in a notebook), and return the run.

        ``error`` is an exception the profiled code raised: the report is then partial, and a
        failure to build it is reported on stderr instead of raised.
        """
        if self._session is None:
            raise CaptureError("this Profiler is not running: call start() first")
        session, self._session = self._session, None
        run = finish_after(session, error)
        if run.analysis_warning:
            print(f"gpumagic: warning: {run.analysis_warning}", file=sys.stderr)
        if run.report is not None and error is None and self.options.label and self.record and not run.taken_over:
            record_run(run, source="api")
        if run.report is not None and _wants_display(self.display):
            _display(run.report)
        return run

    def __enter__(self) -> Run:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(exc)


class profile:
    """Profile a block (``with profile() as run:``) or each call of a function (decorator).

    Options: ``label``, ``skip`` (optimizer steps left out as warm-up, default 1), ``steps``
    (steps recorded, default 5), ``all_steps`` (record everything), ``max_seconds`` (cap while
    no optimizer step has run, default 5), ``interval_ms`` (NVML/CPU sampling, default 100),
    ``nvml``, ``cpu`` (the samplers), ``shapes``, ``flops`` (FLOP counts, shapes too), ``stack``, ``memory``
    (allocations and memory by category; shapes and stacks too), ``loader_stages`` (time the
    DataLoader's stages, default True), ``batch_size`` (for the ``out-of-memory`` finding's
    largest-batch estimate and ``metrics.gpu.energy_j_per_sample``), ``accumulation_steps``
    (batches per optimizer step, default 1, for the energy per sample), ``modules`` (time per ``nn.Module``: ``metrics.modules``; slows module
    calls), ``save`` (bundle path),
    ``display`` (None: only in a notebook).
    A decorated function keeps its return value; its latest run is ``func.last_run``.
    """

    def __init__(self, *, display: bool | None = None, **options: Any) -> None:
        self._display = display
        self._options = _options(options)
        self._profiler: Profiler | None = None

    def _new_profiler(self) -> Profiler:
        profiler = Profiler(display=self._display)
        profiler.options = self._options
        return profiler

    def __enter__(self) -> Run:
        if self._profiler is not None:
            raise CaptureError("this profile() block is already running")
        self._profiler = self._new_profiler()
        return self._profiler.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        profiler, self._profiler = self._profiler, None
        profiler.stop(exc)

    def __call__(self, func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            profiler = self._new_profiler()
            wrapper.last_run = profiler.start()
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                profiler.stop(exc)
                raise
            profiler.stop()
            return result

        wrapper.last_run = None
        return wrapper  # type: ignore[return-value]


def record_run(run: Run, *, source: str, report: Any = None, warn: bool = True) -> str | None:
    """Put a completed run into the run history (:mod:`gpumagic.tuning.runs`); returns None, or
    why the run was not stored.

    Stored: the report (``report`` when given, else the run's), the capture options, the
    notebook's name when the frontend exposes it, the ``--save`` bundle's path. Recording comes
    after the profiled code ran, so nothing that fails here may cost the run its report: a
    history that cannot be written (unreadable, locked, a full disk, the working folder removed)
    or anything else that goes wrong is one warning (``warn=False``: only the returned reason)
    and the report is still shown.
    """
    import warnings
    from dataclasses import asdict

    from gpumagic.tuning import runs
    from gpumagic.tuning.regression import regression, regression_note

    report = run.report if report is None else report
    try:
        found = regression(report, run.options.label)
        if found is not None:
            report.regression = found
            report.notes.insert(0, regression_note(found))
        runs.record(report, label=run.options.label, source=source, options=asdict(run.options),
                    notebook=notebook_name(), bundle=run.saved_to)
    except Exception as exc:  # after the code ran: never lose its report over the history
        reason = exception_text(exc) if isinstance(exc, runs.HistoryError) else f"{type(exc).__name__}: {exception_text(exc)}"
        if warn:
            warnings.warn(f"gpumagic: this run was not stored in the run history: {reason}", RuntimeWarning, stacklevel=2)
        return reason
    return None


def notebook_name() -> str:
    """The notebook's path when the frontend tells the kernel, else "".

    Jupyter Server (2.0+) starts kernels with ``JPY_SESSION_NAME`` set to the notebook's path
    (jupyter-server/jupyter_server#679); VS Code puts ``__vsc_ipynb_file__`` in the namespace.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    vscode = getattr(shell, "user_ns", {}).get("__vsc_ipynb_file__") if shell is not None else None
    if isinstance(vscode, str) and vscode:
        return vscode
    return os.environ.get("JPY_SESSION_NAME", "") if shell is not None else ""


def _options(options: dict[str, Any]) -> CaptureOptions:
    save = options.get("save")
    if isinstance(save, (str, os.PathLike)) and str(save).strip():  # the bundle never replaces the run history
        from gpumagic._atomic import WriteError, refuse_inputs
        from gpumagic.capture.errors import OptionsError
        from gpumagic.tuning.history import kept_files

        try:
            refuse_inputs(save, kept_files())
        except WriteError as exc:
            raise OptionsError(f"save: {exc}") from None
    try:
        return CaptureOptions(**options)
    except TypeError:
        known = sorted(CaptureOptions.__dataclass_fields__)
        unknown = sorted(set(options) - set(CaptureOptions.__dataclass_fields__))
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(known)}, display") from None


def in_notebook() -> bool:
    """Whether this code runs in a Jupyter kernel (not a terminal IPython or a script)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def _wants_display(display: bool | None) -> bool:
    return in_notebook() if display is None else bool(display)


def _display(report: Any) -> None:
    from IPython.display import display

    display(report)
