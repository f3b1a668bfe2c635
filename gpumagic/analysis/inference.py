"""Inference run as if for training: grad mode left on, and dropout left in training mode.

Two facts a trace records about a forward pass that no backward pass follows:

- **Autograd nodes built.** The profiler writes an operator's ``Sequence number`` only while grad
  mode is on: the dispatcher records it for operators that reach the autograd layer under
  ``torch.is_grad_enabled()`` (``Dispatcher::runRecordFunction``); under ``torch.no_grad()`` or
  ``torch.inference_mode()`` operators carry none (checked on torch 2.13: a three-layer MLP
  records 21 under grad mode, 0 under either). The number is the thread's autograd counter,
  which advances by one each time a node of the graph is created, so a recorded operator
  followed (on its thread) by a higher number built a node; with every parameter frozen
  (``requires_grad_(False)``) the numbers stay put and no node is counted. An
  ``autograd.Function``'s ``apply`` takes a number whatever the grad mode (vLLM's ``TopK``,
  ``SortTokens`` under inference mode) and is recorded under its class name, not a
  ``namespace::op`` name: only operators with a ``::`` in their name count as building.
- **Dropout in training mode.** ``nn.Dropout`` in eval mode calls ``aten::dropout``, which returns
  its input and calls nothing; in training mode the same call draws a mask inside it
  (``aten::bernoulli_``, ``aten::mul``, ``aten::div_`` on a CPU; ``aten::native_dropout`` on a
  GPU). A dropout operator with another operator inside it is one in training mode.

Both matter only where nothing is trained: :attr:`Context.workload` is not ``"training"`` (no
backward pass or optimizer step anywhere in the trace).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.trace.model import EventTable

#: The dropout operators of ``torch.nn.functional`` (native_functions.yaml: ``dropout``,
#: ``feature_dropout``, ``alpha_dropout``, ``feature_alpha_dropout`` and their in-place forms).
DROPOUT_OPS = frozenset({"aten::dropout", "aten::dropout_", "aten::feature_dropout", "aten::feature_dropout_",
                         "aten::alpha_dropout", "aten::alpha_dropout_", "aten::feature_alpha_dropout",
                         "aten::feature_alpha_dropout_"})


@dataclass(frozen=True)
class GradMode:
    """The window's operators that ran with grad mode on (:func:`grad_mode`)."""

    #: operators that recorded a sequence number (grad mode was on for them)
    recorded: int
    #: autograd nodes those operators built (a lower bound: the last one on each thread is not
    #: counted, having no later number to compare with)
    nodes: int
    #: host time covered by the recorded operators (their union, ns) and by every operator
    grad_ns: int
    op_ns: int
    #: rows of ``trace.events`` of the operators that built a node
    rows: np.ndarray

    @property
    def grad_frac(self) -> float:
        """The share of the window's operator time that ran with grad mode on."""
        return self.grad_ns / self.op_ns if self.op_ns else 0.0


NO_GRAD = GradMode(0, 0, 0, 0, np.zeros(0, np.int64))


def grad_mode(ctx: Context) -> GradMode:
    """What the window's operators say about grad mode (computed once per context)."""
    return ctx.memo("inference.grad_mode", _grad_mode)


def _grad_mode(ctx: Context) -> GradMode:
    ev, m = ctx.trace.events, ctx.masks
    ops = ctx.events_in_window(m["cpu_op"] & m["host"])
    rows = np.flatnonzero(ops & (ev.seq >= 0))
    if not rows.size:
        return NO_GRAD
    # by thread, in time order (the table is sorted by start; a stable sort keeps it per lane)
    rows = rows[np.argsort(ev.lane[rows], kind="stable")]
    lane, seq = ev.lane[rows], ev.seq[rows]
    dispatched = ctx.host_name_ids(lambda n: "::" in n)[ev.name[rows]]
    built = np.flatnonzero((lane[1:] == lane[:-1]) & (seq[1:] > seq[:-1]) & dispatched[:-1])
    all_ops = np.flatnonzero(ops)
    return GradMode(recorded=int(rows.size), nodes=int(built.size),
                    grad_ns=iv.total(ctx.intervals(_mask(ev, rows))), op_ns=iv.total(ctx.intervals(_mask(ev, all_ops))),
                    rows=np.sort(rows[built]))


def _mask(ev: EventTable, rows: np.ndarray) -> np.ndarray:
    out = np.zeros(len(ev), dtype=bool)
    out[rows] = True
    return out


@dataclass(frozen=True)
class Dropout:
    """The window's dropout calls (:func:`dropout`)."""

    calls: int
    #: rows of ``trace.events`` of the calls that drew a mask (training mode)
    active: np.ndarray


NO_DROPOUT = Dropout(0, np.zeros(0, np.int64))


def dropout(ctx: Context) -> Dropout:
    """The window's dropout operators, and which of them ran in training mode (an operator
    inside them); computed once per context."""
    return ctx.memo("inference.dropout", _dropout)


def _dropout(ctx: Context) -> Dropout:
    ev, m = ctx.trace.events, ctx.masks
    ops = m["cpu_op"] & m["host"]
    calls = np.flatnonzero(ctx.events_in_window(ops) & ctx.host_name_ids(DROPOUT_OPS.__contains__)[ev.name])
    if not calls.size:
        return NO_DROPOUT
    active = np.zeros(calls.size, dtype=bool)
    start = ev.ts_ns[calls]
    end = start + ev.dur_ns[calls]
    for lane in distinct(ev.lane[calls]).tolist():
        here = np.flatnonzero(ev.lane[calls] == lane)
        lane_ts = ev.ts_ns[ops & (ev.lane == lane)]  # in start order
        # the thread's operators that start inside each call, the call itself included
        inside = np.searchsorted(lane_ts, end[here], side="left") - np.searchsorted(lane_ts, start[here], side="left")
        active[here] = inside > 1
    return Dropout(calls=int(calls.size), active=calls[active])


__all__ = ["DROPOUT_OPS", "NO_DROPOUT", "NO_GRAD", "Dropout", "GradMode", "dropout", "grad_mode"]
