"""One way to write a file: all of it or nothing, never over the input.

Every writer in gpumagic (``analyze -o``, ``compare -o``, ``Report.save_html``, ``--save`` bundles,
and later exports) goes through :func:`write_atomic`: the data goes to a temporary file in the
target's folder, is flushed to disk, and is renamed over the target only when complete. A failed
write (full disk, file-size limit, Ctrl-C) removes the temporary file and leaves the target as it
was. ``protect`` names files that must never be the target (the input trace), compared by device
and inode, so a link or another spelling of the same path is caught too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from gpumagic.errors import GpumagicError

#: Mode of a written file: readable by all, writable by the owner, as a plain ``open()`` gives under
#: the usual umask 022 (``mkstemp`` alone would give 0600).
FILE_MODE = 0o644


class WriteError(GpumagicError, OSError):
    """A file could not be written; the message is one sentence naming it and why."""


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when ``a`` and ``b`` both exist and are the same file (links followed)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_target(path: str | os.PathLike, protect: Iterable[str | os.PathLike] = ()) -> Path:
    """``path`` as a Path, or :class:`WriteError` when it cannot be a file written by :func:`write_atomic`."""
    target = Path(path).expanduser()
    if not str(path):
        raise WriteError("the output path is empty")
    for p in protect:
        if same_file(target, p):
            raise WriteError(f"{target}: refusing to write over the input file {p}")
    if target.is_dir():
        raise WriteError(f"{target} is a directory; give a file name")
    if target.exists() and not target.is_file():
        raise WriteError(f"{target} is not a regular file")
    folder = target.parent
    if not folder.is_dir():
        raise WriteError(f"cannot write {target}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise WriteError(f"cannot write {target}: the folder {folder} is not writable")
    return target


def write_atomic(path: str | os.PathLike, data: bytes | str, *, protect: Iterable[str | os.PathLike] = (),
                 mode: int = FILE_MODE) -> Path:
    """Write ``data`` (str as UTF-8) to ``path`` whole or not at all; returns the path.

    Raises :class:`WriteError` (one sentence) when the target is refused or the write fails; the
    target then keeps its old content and no temporary file is left behind.
    """
    target = check_target(path, protect)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise WriteError(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except OSError as exc:
            raise WriteError(f"cannot write {target}: {exc.strerror or exc}") from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):  # the rename may have happened already
            os.unlink(tmp)
        raise
    return target
