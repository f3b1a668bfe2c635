"""The recorded traces of tests/data, each loaded and analysed once per test process (once per
pytest-xdist worker), however many test modules ask for it.

:func:`analysed` returns a fresh :class:`~gpumagic.report.model.Report` around the shared
analysis: its ``metrics``, ``findings``, ``notes`` and ``label`` are the caller's to change (render
tests rename ``metrics.trace.source``, comparison tests set labels); the loaded ``trace`` and the
frozen findings are shared and must be treated as read-only.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@functools.cache
def _analysis(path: str):
    import gpumagic

    return gpumagic.analyze(path)


def analysed(name: str):
    """The real analysis of ``tests/data/<name>`` (``.json.gz`` added when missing), as a Report
    the caller may change."""
    if not name.endswith((".json", ".json.gz")):
        name += ".json.gz"
    report = _analysis(os.path.realpath(os.path.join(DATA, name)))  # a name or a path: one analysis per file
    return dataclasses.replace(report, metrics=copy.deepcopy(report.metrics), findings=list(report.findings),
                               notes=list(report.notes))
