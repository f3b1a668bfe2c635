"""DataLoader worker processes started again and again: what each start costs the loop.

Without ``persistent_workers=True``, every ``iter(loader)`` — every epoch — starts the loader's
worker processes anew, and the iterator of the epoch before shuts its own down when its last
``next`` finds the data exhausted (``torch.utils.data.DataLoader``: ``persistent_workers``,
"the data loader will not shut down the worker processes after a dataset has been consumed
once"). A gpumagic capture records the start as a range (``trace.links.WORKER_START_PREFIX``,
written by ``capture.stages``); the loop then waits for the new workers' first batch.

A start's cost to the loop is the start's range, the first ``next`` after it (the new workers'
first batch, made while they start up), and the ``next`` just before it when that one ended the
epoch (it shut the old workers down). With persistent workers all of it but the first batch's
making goes: the whole is an upper bound on what they save.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.trace.links import WORKER_START_PREFIX

#: The ``next`` that ended the epoch runs right before the start: the loop's own code between them
#: (the epoch's end, the next ``for``) is a few Python statements; one that ended earlier than
#: this before the start is the loop's last batch, not the shutdown.
ADJACENT_NS = 1_000_000
_WORKERS = re.compile(r"\((\d+) workers?\)")


@dataclass(frozen=True)
class WorkerStarts:
    count: int  # worker restarts in the window: starts after a batch of the same thread
    workers: int | None  # workers per start (the largest recorded); None: not named
    start_ns: int  # the starts' own ranges, in the window
    intervals: iv.Intervals  # starts, the first waits after them and the shutdown waits before, clipped


def worker_starts(ctx: Context) -> WorkerStarts:
    """The window's worker restarts (computed once per context): starts after a batch of the same
    thread; the loop's first start is the one persistent workers keep."""
    return ctx.memo("worker_starts", _find)


def _find(ctx: Context) -> WorkerStarts:
    ev, m = ctx.trace.events, ctx.masks
    names = ctx.trace.names
    start_ids = ctx.trace.name_ids(lambda n: n.startswith(WORKER_START_PREFIX))
    rows = np.flatnonzero(ctx.events_in_window(m["host"] & start_ids[ev.name]))
    if not rows.size:
        return WorkerStarts(0, None, 0, iv.empty())
    waits = np.flatnonzero(m["host"] & m["name_dataloader"])
    starts, ends, kept = [], [], []
    for r in rows.tolist():
        lane, s0 = ev.lane[r], int(ev.ts_ns[r])
        s1 = s0 + int(ev.dur_ns[r])
        same = waits[ev.lane[waits] == lane]
        before = same[ev.ts_ns[same] + ev.dur_ns[same] <= s0]
        if not before.size:  # no batch before it on this thread: the loop's first start, not a restart
            continue
        kept.append(r)
        starts.append(s0)
        ends.append(s1)
        after = same[ev.ts_ns[same] >= s1]
        if after.size:  # the new workers' first batch
            first = after[np.argmin(ev.ts_ns[after])]
            starts.append(int(ev.ts_ns[first]))
            ends.append(int(ev.ts_ns[first] + ev.dur_ns[first]))
        last = before[np.argmax(ev.ts_ns[before] + ev.dur_ns[before])]
        end = int(ev.ts_ns[last] + ev.dur_ns[last])
        if s0 - end <= ADJACENT_NS:  # the old workers' shutdown: the epoch's last next ran right before
            starts.append(int(ev.ts_ns[last]))
            ends.append(end)
    if not kept:
        return WorkerStarts(0, None, 0, iv.empty())
    rows = np.asarray(kept, np.int64)
    counts = [int(g) for n in {names[ev.name[r]] for r in kept} for g in _WORKERS.findall(n)]
    own = iv.clip(iv.union(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows]), ctx.lo, ctx.hi)
    return WorkerStarts(count=int(rows.size), workers=max(counts) if counts else None, start_ns=iv.total(own),
                        intervals=iv.clip(iv.union(np.asarray(starts, np.int64), np.asarray(ends, np.int64)),
                                          ctx.lo, ctx.hi))
