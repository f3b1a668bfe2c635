"""Integrations with training frameworks (public paths; the code lives in :mod:`gpumagic.shells`).

- :mod:`gpumagic.integrations.huggingface`: ``GpuProfileCallback`` for ``transformers.Trainer``
  and ``huggingface_fixes`` (fixes phrased as ``TrainingArguments``); ``pip install 'gpumagic[hf]'``.
"""
