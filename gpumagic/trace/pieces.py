"""Decoding a large trace piece by piece, and side by side in forked processes.

The JSON text is cut at commas between two top-level events of ``traceEvents``, and each piece
is made into a small JSON object of its own:

- the first piece: the file's text up to the first cut, closed with ``]}``;
- a middle piece: ``{"traceEvents":[`` + the events between two cuts + ``]}``;
- the last piece: ``{"traceEvents":[`` + the rest of the file (its closing ``]`` and any
  top-level fields after the events, such as ``baseTimeNanoseconds``).

Pieces are about :data:`PIECE_BYTES` each, and each is turned into columns (a
:class:`~gpumagic.trace.columns.Part`) before the next is decoded, so only one piece's structs
are alive at a time in a process: memory stays near the size of the text itself, however
large the file. msgspec holds the GIL while it decodes, so threads cannot share the work;
processes can: the pieces are dealt out as contiguous runs, the first run decoded by the calling
process, the others by children made with ``os.fork`` (Linux only), each of which sends back its
parts (numpy columns and small lists, pickled) in a file in memory and leaves with ``os._exit``.

A cut is found by a text search near an even share of the work, so it is only a guess; decoding
checks it. A cut must lie directly inside the top-level ``traceEvents`` array: a cut inside a
string leaves the string open, a cut inside a nested object or array leaves the brackets
unbalanced (both fail to decode), and a cut in another top-level array is caught by two checks,
the first piece's ``traceEvents`` must end at the ``]`` appended to it (found with
:data:`~gpumagic.trace.schema.OUTLINE_DECODER`) and a middle piece may hold no key but
``traceEvents`` (:class:`~gpumagic.trace.schema.PieceTraceFile`). On any failure the caller
decodes the whole file at once, so a bad guess costs time, never correctness.

This module imports only the standard library at first (the CLI asks :func:`available_workers`
before numpy is loaded); the decoder is imported when a piece is decoded.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpumagic.trace import schema


#: No piece is smaller than this (bytes of JSON): below it, a fork and a pickle cost more than
#: the decoding they would share. A file shorter than two such pieces is decoded at once.
MIN_PIECE_BYTES = 8 << 20
#: The size pieces are cut to: the structs of one piece (about twice its text) are the most
#: that is alive at a time in each process.
PIECE_BYTES = 32 << 20
#: At most this many processes decode pieces, whatever the number of cores.
MAX_WORKERS = 8
#: In one process, a file is cut only from this size: below it, decoding it at once is a little
#: faster (no piece to verify) and its structs (about 3x the text) are not yet a burden.
ONE_PROCESS_MIN_BYTES = 4 * PIECE_BYTES

_CUT = re.compile(rb",\s*\{")
_OPEN = b'{"traceEvents":['


def available_workers() -> int:
    """The number of CPU cores this process may run on (1 where fork is not used)."""
    if not sys.platform.startswith("linux"):
        return 1
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cuts(raw: bytes | bytearray, pieces: int) -> list[int]:
    """Offsets of up to ``pieces - 1`` commas that may separate two top-level events, placed so
    that the pieces take about as long to decode; each is followed (after white space) by
    ``{``."""
    out: list[int] = []
    for target in _even_shares(raw, pieces):
        m = _CUT.search(raw, max(target, out[-1] + 1 if out else 0))
        if m is None:
            break
        out.append(m.start())
    return out


def _even_shares(raw: bytes | bytearray, pieces: int, samples: int = 64, width: int = 16 << 10) -> list[int]:
    """Offsets that split ``raw`` into ``pieces`` runs of about equal work.

    The work is mostly per duration event (decoding its fields, then one column per field;
    flow arrows are skipped and instant events are few or cheap), and events differ in size
    (a kernel's ``args`` are longer than an operator's), so equal bytes are not equal work. The
    density of duration events is estimated by counting their ``"dur"`` keys in ``samples``
    windows of ``width`` bytes spread over the text (about 1 MB read in all), and the cumulative
    estimate is inverted.
    """
    n = len(raw)
    step = n / samples
    counts = [raw.count(b'"dur"', int(k * step), min(n, int(k * step) + width)) + 1 for k in range(samples)]
    total = sum(counts)
    out, acc, k = [], 0.0, 0
    for i in range(1, pieces):
        goal = total * i / pieces
        while k < samples - 1 and acc + counts[k] < goal:
            acc += counts[k]
            k += 1
        out.append(min(n, int((k + (goal - acc) / counts[k]) * step)))
    return out


def piece(raw: bytes | bytearray, at: list[int], i: int) -> bytes | bytearray:
    """The JSON text of piece ``i`` of ``raw`` cut at the commas ``at`` (a copy)."""
    with memoryview(raw) as view:  # one copy, made by join (slicing and + would make three)
        if i == 0:
            return b"".join((view[: at[0]], b"]}"))
        if i < len(at):
            return b"".join((_OPEN, view[at[i - 1] + 1: at[i]], b"]}"))
        return b"".join((_OPEN, view[at[i - 1] + 1:]))


@contextmanager
def _piece_text(raw: bytes | bytearray, at: list[int], i: int) -> Iterator[bytes | bytearray | memoryview]:
    """Piece ``i``'s text. In a ``bytearray`` it is made in place: ``]}`` over the comma that
    ends the piece and the byte after it, and ``{"traceEvents":[`` over the bytes that end the
    piece before; the bytes are put back afterwards (a forked child, which owns a private copy
    of the pages it writes, need not care). In ``bytes`` it is a copy."""
    start = at[i - 1] + 1 - len(_OPEN) if i else 0
    if not isinstance(raw, bytearray) or start < 0:
        yield piece(raw, at, i)
        return
    end = at[i] + 2 if i < len(at) else len(raw)
    saved = [(at[i], bytes(raw[at[i]:end]))] if i < len(at) else []
    if i:
        saved.append((start, bytes(raw[start:start + len(_OPEN)])))
    try:
        if i < len(at):
            raw[at[i]:end] = b"]}"
        if i:
            raw[start:start + len(_OPEN)] = _OPEN
        with memoryview(raw) as view, view[start:end] as text:
            yield text
    finally:
        for pos, old in saved:
            raw[pos:pos + len(old)] = old


def decode_piece(raw: bytes | bytearray, at: list[int], i: int,
                 decoders: schema.Decoders | None = None) -> tuple[schema.Header, Any] | None:
    """(header fields, Part) of piece ``i``, or None when the piece does not decode as a piece of
    the trace's ``traceEvents``. ``decoders``: :data:`~schema.FAST` unless given."""
    import msgspec

    from gpumagic.trace import schema
    from gpumagic.trace.columns import extract

    decoders = decoders or schema.FAST
    last = i == len(at)
    tf: schema.PieceTraceFile | schema.FastTraceFile
    try:
        with _piece_text(raw, at, i) as text:
            if 0 < i < len(at):
                tf = decoders.piece.decode(text)
            else:
                tf = decoders.file.decode(text)
                if i == 0 and not last and not _events_end_at_the_end(text):
                    del tf  # its raw views into ``text`` (see below)
                    return None
            if tf.traceEvents is None:
                return None
            header = schema.header_of(tf) if isinstance(tf, schema.FastTraceFile) else schema.Header()
            # the operators' raw shapes are views into ``text``: read them, and free the structs,
            # before the text is released (a view cannot be released while one is alive)
            part = extract(tf.traceEvents, with_ops=True, with_comms=decoders is schema.COMMS)
            del tf
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    return header, part


def _events_end_at_the_end(text: bytes | bytearray | memoryview) -> bool:
    """Whether the top-level ``traceEvents`` of the first piece's text is closed by the ``]``
    appended to it, i.e. the cut fell inside ``traceEvents`` and not in a later array."""
    import numpy as np

    from gpumagic.trace import schema

    events = schema.OUTLINE_DECODER.decode(text).traceEvents
    if not len(events):
        return False
    start = np.frombuffer(events, dtype=np.uint8).ctypes.data - np.frombuffer(text, dtype=np.uint8).ctypes.data
    return start + len(events) == len(text) - 1


def decode_run(raw: bytes | bytearray, at: list[int], run: range, decoders: schema.Decoders | None = None) -> list | None:
    """The (header, Part) of each piece in ``run``, one piece after another (each piece's structs
    are freed before the next is decoded), or None if one fails."""
    out = []
    for i in run:
        result = decode_piece(raw, at, i, decoders)
        if result is None:
            return None
        out.append(result)
    return out


def decode_in_pieces(raw: bytes | bytearray, workers: int,
                     decoders: schema.Decoders | None = None) -> tuple[schema.Header, list] | None:
    """Decode ``raw`` in pieces, runs of them side by side in up to ``workers`` processes:
    (merged header, parts in file order), or None when the file is too small to cut, cannot
    be cut, or a piece fails. ``decoders``: :data:`~schema.FAST` unless given."""
    from gpumagic.trace.decode import first_char

    if workers < 2 or not hasattr(os, "fork"):
        workers = 1
    if len(raw) < max(2 * MIN_PIECE_BYTES, ONE_PROCESS_MIN_BYTES if workers == 1 else 0) or first_char(raw) != b"{":
        return None
    at = cuts(raw, max(2, -(-len(raw) // PIECE_BYTES)))
    if not at:
        return None
    count = len(at) + 1
    procs = min(workers, MAX_WORKERS, count)
    runs = [range(count * k // procs, count * (k + 1) // procs) for k in range(procs)]
    children: list[tuple[int, int]] = []
    try:
        try:
            for run in runs[1:]:
                children.append(_fork(raw, at, run, decoders))
        except OSError:  # no process or file to spare (EAGAIN, ENOMEM, EMFILE): one process it is
            for pid, fd in children:
                _stop(pid, fd)
            children = []
            runs = [range(count)]
        results = decode_run(raw, at, runs[0], decoders)
        if results is None:
            return None
        while children:
            pid, fd = children[0]
            _, status = os.waitpid(pid, 0)
            children.pop(0)  # reaped: only its file is left to close
            try:
                received = None if status else _receive(fd)
            finally:
                os.close(fd)
            if received is None:
                return None
            results.extend(received)
    finally:
        for pid, fd in children:  # failed or interrupted: stop the rest, and reap them
            _stop(pid, fd)
    return _merge_headers([h for h, _ in results]), [p for _, p in results]


def _fork(raw: bytes | bytearray, at: list[int], run: range, decoders: schema.Decoders | None = None) -> tuple[int, int]:
    """Fork a child that decodes ``run`` and leaves its pickled result in a file: (pid, the
    file's descriptor). The file is in memory (:func:`_result_file`), so the child writes its
    result and ends while the parent is still decoding its own run; through a pipe it would wait,
    blocked, until the parent came to read (at 860 MB of JSON, 0.3-0.6 s after both were done)."""
    fd = _result_file()
    try:
        pid = _fork_quietly()
    except OSError:
        os.close(fd)
        raise
    if pid == 0:  # the child: decode, write, leave without running any of the parent's clean-up
        code = 1
        try:
            result = decode_run(raw, at, run, decoders)
            if result is not None:
                _write_result(fd, result)
                code = 0
        finally:
            os._exit(code)
    return pid, fd


def _result_file() -> int:
    """A file descriptor for a child's result: an anonymous file in memory (``memfd_create``), or
    an unlinked temporary file where there is none; it goes away when closed."""
    try:
        return os.memfd_create("gpumagic-piece-result", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        import tempfile

        fd, path = tempfile.mkstemp(prefix="gpumagic-piece-")
        os.unlink(path)
        return fd


#: A result file's numpy buffers start at multiples of this many bytes (numpy's arrays over
#: them are then aligned, as arrays it allocates are).
_ALIGN = 64


def _write_result(fd: int, result: Any) -> None:
    """Write ``result`` to ``fd``: pickled with protocol 5, the numpy columns' memory out of band
    (written straight from the arrays, not copied into the pickle first), laid out as
    ``[stream length, buffer count, each buffer's length]`` (8 bytes each, little-endian), the
    pickle stream, then each buffer at the next multiple of :data:`_ALIGN`."""
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(result, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    _write_all(fd, b"".join(n.to_bytes(8, "little") for n in (len(stream), len(views), *(v.nbytes for v in views))))
    _write_all(fd, stream)
    at = 16 + 8 * len(views) + len(stream)
    for view in views:
        _write_all(fd, bytes(-at % _ALIGN))
        _write_all(fd, view)
        at += -at % _ALIGN + view.nbytes


def _write_all(fd: int, data: bytes | memoryview) -> None:
    with memoryview(data) as whole, whole.cast("B") as left:
        while left:
            left = left[os.write(fd, left):]


def _fork_quietly() -> int:
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork() in a process with other threads (numpy's OpenBLAS
        # pool counts). The warning is about a child that needs a lock another thread held at
        # the fork; this child takes none: it decodes, pickles, writes to a file, and leaves
        # with os._exit.
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _receive(fd: int) -> Any:
    """The result a child that ended well left in the file ``fd`` (:func:`_write_result`), or
    None if it left nothing or something unreadable. The file is mapped copy-on-write and the
    columns are numpy arrays over the mapping, not copies: the mapping lasts as long as they do."""
    import mmap

    try:
        size = os.fstat(fd).st_size
        if size < 16:
            return None
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        view = memoryview(mapped)
        length, count = int.from_bytes(view[:8], "little"), int.from_bytes(view[8:16], "little")
        at = 16 + 8 * count
        if count > size // 8 or at + length > size:
            return None
        lengths = [int.from_bytes(view[16 + 8 * k:24 + 8 * k], "little") for k in range(count)]
        stream = view[at:at + length]
        at += length
        buffers = []
        for n in lengths:
            at += -at % _ALIGN
            if at + n > size:
                return None
            buffers.append(view[at:at + n])
            at += n
        return pickle.loads(stream, buffers=buffers)
    except Exception:  # a truncated or corrupt payload: decode in one process instead
        return None


def _stop(pid: int, fd: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with suppress(ChildProcessError):  # reaped already (interrupted just after its wait)
        os.waitpid(pid, 0)
    with suppress(OSError):
        os.close(fd)


def _merge_headers(headers: list[schema.Header]) -> schema.Header:
    """The top-level fields are split between the first piece (those before ``traceEvents``) and
    the last (those after); take each from the piece that holds it."""
    from gpumagic.trace import schema

    default = schema.Header()
    merged = {f: next((getattr(h, f) for h in headers if getattr(h, f) != getattr(default, f)), getattr(default, f))
              for f in schema.HEADER_FIELDS}
    return schema.Header(**merged)
