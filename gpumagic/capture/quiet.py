"""Keep Kineto's log lines and torch.profiler's warnings out of the notebook.

Kineto logs through its own logger to stderr (``USDT: ... profiler_start`` / ``profiler_stop``
on every session with torch 2.13, ``STAGE: Completed Stage`` lines with older releases), which
ipykernel forwards into the cell output. Its threshold comes from ``KINETO_LOG_LEVEL``, read
when the profiler is first used in the process (torch 2.13: setting it after ``import torch``
but before the first profile works; after, it has no effect).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator

KINETO_LOG_LEVEL_ENV = "KINETO_LOG_LEVEL"
#: libkineto's severities: VERBOSE 0, INFO 1, WARNING 2, STAGE 3, ERROR 4, USDT 5 (Logger.h);
#: 6 hides every line, the per-session USDT lines included. A value the user set is kept.
QUIET_LEVEL = "6"
#: Modules whose warnings are noise while gpumagic drives the profiler itself.
_PROFILER_MODULES = r"torch\.(profiler|autograd\.profiler)(\..*)?$"


def quiet_kineto() -> None:
    """Set ``KINETO_LOG_LEVEL`` for this process unless the user already did."""
    os.environ.setdefault(KINETO_LOG_LEVEL_ENV, QUIET_LEVEL)


@contextlib.contextmanager
def profiler_warnings_hidden() -> Iterator[None]:
    """Hide torch.profiler's warnings around gpumagic's own calls into it (start, stop, export)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=_PROFILER_MODULES)
        yield
