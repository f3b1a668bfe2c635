"""The trace layer: the columnar model and its loaders. Never imports torch.

Names resolve on first use, so that ``gpumagic.trace.files`` can be imported without numpy.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_NAMES = {
    "load": "gpumagic.trace.kineto",
    **{n: "gpumagic.trace.model" for n in ("DeviceInfo", "EventTable", "Kind", "Lane", "MemoryTable", "Samples", "Trace")},
}

__all__ = ["DeviceInfo", "EventTable", "Kind", "Lane", "MemoryTable", "Samples", "Trace", "load"]


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'gpumagic.trace' has no attribute {name!r}")
    return getattr(import_module(module), name)
