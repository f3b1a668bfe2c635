"""Work done in a forked child process, its result handed back through a file in memory.

Two parts of ``gpumagic analyze`` use a second core this way: decoding runs of a large trace's
pieces (:mod:`gpumagic.trace.pieces`) and computing the costliest metrics of a large trace while
the calling process computes the rest (:mod:`gpumagic.analysis.aside`). Both need the same few
things, kept here once:

- :func:`start` forks (Linux's ``os.fork``: the child shares the parent's memory copy-on-write,
  so a gigabyte of columns costs it nothing to see) and runs the work in the child, which writes
  its result to an anonymous file in memory and leaves with ``os._exit``, running none of the
  parent's clean-up. Through a pipe it would wait, blocked, until the parent came to read (at
  860 MB of JSON, 0.3-0.6 s after both were done); into a file it writes and ends.
- :func:`wait` reaps the child and reads its result: pickled with protocol 5, numpy arrays'
  memory out of band, so that the parent's arrays are views of the mapped file rather than
  copies of it. ``None`` when the child failed, was killed, or left something unreadable: the
  caller then does the work itself, so a failed child costs time, never an answer.
- :func:`stop` kills and reaps a child that is no longer wanted (a failure elsewhere, Ctrl-C).

A child is made only where nothing can hold a lock it would need: the command line's process,
never a notebook kernel, whose other threads (ZeroMQ, the profiler, CUDA's) may hold any lock at
the instant of the fork. The command's only other thread is the read-ahead one: it has ended by
the time pieces are dealt out and the aside child is forked, and while a large gzip is still
inflating it is only appending to the text when the early child is forked
(:func:`gpumagic.trace.pieces.start_early`), which reads nothing of it past the bytes already
inflated (the fork holds the GIL, so the thread is not in Python code then, and glibc's fork
handlers reset malloc's locks in the child).

Only the standard library is imported here, and ``pickle`` only when a result is written or
read: the command line imports this module (through :mod:`gpumagic.trace.pieces`) before it
starts reading the trace, so what it imports delays the read.
"""

from __future__ import annotations

import os
import signal
import warnings
from collections.abc import Callable
from contextlib import suppress
from typing import Any


class Child:
    """A forked child that is doing some work: its process id, the descriptor of the file in
    memory that it leaves its result in, and whether it has been reaped (its file closed): after
    that, :func:`wait` and :func:`stop` leave it alone, since its id and descriptor may already
    name another process or file. (A plain class: a dataclass took a millisecond to make at
    import, on the command line's path to reading the trace.)"""

    __slots__ = ("ended", "fd", "pid")

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd
        self.ended = False

    def __repr__(self) -> str:
        return f"Child(pid={self.pid}, fd={self.fd}, ended={self.ended})"


def start(work: Callable[[], Any]) -> Child:
    """Fork a child that calls ``work()`` and leaves the result in a file; the child ends with
    status 0 once the result is written, 1 if ``work`` raised or returned ``None``. Raises
    :class:`OSError` when no process or file can be had (EAGAIN, ENOMEM, EMFILE); nothing is left
    behind then."""
    fd = result_file()
    held = _hold_interrupts()
    try:
        pid = fork_quietly()
    except OSError:
        _release(held)
        os.close(fd)
        raise
    if pid == 0:  # the child: work, write, leave without running any of the parent's clean-up
        code = 1
        try:
            _release(held)  # a Ctrl-C from here on ends the child quietly, through os._exit below
            result = work()
            if result is not None:
                write_result(fd, result)
                code = 0
        finally:
            os._exit(code)
    _release(held)
    return Child(pid, fd)


