"""Forward computations run as if for training: grad mode left on for a graph no backward pass
uses, and dropout left in training mode where nothing trains.

- **Autograd nodes built and never used.** The profiler writes an operator's ``Sequence number``
  only while grad mode is on: the dispatcher records it for operators that reach the autograd
  layer under ``torch.is_grad_enabled()`` (``Dispatcher::runRecordFunction``); under
  ``torch.no_grad()`` or ``torch.inference_mode()`` operators carry none (checked on torch 2.13: a
  three-layer MLP records 21 under grad mode, 0 under either). The number is the thread's
  autograd counter, which advances by one each time a node of the graph is created, so a
  recorded operator followed (on its thread) by a higher number built a node; with every
  parameter frozen (``requires_grad_(False)``) the numbers stay put and no node is counted. An
  ``autograd.Function``'s ``apply`` takes a number whatever the grad mode (vLLM's ``TopK``,
  ``SortTokens`` under inference mode) and is recorded under its class name, not a
  ``namespace::op`` name: only operators with a ``::`` in their name count as building, and
  torch.compile's ``CompiledFunction``: AOTAutograd wraps a compiled graph in that
  ``autograd.Function`` only when grad mode is on and an input requires grad (its training
  graph, whose forward saves what the compiled backward needs); under ``torch.no_grad()`` it
  runs an inference graph and no ``CompiledFunction`` is recorded (checked on torch 2.13). The
  autograd engine's ``evaluate_function`` span around each node it runs carries that node's
  number: a node whose number none carries was built for nothing — inference with grad mode on,
  or, in a training loop, an evaluation or a metric computed on the side without
  ``torch.no_grad()``.
- **Dropout in training mode.** ``nn.Dropout`` in eval mode calls ``aten::dropout``, which returns
  its input and calls nothing; in training mode the same call draws a mask inside it
  (``aten::bernoulli_``, ``aten::mul``, ``aten::div_`` on a CPU; ``aten::native_dropout``, the
  fused kernel, on CUDA and other accelerators: aten/src/ATen/native/Dropout.cpp,
  ``is_fused_kernel_acceptable``). A dropout operator with another operator starting inside it
  is one in training mode (with ``p == 0`` it returns its input in either mode: harmless). This
  matters only where nothing trains (:attr:`Context.workload` is not ``"training"``).
- **Batch normalisation in training mode.** ``nn.BatchNorm*`` calls ``aten::batch_norm`` in either
  mode; in training mode with running statistics (the default) its ``forward`` first adds one to
  ``num_batches_tracked`` (``aten::add_``), then calls ``F.batch_norm``, which normalises with
  the batch's own statistics and updates the running ones (torch/nn/modules/batchnorm.py; checked
  on torch 2.13: the ``aten::add_`` precedes the call in train mode only, under ``no_grad`` too).
  A batch-norm call whose thread's previous operator (one that ended before it started) is an
  ``aten::add_`` ran in training mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.phases import BACKWARD_RE, LAYER_OPS
from gpumagic.trace.model import EventTable

#: The ``autograd.Function`` torch.compile's AOTAutograd runs a compiled training graph in
#: (torch/_functorch/_aot_autograd/runtime_wrappers.py); its backward is ``CompiledFunctionBackward``.
COMPILED_FUNCTION = "CompiledFunction"
#: The dropout operators of ``torch.nn.functional`` (native_functions.yaml: ``dropout``,
#: ``feature_dropout``, ``alpha_dropout``, ``feature_alpha_dropout`` and their in-place forms).
DROPOUT_OPS = frozenset({"aten::dropout", "aten::dropout_", "aten::feature_dropout", "aten::feature_dropout_",
                         "aten::alpha_dropout", "aten::alpha_dropout_", "aten::feature_alpha_dropout",
                         "aten::feature_alpha_dropout_"})


@dataclass(frozen=True)
class GradMode:
    """The window's operators that ran with grad mode on, and the autograd nodes they built that
    no backward pass used (:func:`grad_mode`)."""

    #: operators that recorded a sequence number (grad mode was on for them), backward's own left out
    recorded: int
    #: autograd nodes built in the window that no backward pass in the trace evaluated (a lower
    #: bound: the last operator on each thread is not counted, having no later number to compare with)
    nodes: int
    #: host time covered by the operators that built those nodes (their union, ns), and by every operator
    unused_ns: int
    op_ns: int
    #: rows of ``trace.events`` of the operators that built those nodes
    rows: np.ndarray
    #: of those nodes, torch.compile's (``CompiledFunction`` calls: each holds a compiled forward's saved tensors)
    compiled: int = 0
    #: whether the trace runs backward passes (then ``nodes`` counts only what they left unused)
    training: bool = False
    #: of those nodes, the ones a layer's operator built (:data:`LAYER_OPS`: a matmul, a
    #: convolution, an embedding lookup, attention): a model's forward pass, not a metric's arithmetic
    layers: int = 0

    @property
    def unused_frac(self) -> float:
        """The share of the window's operator time spent in operators that built unused nodes."""
        return self.unused_ns / self.op_ns if self.op_ns else 0.0


