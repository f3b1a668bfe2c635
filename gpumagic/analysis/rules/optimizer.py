"""``unfused-optimizer``: a CPU training loop's optimizer steps run the per-parameter for-loop
where a fused kernel exists."""

from __future__ import annotations

import re

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.optimizerimpl import optimizer_steps
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix
from gpumagic.trace.model import meta_block

#: A finding from this share of the window (TensorBoard profiler plugin's 5 % line for a
#: bottleneck worth naming).
MIN_SHARE = 0.05
#: The optimizers whose fused kernel runs on the CPU and pays: the ``fused`` argument on CPU since
#: PyTorch 2.4 (pytorch/pytorch#123238). SGD has one too, but without momentum its per-parameter
#: step is one operator and fusing it measured 0.98x; with momentum 1.03-1.16x
#: (``benchmarks/optimizer_fused.py``): not its fix.
FUSED_ON_CPU = ("Adam", "AdamW", "Adagrad")
#: SGD with momentum: its for-loop step runs two or three operators a parameter (the momentum
#: buffer's ``mul_`` and ``add_``, then the parameter's ``add_``), and ``foreach=True`` runs each
#: once for every parameter: benchmarks/optimizer_fused.py (2026-12-06, 5 alternated rounds), an
#: MLP 256-512-512-10 on 64 rows, 2.118 ms a step for-loop, 1.843 ms foreach (0.130 saved), 1.949
#: ms fused (0.080). Without momentum the step is one ``add_`` a parameter: nothing to merge.
FOREACH_ON_CPU = ("SGD",)
#: The momentum buffer's update, inside SGD's for-loop step (``buf.mul_(momentum).add_(grad)``).
MOMENTUM_OP = "aten::mul_"
FUSED_SINCE = (2, 4)
DOC = "https://pytorch.org/docs/stable/optim.html#algorithms"
#: benchmarks/optimizer_fused.py on this project's 2-core machine, alternated rounds: the plain
#: loops with the for-loop step against fused=True.
MEASURED = ("benchmarks/optimizer_fused.py, four CPU MLPs: fused=True saved 0.37, 0.28, 0.15 and 0.10 of the "
            "step where the steps took 0.51, 0.38, 0.16 and 0.27 of the profiled window")


@rule("unfused-optimizer")
def unfused_optimizer(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a CPU-only trace (no GPU activity) whose ``Optimizer.step#<Class>.step`` spans in
    the window are of Adam, AdamW or Adagrad and hold no fused kernel (``aten::_fused_*``): the
    for-loop implementation (PyTorch's default on the CPU) or foreach (``analysis.optimizerimpl``);
    or of SGD with momentum (its steps update momentum buffers, ``aten::mul_``) in the for-loop
    implementation, whose fix is ``foreach=True`` (its fused kernel measured slower).
    Threshold: those classes' steps take ≥ 5 % of the window (TensorBoard plugin's line; another
    optimizer's steps beside them, such as a ``SparseAdam`` for sparse embeddings, which has no
    fused kernel, are not counted). Gain: their share of the window, an upper bound (the fused step still updates every parameter; the
    profiler's cost on the for-loop's many small operators inflates the share); measured in
    ``benchmarks/optimizer_fused.py``. Silent with a GPU (its default is foreach; a for-loop step
    there shows as tiny kernels: ``launch-bound``), for SGD without momentum, for other optimizers,
    and for subclasses (their names differ). Where a sparse embedding's backward ran
    (``aten::embedding_sparse_backward``), the fixes pass the dense parameters only: a fused or
    foreach step raises on a sparse gradient. False positives: parameters that are not floating point or a ``differentiable``
    optimizer, which fused does not support; PyTorch older than 2.4 (the fix says to upgrade)."""
    if ctx.device >= 0:
        return None
    judged = judged_classes(ctx)
    if not judged:
        return None
    # another optimizer's steps (SparseAdam's) gain nothing; the set is analysis.gains' too (one memo)
    steps = optimizer_steps(ctx, judged)
    share = ctx.frac(steps.ns)
    if steps.impl == "fused" or share < MIN_SHARE or (steps.impl == "foreach" and not judged & set(FUSED_ON_CPU)):
        return None
    fusable = sorted(judged & set(FUSED_ON_CPU))
    foreach = sorted(judged & set(FOREACH_ON_CPU))
    names = " and ".join(fusable + foreach)
    torch_version = meta_block(ctx.trace.meta, "versions").get("torch")
    old = _older_than(torch_version, FUSED_SINCE)
    sparse = _has_sparse_gradients(ctx)
    return finding(
        severity=severity_for(share),
        title=f"The optimizer ({names}) updates the parameters one at a time",
        why=(f"""On the CPU, torch.optim's {names} runs its for-loop implementation by default: for every parameter
        tensor, one element-wise operator after another (the moving averages, the square root, the update), each
        paying PyTorch's per-operator cost and reading the tensors again.""" if steps.impl == "for-loop" else
             f"""This {names} runs its foreach implementation (foreach=True): each operator takes every parameter at
        once, but the operators still run one after another, each reading the tensors again.""")
        + (""" With fused=True one kernel updates all the parameters in a single pass (PyTorch 2.4 or later on the
        CPU).""" if fusable else "")
        + (""" SGD with momentum updates its momentum buffer and then the parameter, two or three operators a
        parameter; with foreach=True each of them runs once for all the parameters (its fused kernel measured
        slower than foreach on the CPU).""" if foreach else ""),
        summary=(f"{steps.calls} optimizer {'steps' if steps.calls != 1 else 'step'} ({names}, {steps.impl} implementation) "
                 f"{'take' if steps.calls != 1 else 'takes'} {pct(share)} of the "
                 f"window, {steps.ops_per_call:.0f} operators a step on the host."
                 + (f" This run used PyTorch {torch_version}, older than 2.4: fused on the CPU needs an upgrade."
                    if old else "")),
        numbers={"optimizer_steps": steps.calls, "optimizer_step_frac": round(share, 4),
                 "operators_per_step": round(steps.ops_per_call, 1), "implementation": steps.impl or "",
                 "threshold_frac": MIN_SHARE},
        windows=windows(*steps.intervals, "cpu", label="optimizer step"),
        est_gain=share,
        gain_method=("the optimizer steps' share of the window: the most fusing them can save (the fused step "
                     f"still updates every parameter, and the profiler inflates the for-loop's many operators; "
                     f"{MEASURED})"),
        fixes=(_fixes(fusable, ctx.workload == "training", sparse)
               + tuple(_foreach_fix(c, sparse) for c in foreach)),
        doc_url=DOC,
    )


