"""Integrations with training frameworks. Each submodule imports its framework only when used.

- :mod:`gpumagic.integrations.huggingface`: ``GpuProfileCallback`` for ``transformers.Trainer``
  and ``huggingface_fixes`` (fixes phrased as ``TrainingArguments``); ``pip install 'gpumagic[hf]'``.
"""