NO_GRAD = GradMode(0, 0, 0, 0, np.zeros(0, np.int64))


def grad_mode(ctx: Context) -> GradMode:
    """What the window's operators say about grad mode (computed once per context)."""
    return ctx.memo("inference.grad_mode", _grad_mode)


def _grad_mode(ctx: Context) -> GradMode:
    """Nodes are numbered per thread as they are built, so an operator whose thread records a
    higher number next built one; the backward's events around each node it runs (the engine's
    ``evaluate_function: XBackward0`` span, or the node ``XBackward`` itself in traces of 2021)
    carry the node's number, so a node whose number none carries was never used by a backward
    pass. Operators inside those events (a checkpoint's recomputation, a double backward) and the
    events themselves are the backward's, and left out; so are operators that start after the last
    backward event began (their backward may lie past the end of the trace), and, in a trace that
    ends inside a backward pass (:func:`_cut_pass_start`), those after the pass before it, and in a
    window whose last step runs several backward passes (:func:`_cut_step_start`), that step's. So are
    operators inside compilation frames (``names.COMPILE_RE``: dynamo tracing the model's first call
    runs its operators under grad mode, building nodes nothing will run; their neighbours' numbers
    still tell which nodes the operators outside built). A trace whose
    backward events carry no numbers cannot be matched: nothing is counted there."""
    ev, m = ctx.trace.events, ctx.masks
    host_ops = m["cpu_op"] & m["host"]
    backward_name = ctx.host_name_ids(BACKWARD_RE.search)[ev.name]
    backward = np.flatnonzero(host_ops & backward_name)
    numbered = backward[ev.seq[backward] >= 0]
    if backward.size and not numbered.size:
        return NO_GRAD
    ops = ctx.events_in_window(host_ops)
    rows = np.flatnonzero(ops & (ev.seq >= 0) & ~backward_name)
    if backward.size and rows.size:
        rows = rows[~starts_inside(ev, rows, backward)]
    if not rows.size:
        return NO_GRAD
    # by thread, in time order (the table is sorted by start; a stable sort keeps it per lane)
    rows = rows[np.argsort(ev.lane[rows], kind="stable")]
    lane, seq = ev.lane[rows], ev.seq[rows]
    compiled_name = ctx.host_name_ids(lambda n: n == COMPILED_FUNCTION)
    dispatched = (ctx.host_name_ids(lambda n: "::" in n) | compiled_name)[ev.name[rows]]
    built = rows[np.flatnonzero((lane[1:] == lane[:-1]) & (seq[1:] > seq[:-1]) & dispatched[:-1])]
    if numbered.size:
        used = np.isin(ev.seq[built], ev.seq[numbered])
        limit = min(ev.ts_ns[backward].max(), _cut_pass_start(ev, host_ops, backward), _cut_step_start(ctx, numbered))
        built = built[~used & (ev.ts_ns[built] < limit)]
    rows, built = outside_compile(ctx, rows), outside_compile(ctx, built)  # the tracer's nodes, not the model's
    built = np.sort(built)
    if built.size:
        built = built[~_sampling(ctx, built)]
    compiled = int(np.count_nonzero(compiled_name[ev.name[built]]))
    layers = int(np.count_nonzero(ctx.host_name_ids(LAYER_OPS.__contains__)[ev.name[built]]))
    return GradMode(recorded=int(rows.size), nodes=int(built.size), unused_ns=iv.total(ctx.intervals(built)),
                    op_ns=iv.total(ctx.intervals(ops)), rows=built, training=bool(backward.size), compiled=compiled,
                    layers=layers)


