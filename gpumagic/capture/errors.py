"""What the capture layer raises on purpose (all under :class:`gpumagic.errors.GpumagicError`).

::

    GpumagicError
     └── CaptureError            profiling could not start or run
          ├── OptionsError       an option value is out of range (also a ValueError)
          ├── ProfilerBusyError  a gpumagic capture or another torch profiler is already active
          └── TorchMissingError  torch is not installed (also an ImportError)

Each message is one sentence; the ``%%gpuprofile`` magic shows it as a ``UsageError``.
"""

from __future__ import annotations

from gpumagic.errors import GpumagicError

#: Shown when ``import torch`` fails.
TORCH_INSTALL_HINT = (
    "gpumagic needs PyTorch to profile: install it first (see https://pytorch.org/get-started/locally/)"
)


class CaptureError(GpumagicError):
    """Profiling could not start or run."""


class OptionsError(CaptureError, ValueError):
    """An option value is out of range or contradicts another option."""


class ProfilerBusyError(CaptureError):
    """A gpumagic capture or another ``torch.profiler`` session is already active."""


class TorchMissingError(CaptureError, ImportError):
    """``torch`` cannot be imported."""
