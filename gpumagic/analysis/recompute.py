"""The forward work a backward pass runs again: activation (gradient) checkpointing.

``torch.utils.checkpoint.checkpoint(block, x)`` keeps only the block's input in the forward pass
and, when the backward reaches the block, runs its forward again to rebuild the activations it
dropped: with ``use_reentrant=True`` inside the ``CheckpointFunctionBackward`` node, with
``use_reentrant=False`` inside the first node that unpacks one of the block's saved tensors.
Hugging Face's ``gradient_checkpointing`` calls it on every layer. Either way, the trace shows
forward operators — ``aten::linear``, ``aten::layer_norm``, ``aten::gelu`` — nested inside the
autograd engine's ``autograd::engine::evaluate_function: …`` spans, where the backward's own
formulas call other operators (``aten::mm``, ``aten::native_layer_norm_backward``,
``aten::gelu_backward``: ``tools/autograd/derivatives.yaml``).

:data:`FORWARD_OPS` are the operators a module's forward calls and no derivative formula does;
other operators a recomputed block calls (``aten::matmul``, ``aten::add``) also run in backward
formulas, so they are not counted, and the time found is a lower bound of the recomputation.
torch.compile's recomputation (its partitioner's choice, inside the compiled backward) runs as
generated kernels under one ``CompiledFunctionBackward`` node and is not seen here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic._arrays import distinct, median_of
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.trace.links import EVALUATE_PREFIX

#: Forward operators no derivative formula calls (exact names): a module's entry points.
FORWARD_OPS = frozenset(f"aten::{n}" for n in (
    "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "layer_norm", "group_norm", "batch_norm", "instance_norm", "rms_norm", "embedding",
    "scaled_dot_product_attention", "gelu", "silu", "dropout"))


@dataclass(frozen=True)
class Recompute:
    """The recomputed forward operators, per step: host spans and, with a GPU, the kernel time
    they launched."""

    per_step: list[iv.Intervals]  # the spans (ns), one interval set per step
    host_ns: list[int]  # their time per step (ns)
    gpu_ns: list[int]  # the primary GPU's kernel time they launched, per step (ns); zeros without one
    names: dict[str, int]  # operator name -> calls in the steps (outermost and nested)


def recompute(ctx: Context) -> Recompute:
    """The steps' recomputed forward operators (computed once per context)."""
    return ctx.memo("recompute", _find)


def _find(ctx: Context) -> Recompute:
    ev, names = ctx.trace.events, ctx.trace.names
    host = ctx.masks["host"]
    fwd = ctx.host_name_ids(lambda n: n in FORWARD_OPS)
    node = ctx.host_name_ids(lambda n: n.startswith(EVALUATE_PREFIX))
    cand = np.flatnonzero(host & fwd[ev.name])
    nodes = np.flatnonzero(host & node[ev.name])
    steps = ctx.step_bounds
    if not cand.size or not nodes.size or not steps:
        return Recompute([iv.empty() for _ in steps], [0] * len(steps), [0] * len(steps), {})
    # per recomputing node: from its start (the checkpoint's unpack hook, or the reentrant
    # CheckpointFunctionBackward, sets up the recomputation there) to the end of its last
    # recomputed operator; the node's own backward work comes after
    hull: dict[tuple[int, int], int] = {}
    found: list[int] = []
    for lane in distinct(ev.lane[cand]).tolist():  # a node holds the operators of its own thread
        mine = nodes[ev.lane[nodes] == lane]
        n_s, n_e = ev.ts_ns[mine], ev.ts_ns[mine] + ev.dur_ns[mine]
        ops = cand[ev.lane[cand] == lane]
        ops = ops[iv.contains(iv.union(n_s, n_e), ev.ts_ns[ops])]  # the forward passes' own: out
        o_s, o_e = ev.ts_ns[ops], ev.ts_ns[ops] + ev.dur_ns[ops]
        k = np.searchsorted(n_s, o_s, side="right") - 1
        for j in range(ops.size):
            i = int(k[j])
            while i >= 0 and n_e[i] < o_e[j]:  # back past the nodes nested before it, to the one that holds it
                i -= 1
            if i >= 0:
                key = (int(n_s[i]), lane)
                hull[key] = max(hull.get(key, 0), int(o_e[j]))
                found.append(int(ops[j]))
    rows = np.array(sorted(found), dtype=np.int64)
    spans = iv.union(np.array([key[0] for key in hull], dtype=np.int64), np.array(list(hull.values()), dtype=np.int64))
    per = [iv.clip(spans, lo, hi) for lo, hi in steps]
    gpu = [0] * len(steps)
    if ctx.device >= 0 and ctx.launch_ts is not None and rows.size:
        k = np.flatnonzero(ctx.masks["kernel"] & ctx.on_device & (ctx.launch_ts >= 0))
        launched = iv.contains(spans, ctx.launch_ts[k])
        t, d = ctx.launch_ts[k][launched], ev.dur_ns[k][launched]
        gpu = [int(d[(t >= lo) & (t < hi)].sum()) for lo, hi in steps]
    in_steps = np.zeros(rows.size, bool)
    for lo, hi in steps:
        in_steps |= (ev.ts_ns[rows] >= lo) & (ev.ts_ns[rows] < hi)
    counts = {names[n]: int(np.count_nonzero(ev.name[rows[in_steps]] == n)) for n in distinct(ev.name[rows[in_steps]]).tolist()}
    return Recompute(per, [iv.total(p) for p in per], gpu, counts)


def kept_bytes(ctx: Context) -> int | None:
    """What the recomputed activations hold, from the allocator's records: per step, the rise of
    allocated memory across each recomputation (the activations it rebuilds and the backward
    then reads), summed; the median over the steps (bytes). Without checkpointing, the forward
    pass keeps all of them at once, so the peak grows by about this much. The primary GPU's
    records, or the CPU's on a CPU-only trace (``--memory``); ``None`` without records."""
    mem = ctx.trace.memory
    sel = ctx.memory_records() if ctx.device >= 0 else (mem.device_type == 0)
    sel = sel & (mem.allocated >= 0)
    rec = recompute(ctx)
    if not sel.any() or not any(rec.host_ns):
        return None
    order = np.argsort(mem.ts_ns[sel], kind="stable")
    t, alloc = mem.ts_ns[sel][order], mem.allocated[sel][order]

    def at(x: np.ndarray) -> np.ndarray:  # allocated after the last record at or before x (0 before any)
        k = np.searchsorted(t, x, side="right") - 1
        return np.where(k >= 0, alloc[np.maximum(k, 0)], 0)

    per = [int(np.maximum(at(e) - at(s), 0).sum()) for s, e in rec.per_step if s.size]
    return int(median_of(per)) if per else None


__all__ = ["FORWARD_OPS", "Recompute", "kept_bytes", "recompute"]
