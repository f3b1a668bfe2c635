"""Labelled runs of this session, for ``%%gpuprofile --label NAME`` … ``%%gpuprofile --compare NAME``.

A process-wide registry: label → :class:`~gpumagic.report.model.Report`. Labelling a run again
replaces the earlier one. Nothing is written to disk; the registry lives as long as the kernel.

::

    runs.remember("before", report)
    runs.get("before")      # the Report; UnknownRunError naming the known labels otherwise
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from gpumagic.errors import GpumagicError

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Report

_lock = threading.Lock()
_runs: dict[str, Report] = {}


class UnknownRunError(GpumagicError, LookupError):
    """No run was remembered under that label."""


def remember(label: str, report: Report) -> None:
    """Keep ``report`` under ``label`` (a non-empty string), replacing any earlier run of that name."""
    if not isinstance(label, str) or not label.strip():
        raise ValueError(f"a run label must be a non-empty string, not {label!r}")
    if not hasattr(report, "metrics") or not hasattr(report, "findings"):
        raise TypeError(f"remember() takes a gpumagic Report, not {type(report).__name__}")
    with _lock:
        _runs[label] = report


def get(label: str) -> Report:
    """The report remembered under ``label``; :class:`UnknownRunError` names the known labels."""
    with _lock:
        report = _runs.get(label)
        known = sorted(_runs)
    if report is None:
        listed = ", ".join(repr(k) for k in known) if known else "none yet (profile a cell with --label NAME first)"
        raise UnknownRunError(f"no run is labelled {label!r}; known labels: {listed}")
    return report


def labels() -> list[str]:
    """The labels remembered so far, in the order they were first given."""
    with _lock:
        return list(_runs)


def forget(label: str | None = None) -> None:
    """Drop one labelled run (a missing label is not an error), or all of them with no argument."""
    with _lock:
        if label is None:
            _runs.clear()
        else:
            _runs.pop(label, None)
