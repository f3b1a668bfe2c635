"""``dense-embedding-grad``: a CPU training loop whose embedding table's gradient is dense, so
that every step zero-fills, accumulates and updates the whole table for the few rows a batch used."""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.optimizerimpl import optimizer_steps
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: The backward of an ``nn.Embedding`` / ``nn.EmbeddingBag`` built with ``sparse=False`` (the
#: default): it makes a dense gradient of the table's full size, then adds the used rows into it.
DENSE_BACKWARD = frozenset({"aten::embedding_dense_backward", "aten::_embedding_bag_dense_backward"})
#: The operators that fill a new tensor with zeros (the dense gradient before the rows are added).
ZERO_FILL = frozenset({"aten::zeros", "aten::zero_", "aten::fill_", "aten::zeros_like", "aten::new_zeros"})
#: A finding when the zero fill takes at least this share of the dense backward's time: filling
#: costs per row of the table, adding per row used, so a fill at least as long as the rest means
#: a table far larger than what a batch touches. Measured with torch.profiler on this project's
#: machine (PyTorch 2.13, three backwards each): 0.90 for 200,000 × 32 and bags of 1,280 ids,
#: 0.85 for 30,000 × 768 and 4,096 ids, 0.34 for 50,000 × 64 and 8,192 ids (some 15 % of the rows
#: a step), 0.05 for a 2,002-row vocabulary and 3,840 ids and for 5,000 rows and 20,000 ids (a
#: batch covers the table). One step of the recorded fixture read 0.48 on a busy moment, and a
#: tiny BERT's 2-µs fills read 0.55-0.98 in all when one was stalled 7.5 ms by other processes:
#: the median of the calls' own shares is taken, which one call either way does not decide ...
MIN_FILL_FRAC = 0.5
#: ... and the dense backward and the optimizer steps, what the fix shortens, take at least this
#: share of the window (the TensorBoard profiler plugin's 5 % line for a bottleneck worth
#: naming, doubled: every loop has an optimizer step).
MIN_FRAC = 0.10
#: Optimizers that take a sparse gradient as they are (torch.nn.Embedding's notes: SGD, SparseAdam
#: and Adagrad on the CPU; SGD refuses one with weight_decay set: checked with PyTorch 2.13).
ACCEPTS_SPARSE = ("SGD", "Adagrad", "SparseAdam")
DOC = "https://pytorch.org/docs/stable/generated/torch.nn.Embedding.html"
#: benchmarks/sparse_embedding.py on this project's 2-core machine, unprofiled, alternated rounds.
MEASURED = ("benchmarks/sparse_embedding.py: a 200,000 × 32 EmbeddingBag and a linear head, Adam, 29.9 ms a "
            "step dense, 5.8 ms dense with fused=True, 1.7 ms sparse with SparseAdam (0.94 saved)")
SPARSE_ADAM_CODE = """
# the table with sparse gradients: a backward yields the rows the batch used, not the whole table
# (in your model, pass sparse=True where the table is built; nn.EmbeddingBag takes it too)
embedding = torch.nn.Embedding(num_embeddings, embedding_dim, sparse=True)
# Adam rejects sparse gradients: SparseAdam for the table, Adam for every other parameter
table_ids = {id(p) for p in embedding.parameters()}
optimizers = [torch.optim.SparseAdam(list(embedding.parameters()), lr=lr),
              torch.optim.Adam([p for p in model.parameters() if id(p) not in table_ids], lr=lr)]
for opt in optimizers:   # in the loop: zero_grad() and step() each one
    opt.step()
"""
SPARSE_KEEP_CODE = """
# the table with sparse gradients: a backward yields the rows the batch used, not the whole table
# (in your model, pass sparse=True where the table is built; nn.EmbeddingBag takes it too)
embedding = torch.nn.Embedding(num_embeddings, embedding_dim, sparse=True)
# SGD and Adagrad take sparse gradients as they are; SGD with weight_decay does not: give the
# table its own optimizer without it
table_ids = {id(p) for p in embedding.parameters()}
optimizers = [torch.optim.SGD(list(embedding.parameters()), lr=lr),   # an Adagrad stays an Adagrad
              torch.optim.SGD([p for p in model.parameters() if id(p) not in table_ids], lr=lr, weight_decay=1e-4)]
"""


def _dense_backward(ctx: Context) -> np.ndarray:
    ev = ctx.trace.events
    return ctx.events_in_window(ctx.masks["host"] & ctx.masks["cpu_op"]
                                & ctx.trace.name_ids(DENSE_BACKWARD.__contains__)[ev.name])


def embedding_update_time(ctx: Context) -> iv.Intervals:
    """What the finding's fix shortens: the dense backwards and the optimizer steps
    (``analysis.gains`` counts it once beside ``unfused-optimizer``'s steps)."""
    return iv.merge(ctx.intervals(_dense_backward(ctx)), optimizer_steps(ctx).intervals)


@rule("dense-embedding-grad")
def dense_embedding_grad(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a CPU-only trace whose window holds the dense backward of an embedding table
    (``aten::embedding_dense_backward``, ``aten::_embedding_bag_dense_backward``: ``sparse=False``,
    the default) in which filling the new gradient with zeros (``aten::zeros``/``zero_``/``fill_``
    nested in it) takes ≥ 50 % of its time (the median of the calls' own shares: one fill that a
    busy machine stalled does not decide): the table is far larger than the rows a batch used,
    yet its backward makes a gradient of the whole table, and the optimizer then updates every row
    (and, for Adam, every row's moments). Threshold: the dense backward and the optimizer steps
    take ≥ 10 % of the window. Gain: their share, an upper bound (the sparse backward and update
    still do the used rows' work; the optimizer's other parameters stay). Fix: ``sparse=True``
    and an optimizer that takes sparse gradients (SparseAdam for an Adam; SGD and Adagrad as they
    are). Silent on a GPU (the table's time is in kernels the host spans do not measure: not
    judged here). False positives: a table nearly every batch covers (the fill is then short
    beside the adds, so the rule stays silent); SparseAdam is "lazy" (a row's moments move only
    when the row is used) and has no weight decay, which changes training."""
    if ctx.device >= 0:
        return None
    ev = ctx.trace.events
    host_ops = ctx.masks["host"] & ctx.masks["cpu_op"]
    backward = _dense_backward(ctx)
    if not backward.any():
        return None
    bwd = ctx.intervals(backward)
    fill = iv.intersect(ctx.intervals(ctx.events_in_window(host_ops & ctx.trace.name_ids(ZERO_FILL.__contains__)[ev.name])),
                        bwd)
    # each call's own share, their median: one fill a busy machine stalled for milliseconds is no
    # table larger than its batch (a share of the summed times would let it decide)
    rows = np.flatnonzero(backward)
    shares = [iv.total(iv.clip(fill, int(ev.ts_ns[r]), int(ev.ts_ns[r] + ev.dur_ns[r]))) / int(ev.dur_ns[r])
              for r in rows.tolist() if ev.dur_ns[r] > 0]
    fill_frac = median_of(shares) if shares else 0.0
    if fill_frac < MIN_FILL_FRAC:
        return None
    steps = optimizer_steps(ctx)
    frac = ctx.frac(iv.total(iv.merge(bwd, steps.intervals)))
    if frac < MIN_FRAC:
        return None
    calls = int(np.count_nonzero(backward))
    classes = steps.classes
    adam_like = [c for c in classes if c not in ACCEPTS_SPARSE]
    fixes: tuple[Fix, ...]
    if adam_like or not classes:
        fixes = (pytorch("Give the table sparse gradients, and SparseAdam for it", SPARSE_ADAM_CODE),)
    else:
        takes = f"{classes[0]} takes them as it is" if len(classes) == 1 else f"{' and '.join(classes)} take them"
        fixes = (pytorch(f"Give the table sparse gradients: {takes}", SPARSE_KEEP_CODE),)
    optimizer = " and ".join(classes) if classes else "the optimizer"
    return finding(
        severity=severity_for(frac),
        title="The embedding table's gradient is dense: every step fills and updates the whole table",
        why=f"""An nn.Embedding or nn.EmbeddingBag built with sparse=False (the default) makes, in each backward, a
        gradient the size of the whole table and adds the rows the batch used into it. Here filling that gradient
        with zeros takes {pct(fill_frac)} of the table's backward: the table is far larger than what a batch
        touches. {optimizer} then reads and updates every row of it{", with its moments," if adam_like else ""} each
        step. With sparse=True the backward yields only the used rows and an optimizer that takes sparse gradients
        updates only those. Adam refuses sparse gradients; SparseAdam is its lazy form: a row's moments move only
        when the row is used, and it has no weight decay, so training changes a little (the usual trade for large
        tables). SGD takes sparse gradients unless weight_decay is set.""",
        summary=(f"{calls:,} dense embedding backward(s) in the window, {pct(fill_frac)} of their time filling the "
                 f"gradient with zeros; with the optimizer steps ({optimizer}) they take {pct(frac)} of the window."),
        numbers={"dense_backwards": calls, "zero_fill_frac": round(fill_frac, 4), "cost_frac": round(frac, 4),
                 "optimizer_steps": steps.calls, "threshold_zero_fill_frac": MIN_FILL_FRAC,
                 "threshold_frac": MIN_FRAC},
        est_gain=frac,
        gain_method=("upper bound: the dense backward's and the optimizer steps' share of the window; the sparse "
                     f"backward and update still do the used rows' work ({MEASURED})"),
        windows=(),
        fixes=fixes,
        doc_url=DOC,
    )


__all__ = ["dense_embedding_grad", "embedding_update_time"]
