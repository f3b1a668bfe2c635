"""Helpers for the render tests: analysed fixture traces (cached) and golden-file comparison.

Golden files live in ``tests/render/golden/``. After an intended change to a renderer or to the
analysis, regenerate them with::

    GPUMAGIC_UPDATE_GOLDEN=1 python -m pytest tests/render -q -p no:cacheprovider

and review the diff before committing.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import msgspec
import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE_ENV = "GPUMAGIC_UPDATE_GOLDEN"

#: Fixture traces with golden renders (all six recorded traces of tests/data).
FIXTURES = (
    "resnet50_v100_workers0",
    "resnet50_v100_workers4",
    "a100_training_rank0",
    "v100_resnet_ns_timestamps",
    "v100_large_216k_events",
    "h100_bert_small_inference",
)


@functools.cache
def analysed(name: str):
    """The real analysis of ``tests/data/<name>.json.gz``; ``trace.source`` shortened to the file
    name so that renders do not depend on where the repository is checked out."""
    from recorded import analysed as recorded  # loaded and analysed once per process, for every module

    report = recorded(name)
    trace = msgspec.structs.replace(report.metrics.trace, source=f"{name}.json.gz")
    report.metrics = msgspec.structs.replace(report.metrics, trace=trace)
    return report


def check_golden(name: str, actual: str) -> None:
    """Compare ``actual`` with ``golden/<name>``, or rewrite it when GPUMAGIC_UPDATE_GOLDEN=1."""
    path = GOLDEN / name
    if os.environ.get(UPDATE_ENV) == "1":
        path.write_text(actual, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"golden file {path.name} is missing; create it with {UPDATE_ENV}=1")
    expected = path.read_text(encoding="utf-8")
    if actual != expected:
        diff_at = next((i for i, (a, b) in enumerate(zip(actual, expected)) if a != b), min(len(actual), len(expected)))
        pytest.fail(
            f"{path.name} differs from the golden file at character {diff_at}: "
            f"got {actual[diff_at:diff_at + 80]!r}, expected {expected[diff_at:diff_at + 80]!r} "
            f"(if intended: {UPDATE_ENV}=1, then review the diff)"
        )