def _hold_interrupts() -> Any:
    """Block SIGINT in this thread until :func:`_release`: a terminal's Ctrl-C goes to the whole
    process group, and one that reached a child while os.fork ran Python's after-fork hooks
    (``threading._after_fork``) printed its traceback there ("Exception ignored in ...") before the
    child's own code could end it quietly. Held across the fork, it is delivered to each process
    once the fork is done. None where signals cannot be masked."""
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _release(held: Any) -> None:
    """Restore the signal mask :func:`_hold_interrupts` replaced (a Ctrl-C held meanwhile arrives now)."""
    if held is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def wait(child: Child) -> Any:
    """Wait for ``child`` to end and return its result, or ``None`` when it failed, was killed or
    left nothing readable (or was stopped already). Its file is closed either way (the result's
    arrays keep the mapping)."""
    if child.ended:
        return None
    try:
        _, status = os.waitpid(child.pid, 0)
    except BaseException:  # interrupted while waiting: it is not reaped yet
        stop(child)
        raise
    child.ended = True
    try:
        return None if status else receive(child.fd)
    finally:
        os.close(child.fd)


def stop(child: Child) -> None:
    """Kill ``child`` if it still runs, reap it, and close its file; nothing if that was done."""
    if child.ended:
        return
    with suppress(ProcessLookupError):
        os.kill(child.pid, signal.SIGKILL)
    with suppress(ChildProcessError):  # reaped already (interrupted just after its wait)
        os.waitpid(child.pid, 0)
    child.ended = True
    with suppress(OSError):
        os.close(child.fd)


def result_file() -> int:
    """A file descriptor for a child's result: an anonymous file in memory (``memfd_create``), or
    an unlinked temporary file where there is none; it goes away when closed and unmapped."""
    try:
        return os.memfd_create("gpumagic-result", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        import tempfile

        fd, path = tempfile.mkstemp(prefix="gpumagic-result-")
        os.unlink(path)
        return fd


def fork_quietly() -> int:
    """``os.fork()``, without the warning Python 3.12+ gives in a process with other threads."""
    with warnings.catch_warnings():
        # The warning is about a child that needs a lock another thread held at the fork
        # (numpy's OpenBLAS pool counts as threads). These children take none: they compute on
        # what they inherited, pickle, write to a file, and leave with os._exit.
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


#: A result file's out-of-band buffers start at multiples of this many bytes, so that numpy's
#: arrays over them are aligned, as the arrays it allocates itself are.
ALIGN = 64


def write_result(fd: int, result: Any) -> None:
    """Write ``result`` to ``fd``: pickled with protocol 5, the memory of numpy arrays out of band
    (written straight from the arrays, not copied into the pickle first), laid out as
    ``[stream length, buffer count, each buffer's length]`` (8 bytes each, little-endian), the
    pickle stream, then each buffer at the next multiple of :data:`ALIGN`."""
    import pickle

    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(result, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    _write_all(fd, b"".join(n.to_bytes(8, "little") for n in (len(stream), len(views), *(v.nbytes for v in views))))
    _write_all(fd, stream)
    at = 16 + 8 * len(views) + len(stream)
    for view in views:
        _write_all(fd, bytes(-at % ALIGN))
        _write_all(fd, view)
        at += -at % ALIGN + view.nbytes


def _write_all(fd: int, data: bytes | memoryview) -> None:
    with memoryview(data) as whole, whole.cast("B") as left:
        while left:
            left = left[os.write(fd, left):]


def receive(fd: int) -> Any:
    """The result that :func:`write_result` left in the file ``fd``, or ``None`` if the file holds
    nothing or something unreadable (a truncated or corrupt payload). The file is mapped
    copy-on-write and the arrays are numpy arrays over the mapping, not copies (writeable: a
    write copies the page, never the file); the mapping lasts as long as they do."""
    import mmap
    import pickle

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
            at += -at % ALIGN
            if at + n > size:
                return None
            buffers.append(view[at:at + n])
            at += n
        return pickle.loads(stream, buffers=buffers)
    except Exception:  # a truncated or corrupt payload: the caller does the work itself
        return None


__all__ = ["ALIGN", "Child", "fork_quietly", "receive", "result_file", "start", "stop", "wait", "write_result"]
