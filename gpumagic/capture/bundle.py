"""The gpumagic bundle: a Kineto JSON trace with one more top-level key, ``"gpumagic"``.

``"gpumagic": {"format": 1, "label", "notes", "capture", "machine", "versions", "clock":
{"anchor_epoch_ns", "anchor_name"}, "samples": {"gpu": {field: [...]}, "cpu": {field: [...]}}}``

``machine`` includes the cores the run could use (``usable_cores``, ``cpu_affinity``,
``cpu_quota_cores``: see ``capture.machine.usable_cpus``), so that ``gpumagic analyze`` of a saved
run sizes its DataLoader advice to them.

Any Kineto reader (Perfetto, TensorBoard, HTA) still opens the file: unknown keys are ignored.
The key is spliced into the exported bytes rather than re-encoding the whole trace, which keeps
saving cheap for large traces.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

BUNDLE_FORMAT = 1
BUNDLE_KEY = "gpumagic"
#: Name of the annotation whose start is recorded on the system clock; aligns samples.
CLOCK_ANCHOR = "gpumagic::clock_anchor"
#: A step marker still open when recording ended covers no complete step; it is renamed so
#: that the analysis does not count it as one.
PARTIAL_STEP_PREFIX = "gpumagic::partial_step#"
#: gzip level for saved bundles: traces compress ~10x at level 6, with little gain beyond.
GZIP_LEVEL = 6
#: Saved bundles are ordinary user files (mkstemp alone would leave them owner-only).
SAVED_FILE_MODE = 0o644


def make_section(*, label: str, notes: list[str], capture: dict[str, Any], machine: dict[str, Any],
                 versions: dict[str, str], anchor_epoch_ns: int | None,
                 samples: dict[str, dict[str, list]]) -> dict[str, Any]:
    """The ``"gpumagic"`` block; ``samples`` blocks that are empty are left out."""
    return {
        "format": BUNDLE_FORMAT,
        "label": label,
        "notes": list(notes),
        "capture": capture,
        "machine": machine,
        "versions": versions,
        "clock": {"anchor_epoch_ns": anchor_epoch_ns, "anchor_name": CLOCK_ANCHOR},
        "samples": {k: v for k, v in samples.items() if v},
    }


def splice(kineto_json: bytes, section: dict[str, Any]) -> bytes:
    """Insert ``"gpumagic": section`` as the first key of the trace's top-level object.

    Raises ValueError when the bytes are not a JSON object (a Kineto trace always is).
    """
    body = kineto_json.lstrip()
    if not body.startswith(b"{"):
        raise ValueError("the exported trace is not a JSON object")
    encoded = json.dumps(section, allow_nan=False, separators=(",", ":")).encode()
    rest = body[1:]
    comma = b"" if rest.lstrip().startswith(b"}") else b","
    return b'{"' + BUNDLE_KEY.encode() + b'":' + encoded + comma + rest


#: Top-level fields of Kineto's JSON that name the machine or a local path, not the run:
#: ``host_name`` (the machine's host name) and ``traceName`` (the temporary file the trace was
#: exported to). Blanked in bundles so that a shared bundle does not identify where it was made.
IDENTIFYING_FIELDS = ("host_name", "traceName")
_IDENTIFYING = re.compile(rb'("(?:' + b"|".join(f.encode() for f in IDENTIFYING_FIELDS) + rb')"\s*:\s*)"(?:[^"\\]|\\.)*"')


def scrub_identity(kineto_json: bytes) -> bytes:
    """Blank the values of :data:`IDENTIFYING_FIELDS` (they stay present, as empty strings, so
    readers that expect them still find them)."""
    return _IDENTIFYING.sub(rb'\1""', kineto_json)


def rename_partial_step(kineto_json: bytes, marker: str, step_index: int) -> bytes:
    """Rename every event called ``marker`` (CPU and GPU copies) to the partial-step name."""
    pattern = re.compile(rb'("name"\s*:\s*)"' + re.escape(marker.encode()) + rb'"')
    replacement = rb'\1"' + f"{PARTIAL_STEP_PREFIX}{step_index}".encode() + rb'"'
    return pattern.sub(replacement, kineto_json)


def check_target(path: str | os.PathLike) -> Path:
    """The save path, or ValueError in one sentence when a bundle cannot be written there."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise ValueError(f"{target} is a directory; give a file name such as run.json.gz")
    if not target.parent.is_dir():
        raise ValueError(f"cannot save to {target}: the folder {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK):
        raise ValueError(f"cannot save to {target}: the folder {target.parent} is not writable")
    return target


def write(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` (gzip when it ends in ``.gz``), atomically; returns the path."""
    target = check_target(path)
    if target.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
    fd, tmp = tempfile.mkstemp(prefix=".gpumagic-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, SAVED_FILE_MODE)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    return target
