"""The gpumagic bundle: a Kineto JSON trace with one more top-level key, ``"gpumagic"``.

``"gpumagic": {"format": 1, "label", "notes", "capture", "machine", "versions", "clock":
{"anchor_epoch_ns", "anchor_name"}, "samples": {"gpu": {field: [...]}, "cpu": {field: [...]}},
"every_step": {...}}`` — ``every_step`` is the step timer's block (``capture.everystep``: every
optimizer step's duration and start, the recorded and profiled steps, the events beside them).

``"loader_stages": {"batches", "workers", "stages": [{"name", "where", "self_ns", "calls"}]}``
(present when a DataLoader was iterated while recording: :mod:`gpumagic.capture.stages`).

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

from gpumagic._atomic import WriteError, is_sink, write_atomic
from gpumagic._atomic import check_target as check_write_target

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
                 samples: dict[str, dict[str, list]], loader_stages: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``"gpumagic"`` block; ``samples`` blocks that are empty are left out, and
    ``loader_stages`` when None. ``extra``: blocks added as they are (``error``: what the profiled
    code raised; ``memory_categories``)."""
    section = {
        "format": BUNDLE_FORMAT,
        "label": label,
        "notes": list(notes),
        "capture": capture,
        "machine": machine,
        "versions": versions,
        "clock": {"anchor_epoch_ns": anchor_epoch_ns, "anchor_name": CLOCK_ANCHOR},
        "samples": {k: v for k, v in samples.items() if v},
        **(extra or {}),
    }
    if loader_stages is not None:
        section["loader_stages"] = loader_stages
    return section


#: The longest error message kept in a bundle (an out-of-memory message is ~600 characters).
ERROR_MESSAGE_CHARS = 4000


def error_block(error: BaseException) -> dict[str, Any]:
    """What the profiled code raised, as plain data: ``type`` (its class's name), ``types`` (the
    names along its class's MRO, so ``torch.OutOfMemoryError`` is known without torch) and
    ``message`` (``str(error)``, at most :data:`ERROR_MESSAGE_CHARS` characters)."""
    try:
        message = str(error)
    except Exception:  # a broken __str__ is no reason to lose the bundle
        message = ""
    return {"type": type(error).__name__, "types": [c.__name__ for c in type(error).__mro__],
            "message": message[:ERROR_MESSAGE_CHARS]}


def shorten_block(block: dict[str, Any], cwd: str, home: str) -> dict[str, Any]:
    """``block`` with its Python frames' paths shortened as :func:`shorten_paths` does."""
    encoded = json.dumps(block, allow_nan=False, separators=(",", ":")).encode()
    return json.loads(shorten_paths(encoded, cwd=cwd, home=home))


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


def shorten_paths(kineto_json: bytes, cwd: str, home: str) -> bytes:
    """Python frames (``--stack``) name their files by absolute path, e.g.
    ``"/home/ana/proj/train.py(12): forward"``; torch already shortens files under ``sys.path``.
    Rewrite the rest: under ``cwd`` a path becomes relative (``train.py(12)``), under ``home`` it
    starts with ``~`` (``~/lib/x.py(3)``). Only a path at the start of a JSON string or after a
    ``;`` (Kineto's call-stack separator) is rewritten; ``cwd`` or ``home`` equal to ``/`` is left alone.
    """
    for folder, replacement in ((cwd, b""), (home, b"~/")):
        folder = folder.rstrip("/")
        if not folder or folder == "/" or not os.path.isabs(folder):
            continue
        encoded = json.dumps(folder + "/")[1:-1].encode()  # as it appears inside a JSON string
        kineto_json = _replace_after(kineto_json, encoded, replacement, _PATH_STARTS)
    return kineto_json


#: The bytes a rewritten path may follow: a JSON string's opening quote, Kineto's ``;``, a space.
_PATH_STARTS = frozenset(b'"; ')


def _replace_after(data: bytes, needle: bytes, replacement: bytes, after: frozenset[int]) -> bytes:
    """``data`` with each ``needle`` that follows one of the bytes ``after`` replaced, left to right
    (what ``re.sub(rb'(?<=[...])' + re.escape(needle), ...)`` does), found by ``bytes.find``: a
    trace without the folder in it is scanned once at memchr speed (the look-behind regex took
    0.5 s for a 26 MB trace, the longest step after the export)."""
    at = data.find(needle)
    if at < 0:
        return data
    parts, start = [], 0
    while at >= 0:
        if at > 0 and data[at - 1] in after:
            parts += (data[start:at], replacement)
            start = at + len(needle)
            at = data.find(needle, start)
        else:
            at = data.find(needle, at + 1)
    parts.append(data[start:])
    return b"".join(parts)


def rename_partial_step(kineto_json: bytes, marker: str, step_index: int) -> bytes:
    """Rename every event called ``marker`` (CPU and GPU copies) to the partial-step name."""
    pattern = re.compile(rb'("name"\s*:\s*)"' + re.escape(marker.encode()) + rb'"')
    replacement = rb'\1"' + f"{PARTIAL_STEP_PREFIX}{step_index}".encode() + rb'"'
    return pattern.sub(replacement, kineto_json)


def check_target(path: str | os.PathLike) -> Path:
    """The save path, or ValueError in one sentence when a bundle cannot be written there.

    Beyond :func:`gpumagic._atomic.check_target` (an existing, writable folder; not a directory),
    a temporary file is created and removed in the folder, which catches what permission bits do
    not show (``/proc``, read-only mounts), so that such a target is refused before the code runs.
    """
    try:
        target = check_write_target(path)
        if is_sink(target):  # /dev/null: nothing to create in its folder
            return target
        fd, probe = tempfile.mkstemp(prefix=".gpumagic-probe-", dir=target.parent)
    except WriteError as exc:
        raise ValueError(str(exc)) from None
    except OSError as exc:
        raise ValueError(f"cannot save to {path}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)
    return target


def write(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` (gzip when it ends in ``.gz``) through
    :func:`gpumagic._atomic.write_atomic`: whole or not at all. ValueError in one sentence."""
    try:
        if Path(path).name.endswith(".gz"):
            data = gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
        return write_atomic(path, data, mode=SAVED_FILE_MODE)
    except WriteError as exc:
        raise ValueError(str(exc)) from None
    except OSError as exc:  # e.g. a path the system cannot even look up (name too long)
        raise ValueError(f"cannot save to {path}: {exc.strerror or exc}") from None
