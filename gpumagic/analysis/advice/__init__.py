"""Advice that depends on the user's framework: findings' fixes rephrased for it.

- :mod:`.huggingface`: ``TrainingArguments`` settings per finding, for ``transformers.Trainer``.
- :mod:`.serving`: a serving engine's arguments (vLLM) per finding, for a serving window.
"""
