"""``metrics.host.loader_stages``: the data pipeline's stages, from the timings a gpumagic capture
records in the main process and the DataLoader's workers (:mod:`gpumagic.capture.stages`, read
from the bundle by :mod:`gpumagic.trace.bundled`), and which fix fits the dominant one.

Each stage's time is its *self* wall-clock time, so the stages of a batch add up to the batch's
fetch time and the shares add up to 1 (before rounding to 4 digits); ``other`` is the part of
each fetch no stage covers. ``ms_per_batch`` is the stage's time over every process that ran it
divided by the batches it covers: with workers, CPU time spent in parallel, not time the loop
waited. When the timers' own cost would be a noticeable share of a batch (microsecond-scale
transforms), they time only some batches (``capture.stages.TARGET_SHARE``): a stage inside the
fetch covers the timed batches, ``pin_memory`` every batch; shares are of the per-batch times.

The timings cover every batch made while the capture recorded (workers also the batches they
prefetched), not only the analysis window: they say where a batch's time goes, which does not
depend on the window.
"""

from __future__ import annotations

import re
from typing import Any

from gpumagic.analysis.context import Context
from gpumagic.report.metrics import LoaderStage

OTHER = "other"
#: Stage names that read or decode files (a torchvision loader, ``load_image``, ``decode_jpeg``,
#: ``Image.open``, ``imread``, ...).
_DECODE = re.compile(r"decode|read|load|open|imread|jpe?g|png|pil|image", re.IGNORECASE)
_DATASET = (".__getitem__", ".__getitems__", ".__iter__")
#: How the capture names a collate function of the user's own (``capture.stages.COLLATE_ROLE``):
#: ``pad_batch (collate_fn)``; ``default_collate`` keeps its name.
CUSTOM_COLLATE = " (collate_fn)"


def loader_stages(ctx: Context) -> list[LoaderStage] | None:
    """The stages, largest first; None without timings (a plain trace, or no batch made)."""
    block: Any = ctx.trace.meta.get("loader_stages")
    if not isinstance(block, dict) or not block.get("batches"):
        return None
    batches = block["batches"]
    per_batch = [(r, r["self_ns"] / (r.get("batches") or batches)) for r in block["stages"] if r["self_ns"] > 0]
    total = sum(ns for _, ns in per_batch)
    if not total:
        return None
    per_batch.sort(key=lambda x: -x[1])
    return [LoaderStage(name=r["name"], ms_per_batch=round(ns / 1e6, 4), share=round(ns / total, 4),
                        where=r["where"]) for r, ns in per_batch]


def custom_collate(name: str) -> bool:
    """Whether a collate stage is the user's own function (padding, tokenizing: work of its own),
    not ``default_collate`` (stacking the samples). Bundles from before the role was named call
    the user's collate by its name alone, read as stacking."""
    return name.endswith(CUSTOM_COLLATE)


def kind(name: str) -> str:
    """What a stage is, for the fix: ``"dataset"`` (the dataset's own per-sample Python),
    ``"collate"``, ``"pin"``, ``"decode"`` (reading/decoding files), ``"other"`` or ``"transform"``."""
    if name == OTHER:
        return "other"
    if name == "pin_memory":
        return "pin"
    if name.endswith(_DATASET):
        return "dataset"
    if "collate" in name.lower():  # default_collate, or the user's own: custom_collate() tells them apart
        return "collate"
    if _DECODE.search(name.rsplit(".", 1)[-1] if "." in name else name):
        return "decode"
    return "transform"
