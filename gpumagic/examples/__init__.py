"""The example trace shipped with the package (see README.md beside this file for its source and licence).

::

    gpumagic.analyze(gpumagic.examples.trace_path())     # = gpumagic analyze example
"""

from __future__ import annotations

from pathlib import Path

#: ResNet-50 training on a V100 with ``DataLoader(num_workers=0)``, from pytorch/kineto's samples.
EXAMPLE_TRACE = "resnet50_v100_workers0.json.gz"


def trace_path() -> Path:
    """The bundled example trace (ResNet-50 on a V100 with ``num_workers=0``)."""
    return Path(__file__).resolve().parent / EXAMPLE_TRACE
