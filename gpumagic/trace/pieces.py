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
parts (numpy columns and small lists, pickled) in a file in memory and leaves with ``os._exit``
(:mod:`gpumagic._forked`).

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
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gpumagic import _forked

if TYPE_CHECKING:
    from gpumagic.trace import schema
    from gpumagic.trace.files import Progress


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

#: How much more the first piece of a file costs per duration event than the others (its
#: header, and the outline decode that checks its cut, _events_end_at_the_end), so it is given
#: fewer events. Cut in two with equal shares, the 54 MB V100 trace's first piece took 0.135 s
#: against 0.110 s for the second (0.017 s of it the check); with 1.12, 0.104 against 0.113 s, the
#: MI300X capture's 0.076 against 0.073 s, the ResNet-50's 0.056 against 0.049 s (the child that
#: decodes the second also pickles and writes it, so the first may be a little shorter).
FIRST_PIECE_WEIGHT = 1.12

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


def cuts(raw: bytes | bytearray, pieces: int, start: int = 0, end: int | None = None) -> list[int]:
    """Offsets of up to ``pieces - 1`` commas that may separate two top-level events, placed so
    that the pieces of ``raw[start:end]`` take about as long to decode; each is followed (after
    white space) by ``{`` before ``end``."""
    end = len(raw) if end is None else end
    out: list[int] = []
    for target in _even_shares(raw, pieces, start, end):
        m = _CUT.search(raw, max(target, out[-1] + 1 if out else start), end)
        if m is None:
            break
        out.append(m.start())
    return out


def _even_shares(raw: bytes | bytearray, pieces: int, start: int = 0, end: int | None = None,
                 samples: int = 64, width: int = 16 << 10) -> list[int]:
    """Offsets that split ``raw[start:end]`` into ``pieces`` runs of about equal work.

    The work is mostly per duration event (decoding its fields, then one column per field;
    flow arrows are skipped and instant events are few or cheap), and events differ in size
    (a kernel's ``args`` are longer than an operator's), so equal bytes are not equal work. The
    density of duration events is estimated by counting their ``"dur"`` keys in ``samples``
    windows of ``width`` bytes spread over the span (about 1 MB read in all), and the cumulative
    estimate is inverted.
    """
    end = len(raw) if end is None else end
    n = end - start
    step = n / samples
    counts = [raw.count(b'"dur"', start + int(k * step), min(end, start + int(k * step) + width)) + 1
              for k in range(samples)]
    total = sum(counts)
    # the first piece of a file costs more per event: the header, and the outline decode that
    # checks its cut (_events_end_at_the_end), so it gets fewer events
    lead = 1 / FIRST_PIECE_WEIGHT if start == 0 else 1.0
    out, acc, k = [], 0.0, 0
    for i in range(1, pieces):
        goal = total * (i - 1 + lead) / (pieces - 1 + lead)
        while k < samples - 1 and acc + counts[k] < goal:
            acc += counts[k]
            k += 1
        out.append(start + min(n, int((k + (goal - acc) / counts[k]) * step)))
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


class Early:
    """A child started on the first pieces of a text that was still being inflated
    (:func:`start_early`): it decodes pieces ``0 .. len(at) - 1``, cut at ``at``, with ``decoders``.
    (A plain class: the command line imports this module before it starts reading.)"""

    __slots__ = ("at", "child", "decoders")

    def __init__(self, child: _forked.Child, at: list[int], decoders: schema.Decoders) -> None:
        self.child = child
        self.at = at
        self.decoders = decoders


#: An early child is started only for a gzip trace that inflates to at least this many bytes:
#: below it the inflation takes less time than the imports it runs beside.
EARLY_MIN_BYTES = 4 * PIECE_BYTES
#: How often :func:`start_early` looks at the inflation's progress while it waits (seconds).
EARLY_POLL_S = 0.002


