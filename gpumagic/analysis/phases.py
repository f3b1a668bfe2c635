"""Each step split into the phases a training loop is written in: data, forward, backward,
optimizer, evaluation, other (``metrics.phases``, docs/metrics.md).

Measured on the host, on the same step bounds as ``metrics.steps`` (``Context.step_bounds``:
the ``ProfilerStep#`` annotation, extended to the end of the GPU work it launched), so the six
phases of a step add up to its duration. What marks each phase in a torch.profiler trace:

- ``data``: the DataLoader's ``enumerate(DataLoader)#…__next__`` spans (the wait for the next
  batch; PyTorch's ``torch/utils/data/dataloader.py`` records them with ``record_function``);
- ``optimizer``: ``Optimizer.step#<Class>.step`` and ``Optimizer.zero_grad#<Class>.zero_grad``
  (``torch/optim/optimizer.py`` wraps both in ``record_function``), less the forward and backward
  passes a step runs itself (``LBFGS.step(closure)``: :class:`_Closures`);
- ``backward``: from the first to the last event of the autograd engine in each backward pass
  of the step (``autograd::engine::evaluate_function: …``, the ``*Backward*`` nodes and
  everything on the engine's own thread, which ``loss.backward()`` hands the work to); a pass
  ends where an operator of the main thread starts outside the engine's events, so the forward
  passes of later micro-batches (gradient accumulation) are forward, not backward;
- ``forward``: from the step's first operator of the forward pass to the end of the last
  backward pass, less the backward passes (the loss included), or, without a backward (inference), from the step's first host operator
  to its last. The forward pass's first operator is the first whose work the backward undoes:
  an operator ``aten::x_y`` whose node ``XYBackward<n>`` the step's backward evaluates (the
  autograd engine names a node after the operator that made it: ``aten::addmm`` →
  ``AddmmBackward0``; an autograd Function's after the Function, torch.compile's
  ``CompiledFunction`` → ``CompiledFunctionBackward``), or any operator enclosing one; a layer's
  operator before that one (:data:`LAYER_OPS`: a matmul, a convolution, an embedding, attention)
  starts it instead — a part of the model that builds no node (a frozen backbone, a teacher under
  ``torch.no_grad()``) runs its forward there; and a call whose sequence number shows it built
  no node (:func:`outer_calls`: a random augmentation of the batch whose ``aten::fill_`` shares a
  name with the model's) does not start it. The loop's own work before it — metrics on
  the last step's output, ``.tolist()``, logging, after ``zero_grad`` — is ``other``, not the
  model's forward; with no such operator, the step's first host operator starts it;
- a ``record_function`` span named like a phase (``"forward"``, ``"backward"``,
  ``"optimizer"``, ``"data"``: :data:`PHASE_ANNOTATIONS`) marks that phase where present;
- ``evaluation``: an evaluation loop inside the step (a module switched to eval mode and back
  with no optimizer step between: gpumagic's step timer, the ``evaluation`` segments of
  :mod:`gpumagic.analysis.segments`), with its own batches' waits and forward passes; zero in a
  trace that gpumagic did not record;
- ``other``: the rest (host work between the phases, and the tail where only the GPU still
  runs the step's work).

A moment that two phases claim goes to the first of :data:`PRIORITY` (evaluation, data,
optimizer, backward, forward): an evaluation's loader waits and forward passes are evaluation,
a data wait inside the forward pass is data, an optimizer that overlaps the last backward
kernels' launches is optimizer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpumagic._arrays import distinct, median_of
from gpumagic.analysis import everystep
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.names import is_comm_host
from gpumagic.analysis.recompute import recompute
from gpumagic.trace.links import EVALUATE_PREFIX
from gpumagic.trace.model import Kind

PHASES = ("data", "forward", "backward", "optimizer", "evaluation", "other")
PRIORITY = ("evaluation", "data", "optimizer", "backward", "forward")
OPTIMIZER_RE = re.compile(r"^Optimizer\.(step|zero_grad)#")
BACKWARD_RE = re.compile(r"(^autograd::engine::|Backward\d*$|^torch::autograd::)")
#: ``record_function`` names that mark a phase (case-insensitive, exact).
PHASE_ANNOTATIONS = {"data": "data", "dataloader": "data", "load_batch": "data", "forward": "forward",
                     "model_forward": "forward", "forward_pass": "forward", "backward": "backward",
                     "backward_pass": "backward", "loss.backward": "backward", "optimizer": "optimizer",
                     "optimizer_step": "optimizer", "optimizer.step": "optimizer"}
MS = 1e6
#: An operator that writes its first argument in place (``aten::mul_``, ``aten::copy_``,
#: ``aten::_foreach_lerp_``): the name ends in ``_``.
IN_PLACE_RE = re.compile(r"^aten::_?[a-z][a-z0-9_]*[a-z0-9]_$")

#: Operators that compute a layer with parameters, as the profiler records the one that builds its
#: autograd node (checked on torch 2.13: ``nn.Linear`` → ``aten::addmm`` or ``aten::mm``,
#: ``nn.Conv2d`` → ``aten::convolution``, ``nn.Embedding`` → ``aten::embedding``, attention →
#: ``aten::bmm``); a metric's ``sigmoid``, ``cat`` or ``clone`` builds none of these.
LAYER_OPS = frozenset({"aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                       "aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
                       "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d",
                       "aten::embedding", "aten::embedding_bag", "aten::_embedding_bag", "aten::lstm", "aten::gru",
                       "aten::rnn_tanh", "aten::rnn_relu", "aten::gru_cell", "aten::lstm_cell", "aten::rnn_tanh_cell",
                       "aten::rnn_relu_cell", "aten::scaled_dot_product_attention",
                       "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                       "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_native_multi_head_attention"})


def _ms(ns: float) -> float:
    return round(float(ns) / MS, 4)


def phase_intervals(ctx: Context) -> list[dict[str, iv.Intervals]]:
    """Per step, each phase's time as an exclusive interval set inside the step's bounds
    (computed once per context)."""
    return ctx.memo("phases", _phase_intervals)


def _phase_intervals(ctx: Context) -> list[dict[str, iv.Intervals]]:
    ev, m, names = ctx.trace.events, ctx.masks, ctx.trace.names
    host = m["host"]
    annot = {p: np.zeros(len(names), bool) for p in PRIORITY}
    for i in np.flatnonzero(ctx.host_name_ids(lambda n: n.lower() in PHASE_ANNOTATIONS)).tolist():
        annot[PHASE_ANNOTATIONS[names[i].lower()]][i] = True
    opt_names = ctx.host_name_ids(OPTIMIZER_RE.search)  # every use below selects host events
    bwd_names = ctx.host_name_ids(BACKWARD_RE.search)
    ann_rows = host & ((ev.kind == Kind.ANNOTATION) | (ev.kind == Kind.CPU_OP))
    data_rows = np.flatnonzero(host & (m["name_dataloader"] | (annot["data"][ev.name] & ann_rows)))
    opt_rows = np.flatnonzero(host & (opt_names[ev.name] | (annot["optimizer"][ev.name] & ann_rows)))
    engine_lanes = distinct(ev.lane[host & bwd_names[ev.name] & (ev.lane != ctx.main_lane)])
    bwd = host & (bwd_names[ev.name] | (annot["backward"][ev.name] & ann_rows)
                  | (np.isin(ev.lane, engine_lanes) & (ev.lane != ctx.main_lane) & ~m["name_step"]))
    bwd_rows = np.flatnonzero(bwd)
    fwd_ann = np.flatnonzero(annot["forward"][ev.name] & ann_rows)
    makes_node = _makes_backward_node(ctx)
    # where a forward may start before its first node: a layer's operator, a collective (DDP)
    starts = ctx.host_name_ids(LAYER_OPS.__contains__) | ctx.host_name_ids(is_comm_host)
    built = _may_build(ctx)
    ops = np.flatnonzero(host & (ev.lane == ctx.main_lane) & (m["cpu_op"] | m["python"] | m["runtime"])
                         & ~m["name_dataloader"] & ~opt_names[ev.name])
    data_spans, opt_spans, bwd_spans, fwd_spans = (_Spans(ev, r) for r in (data_rows, opt_rows, bwd_rows, fwd_ann))
    op_s = ev.ts_ns[ops]
    cpu_s = ev.ts_ns[ops[m["cpu_op"][ops]]]  # the main thread's operators, in start order
    closures: _Closures | None = None  # read only for steps whose optimizer runs the backward
    evals = everystep.evaluation_spans(ctx)[0]
    eval_iv = iv.union(np.array([a for a, _ in evals], dtype=np.int64), np.array([b for _, b in evals], dtype=np.int64))
    out = []
    for lo, hi in ctx.step_bounds:
        data = data_spans.within(lo, hi)
        opt = opt_all = opt_spans.within(lo, hi)
        b = bwd_spans.hull(lo, hi)
        closure = iv.empty()
        if b[0].size:  # one backward pass, or several (gradient accumulation)
            b = _passes(bwd_spans.within(lo, hi), cpu_s[slice(*np.searchsorted(cpu_s, (lo, hi)))])
            inner = iv.contains(opt, b[0])
            if inner.any():  # passes run by the optimizer's step itself: a closure (LBFGS)
                closures = closures or _Closures(ctx, ops, makes_node)
                closure = closures.forwards(opt, (b[0][inner], b[1][inner]))
                opt = iv.subtract(opt, iv.merge(closure, b))
                outer = (b[0][~inner], b[1][~inner])
            else:
                outer = b
        else:
            outer = b
        fwd_end = outer[0][0] if outer[0].size else None
        a, z = np.searchsorted(op_s, (lo, hi if fwd_end is None else min(hi, fwd_end)))
        sel = ops[a:z]  # the step's host operators (before the backward, when there is one)
        # forward: the step's host operators before the backward, minus data and optimizer time
        sel = sel[~iv.contains(data, ev.ts_ns[sel]) & ~iv.contains(opt_all, ev.ts_ns[sel])]
        f = iv.empty()
        if sel.size:
            # to the end of the last backward pass: the forward passes of later micro-batches lie
            # between the passes (the backward keeps its own time: it comes first in PRIORITY)
            f_hi = int(outer[1][-1]) if fwd_end is not None else int((ev.ts_ns[sel] + ev.dur_ns[sel]).max())
            f_lo = _forward_start(ev, sel, makes_node, m["cpu_op"], starts, built) if fwd_end is not None else int(ev.ts_ns[sel].min())
            f = iv.clip(iv.union(np.array([f_lo]), np.array([f_hi])), lo, hi)
        f = iv.merge(iv.merge(f, closure), fwd_spans.within(lo, hi))
        raw = {"evaluation": iv.clip(eval_iv, lo, hi), "data": data, "optimizer": opt, "backward": b, "forward": f}
        covered, parts = iv.empty(), {}
        for p in PRIORITY:
            parts[p] = iv.subtract(raw[p], covered)
            covered = iv.merge(covered, raw[p])
        parts["other"] = iv.gaps(covered, lo, hi)
        out.append(parts)
    return out


def main_op_starts(ctx: Context) -> np.ndarray:
    """Start times (ns, in order) of the main thread's operator calls, nested ones too (computed
    once per context): what the rules that count a step's calls search."""
    def find(c: Context) -> np.ndarray:
        ev = c.trace.events
        return np.sort(ev.ts_ns[c.masks["cpu_op"] & (ev.lane == c.main_lane)])
    return ctx.memo("main_op_starts", find)


