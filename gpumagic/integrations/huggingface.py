"""Public path of the Hugging Face integration: ``from gpumagic.integrations.huggingface import GpuProfileCallback``.

The callback lives with the other shells in :mod:`gpumagic.shells.hf_callback` (``GpuProfileCallback``
is built there when first used: it subclasses ``transformers.TrainerCallback``); the
``TrainingArguments`` advice it applies, :func:`huggingface_fixes`, is analysis:
:mod:`gpumagic.analysis.advice.huggingface`.
"""

from __future__ import annotations

from typing import Any

from gpumagic.analysis.advice import huggingface as _advice
from gpumagic.analysis.advice.huggingface import ADVICE, Advice, arguments_code, huggingface_fixes, installed_schema
from gpumagic.shells import hf_callback as _callback
from gpumagic.shells.hf_callback import trainer_imported


def __getattr__(name: str) -> Any:
    if hasattr(_advice, name):
        return getattr(_advice, name)
    return getattr(_callback, name)


__all__ = ["ADVICE", "Advice", "GpuProfileCallback", "arguments_code", "huggingface_fixes", "installed_schema",  # noqa: F822
           "trainer_imported"]  # (GpuProfileCallback: built by __getattr__)
