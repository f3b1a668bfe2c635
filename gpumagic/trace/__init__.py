"""The trace layer: the columnar model and its loaders. Never imports torch."""

from gpumagic.trace.kineto import load
from gpumagic.trace.model import DeviceInfo, EventTable, Kind, Lane, MemoryTable, Samples, Trace

__all__ = ["DeviceInfo", "EventTable", "Kind", "Lane", "MemoryTable", "Samples", "Trace", "load"]