_NODE_RE = re.compile(r"(?:^|: )([A-Za-z0-9_]+?)Backward\d*$")


def _key(name: str) -> str:
    return name.replace("_", "").lower()


def _makes_backward_node(ctx: Context) -> np.ndarray:
    """Per name id: an operator whose backward node (``aten::x_y`` → ``XYBackward0``, compared
    without case and underscores) is evaluated somewhere in the trace; an autograd Function's
    too (``CompiledFunction`` → ``CompiledFunctionBackward``: torch.compile's graph, a custom
    Function)."""
    nodes = {_key(mt.group(1)) for n in ctx.trace.names if "Backward" in n and (mt := _NODE_RE.search(n))}
    if not nodes:
        return np.zeros(len(ctx.trace.names), bool)
    return ctx.host_name_ids(lambda n: _key(n.removeprefix("aten::")) in nodes)


@dataclass(frozen=True)
class OuterCalls:
    """The main thread's outermost operator calls (the backward's left out), in start order, and
    what their sequence numbers say (:func:`outer_calls`)."""

    rows: np.ndarray  # rows of ``trace.events``
    numbered: np.ndarray  # bool: the call carries a number (grad mode was on)
    idle: np.ndarray  # bool: numbered, and the next numbered call after it carries the same one: it built no node
    any_numbers: bool  # the trace's calls carry numbers at all (else nothing can be told)