def _cut_pass_start(ev: EventTable, host_ops: np.ndarray, backward: np.ndarray) -> int:
    """Where the forward of a last backward pass the trace may have cut short began: a trace that
    ends inside a backward pass (no operator but the backward's starts after its last event ends:
    a profiler stopped by a time limit, an on-demand trace of a fixed duration) holds only part of
    that pass, and the nodes its forward built after the previous pass may be used in the part
    not recorded. That forward starts after the previous pass's last event; the nodes built since
    are not judged. No cut (an optimizer step or a forward after the last pass): no limit."""
    not_backward = host_ops.copy()
    not_backward[backward] = False
    others = np.flatnonzero(not_backward)
    others = others[~starts_inside(ev, others, backward)]
    ends = ev.ts_ns[backward] + ev.dur_ns[backward]
    if not others.size or (ev.ts_ns[others] >= ends.max()).any():
        return np.iinfo(np.int64).max
    last_other = ev.ts_ns[others].max()  # the last forward (or loss) operator before the cut pass
    before = ends[ends <= last_other]
    return int(before.max()) if before.size else int(ev.ts_ns[others].min())


def outermost_ops(ctx: Context, lane: int) -> np.ndarray:
    """Rows of the window's outermost host operators on thread ``lane``, in time order (an
    operator called inside another left out), once per context and thread."""
    def make(c: Context) -> np.ndarray:
        ev, mk = c.trace.events, c.masks
        ops = np.flatnonzero(c.events_in_window(mk["cpu_op"] & mk["host"] & (ev.lane == lane)))
        order, outer = iv.outermost(ev.ts_ns[ops], ev.ts_ns[ops] + ev.dur_ns[ops])
        top: np.ndarray = ops[order][outer]
        return top
    return ctx.memo(f"inference.outermost_ops:{lane}", make)


#: Drawing from a categorical distribution: ``Categorical.sample`` computes the probabilities from
#: the logits (``aten::softmax``) and reshapes them under grad mode, then calls ``torch.multinomial``
#: (torch/distributions/categorical.py, torch 2.13); ``Bernoulli`` and ``Normal`` sample under
#: ``torch.no_grad()`` and build nothing.
SAMPLING_OPS = frozenset({"aten::multinomial"})


def _sampling(ctx: Context, built: np.ndarray) -> np.ndarray:
    """Mask of ``built`` (operators that built an unused node) inside the outermost operators that
    run, one after another on their thread, right before a draw (:data:`SAMPLING_OPS`): the
    probabilities a policy's ``Categorical(logits=...).sample()`` computes for the draw, whose nodes
    no backward runs — the ``log_prob`` a policy-gradient loss differentiates reads the logits. Not
    a forward computation run with grad mode on (a REINFORCE rollout read 306 such nodes, 5 % of
    its operator time, and was told to evaluate in eval mode without a graph); what the draw's
    caller computed before them, a model's forward, still counts."""
    ev = ctx.trace.events
    draws = ctx.host_name_ids(SAMPLING_OPS.__contains__)
    out = np.zeros(built.size, dtype=bool)
    for lane in distinct(ev.lane[built]).tolist():
        top = outermost_ops(ctx, lane)
        at = np.flatnonzero(draws[ev.name[top]])
        if not at.size:
            continue
        holds = holding(ev, top, built)
        feeding = np.zeros(top.size, dtype=bool)
        for k in at.tolist():
            j = k - 1
            while j >= 0 and holds[j] and not draws[ev.name[top[j]]]:
                feeding[j] = True
                j -= 1
        if feeding.any():
            here = np.flatnonzero(ev.lane[built] == lane)
            out[here] = starts_inside(ev, built[here], top[feeding])
    return out


def _cut_step_start(ctx: Context, numbered: np.ndarray) -> int:
    """Where the window's last step began, when that step runs more than one backward pass (and
    the window holds another step): a step of several backward passes (a GAN's discriminator and
    generator losses, an actor's and a critic's, each with its optimizer) may end between them —
    gpumagic's capture ends a step at its first optimizer's update, before the second optimizer's
    backward of the same iteration — so a forward the step ran may have its backward past the end
    of the window. That step's nodes are not judged; a graph left unused every step shows in the
    others. One pass in the last step (a plain loop ends its step with the update that follows its
    one backward): no limit."""
    none = int(np.iinfo(np.int64).max)
    if len(ctx.step_bounds) < 2:
        return none
    ev = ctx.trace.events
    start, end = ctx.step_bounds[-1]
    starts = pass_starts(ev, numbered[(ev.ts_ns[numbered] >= start) & (ev.ts_ns[numbered] < end)])
    return int(start) if starts.size >= 2 else none


