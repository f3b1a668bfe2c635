"""The data-loader wait batch by batch, and whether the DataLoader ran worker processes.

PyTorch names the span of each ``next(loader)`` after the iterator that made it
(``torch.utils.data.DataLoader``: ``enumerate(DataLoader)#<iterator class>.__next__``):
``_SingleProcessDataLoaderIter`` loads in the main process (``num_workers=0``),
``_MultiProcessingDataLoaderIter`` receives batches from worker processes (torchdata's
``StatefulDataLoader`` names its own the same way, with ``Stateful`` inside). A plain trace says
so even where no CPU sample counts the workers.

Each merged span of the wait is one batch the loop waited for; their median is the wait per
batch, which the data-loader advice weighs against what receiving a batch from a worker costs
the main process (:data:`HANDOFF_MS`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic._arrays import distinct, median_of
from gpumagic.analysis.context import Context
from gpumagic.analysis.loaderrestart import worker_starts

#: Parts of the iterator classes' names: torch's ``_SingleProcessDataLoaderIter`` and
#: ``_MultiProcessingDataLoaderIter``, and torchdata's ``StatefulDataLoader`` ones
#: (``_StatefulSingleProcessDataLoaderIter``, ``_StatefulMultiProcessingDataLoaderIter``).
SINGLE = "SingleProcessDataLoaderIter"
MULTI = "MultiProcessingDataLoaderIter"
#: What the main process pays to receive one batch from a worker process, whatever the worker
#: did to make it: the batch's pickled handles come through a queue, and under PyTorch's default
#: ``file_descriptor`` sharing strategy each tensor's shared memory is fetched from the worker
#: over a socket (``multiprocessing.resource_sharer``) and mapped. Measured on this project's
#: 2-core machine (PyTorch 2.13, a worker always ahead, ``benchmarks/loader_handoff.py``, which
#: prints it for the machine it runs on): 0.42 ms for a batch of one small tensor, 0.54 ms for two
#: (inputs and labels), 0.85 ms for four; loading the same batches in the main process took
#: 0.06-0.18 ms. A batch that loads in less than this in the main process loads no faster from a
#: worker: the worker moves the loading off the main thread, the hand-off stays on it. With
#: ``pin_memory=True`` on a GPU machine, DataLoader's pin-memory thread receives the batches
#: instead, but it needs the GIL for them: with that thread started and pinning made a no-op (a
#: CPU build has no pinned memory), a loop over 64 small samples took 1.56 ms a step with one
#: worker and 0.59 ms with none.
HANDOFF_MS = 0.5
#: A single-process batch up to this long is close to a hand-off: the hand-off differs between
#: machines (0.44-0.90 ms here, by the tensors in a batch), and a profiled wait overstates the
#: loading (each recorded operator costs the profiler 0.28-0.72 us here, by the capture options:
#: about 400 of them for a batch of 64 small samples), so workers may save little or cost more,
#: and the finding adds the measurement that settles it.
MARGINAL_MS = 2 * HANDOFF_MS


@dataclass(frozen=True)
class LoaderWait:
    batches: int  # merged data-loader spans in the window: one per batch waited for
    median_ms: float | None  # the median wait per batch (None: no batch)
    in_workers: bool | None  # the iterator was the multi-process one; None: unnamed or both kinds
    #: the median time between the end of one wait and the start of the next: the loop's own work
    #: per batch (None: fewer than two batches)
    between_ms: float | None = None
    #: workers restarted in the window (``analysis.loaderrestart``: each epoch without persistent
    #: workers); new workers start behind, and the first batches of each epoch wait for them
    restarts: int = 0


def loader_wait(ctx: Context) -> LoaderWait:
    return ctx.memo("loader_wait", _loader_wait)


def _loader_wait(ctx: Context) -> LoaderWait:
    starts, ends = ctx.cat_union["dataloader"]
    if not len(starts):
        return LoaderWait(0, None, None)
    m = ctx.masks
    ids = distinct(ctx.trace.events.name[ctx.events_in_window(m["name_dataloader"] & m["host"])])
    names = [ctx.trace.names[i] for i in ids.tolist()]
    multi, single = any(MULTI in n for n in names), any(SINGLE in n for n in names)
    kind = None if multi == single else multi
    between = round(median_of(starts[1:] - ends[:-1]) / 1e6, 4) if len(starts) > 1 else None
    return LoaderWait(len(starts), round(median_of(ends - starts) / 1e6, 4), kind, between, worker_starts(ctx).count)


def main_waits(ctx: Context) -> np.ndarray:
    """Start times (ns, sorted) of the main thread's ``next(loader)`` spans in the window: one a
    batch the loop asked for."""
    ev, m = ctx.trace.events, ctx.masks
    return np.sort(ev.ts_ns[ctx.events_in_window(m["name_dataloader"] & m["host"] & (ev.lane == ctx.main_lane))])


def worker_gain_share(median_ms: float | None, in_workers: bool | None) -> float:
    """The share of a single-process loader's wait that workers could take off the main thread:
    each batch still costs the main process :data:`HANDOFF_MS` to receive. 1 when the trace
    does not show a single-process loader or the wait per batch is unknown."""
    if in_workers is not False or not median_ms:
        return 1.0
    return max(0.0, 1.0 - HANDOFF_MS / median_ms)
