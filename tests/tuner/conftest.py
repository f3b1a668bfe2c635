"""The tuner must leave no worker process behind: checked after every test in this folder."""

from __future__ import annotations

import multiprocessing
import os

import pytest


def child_pids() -> list[int]:
    """Live child processes of this process (Linux /proc; empty elsewhere)."""
    me, out = os.getpid(), []
    if not os.path.isdir("/proc"):
        return out
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            out.append(int(entry))
    return out


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Children there before the test (an xdist worker also runs other modules, e.g.
    multiprocessing's resource tracker) are not the tuner's; every one the test started is gone."""
    before = set(child_pids())
    started = set(multiprocessing.active_children())  # e.g. another module's Dask cluster, kept for its tests
    yield
    assert set(multiprocessing.active_children()) <= started
    assert set(child_pids()) <= before, "the tuner left worker processes behind"
