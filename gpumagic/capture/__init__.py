"""The capture layer: run code under ``torch.profiler`` with step detection, NVML and host CPU
samplers, and turn the recording into a gpumagic bundle and a Report.

Importing this package does not import torch; a session imports it when it starts.
"""

from gpumagic.capture.errors import CaptureError, OptionsError, ProfilerBusyError, TorchMissingError
from gpumagic.capture.options import CaptureOptions
from gpumagic.capture.run import Run
from gpumagic.capture.session import CaptureSession, active_session

__all__ = ["CaptureError", "CaptureOptions", "CaptureSession", "OptionsError", "ProfilerBusyError", "Run",
           "TorchMissingError", "active_session"]
