"""The example trace shipped with the package (see README.md beside this file for its source and licence).

::

    gpumagic.analyze("example")     # = gpumagic.analyze(gpumagic.examples.trace_path()) = gpumagic analyze example
"""

from __future__ import annotations

from pathlib import Path

#: ResNet-50 training on a V100 with ``DataLoader(num_workers=0)``, from pytorch/kineto's samples.
EXAMPLE_TRACE = "resnet50_v100_workers0.json.gz"
#: The name that means the bundled example wherever a trace path is taken (CLI, ``analyze``, ``load_trace``).
EXAMPLE = "example"


def trace_path() -> Path:
    """The bundled example trace (ResNet-50 on a V100 with ``num_workers=0``)."""
    return Path(__file__).resolve().parent / EXAMPLE_TRACE


def resolve(source):
    """``source`` unchanged, or the bundled example's path when it is the string :data:`EXAMPLE`.

    Only the exact string: a ``Path("example")`` or ``"./example"`` still names a file of that name.
    """
    return str(trace_path()) if isinstance(source, str) and source == EXAMPLE else source
