"""glibc allocator settings for gpumagic's own short-lived processes: freed memory kept for reuse.

Memory that a process has never touched costs a page fault per 4 KiB page the first time it is
written, in which the kernel finds and zeroes a page; on a virtual machine the host may have to
provide it too. glibc's ``malloc`` hands large blocks (from 128 KiB, raised as far as 32 MiB as
blocks are freed) straight back to the kernel when they are freed, and trims the heap's free top
above a threshold, so a process that makes and frees many large arrays pays those faults again
and again. ``mallopt(3)`` changes that for the calling process only.

Only processes that gpumagic owns call this: the command line's (``gpumagic analyze`` of a large
trace, :mod:`gpumagic.shells.cli.analyze`) and a job's pool workers (:mod:`gpumagic.jobs.executors`),
never a notebook kernel, whose memory is the user's. Elsewhere than Linux with glibc (macOS,
musl) nothing is changed.
"""

from __future__ import annotations

import sys

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
#: 32 MiB: the highest that glibc's own, dynamic mmap threshold goes on a 64-bit system
#: (``DEFAULT_MMAP_THRESHOLD_MAX`` in malloc.c). Set at the start, every block under it comes
#: from the heap at once; on the 860 MB trace 256 MiB or 1 GiB gave more page faults or a larger
#: peak, not less time.
LARGE_MMAP_THRESHOLD = 32 << 20


def mallopt(settings: dict[int, int]) -> bool:
    """Apply ``{parameter: value}`` to this process's glibc allocator, in order; whether every
    setting was taken. Not Linux, not glibc, or no C library to ask: nothing is changed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: not glibc's mallopt
            return False
        return all([bool(libc.mallopt(param, value)) for param, value in settings.items()])
    except (OSError, AttributeError, TypeError):
        return False


__all__ = ["LARGE_MMAP_THRESHOLD", "M_MMAP_THRESHOLD", "M_TOP_PAD", "M_TRIM_THRESHOLD", "mallopt"]