def outer_calls(ctx: Context) -> OuterCalls:
    """The profiler writes an operator's ``Sequence number`` only under grad mode and only where
    the call passes the autograd layer — an outermost call, not the operators a composite one
    calls beneath it (``aten::mean``'s ``aten::sum`` and ``aten::fill_`` carry none) — and the
    number is the thread's autograd counter, which advances with each node built
    (:mod:`gpumagic.analysis.inference`). An outermost call whose number the next numbered call
    (after it ends) still carries built none, nor did anything inside it: its inputs need no grad
    (a random augmentation of the batch, a frozen layer). A call without a number that writes in
    place (``mul_``, ``lerp_``, ``copy_``, ``torch._foreach_lerp_``: grad mode off) is the loop
    updating tensors itself — an EMA teacher, a target network's ``load_state_dict`` — and is
    idle too. An outermost call without a number around calls with one (torch.compile's
    ``Torch-Compiled Region`` around its ``CompiledFunction``) counts as numbered, judged by the
    first number inside it. The window's last numbered call is not known to be idle. Computed
    once per context."""
    def make(c: Context) -> OuterCalls:
        ev, m = c.trace.events, c.masks
        bwd_names = c.host_name_ids(BACKWARD_RE.search)
        rows = np.flatnonzero(m["cpu_op"] & m["host"] & (ev.lane == c.main_lane) & ~bwd_names[ev.name])
        order, outer = iv.outermost(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows])
        top = rows[order][outer]
        numbered_rows = rows[ev.seq[rows] >= 0]
        numbered = ev.seq[top] >= 0
        idle = np.zeros(top.size, dtype=bool)
        if numbered_rows.size:
            n_ts, n_seq = ev.ts_ns[numbered_rows], ev.seq[numbered_rows]
            first = np.searchsorted(n_ts, ev.ts_ns[top])  # the call's own number, or the first inside it
            after = np.searchsorted(n_ts, ev.ts_ns[top] + ev.dur_ns[top])
            # a wrapper without a number of its own around calls with one passed the autograd layer
            # all the same: a "Torch-Compiled Region" around its CompiledFunction, which builds the node
            numbered |= after > first
            known = numbered & (after < n_ts.size)
            idle[known] = n_seq[after[known]] <= n_seq[first[known]]
            # grad mode off and writing in place: the loop's own update of tensors (an EMA of the
            # weights, a target network's sync), which builds no node whatever its name
            writes = c.host_name_ids(lambda n: bool(IN_PLACE_RE.match(n)))[ev.name[top]]
            idle |= ~numbered & writes
        return OuterCalls(top, numbered, idle, bool(numbered_rows.size))
    return ctx.memo("phases.outer_calls", make)


