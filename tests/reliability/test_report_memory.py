"""Displayed reports are freed: after N profiled cells nothing keeps their Report or Trace alive.

With the static view (``GPUMAGIC_WIDGETS=0``) through a real IPython shell; the live widget's
share of this promise is the inline-report work's (its own tests hold the widget to it).
"""

from __future__ import annotations

import gc
import weakref

import pytest

pytest.importorskip("torch")

from capture_state import clean_state_fixture  # noqa: F401
from ipyshell import ipython_shell

from gpumagic.shells import magic

CELLS = 6


def test_displayed_reports_and_traces_are_collected(monkeypatch, clean_state):
    monkeypatch.setenv("GPUMAGIC_WIDGETS", "0")
    shown: list[weakref.ref] = []
    original = magic.GpuProfileMagics._show

    def watching(self, run, args, baseline=None):
        if run.report is not None:
            shown.extend([weakref.ref(run.report), weakref.ref(run.report.trace)])
        return original(self, run, args, baseline)

    monkeypatch.setattr(magic.GpuProfileMagics, "_show", watching)
    with ipython_shell("gpumagic") as ip:
        for _ in range(CELLS):
            result = ip.run_cell("%%gpuprofile --no-nvml\nimport torch\ntorch.ones(64).add_(1)\n")
            assert result.success
        gc.collect()
        alive = [r() for r in shown if r() is not None]
        assert len(shown) == 2 * CELLS
        assert alive == [], [type(x).__name__ for x in alive]
