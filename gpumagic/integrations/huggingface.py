"""Public path of the Hugging Face integration: ``from gpumagic.integrations.huggingface import GpuProfileCallback``.

The code lives with the other shells in :mod:`gpumagic.shells.huggingface`; ``GpuProfileCallback``
is built there when first used (it subclasses ``transformers.TrainerCallback``).
"""

from __future__ import annotations

from typing import Any

from gpumagic.shells import huggingface as _impl
from gpumagic.shells.huggingface import ADVICE, Advice, huggingface_fixes, installed_schema, trainer_imported


def __getattr__(name: str) -> Any:
    return getattr(_impl, name)


__all__ = ["ADVICE", "Advice", "GpuProfileCallback", "huggingface_fixes", "installed_schema", "trainer_imported"]  # noqa: F822 (GpuProfileCallback: built by __getattr__)