def starts_inside(ev: EventTable, rows: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Which of ``rows`` start inside one of the ``spans`` (rows of events) on their own thread."""
    out = np.zeros(rows.size, dtype=bool)
    if not rows.size or not spans.size:
        return out
    for lane in distinct(ev.lane[spans]).tolist():
        here = np.flatnonzero(ev.lane[rows] == lane)
        if not here.size:
            continue
        s = spans[ev.lane[spans] == lane]
        lo, hi = iv.union(ev.ts_ns[s], ev.ts_ns[s] + ev.dur_ns[s])
        out[here] = iv.contains((lo, hi), ev.ts_ns[rows[here]])
    return out


def outside_compile(ctx: Context, rows: np.ndarray) -> np.ndarray:
    """``rows`` less those that start inside torch.compile's work (``name_compile`` frames on their
    thread): tracing the model runs its operators on fake tensors, in whatever mode the tracer
    needs (a compiled model in eval mode read "45 of 45 dropout calls drew a mask" while it
    compiled), which says nothing about how the model runs."""
    compiling = ctx.memo("inference.compiling", lambda c: np.flatnonzero(c.masks["name_compile"] & c.masks["host"]))
    if not compiling.size or not rows.size:
        return rows
    kept: np.ndarray = rows[~starts_inside(ctx.trace.events, rows, compiling)]
    return kept


def pass_starts(ev: EventTable, rows: np.ndarray) -> np.ndarray:
    """The start times of the backward passes among ``rows`` (backward nodes with a sequence
    number): each top-level node whose number is above every earlier one's (sorted)."""
    if not rows.size:
        return np.zeros(0, np.int64)
    rows = rows[np.lexsort((-ev.dur_ns[rows], ev.ts_ns[rows]))]
    rows = rows[~nested(ev, rows)]
    seq = ev.seq[rows]
    before = np.concatenate([[-1], np.maximum.accumulate(seq)[:-1]])
    return np.sort(ev.ts_ns[rows[seq > before]])


def nested(ev: EventTable, rows: np.ndarray) -> np.ndarray:
    """Which of ``rows`` (sorted by start, the longest first) start before an earlier one on their
    thread has ended: inside it."""
    out = np.zeros(rows.size, dtype=bool)
    lanes = ev.lane[rows]
    for lane in distinct(lanes).tolist():
        mine = rows[lanes == lane]
        reach = np.maximum.accumulate(ev.ts_ns[mine] + ev.dur_ns[mine])
        out[np.flatnonzero(lanes == lane)[1:]] = ev.ts_ns[mine[1:]] < reach[:-1]
    return out


@dataclass(frozen=True)
class Dropout:
    """The window's dropout calls (:func:`dropout`)."""

    calls: int
    #: rows of ``trace.events`` of the calls that drew a mask (training mode)
    active: np.ndarray
    #: calls that recorded an autograd sequence number (grad mode on)
    numbered: int = 0


NO_DROPOUT = Dropout(0, np.zeros(0, np.int64))


def dropout(ctx: Context) -> Dropout:
    """The window's dropout operators, and which of them ran in training mode (an operator
    inside them); computed once per context."""
    return ctx.memo("inference.dropout", _dropout)


def _dropout(ctx: Context) -> Dropout:
    ev, m = ctx.trace.events, ctx.masks
    ops = m["cpu_op"] & m["host"]
    calls = outside_compile(ctx, np.flatnonzero(ctx.events_in_window(ops)
                                                & ctx.host_name_ids(DROPOUT_OPS.__contains__)[ev.name]))
    if not calls.size:
        return NO_DROPOUT
    # the thread's operators that start inside each call, the call itself included
    op_rows = np.flatnonzero(ops)
    inside = iv.weight_in_ranges(ev.ts_ns[op_rows], ev.lane[op_rows], None, ev.ts_ns[calls],
                                 ev.ts_ns[calls] + ev.dur_ns[calls], ev.lane[calls])
    active = inside > 1
    return Dropout(calls=int(calls.size), active=calls[active], numbered=int(np.count_nonzero(ev.seq[calls] >= 0)))


#: Batch normalisation's operator and the counter update a training-mode module runs before it.
BATCH_NORM = "aten::batch_norm"
COUNTER_ADD = "aten::add_"


@dataclass(frozen=True)
class TrainBatchNorm:
    """The window's batch-norm calls, and those a training-mode module made (:func:`batch_norm`)."""

    calls: int
    #: rows of ``trace.events``: the calls right after a ``num_batches_tracked`` update
    active: np.ndarray


def batch_norm(ctx: Context) -> TrainBatchNorm:
    """The window's ``aten::batch_norm`` calls, and which ran in training mode (the thread's
    previous operator, one that ended before the call began, is ``aten::add_``); computed once
    per context."""
    return ctx.memo("inference.batch_norm", _batch_norm)