def judged_classes(ctx: Context) -> frozenset[str]:
    """The optimizer classes this rule judges in the window (computed once per context): Adam,
    AdamW and Adagrad, and SGD when its steps update momentum buffers (``aten::mul_`` inside
    them, about one a parameter: without momentum there is nothing to merge)."""
    return ctx.memo("unfused_optimizer_classes", _judged)


def _judged(ctx: Context) -> frozenset[str]:
    classes = optimizer_steps(ctx).classes
    out = {c for c in classes if c in FUSED_ON_CPU}
    foreach = [c for c in classes if c in FOREACH_ON_CPU]
    if not foreach:
        return frozenset(out)
    ev = ctx.trace.events
    momentum = np.flatnonzero(ctx.events_in_window(ctx.masks["cpu_op"] & ctx.masks["host"]
                                                   & ctx.host_name_ids(lambda n: n == MOMENTUM_OP)[ev.name]))
    for c in foreach:
        steps = optimizer_steps(ctx, frozenset({c}))
        # the steps' own time (closures left out) holds the momentum updates
        if steps.impl == "for-loop" and momentum.size and \
                np.count_nonzero(iv.contains(steps.intervals, ev.ts_ns[momentum])) >= steps.calls:
            out.add(c)
    return frozenset(out)


def _foreach_fix(c: str, sparse: bool = False) -> Fix:
    params = "dense_params" if sparse else "model.parameters()"
    head = DENSE_PARAMS_CODE.strip("\n") + "\n" if sparse else ""
    return pytorch(f"{c} with momentum: foreach=True runs each of its operators once for all the parameters",
                   head + f"optimizer = torch.optim.{c}({params}, lr=lr, momentum=0.9, foreach=True)   "
                   "# keep your other arguments")


#: The operators a sparse embedding's backward calls (``nn.Embedding(..., sparse=True)``, checked
#: on torch 2.13; ``nn.EmbeddingBag``'s: its gradient is a sparse tensor); a fused or foreach step raises on such a
#: gradient ("does not support sparse gradients"), so the fix gives the optimizer the dense
#: parameters only and leaves the sparse ones to their own optimizer (``SparseAdam``).
SPARSE_BACKWARD = frozenset({"aten::embedding_sparse_backward", "aten::_embedding_bag_sparse_backward"})
DENSE_PARAMS_CODE = """
# fused=True takes dense gradients only: the sparse embeddings' parameters stay with their own optimizer (SparseAdam)
sparse_ids = {id(p) for mod in model.modules()
              if isinstance(mod, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and mod.sparse for p in mod.parameters()}
dense_params = [p for p in model.parameters() if id(p) not in sparse_ids]
"""


def _has_sparse_gradients(ctx: Context) -> bool:
    ev = ctx.trace.events
    return bool(np.any(ctx.host_name_ids(SPARSE_BACKWARD.__contains__)[ev.name] & ctx.masks["host"]))


def _fixes(classes: list[str], training: bool, sparse: bool = False) -> tuple[Fix, ...]:
    params = "dense_params" if sparse else "model.parameters()"
    head = DENSE_PARAMS_CODE.strip("\n") + "\n" if sparse else ""
    out = [pytorch(f"Use the fused {c}: one kernel updates every parameter (fused=True; on the CPU since "
                   "PyTorch 2.4)" + ("; the sparse embeddings' parameters are not for it" if sparse else ""),
                   head + f"optimizer = torch.optim.{c}({params}, lr=lr, fused=True)   # keep your other arguments")
           for c in classes]
    if "AdamW" in classes and training:
        out.append(huggingface("Trainer: the fused AdamW (the default with PyTorch 2.8 or later and a recent "
                               "transformers)", 'TrainingArguments(..., optim="adamw_torch_fused")'))
    return tuple(out)


def _older_than(version: object, least: tuple[int, int]) -> bool:
    """Whether a recorded ``torch.__version__`` is older than ``least`` (False when unknown)."""
    found = re.match(r"(\d+)\.(\d+)", version) if isinstance(version, str) else None
    return found is not None and (int(found.group(1)), int(found.group(2))) < least


__all__ = ["unfused_optimizer"]
