"""Reading a trace file's bytes: plain or gzip. Imports nothing heavy, so that the CLI can read
(and gunzip, which releases the GIL) while the analysis modules are still being imported."""

from __future__ import annotations

import gzip
import os
import zlib

from gpumagic.errors import TraceError

_GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's JSON bytes, gunzipped when it is gzip. Raises :class:`TraceError`."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not raw:
        raise TraceError(f"{path}: the file is empty")
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = _gunzip(raw)
        except (EOFError, OSError, zlib.error):
            raise TraceError(f"{path}: truncated or corrupt gzip data") from None
        if not raw:
            raise TraceError(f"{path}: the gzip file holds no data")
    return raw


def _gunzip(data: bytes) -> bytes:
    """Gunzip into one buffer sized from the gzip trailer (ISIZE, RFC 1952), so that a 50 MB trace
    does not pass through a chain of growing buffers; multi-member files take the general path."""
    isize = int.from_bytes(data[-4:], "little")
    out = zlib.decompress(data, wbits=31, bufsize=max(isize, 1 << 16))
    if len(out) & 0xFFFFFFFF != isize:
        return gzip.decompress(data)
    return out
