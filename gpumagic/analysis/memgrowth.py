"""Memory that climbs step after step: what each step leaves allocated behind it.

A training or inference loop in its steady state frees what a step allocated before the next
step starts, so the allocator's total at its lowest point in each step (the step's *floor*: the
parameters, gradients, optimizer state and whatever the program keeps) is the same from step to
step. A floor that rises at (nearly) every step is memory something keeps: a tensor appended to a
list each step, outputs collected on the device, a running total that is a tensor carrying its
graph (``total_loss += loss``, the example of PyTorch's FAQ, "My model reports 'cuda runtime
error(2): out of memory'"; with no backward pass to free them, the graph keeps the activations it
saved: about 2.4 MB a step for a 512-2048-512 MLP on a batch of 128, torch 2.13 on a CPU). The rise per step says how soon the device fills.

The floors come from the allocator's ``[memory]`` records (``profile_memory``, gpumagic's
``--memory``), whose ``Total Allocated`` is the allocator's live total after each event: the
primary GPU's records, or the CPU's in a trace without a GPU (PyTorch records both).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from gpumagic.analysis.context import Context
from gpumagic.trace.model import meta_block

#: c10's DeviceType for the CPU, in the allocator records.
CPU_DEVICE_TYPE = 0


@dataclass(frozen=True)
class Growth:
    """The floors of the steps that hold allocator records (:func:`growth`)."""

    #: each such step's floor (bytes), in step order
    floors: tuple[int, ...]
    #: the highest allocated total in the records of those steps (bytes)
    peak: int
    #: the memory the allocator can fill: the primary GPU's, or the machine's for the CPU (None: unknown)
    capacity: int | None
    #: "gpu" or "cpu": whose records
    device: str

    @property
    def rises(self) -> int:
        """Transitions from one such step to the next whose floor rose."""
        return sum(b > a for a, b in itertools.pairwise(self.floors))

    @property
    def falls(self) -> int:
        """Transitions from one such step to the next whose floor fell."""
        return sum(b < a for a, b in itertools.pairwise(self.floors))

    @property
    def per_step(self) -> float:
        """The last floor minus the first, over the steps between them (bytes a step; 0 with < 2 steps)."""
        return (self.floors[-1] - self.floors[0]) / (len(self.floors) - 1) if len(self.floors) > 1 else 0.0

    @property
    def steps_to_fill(self) -> float | None:
        """Steps until the rise fills what is left of ``capacity`` above ``peak``; None when it
        does not rise or the capacity is unknown."""
        if self.per_step <= 0 or not self.capacity:
            return None
        return max(self.capacity - self.peak, 0) / self.per_step


NONE = Growth((), 0, None, "")


def growth(ctx: Context) -> Growth:
    """The step floors of ``ctx``'s steps (computed once per context)."""
    return ctx.memo("memgrowth", _growth)


def _growth(ctx: Context) -> Growth:
    mem = ctx.trace.memory
    if ctx.device >= 0:
        sel, device = ctx.memory_records(), "gpu"
        info = ctx.device_info
        capacity = info.total_memory_bytes if info and info.total_memory_bytes > 0 else None
    else:
        sel, device = mem.device_type == CPU_DEVICE_TYPE, "cpu"
        machine = meta_block(ctx.trace.meta, "machine").get("memory_bytes")
        capacity = machine if isinstance(machine, int) and machine > 0 else None
    rows = np.flatnonzero(sel & (mem.allocated >= 0))
    if rows.size < 2 or len(ctx.step_bounds) < 2:
        return NONE
    ts = mem.ts_ns[rows]  # in file order: the pieces of a file are concatenated, not sorted
    order = np.argsort(ts, kind="stable")
    ts, allocated = ts[order], mem.allocated[rows][order]
    floors, peak = [], 0
    for lo, hi in ctx.step_bounds:
        a, b = np.searchsorted(ts, (lo, hi))
        if b > a:
            floors.append(int(allocated[a:b].min()))
            peak = max(peak, int(allocated[a:b].max()))
    if len(floors) < 2:
        return NONE
    return Growth(floors=tuple(floors), peak=peak, capacity=capacity, device=device)


__all__ = ["NONE", "Growth", "growth"]