def _may_build(ctx: Context) -> np.ndarray:
    """Per event row: ``False`` for a main-thread operator inside an outermost call known to have
    built no autograd node while grad mode was on (:func:`outer_calls`), ``True`` for every other
    row. A name matching a node the backward evaluates (``aten::fill_`` and a ``FillBackward0`` of
    the model's) is no proof that this call made it. A call without a number that does not write
    in place is not judged: grad mode off for a wrapper's work inside the model's call is the
    forward's, as its name says (DistributedDataParallel's buffer broadcast, whose copies back
    are in place, starts the forward by its collective: :func:`_forward_start`)."""
    ev = ctx.trace.events
    out = np.ones(len(ev.ts_ns), dtype=bool)
    calls = outer_calls(ctx)
    idle = calls.rows[calls.idle]
    if idle.size:
        s, e = iv.union(ev.ts_ns[idle], ev.ts_ns[idle] + ev.dur_ns[idle])
        main = np.flatnonzero((ev.lane == ctx.main_lane) & ctx.masks["cpu_op"])
        out[main[iv.contains((s, e), ev.ts_ns[main])]] = False
    return out


def _forward_start(ev, sel: np.ndarray, makes_node: np.ndarray, cpu_op: np.ndarray,
                   starts: np.ndarray | None = None, built: np.ndarray | None = None) -> int:
    """When the forward pass starts among the step's host events ``sel`` (start order, the
    backward's and the optimizer's left out): the outermost operator around the first one whose
    backward node the trace evaluates (an operator: with ``with_stack`` the loop's own Python
    frame encloses the whole step); the first event when none is. With ``built`` (per row,
    :func:`_may_build`), an operator known to have built no node is not the one. With ``starts``
    (per name id), the first such call before that one starts it instead: a layer's operator
    (:data:`LAYER_OPS`: the forward of a part of the model that builds no node — a frozen
    backbone, a teacher or a target network under ``torch.no_grad()`` — is the model's forward
    too, not the loop's own code), or a collective (``record_param_comms``, ``c10d::``):
    DistributedDataParallel's forward broadcasts its buffers (under ``torch.no_grad()``, copying
    them back in place) before the model's first layer."""
    first = int(ev.ts_ns[sel[0]])
    hit = np.flatnonzero(makes_node[ev.name[sel]] & cpu_op[sel] & (True if built is None else built[sel]))
    if hit.size == 0:
        return first
    if starts is not None:
        earlier = np.flatnonzero(starts[ev.name[sel[: hit[0]]]] & cpu_op[sel[: hit[0]]])
        if earlier.size:
            hit = earlier
    t = int(ev.ts_ns[sel[hit[0]]])
    before = sel[: hit[0] + 1]
    before = before[cpu_op[before]]
    around = before[ev.ts_ns[before] + ev.dur_ns[before] > t]
    return int(ev.ts_ns[around].min())


