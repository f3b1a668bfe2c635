"""Reading a trace's bytes: a plain or gzip file, or standard input, in bounded memory.

Imports nothing heavy, so that the CLI can read (and gunzip, which releases the GIL) while the
analysis modules are still being imported."""

from __future__ import annotations

import os
import stat
import sys
import types
import zlib

from gpumagic.errors import TraceError

_inflate: types.ModuleType
try:  # ISA-L's inflate: zlib's API, about twice as fast (measured in benchmarks/analyze_speed.py)
    from isal import isal_zlib as _inflate
except ImportError:  # no wheel for this platform: the standard library's zlib
    _inflate = zlib

_GZIP_MAGIC = b"\x1f\x8b"
#: The path that means standard input.
STDIN = "-"
#: Standard input is read up to this many bytes (a pipe has no size to check beforehand; a file
#: given by its path has no such limit).
STDIN_LIMIT_BYTES = 4 << 30
#: Real traces compress about 10-20:1. Past :data:`INFLATE_FREE_BYTES` of output, a gzip file
#: that inflates to more than this many times its own size is refused (a "gzip bomb": 1 MB of
#: compressed NUL bytes inflates to 1 GB). :data:`INFLATE_ENV` lifts it.
MAX_INFLATE_RATIO = 100
INFLATE_FREE_BYTES = 256 << 20
#: Environment variable: the largest inflation ratio accepted (a number), or 0 for no limit.
INFLATE_ENV = "GPUMAGIC_MAX_INFLATE"
#: Output is inflated this many bytes at a time (zlib releases the GIL for each step). Small
#: enough that malloc serves each step's output from the memory the step before freed: 16 MB
#: steps were mapped afresh each time (860 MB of JSON: 458k page faults, 2.0 s, against 237k
#: and 1.2 s with 2 MB steps, benchmarks/analyze_speed.py's 1 GB case).
_INFLATE_STEP = 2 << 20
_INPUT_STEP = 1 << 20


class Progress:
    """How far a read has got, for another thread to look at while it runs: ``text``, the
    ``bytearray`` a gunzip is filling (``None`` until it is made; a plain read or
    ``mutable=False`` never sets it), ``done``, how many of its first bytes are inflated (they
    never change afterwards), ``total``, the size the gzip trailer gives (0 when it cannot be
    trusted), and ``ended``, set once the read has returned or failed."""

    __slots__ = ("done", "ended", "text", "total")

    def __init__(self) -> None:
        self.text: bytearray | None = None
        self.done = 0
        self.total = 0
        self.ended = False


def read_bytes(path: str | os.PathLike, *, mutable: bool = False, progress: Progress | None = None) -> bytes | bytearray:
    """The file's JSON bytes, gunzipped when it is gzip. Raises :class:`TraceError`.

    ``-`` reads standard input. Anything that is not a regular file (a FIFO, a device such as
    ``/dev/zero``, a socket) is refused before it is opened. Gzip data is inflated at
    once (refused early if it inflates absurdly, see :data:`MAX_INFLATE_RATIO`);
    ``mutable=True`` returns a ``bytearray``, gzip or not, which
    :mod:`gpumagic.trace.pieces` can cut into pieces without copying them; ``progress`` then shows
    the gzip's inflation as it goes (:class:`Progress`: the command line starts decoding the first
    pieces of a large trace before the rest is inflated).
    """
    try:
        path = os.fspath(path)
        raw = _read_stdin() if path == STDIN else _read_file(path, mutable)
        name = display_name(path)
        if not raw:
            raise TraceError("<stdin>: standard input is empty; pipe a trace into it (gpumagic analyze - < trace.json.gz)"
                             if path == STDIN else f"{name}: the file is empty")
        if raw[:2] == _GZIP_MAGIC:
            raw = gunzip(raw, name, mutable=mutable, progress=progress if mutable else None)
            if not raw:
                raise TraceError(f"{name}: the gzip file holds no data")
        elif mutable and not isinstance(raw, bytearray):
            raw = bytearray(raw)
        return raw
    finally:
        if progress is not None:
            progress.ended = True


def gzip_size(path: str | os.PathLike) -> int | None:
    """The size the gzip file ``path`` says its data inflates to: the ISIZE field of its last
    eight bytes (RFC 1952; the size modulo 2**32, and of the last member only). None for
    standard input, a file that is not gzip, or one that cannot be read. A hint for choosing how
    to read the file, never trusted for the result: :func:`gunzip` checks what it inflates."""
    path = os.fspath(path)
    if path == STDIN:
        return None
    try:
        st = os.stat(path)
        # only a regular file: opening a FIFO would wait for a writer (read_bytes refuses one)
        if not stat.S_ISREG(st.st_mode) or st.st_size < 18:  # a gzip header and trailer at least
            return None
        with open(path, "rb", buffering=0) as fh:
            if fh.read(2) != _GZIP_MAGIC:
                return None
            fh.seek(st.st_size - 4)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return None


def display_name(path: str) -> str:
    """How messages name ``path``: ``<stdin>`` for ``-``."""
    return "<stdin>" if path == STDIN else path


def _read_file(path: str, mutable: bool) -> bytes | bytearray:
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise TraceError(f"{path}: is a directory, not a trace file{_traces_inside(path)}")
        if not stat.S_ISREG(st.st_mode):
            raise TraceError(f"{path}: is not a regular file ({_file_kind(st.st_mode)}); give a trace file, "
                             f"or {STDIN} to read standard input")
        with open(path, "rb", buffering=0) as fh:
            if not mutable:
                return fh.read()
            buf = bytearray(st.st_size)
            got = fh.readinto(buf)
            if got < st.st_size:
                del buf[got:]
            return buf
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, not a trace file{_traces_inside(path)}") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a plain file"


