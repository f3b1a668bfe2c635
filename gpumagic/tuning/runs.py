"""Runs by name, for ``%%gpuprofile --label NAME`` … ``%%gpuprofile --compare NAME``, on top of the history.

Every run recorded here goes into the run history (:mod:`gpumagic.tuning.history`), so a later
kernel finds it too. A label may be used many times and every run is kept: ``LABEL`` is its
latest run, ``LABEL@N`` its N-th most recent, and ``r<id>`` names one run by its id.

::

    runs.record(report, label="before")   # -> StoredRun (its .ref is "r12")
    runs.get("before")      # the Report; UnknownRunError naming the known labels otherwise
    runs.get("before@2"), runs.get("r12")

A run recorded in this kernel comes back as the very Report object it was (with its trace, so
its timeline still draws) while something else still holds it (``-o NAME``, a variable); the
history itself keeps no report alive, so memory stays flat however many cells run. Otherwise,
and for a run from an earlier kernel, the report is rebuilt from its JSON (without the trace).
"""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpumagic.report.labels import RUN_ID_RE, label_problem
from gpumagic.tuning.history import (
    DB_NAME,
    History,
    HistoryError,
    HistoryStore,
    RunNameError,
    StoredRun,
    UnknownRunError,
    check_ref,
    history_home,
)

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Report

__all__ = ["HistoryError", "RunNameError", "UnknownRunError", "find", "forget", "get", "history", "labels", "record", "remember", "store"]

_lock = threading.Lock()
_stores: dict[Path | None, HistoryStore] = {}
#: The reports recorded by this process that are still alive elsewhere, by (database, run id):
#: handed back as the same objects, trace included. Weak, since a report holds its whole trace.
_live: weakref.WeakValueDictionary[tuple[Path | None, int], Report] = weakref.WeakValueDictionary()


def store() -> HistoryStore:
    """The history store for the current ``GPUMAGIC_HOME`` (read at each call)."""
    home = history_home()
    path = None if home is None else home / DB_NAME
    with _lock:
        found = _stores.get(path)
        if found is None:
            found = _stores[path] = HistoryStore(path)
        return found


def record(report: Report, *, label: str | None = "", source: str = "", options: dict[str, Any] | None = None,
           notebook: str = "", bundle: str | None = None) -> StoredRun:
    """Store a run in the history (every run is kept; see the module docstring); returns its row.

    ``label`` "" or None: an unlabelled run. A label that looks like a run id (``r12``) or cannot
    be stored raises :class:`RunNameError` (:func:`gpumagic.report.labels.label_problem`)."""
    label = "" if label is None else label
    problem = label_problem(label)
    if problem is not None:
        raise RunNameError(problem)
    if not hasattr(report, "metrics") or not hasattr(report, "findings"):
        raise TypeError(f"record() takes a gpumagic Report, not {type(report).__name__}")
    s = store()
    row = s.add(report, label=label.strip(), source=source, options=options, workdir=_storable(_workdir()),
                notebook=_storable(notebook), bundle=None if bundle is None else _storable(os.path.abspath(bundle)))
    with _lock:
        _live[(s.path, row.id)] = report
    return row


def _workdir() -> str:
    """The working folder, or "" when it was removed under the kernel (``os.getcwd()`` then fails)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def _storable(text: str) -> str:
    """``text`` as SQLite can store it (UTF-8): an undecodable file name's lone surrogates as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def remember(label: str, report: Report) -> StoredRun:
    """Record ``report`` under ``label`` (a non-empty string); earlier runs of that label are kept."""
    if not isinstance(label, str) or not label.strip():
        raise ValueError(f"a run label must be a non-empty string, not {label!r}")
    return record(report, label=label)


def find(ref: str) -> StoredRun:
    """The stored run that ``ref`` names (``LABEL``, ``LABEL@N`` or ``r<id>``)."""
    return store().find(ref)


def get(ref: str) -> Report:
    """The report of the run ``ref`` names; :class:`UnknownRunError` names the known labels."""
    s = store()
    row = s.find(ref)
    with _lock:
        live = _live.get((s.path, row.id))
    return live if live is not None else s.report(row)


def labels() -> list[str]:
    """The labels in the history, in the order they were first given."""
    return store().labels()


def forget(ref: str | None = None) -> int:
    """Delete the runs ``ref`` names (a label: all its runs; ``LABEL@N`` or ``r<id>``: one), or
    every run with no argument; a name nothing answers to is not an error. Returns the count."""
    s = store()
    if ref is None:
        return s.clear()
    check_ref(ref)  # "" is refused, never "every unlabelled run"
    try:
        targets = matching(ref)
    except UnknownRunError:
        return 0
    return s.remove(targets)


def matching(ref: str) -> list[StoredRun]:
    """Every run a plain label names, or the one run ``LABEL@N`` / ``r<id>`` names.

    :class:`RunNameError` for an empty ``ref``, or an ``r<id>`` that is both a run id and a label."""
    s = store()
    check_ref(ref)
    if RUN_ID_RE.fullmatch(ref):
        try:
            row = s.find(ref)  # RunNameError when ambiguous
        except UnknownRunError:
            row = None
        if row is not None and row.ref == ref:
            return [row]
    every = s.runs(label=ref)
    return every if every else [s.find(ref)]


def history(limit: int | None = None) -> History:
    """The history as a displayable table (oldest first) with a chart: ``gpumagic.history()``."""
    s = store()
    rows = s.runs(limit=limit)
    return History(runs=rows[::-1], where=str(s.path) if s.path is not None else "")
