"""Reading a trace file's bytes: plain or gzip. Imports nothing heavy, so that the CLI can read
(and gunzip, which releases the GIL) while the analysis modules are still being imported."""

from __future__ import annotations

import gzip
import os
import zlib

from gpumagic.errors import TraceError

_GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: str | os.PathLike, *, mutable: bool = False) -> bytes | bytearray:
    """The file's JSON bytes, gunzipped when it is gzip. Raises :class:`TraceError`.

    ``mutable=True`` returns a ``bytearray``, which :mod:`gpumagic.trace.pieces` can cut into
    pieces without copying them.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, not a trace file{_traces_inside(path)}") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not raw:
        raise TraceError(f"{path}: the file is empty")
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = _gunzip_into(raw) if mutable else _gunzip(raw)
        except (EOFError, OSError, zlib.error):
            raise TraceError(f"{path}: truncated or corrupt gzip data") from None
        if not raw:
            raise TraceError(f"{path}: the gzip file holds no data")
    elif mutable:
        raw = bytearray(raw)
    return raw


def _gunzip(data: bytes) -> bytes:
    """Gunzip into one buffer sized from the gzip trailer (ISIZE, RFC 1952), so that a 50 MB trace
    does not pass through a chain of growing buffers; multi-member files take the general path."""
    isize = int.from_bytes(data[-4:], "little")
    out = zlib.decompress(data, wbits=31, bufsize=max(isize, 1 << 16))
    if len(out) & 0xFFFFFFFF != isize:
        return gzip.decompress(data)
    return out


def _gunzip_into(data: bytes) -> bytearray:
    """Gunzip into a ``bytearray``: one :func:`_gunzip` call (which releases the GIL for all of
    its work), then one copy. Inflating a few MB at a time into a growing buffer looks leaner
    but measured slower: each step must take the GIL back from the thread importing numpy."""
    return bytearray(_gunzip(data))


#: Names that trace files written by torch.profiler end with (``export_chrome_trace``,
#: ``tensorboard_trace_handler``'s ``*.pt.trace.json[.gz]``, gpumagic bundles).
TRACE_NAME_ENDINGS = (".json", ".json.gz")


def _traces_inside(directory: str) -> str:
    """For the error about a directory: the newest trace files in it, to name one instead."""
    try:
        entries = [e for e in os.scandir(directory) if e.is_file() and e.name.endswith(TRACE_NAME_ENDINGS)]
    except OSError:
        return ""
    if not entries:
        return " (it holds no .json or .json.gz file)"
    entries.sort(key=lambda e: e.stat().st_mtime, reverse=True)
    if len(entries) == 1:
        return f"; its trace file is {os.path.join(directory, entries[0].name)}"
    shown = ", ".join(os.path.join(directory, e.name) for e in entries[:3])
    more = f" and {len(entries) - 3} more" if len(entries) > 3 else ""
    return f"; give one of its {len(entries)} trace files, newest first: {shown}{more}"