def _read_stdin() -> bytearray:
    """Standard input, read to its end, up to :data:`STDIN_LIMIT_BYTES`. A terminal or a device
    (``< /dev/zero``) is refused: a trace comes from a file or a pipe."""
    stream = sys.stdin.buffer if sys.stdin is not None else None
    try:
        fd = stream.fileno() if stream is not None else 0
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError, AttributeError):
        raise TraceError("<stdin>: standard input cannot be read") from None
    if os.isatty(fd) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise TraceError("<stdin>: standard input is a terminal or a device; pipe a trace into it "
                         "(gpumagic analyze - < trace.json.gz)")
    out = bytearray()
    try:
        while True:
            chunk = os.read(fd, min(_INFLATE_STEP, STDIN_LIMIT_BYTES + 1 - len(out)))
            if not chunk:
                return out
            out += chunk
            if len(out) > STDIN_LIMIT_BYTES:
                raise TraceError(f"<stdin>: more than {STDIN_LIMIT_BYTES >> 30} GiB on standard input; "
                                 "save the trace to a file and give its path")
    except OSError as exc:
        raise TraceError(f"<stdin>: cannot read ({exc.strerror or exc})") from None


def inflate_limit() -> float:
    """The largest inflation ratio accepted: :data:`MAX_INFLATE_RATIO`, or :data:`INFLATE_ENV`
    (0 means no limit). A value that is not a finite number >= 0 (``nan``, ``inf``, ``-1``, a word)
    gives one warning and the default: a typo never switches the limit off."""
    from gpumagic._env import env_float

    ratio = env_float(INFLATE_ENV, MAX_INFLATE_RATIO, minimum=0, maximum=1e12, what="a ratio such as 1000, or 0 for no limit")
    return float("inf") if ratio == 0 else ratio


def gunzip(data: bytes | bytearray, name: str = "<bytes>", *, mutable: bool = True,
           progress: Progress | None = None) -> bytes | bytearray:
    """Inflate gzip ``data`` (one member or several): a ``bytearray`` when ``mutable``, else
    ``bytes`` when that is faster.

    Past :data:`INFLATE_FREE_BYTES`, output beyond the inflation limit stops it with a
    :class:`TraceError` naming the ratio. Not ``mutable``, a single member whose trailer tells
    its size (ISIZE, RFC 1952) is inflated in one call into a ``bytes`` of that size
    (:func:`_inflate_whole`: 54 ms against 91 ms for the 54 MB V100 trace, which the copy of
    each step costs); anything else, a step at a time, appended to a ``bytearray`` that grows
    in place (a large one is moved by remapping its pages, not copied: a 1 GB trace needs 1 GB,
    not a second copy), whose filling ``progress`` (a :class:`Progress`) follows. It is not
    made at the trailer's size up front: zero-filling 819 MB took 0.34 s in one piece while
    holding the GIL, which stalled the thread that imports the analysis meanwhile, and growing
    it as the text comes costs no more memory (peak RSS 848 against 850 MB).
    """
    ratio = inflate_limit()
    allowed = max(INFLATE_FREE_BYTES, ratio * len(data))
    hint = int.from_bytes(data[-4:], "little")
    if not mutable and 0 < hint <= allowed:
        whole = _inflate_whole(data, hint)
        if whole is not None:
            return whole
    out = bytearray()
    if progress is not None:
        progress.text, progress.total = out, hint if hint <= allowed else 0
    try:
        with memoryview(data) as view:
            pos = 0
            while pos < len(view):
                d = _inflate.decompressobj(wbits=31)
                while not d.eof:
                    if d.unconsumed_tail:
                        chunk = d.decompress(d.unconsumed_tail, _INFLATE_STEP)
                    elif pos < len(view):
                        step = view[pos:pos + _INPUT_STEP]
                        pos += len(step)
                        chunk = d.decompress(step, _INFLATE_STEP)
                    else:
                        raise EOFError
                    end = len(out) + len(chunk)
                    if end > allowed:
                        raise TraceError(
                            f"{name}: inflates to more than {ratio:g} times its compressed size (over {end / len(data):.0f}:1 "
                            f"past {INFLATE_FREE_BYTES >> 20} MiB; real traces compress about 10-20:1); "
                            f"set {INFLATE_ENV}=<ratio> (0 for no limit) to read it anyway")
                    out += chunk
                    if progress is not None:
                        progress.done = end
                pos -= len(d.unused_data)
                if view[pos:pos + 2] != _GZIP_MAGIC:  # no further member (end, or padding)
                    break
    except (EOFError, zlib.error, _inflate.error):
        raise TraceError(f"{name}: truncated or corrupt gzip data") from None
    return out


def _inflate_whole(data: bytes | bytearray, size: int) -> bytes | None:
    """``data`` inflated in one call, when it is one gzip member of ``size`` bytes (its trailer's
    ISIZE) followed by nothing but padding; else None (several members, a trailer that does not
    tell the size, or data that is corrupt: the caller's step-by-step inflation then reads it,
    or names the error). At most ``size + 1`` bytes are made, which the caller has checked
    against the inflation limit."""
    d = _inflate.decompressobj(wbits=31)
    try:
        out = d.decompress(data, size + 1)
    except (zlib.error, _inflate.error):
        return None
    if not d.eof or len(out) != size or d.unused_data[:2] == _GZIP_MAGIC:
        return None
    return out


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