class _Closures:
    """The forward passes that an optimizer's step runs itself, each before one of its backward
    passes. ``LBFGS.step(closure)`` calls the closure (zero the gradients, forward, loss,
    backward) once and then once per line-search evaluation, up to ``max_iter`` times; so do
    sharpness-aware optimizers. Between those calls the step does its own work (LBFGS's dot
    products and updates), whose operators can share names with the model's (``aten::sub``), so
    the forward pass is found by what can only belong to it: it starts after the closure's
    ``optimizer.zero_grad()`` (the latest ``Optimizer.zero_grad#`` span before the pass) at the
    first operator whose backward node the trace evaluates; with no ``zero_grad`` there (or no
    such operator after it), at the first operator (after the end of the pass before) that made
    the node the pass evaluates
    last, the forward's first (``aten::t`` → ``TBackward0``, ``aten::convolution`` →
    ``ConvolutionBackward0``). With neither, the time stays the optimizer's."""

    def __init__(self, ctx: Context, ops: np.ndarray, makes_node: np.ndarray):
        ev = ctx.trace.events
        host = ctx.masks["host"]
        self.ctx, self.ev, self.ops, self.makes_node = ctx, ev, ops, makes_node
        self.op_s = ev.ts_ns[ops]
        self.cpu_op = ctx.masks["cpu_op"]
        zg = ctx.host_name_ids(lambda n: n.startswith("Optimizer.zero_grad#"))
        zg_rows = np.flatnonzero(host & zg[ev.name])
        self.zg_end = np.sort(ev.ts_ns[zg_rows] + ev.dur_ns[zg_rows])
        nodes = ctx.host_name_ids(lambda n: n.startswith(EVALUATE_PREFIX) and "AccumulateGrad" not in n)
        self.node_rows = np.flatnonzero(host & nodes[ev.name])
        self.node_s = ev.ts_ns[self.node_rows]
        self.by_key: dict[str, np.ndarray] = {}

    def _made(self, node_row: int) -> np.ndarray:
        """Per name id: the operators that make the node of the event ``node_row``."""
        mt = _NODE_RE.search(self.ctx.trace.names[int(self.ev.name[node_row])])
        key = _key(mt.group(1)) if mt else ""
        if key not in self.by_key:
            self.by_key[key] = (self.ctx.host_name_ids(lambda n: _key(n.removeprefix("aten::")) == key) if key
                                else np.zeros(len(self.ctx.trace.names), bool))
        return self.by_key[key]

    def _start(self, lo: int, hi: int, marks: np.ndarray) -> int | None:
        """Where a forward starts among the main thread's events in ``[lo, hi)``: at the first
        operator ``marks`` names (or the one around it); ``None`` when none is there."""
        a, z = np.searchsorted(self.op_s, (lo, hi))
        sel = self.ops[a:z]
        if not sel.size or not np.any(marks[self.ev.name[sel]] & self.cpu_op[sel]):
            return None
        return _forward_start(self.ev, sel, marks, self.cpu_op)

    def forwards(self, opt: iv.Intervals, passes: iv.Intervals) -> iv.Intervals:
        """The closures' forward passes, for the backward ``passes`` inside the step spans ``opt``."""
        s, e = passes
        k = np.searchsorted(opt[0], s, side="right") - 1  # the step span that holds each pass
        starts, ends = [], []
        for j in range(s.size):
            prev = int(e[j - 1]) if j and k[j - 1] == k[j] else int(opt[0][k[j]])
            z = int(np.searchsorted(self.zg_end, s[j], side="right"))
            found = None
            if z > 0 and self.zg_end[z - 1] >= prev:  # after the closure's zero_grad
                found = self._start(int(self.zg_end[z - 1]), int(s[j]), self.makes_node)
            if found is None:  # else from the operator that made the node evaluated last
                a, b = np.searchsorted(self.node_s, (s[j], e[j]))
                if a < b:
                    found = self._start(prev, int(s[j]), self._made(int(self.node_rows[b - 1])))
            if found is not None:
                starts.append(found)
                ends.append(int(s[j]))
        if not starts:
            return iv.empty()
        return iv.union(np.array(starts), np.array(ends))


