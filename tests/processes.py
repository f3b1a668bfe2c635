"""Test helper: the child processes of this process (the forked decoders and aside children must
all be gone after each call)."""

from __future__ import annotations

import os


def children() -> set[int]:
    """This process's child processes, living or not yet reaped (Linux: /proc/self/task/*/children)."""
    out: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as fh:
                out.update(int(p) for p in fh.read().split())
        except OSError:  # the thread ended meanwhile
            pass
    return out
