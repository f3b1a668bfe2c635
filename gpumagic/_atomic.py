"""One way to write a file: all of it or nothing, never over the input.

Every writer in gpumagic (``analyze -o``, ``compare -o``, ``Report.save_html``, ``--save`` bundles,
and later exports) goes through :func:`write_atomic`: the data goes to a temporary file in the
target's folder, is flushed to disk, and is renamed over the target only when complete. A failed
write (full disk, file-size limit, Ctrl-C) removes the temporary file and leaves the target as it
was.

One rule keeps outputs off inputs: every writer passes, as ``protect``, every input it read (trace
files, rank files, the run-history database). Each is resolved as the readers resolve it
(:func:`local_path`: ``~`` expanded, a ``file://`` URL as its path), and stands for itself and its
SQLite side files (``-wal``, ``-shm``, ``-journal``, :data:`SIDE_SUFFIXES`), compared by device and
inode (a link or another spelling of the same path) and by resolved name (a side file that does
not exist yet). A target that exists keeps its permission bits (a private 0600 file stays 0600).
A character device that accepts writes (``/dev/null``) is written directly: nothing to replace.
"""

from __future__ import annotations

import contextlib
import os
import stat
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

from gpumagic.errors import GpumagicError

#: Mode of a written file: readable by all, writable by the owner, as a plain ``open()`` gives under
#: the usual umask 022 (``mkstemp`` alone would give 0600).
FILE_MODE = 0o644


class WriteError(GpumagicError, OSError):
    """A file could not be written; the message is one sentence naming it and why."""


#: Files that belong to a protected input: SQLite's write-ahead log, its shared-memory index and
#: its rollback journal sit next to the database as ``NAME-wal``, ``NAME-shm``, ``NAME-journal``
#: (https://www.sqlite.org/tempfiles.html); writing over any of them loses the database's data.
SIDE_SUFFIXES = ("-wal", "-shm", "-journal")


def local_path(p: str | os.PathLike) -> str | None:
    """The local file an input names, as the readers open it: ``~`` expanded, ``file://HOST/PATH``
    (host empty or ``localhost``) as ``PATH`` with %-escapes decoded; None for ``-`` (standard input)
    and for other URLs (``s3://``), which name no local file."""
    text = os.fspath(p)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if text == "-" or not text:
        return None
    if text.startswith("file://"):
        parts = urllib.parse.urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            return None
        from urllib.request import url2pathname  # here: it imports http.client & co. (15 ms)

        return url2pathname(parts.path)
    if "://" in text:
        return None
    return os.path.expanduser(text)


def _protected(protect: Iterable[str | os.PathLike]) -> Iterable[str]:
    for p in protect:
        path = local_path(p)
        if path is not None:
            yield path
            for suffix in SIDE_SUFFIXES:
                yield path + suffix


def _same_name(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def is_sink(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a character device (``/dev/null``): written in place, never replaced."""
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when ``a`` and ``b`` both exist and are the same file (links followed)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_inputs(path: str | os.PathLike, protect: Iterable[str | os.PathLike]) -> Path:
    """``path`` as a Path; :class:`WriteError` when it is one of ``protect`` (see the module docstring)."""
    target = Path(path).expanduser()
    for p in _protected(protect):
        if same_file(target, p) or _same_name(target, p):
            raise WriteError(f"{target}: refusing to write over the input file {p}")
    return target


def check_target(path: str | os.PathLike, protect: Iterable[str | os.PathLike] = ()) -> Path:
    """``path`` as a Path, or :class:`WriteError` when it cannot be a file written by :func:`write_atomic`."""
    if not str(path):
        raise WriteError("the output path is empty")
    target = refuse_inputs(path, protect)
    if is_sink(target):
        if not os.access(target, os.W_OK):
            raise WriteError(f"cannot write {target}: permission denied")
        return target
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

    A new file gets ``mode``; an existing one keeps its own permission bits. Raises
    :class:`WriteError` (one sentence) when the target is refused or the write fails; the target
    then keeps its old content and no temporary file is left behind.
    """
    target = check_target(path, protect)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if is_sink(target):
        return _write_sink(target, payload)
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(os.stat(target).st_mode)
    import tempfile  # here: a command writing to standard output or /dev/null never needs it

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


def _write_sink(target: Path, payload: bytes) -> Path:
    """Write to a character device (``/dev/null``; ``/dev/full`` fails with ENOSPC, as it should)."""
    try:
        with open(target, "wb", buffering=0) as fh:
            view = memoryview(payload)
            while view:
                view = view[fh.write(view):]
    except OSError as exc:
        raise WriteError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target
