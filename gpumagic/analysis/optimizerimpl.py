"""Which implementation ran each optimizer step, and how much of the window the steps took.

``torch.optim`` wraps every ``step()`` in ``record_function("Optimizer.step#<Class>.step")``
(``torch/optim/optimizer.py``), and what runs inside tells the implementation apart:

- ``fused``: one ``aten::_fused_<name>_`` call updates every parameter of a group (``fused=True``);
- ``foreach``: the ``aten::_foreach_*`` operators, each over a list of tensors (``foreach=True``,
  the default when every parameter is on CUDA: ``_default_to_fused_or_foreach``);
- ``for-loop``: neither, the single-tensor implementation, a handful of element-wise operators per
  parameter (the default on the CPU, whose tensors are not among foreach's default devices); said
  only of torch.optim's own classes (:data:`TORCH_OPTIM`): apex's ``FusedAdam`` runs kernels of
  its own, unknown here.

On the CPU, Adam, AdamW and Adagrad have a fused kernel (the ``fused`` argument, for CPU since
PyTorch 2.4: pytorch/pytorch#123238, ``_get_fused_kernels_supported_devices`` lists ``cpu``); SGD
has one too, but its for-loop step is one or two operators a parameter, and fusing it measured
no gain (``benchmarks/optimizer_fused.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.phases import phase_intervals

STEP_RE = re.compile(r"^Optimizer\.step#([A-Za-z_]\w*)\.step$")
#: torch.optim's own classes: a step of another class (apex's or DeepSpeed's FusedAdam, a subclass)
#: without aten's fused or foreach operators may run kernels of its own, so its implementation is
#: left unknown.
TORCH_OPTIM = frozenset({"Adadelta", "Adafactor", "Adagrad", "Adam", "Adamax", "AdamW", "ASGD", "LBFGS", "Muon",
                         "NAdam", "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam"})
FUSED_PREFIX = "aten::_fused_"
FOREACH_PREFIX = "aten::_foreach_"


@dataclass(frozen=True)
class OptimizerSteps:
    """The optimizer steps in the window."""

    calls: int  # Optimizer.step# spans
    classes: tuple[str, ...]  # their optimizer classes, sorted
    ns: int  # the union of their time, less the forward and backward passes a closure runs inside them
    intervals: iv.Intervals
    impl: str | None  # "fused", "foreach" or "for-loop" (None without a step, or another library's class)
    ops_per_call: float  # host operators inside a step, on average
    spans: iv.Intervals  # the steps' whole spans, closures included (``intervals`` leaves those out)


def optimizer_steps(ctx: Context, classes: frozenset[str] | None = None) -> OptimizerSteps:
    """The window's optimizer steps, or only those of ``classes`` (each set computed once per
    context): where several optimizers step (a ``SparseAdam`` for the embeddings beside an
    ``Adam``), what one of them costs and how it ran is its own steps' alone."""
    if classes is None:
        return ctx.memo("optimizer_steps", lambda c: _find(c, None))
    return ctx.memo("optimizer_steps:" + ",".join(sorted(classes)), lambda c: _find(c, classes))


def _find(ctx: Context, only: frozenset[str] | None) -> OptimizerSteps:
    ev, names = ctx.trace.events, ctx.trace.names
    host = ctx.masks["host"]
    is_step = ctx.host_name_ids(STEP_RE.search)
    chosen_names = is_step if only is None else ctx.host_name_ids(
        lambda n: (m := STEP_RE.search(n)) is not None and m.group(1) in only)
    rows = np.flatnonzero(ctx.events_in_window(host & chosen_names[ev.name]))
    # a step counts where its middle falls in the window: a step boundary that gpumagic's capture
    # sets in the optimizer's post-hook leaves the previous update's last microsecond inside it
    middle = ev.ts_ns[rows] + ev.dur_ns[rows] // 2
    rows = rows[(middle >= ctx.lo) & (middle < ctx.hi)]
    if not rows.size:
        return OptimizerSteps(0, (), 0, iv.empty(), None, 0.0, iv.empty())
    classes = tuple(sorted({m.group(1) for i in distinct(ev.name[rows]).tolist() if (m := STEP_RE.search(names[i]))}))
    chosen = np.zeros(len(ev.name), dtype=bool)
    chosen[rows] = True
    spans = ctx.intervals(chosen)
    # the operators inside the steps, on the steps' threads
    ops = host & ctx.masks["cpu_op"] & ~is_step[ev.name] & np.isin(ev.lane, distinct(ev.lane[rows]))
    starts, ends = spans
    k = np.searchsorted(starts, ev.ts_ns, side="right") - 1
    inside = ops & (k >= 0) & (ev.ts_ns < ends[np.maximum(k, 0)])
    inner = {names[i] for i in distinct(ev.name[inside]).tolist()}
    impl = ("fused" if any(n.startswith(FUSED_PREFIX) for n in inner) else
            "foreach" if any(n.startswith(FOREACH_PREFIX) for n in inner) else
            "for-loop" if set(classes) <= TORCH_OPTIM else None)
    own = iv.subtract(spans, _closures(ctx, spans))
    return OptimizerSteps(int(rows.size), classes, iv.total(own), own, impl, float(inside.sum()) / rows.size, spans)


def _closures(ctx: Context, spans: iv.Intervals) -> iv.Intervals:
    """The forward and backward passes that run inside the steps (``step(closure)``: LBFGS, and
    any torch.optim class given a closure), as the step phases find them: the model's time,
    not the optimizer's."""
    if not ctx.step_bounds:
        return iv.empty()
    model = iv.empty()
    for parts in phase_intervals(ctx):
        model = iv.merge(model, iv.merge(parts["forward"], parts["backward"]))
    return iv.intersect(model, spans)