def start_early(progress: Progress, workers: int, decoders: schema.Decoders | None = None) -> Early | None:
    """While a large gzip trace is still being inflated (``progress``, filled by another thread:
    :class:`gpumagic.trace.files.Progress`), fork a child that decodes the pieces of what is
    inflated already, so that one core decodes while the other inflates; ``None`` when there is
    nothing to gain (one worker, a small or finished text, too little inflated yet) or no process
    to be had. :func:`decode_in_pieces` takes it (``early=``) and decodes the rest; a caller that
    does not get that far must :func:`stop_early` it.

    This waits (sleeping, so that the reading thread has the GIL) until ``1 / (workers + 2)`` of
    the text is inflated, and the child takes that much: once the inflation ends, the other
    processes share the rest, and the early child, which started sooner, ends about when they
    do. On 2 cores (the 860 MB V100 trace x20), a quarter ended the decode 0.2-0.3 s sooner than
    with no early child; a third, 0.1-0.2 s (three processes then shared two cores for longer);
    a fifth, about as a quarter. The bytes it reads are final (inflation only appends), and its
    pieces are verified by decoding as any piece is."""
    from gpumagic.trace import schema
    from gpumagic.trace.decode import first_char

    if workers < 2 or not hasattr(os, "fork"):
        return None
    while progress.text is None and not progress.ended:  # the compressed file is still being read
        time.sleep(EARLY_POLL_S)
    if progress.text is None or progress.total < EARLY_MIN_BYTES:
        return None
    share = progress.total // (workers + 2)
    while progress.done < share and not progress.ended:  # the reading thread has the GIL meanwhile
        time.sleep(EARLY_POLL_S)
    text, end = progress.text, min(progress.done, share)
    if progress.ended or end < MIN_PIECE_BYTES or first_char(text[:4096]) != b"{":
        return None
    count = max(1, round(end / PIECE_BYTES))
    at = cuts(text, count, 0, end)
    last = _CUT.search(text, max(end - MIN_PIECE_BYTES // 2, at[-1] + 1 if at else 0), end)
    if last is None or len(at) != count - 1:
        return None
    at.append(last.start())
    decoders = decoders or schema.FAST
    try:
        child = _fork(text, at, range(len(at)), decoders)
    except OSError:
        return None
    return Early(child, at, decoders)


def stop_early(early: Early | None) -> None:
    """Stop and reap an early child that will not be used."""
    if early is not None:
        _forked.stop(early.child)


def decode_in_pieces(raw: bytes | bytearray, workers: int, decoders: schema.Decoders | None = None,
                     early: Early | None = None) -> tuple[schema.Header, list] | None:
    """Decode ``raw`` in pieces, runs of them side by side in up to ``workers`` processes:
    (merged header, parts in file order), or None when the file is too small to cut, cannot
    be cut, or a piece fails. ``decoders``: :data:`~schema.FAST` unless given. ``early``: a child
    :func:`start_early` made on the first pieces of ``raw``, which this waits for (or stops,
    whatever happens)."""
    try:
        return _decode_in_pieces(raw, workers, decoders, early)
    finally:
        stop_early(early)  # not used, or interrupted before it was: never left running


def _decode_in_pieces(raw: bytes | bytearray, workers: int, decoders: schema.Decoders | None,
                      early: Early | None) -> tuple[schema.Header, list] | None:
    from gpumagic.trace import schema
    from gpumagic.trace.decode import first_char

    decoders = decoders or schema.FAST
    if early is not None and (early.decoders is not decoders or early.at[-1] + 2 > len(raw) or workers < 2):
        stop_early(early)
        early = None
    if workers < 2 or not hasattr(os, "fork"):
        workers = 1
    if early is None and (len(raw) < max(2 * MIN_PIECE_BYTES, ONE_PROCESS_MIN_BYTES if workers == 1 else 0)
                          or first_char(raw) != b"{"):
        return None
    # the pieces an early child has taken come first; the rest of the text is cut after them
    done = list(early.at) if early is not None else []
    start = done[-1] + 1 if done else 0
    at = done + cuts(raw, max(1 if done else 2, -(-(len(raw) - start) // PIECE_BYTES)), start)
    if not at:
        return None
    count = len(at) + 1
    first = len(done)
    procs = min(workers, MAX_WORKERS, count - first)
    runs = [range(first + (count - first) * k // procs, first + (count - first) * (k + 1) // procs) for k in range(procs)]
    # in file order: the early child's run, this process's, then the other children's
    children: list[_forked.Child] = [early.child] if early is not None else []
    try:
        try:
            for run in runs[1:]:
                children.append(_fork(raw, at, run, decoders))
        except OSError:  # no process or file to spare (EAGAIN, ENOMEM, EMFILE): this one decodes the rest
            ours = 1 if first else 0  # the early child, which runs on
            for child in children[ours:]:
                _forked.stop(child)
            children = children[:ours]
            runs = [range(first, count)]
        mine = decode_run(raw, at, runs[0], decoders)
        if mine is None:
            return None
        results = []
        if first:
            received = _forked.wait(children.pop(0))  # reaped and closed, even if interrupted
            if received is None:
                return None
            results.extend(received)
        results.extend(mine)
        while children:
            received = _forked.wait(children.pop(0))
            if received is None:
                return None
            results.extend(received)
    finally:
        for child in children:  # failed or interrupted: stop the rest, and reap them
            _forked.stop(child)
    return _merge_headers([h for h, _ in results]), [p for _, p in results]


def _fork(raw: bytes | bytearray, at: list[int], run: range, decoders: schema.Decoders | None = None) -> _forked.Child:
    """Fork a child that decodes ``run`` and leaves its result in a file in memory
    (:func:`gpumagic._forked.start`)."""
    return _forked.start(lambda: decode_run(raw, at, run, decoders))


def _merge_headers(headers: list[schema.Header]) -> schema.Header:
    """The top-level fields are split between the first piece (those before ``traceEvents``) and
    the last (those after); take each from the piece that holds it."""
    from gpumagic.trace import schema

    default = schema.Header()
    merged = {f: next((getattr(h, f) for h in headers if getattr(h, f) != getattr(default, f)), getattr(default, f))
              for f in schema.HEADER_FIELDS}
    return schema.Header(**merged)
