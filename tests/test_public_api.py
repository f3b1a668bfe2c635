"""The public surface is deliberate: lock ``__all__`` and lazy imports."""

import subprocess
import sys

import gpumagic

PUBLIC = {
    "Evidence", "Finding", "Fix", "GpumagicError", "Profiler", "Report", "Trace", "TraceError", "Window",
    "__version__", "analyze", "analyze_job", "compare", "history", "load_ipython_extension", "load_trace", "monitor",
    "profile",
    "tune_dataloader", "unload_ipython_extension",
}


def test_all_is_locked():
    assert set(gpumagic.__all__) == PUBLIC


def test_import_registers_nothing_and_loads_no_heavy_package():
    code = ("import sys, gpumagic; "
            "print(sorted(m for m in ('torch', 'IPython', 'ipywidgets', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_attribute():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gpumagic.nope  # noqa: B018


def test_gpumagic_compare_stays_the_function():
    """Importing the submodule must not shadow the package attribute ``compare``."""
    import importlib

    importlib.import_module("gpumagic.tuning.comparison")
    assert callable(gpumagic.compare)
