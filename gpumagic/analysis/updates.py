"""The window's optimizer updates, and the gradients each one had to work with.

torch.optim's ``Optimizer.step`` records itself as ``Optimizer.step#<Class>.step``
(``Optimizer.profile_hook_step``; any subclass, other libraries' included, unless the step is
compiled: torch.compile drops the annotation). A wrapper that steps an inner optimizer records
both, nested: the outermost counts, once. An update that runs a forward and backward itself
(LBFGS's closure) is left out: what runs inside it is not the update's alone.

The gradients: the autograd engine writes each parameter's ``.grad`` in an ``AccumulateGrad``
node (torch/csrc/autograd/functions/accumulate_grad.h; recorded bare, and since about torch 1.11
inside an ``autograd::engine::evaluate_function:`` span too). An update's backward pass is the
nodes since the update before it; a second optimizer stepping after the same backward has none
of its own (``written`` 0).

Backward passes: the engine's node spans carry the sequence number of the forward operator that
built the node, and the numbers only grow from one forward to the next (the thread's autograd
counter), while a pass starts at its graph's root, the highest number in it. So a top-level
backward node whose number is above every earlier one starts a pass: an update after gradient
accumulation over four micro-batches follows four (nodes nested in another node, a reentrant
checkpoint's inner backward, are not counted). Traces whose backward carries no numbers (2021's)
count none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.inference import holding, nested, pass_starts
from gpumagic.analysis.phases import BACKWARD_RE

#: An optimizer update's annotation; group 1 is the optimizer's class.
UPDATE_RE = re.compile(r"^Optimizer\.step#(\w+)\.step$")
#: The engine's node that writes a parameter's gradient, bare or inside the engine's span.
ACCUMULATE_RE = re.compile(r"(^|: )torch::autograd::AccumulateGrad$")
BARE_ACCUMULATE = "torch::autograd::AccumulateGrad"
#: ``optimizer.zero_grad()``'s annotation.
ZERO_GRAD_RE = re.compile(r"^Optimizer\.zero_grad#")


@dataclass(frozen=True)
class Updates:
    """The window's outermost optimizer updates, in time order (:func:`updates`)."""

    #: rows of ``trace.events``
    rows: np.ndarray
    #: each update's optimizer class (``Adam``, ``SGD``, a wrapper's own name)
    classes: tuple[str, ...]
    #: gradients the backward before each update wrote: its AccumulateGrad nodes since the update before
    written: np.ndarray
    #: operators, annotations and launches (nested updates' annotations left out) starting inside
    #: each update, on its thread
    inside: np.ndarray
    #: backward passes since the update before (0 where the backward carries no sequence numbers)
    passes: np.ndarray
    #: start times (ns, sorted) of the window's backward passes, which ``passes`` counts
    pass_ts: np.ndarray
    #: times (ns, sorted) of the window's gradient writes, which ``written`` counts
    write_ts: np.ndarray

    @property
    def judged(self) -> np.ndarray:
        """Mask of the updates after a backward pass of their own."""
        return self.written > 0


NO_UPDATES = Updates(np.zeros(0, np.int64), (), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                     np.zeros(0, np.int64), np.zeros(0, np.int64))


def reset_times(ctx: Context) -> np.ndarray:
    """Start times (ns, sorted) of the trace's ``optimizer.zero_grad()`` calls (their
    ``Optimizer.zero_grad#`` annotation, or an operator span of that name), window or not."""
    ev, mk = ctx.trace.events, ctx.masks
    marks = mk["host"] & (mk["annotation"] | mk["cpu_op"])
    return np.sort(ev.ts_ns[marks & ctx.host_name_ids(ZERO_GRAD_RE.search)[ev.name]])


def gradient_writes(ctx: Context) -> np.ndarray:
    """Mask of the trace's gradient writes, one row a node: the bare ``AccumulateGrad`` node where
    the engine's span around it is written too (computed once per context)."""
    return ctx.memo("updates.gradient_writes", _gradient_writes)


def _gradient_writes(ctx: Context) -> np.ndarray:
    return backward_nodes(ctx, BARE_ACCUMULATE)


def backward_nodes(ctx: Context, node: str) -> np.ndarray:
    """Mask of the trace's autograd nodes named ``node`` (``torch::autograd::AccumulateGrad``,
    ``PowBackward0``), one row a node: the bare node where the engine's
    ``autograd::engine::evaluate_function: …`` span around it is recorded too."""
    ev, mk = ctx.trace.events, ctx.masks
    named: np.ndarray = mk["cpu_op"] & mk["host"] & ctx.host_name_ids(
        lambda n: n == node or n.endswith(": " + node))[ev.name]
    bare: np.ndarray = named & ctx.host_name_ids(lambda n: n == node)[ev.name]
    return bare if bare.any() else named


def updates(ctx: Context) -> Updates:
    """The window's optimizer updates (computed once per context)."""
    return ctx.memo("updates", _updates)


def _updates(ctx: Context) -> Updates:
    ev, mk = ctx.trace.events, ctx.masks
    host_ops = mk["cpu_op"] & mk["host"]
    marks = mk["host"] & (mk["annotation"] | mk["cpu_op"])
    is_update = ctx.host_name_ids(UPDATE_RE.search)[ev.name]
    rows = np.flatnonzero(ctx.events_in_window(marks & is_update))
    if not rows.size:
        return NO_UPDATES
    rows = rows[np.lexsort((-ev.dur_ns[rows], ev.ts_ns[rows]))]
    rows = rows[~nested(ev, rows)]
    backward = host_ops & ctx.host_name_ids(BACKWARD_RE.search)[ev.name]
    rows = rows[~holding(ev, rows, np.flatnonzero(backward))]  # a closure's forward and backward inside (LBFGS)
    if not rows.size:
        return NO_UPDATES
    node_ts = np.sort(ev.ts_ns[ctx.events_in_window(gradient_writes(ctx))])
    ends = ev.ts_ns[rows] + ev.dur_ns[rows]
    since = np.append(np.iinfo(np.int64).min, ends[:-1])
    written = np.searchsorted(node_ts, ev.ts_ns[rows]) - np.searchsorted(node_ts, since)
    # what an update runs: operators, annotations, launches (not Python frames, which an update
    # with nothing to do still records with --stack, nor a step marker starting at its end)
    host = np.flatnonzero(mk["host"] & (mk["cpu_op"] | mk["annotation"] | mk["runtime"]) & ~mk["name_step"] & ~is_update)
    inside = iv.weight_in_ranges(ev.ts_ns[host], ev.lane[host], None, ev.ts_ns[rows], ends, ev.lane[rows])
    classes = tuple(UPDATE_RE.search(ctx.trace.names[n]).group(1)  # type: ignore[union-attr]
                    for n in ev.name[rows].tolist())
    starts = pass_starts(ev, np.flatnonzero(ctx.events_in_window(backward & (ev.seq >= 0))))
    passes = np.searchsorted(starts, ev.ts_ns[rows]) - np.searchsorted(starts, since)
    return Updates(rows=rows, classes=classes, written=written.astype(np.int64), inside=inside,
                   passes=passes.astype(np.int64), pass_ts=starts, write_ts=node_ts)


__all__ = ["ACCUMULATE_RE", "BARE_ACCUMULATE", "NO_UPDATES", "UPDATE_RE", "ZERO_GRAD_RE", "Updates", "backward_nodes",
           "gradient_writes", "reset_times", "updates"]