def _batch_norm(ctx: Context) -> TrainBatchNorm:
    ev, m = ctx.trace.events, ctx.masks
    ops = m["cpu_op"] & m["host"]
    calls = outside_compile(ctx, np.flatnonzero(ctx.events_in_window(ops)
                                                & ctx.host_name_ids(lambda n: n == BATCH_NORM)[ev.name]))
    if not calls.size:
        return TrainBatchNorm(0, np.zeros(0, np.int64))
    add = ctx.host_name_ids(lambda n: n == COUNTER_ADD)
    active = []
    for lane in distinct(ev.lane[calls]).tolist():
        rows = np.flatnonzero(ops & (ev.lane == lane))
        rows = rows[np.argsort(ev.ts_ns[rows], kind="stable")]
        starts, ends = ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows]
        mine = calls[ev.lane[calls] == lane]
        for c, k in zip(mine.tolist(), np.searchsorted(starts, ev.ts_ns[mine], side="left").tolist(), strict=True):
            j = k - 1
            while j >= 0 and ends[j] > ev.ts_ns[c]:  # the operators holding the call: not before it
                j -= 1
            if j >= 0 and add[ev.name[rows[j]]]:
                active.append(c)
    return TrainBatchNorm(int(calls.size), np.array(active, np.int64))


@dataclass(frozen=True)
class NoGradDropout:
    """A training trace's dropout calls without grad mode (:func:`no_grad_dropout`)."""

    #: rows of ``trace.events`` of the calls that drew a mask without grad mode, outside the
    #: backward and outside a custom autograd Function's forward
    active: np.ndarray
    #: dropout calls that recorded a sequence number (grad mode on: the trained forward passes)
    trained: int


def no_grad_dropout(ctx: Context) -> NoGradDropout:
    """In a trace whose forward and backward operators record autograd sequence numbers: the
    active dropout calls (:func:`dropout`) that recorded none, i.e. ran under ``torch.no_grad()``
    or ``torch.inference_mode()`` (checked on torch 2.13: ``aten::dropout`` carries ``Sequence
    number`` in grad mode only), leaving out those inside a backward event and those inside an
    operator that recorded one (a custom ``autograd.Function``'s forward runs without grad mode
    inside its ``apply``, which records one: a reentrant checkpoint's ``CheckpointFunction``).
    Nothing is counted in a trace whose backward events or forward operators carry no numbers
    (a distillation's teacher may be the only model with dropout, and never run in grad mode: its
    own calls cannot say whether the trace numbers them)."""
    return ctx.memo("inference.no_grad_dropout", _no_grad_dropout)


def _no_grad_dropout(ctx: Context) -> NoGradDropout:
    none = NoGradDropout(np.zeros(0, np.int64), 0)
    d = dropout(ctx)
    if not d.active.size:
        return none
    ev, m = ctx.trace.events, ctx.masks
    host_ops = m["cpu_op"] & m["host"]
    backward_name = ctx.host_name_ids(BACKWARD_RE.search)[ev.name]
    if not np.any(ev.seq[host_ops & backward_name] >= 0) or not np.any(ev.seq[host_ops & ~backward_name] >= 0):
        return none  # the trace does not number its nodes and operators
    active = d.active[ev.seq[d.active] < 0]
    backward = np.flatnonzero(host_ops & backward_name)
    if active.size and backward.size:
        active = active[~starts_inside(ev, active, backward)]
    if active.size:  # inside an operator that ran with grad mode on (a custom Function's apply)
        graded = np.flatnonzero(host_ops & (ev.seq >= 0) & ~backward_name)
        active = active[~starts_inside(ev, active, graded)]
    return NoGradDropout(active=active, trained=d.numbered)


def holding(ev: EventTable, calls: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Which of ``calls`` (rows of events) hold one of ``rows`` (an event starting inside the
    call, on its thread): e.g. the active dropout calls of a forward computation whose operators
    built unused nodes (a training-mode dropout's ``aten::mul`` builds one)."""
    return iv.weight_in_ranges(ev.ts_ns[rows], ev.lane[rows], None, ev.ts_ns[calls], ev.ts_ns[calls] + ev.dur_ns[calls],
                               ev.lane[calls]) > 0


__all__ = ["BATCH_NORM", "DROPOUT_OPS", "NO_DROPOUT", "NO_GRAD", "SAMPLING_OPS", "Dropout", "GradMode", "NoGradDropout",
           "TrainBatchNorm", "batch_norm", "dropout", "grad_mode", "holding", "nested", "no_grad_dropout",
           "outermost_ops", "outside_compile", "pass_starts", "starts_inside"]