def _passes(spans: iv.Intervals, op_starts: np.ndarray) -> iv.Intervals:
    """The backward passes of a step: the backward's spans (``spans``, normalised), one hull per
    run of them with no operator of the main thread starting in between (``op_starts``, sorted).
    A step of several micro-batches (gradient accumulation) runs a forward between its
    backwards; inside one pass, the gaps between the engine's nodes stay the backward's."""
    s, e = spans
    if s.size < 2:
        return spans
    outside = op_starts[~iv.contains(spans, op_starts)]
    # an operator starting in the gap [e[j], s[j + 1]) splits the backward there
    split = np.searchsorted(outside, s[1:], side="left") > np.searchsorted(outside, e[:-1], side="left")
    first = np.concatenate([[0], np.flatnonzero(split) + 1])
    last = np.concatenate([first[1:] - 1, [s.size - 1]])
    return s[first], e[last]


class _Spans:
    """The spans of some events (rows in start order, as the event table is sorted), cut to a
    step in time logarithmic in their number: a trace of a hundred steps is not read a hundred
    times over."""

    def __init__(self, ev, rows: np.ndarray):
        self.start = ev.ts_ns[rows]
        self.end = self.start + ev.dur_ns[rows]
        #: the latest end among the spans up to each one: the spans that start before ``lo``
        #: and reach into ``[lo, hi)`` all lie after the first whose running end passes ``lo``
        self.reach = np.maximum.accumulate(self.end) if rows.size else self.end

    def within(self, lo: int, hi: int) -> iv.Intervals:
        """The time inside ``[lo, hi)`` covered by the spans that overlap it."""
        a = int(np.searchsorted(self.reach, lo, side="right"))
        z = int(np.searchsorted(self.start, hi, side="left"))
        s, e = self.start[a:z], self.end[a:z]
        keep = e > lo
        return iv.clip(iv.union(s[keep], e[keep]), lo, hi)

    def hull(self, lo: int, hi: int) -> iv.Intervals:
        """From the first start to the last end of the spans that start inside ``[lo, hi)``,
        clipped to it."""
        a, z = np.searchsorted(self.start, (lo, hi), side="left")
        if a == z:
            return iv.empty()
        return iv.clip(iv.union(self.start[a:a + 1], np.array([self.end[a:z].max()])), lo, hi)


def metrics(ctx: Context) -> dict[str, Any] | None:
    """``metrics["phases"]``: ``per_step`` (one ``{data, forward, backward, optimizer, evaluation, other}``
    in ms per step, adding up to ``steps.durations_ms``), ``median_ms`` (per phase, the median
    over steps), ``found`` (which markers the trace had), ``spans_ns`` (per step, each phase but
    ``other`` as ``[start, end]`` pairs in ns: the timeline's phase lane), ``gpu_per_step`` and
    ``gpu_median_ms`` (the GPU time of the work launched in each phase, see
    :func:`_gpu_per_step`; empty / ``None`` without a GPU), ``recompute_median_ms`` (the part of
    backward that ran forward operators again, activation checkpointing: ``analysis.recompute``;
    absent when none did). ``None`` without step markers."""
    if not ctx.step_bounds:
        return None
    per = phase_intervals(ctx)
    per_step = [{p: _ms(iv.total(parts[p])) for p in PHASES} for parts in per]
    cols = {p: np.array([s[p] for s in per_step]) for p in PHASES}
    found = {
        "dataloader": bool(ctx.masks["name_dataloader"].any()),
        "backward": any(iv.total(parts["backward"]) for parts in per),
        "optimizer": any(iv.total(parts["optimizer"]) for parts in per),
    }
    spans = [{p: [[int(s), int(e)] for s, e in zip(*parts[p])] for p in PHASES if p != "other"} for parts in per]
    gpu = _gpu_per_step(ctx, per)
    out = {"order": list(PHASES), "per_step": per_step,
           "median_ms": {p: round(median_of(cols[p]), 4) for p in PHASES}, "found": found,
           "spans_ns": spans, "gpu_per_step": gpu, "gpu_median_ms": None}
    if gpu:
        out["gpu_median_ms"] = {p: round(median_of([g[p] for g in gpu]), 4) for p in PHASES}
    redo = recompute(ctx).host_ns
    if any(redo):
        out["recompute_median_ms"] = _ms(median_of(redo))
    return out


def _gpu_per_step(ctx: Context, per: list[dict[str, iv.Intervals]]) -> list[dict[str, float]]:
    """Per step and phase, the GPU time (ms, summed over the primary device's kernels, copies and
    memsets) of the work launched during that phase — where the GPU's phases differ from the
    host's: a backward launched in 5 ms of host time may keep the GPU busy for 50. Empty without
    a GPU or correlation ids."""
    ev, m = ctx.trace.events, ctx.masks
    if ctx.device < 0 or ctx.launch_ts is None:
        return []
    rows = np.flatnonzero(m["gpu"] & ctx.on_device & (ctx.launch_ts >= 0))
    if rows.size == 0:
        return []
    t, dur = ctx.launch_ts[rows], ev.dur_ns[rows]
    order = np.argsort(t, kind="stable")  # by launch time, so that each step reads only its own
    t, dur = t[order], dur[order]
    out = []
    for (lo, hi), parts in zip(ctx.step_bounds, per):
        # every phase lies inside its step's bounds: only the work launched in them can count
        a, z = np.searchsorted(t, (lo, hi), side="left")
        ts, ds = t[a:z], dur[a:z]
        out.append({p: _ms(ds[iv.contains(parts[p], ts)].sum()) for p in PHASES})
    return out
