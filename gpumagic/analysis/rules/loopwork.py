"""``loop-host-work``: a CPU-only training loop spends much of each step in its own code, outside
the model's forward, backward and optimizer step."""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis import everystep
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.hostcpu import main_thread_use
from gpumagic.analysis.phases import phase_intervals
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding, Fix

#: A finding from this share of the window (the TensorBoard profiler plugin's 5 % line for a
#: bottleneck worth naming, doubled: some loop code between steps is in every loop) ...
MIN_FRAC = 0.10
#: ... and this much a step (median, ms). A plain loop's own work under gpumagic's capture — the
#: ``for`` statement, the model call before its first operator, the step hook — measured 0.05 to
#: 0.29 ms a step on this project's 2-core machine (CPU MLPs and TensorDataset loaders, with and
#: without workers): not the user's code to change.
MIN_STEP_MS = 0.5
#: How many operators (and Python functions, when the trace has stacks) the evidence names,
#: each with at least this share of the time.
TOP_OPS = 3
MIN_OP_SHARE = 0.01
MIN_FRAME_SHARE = 0.05
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
#: benchmarks/loop_work.py on this project's 2-core machine (the loop profiled, then timed unprofiled).
MEASURED = ("benchmarks/loop_work.py: the tensor fix saved 0.27 of the step for an estimate of 0.24, and 0.41 for "
            "0.42 with twice the bookkeeping")
DOC = "https://ipython.readthedocs.io/en/stable/interactive/magics.html#magic-prun"
#: The usual per-step bookkeeping, kept on tensors: one reduction a step instead of a Python loop
#: over the batch, and a number brought to Python only when it is printed. ``correct`` starts as a
#: Python 0 and becomes a tensor on the model's device at the first addition, so the snippet is
#: the same on a CPU and a GPU.
TENSOR_METRICS_CODE = """
correct, seen = 0, 0  # before the loop
# in the loop, after the forward (logits: the model's output, targets: the batch's labels):
correct = correct + (logits.argmax(dim=1) == targets).sum()  # one reduction a step, no Python loop, no .item()
seen += targets.numel()
if step % 100 == 0:  # bring the number to Python only when you print it
    print(f"step {step}: accuracy {float(correct) / seen:.3f}")
"""
#: A Python loop updating tensors one by one in place (an EMA of the weights, a weight clip, a
#: manual update): from this many in-place operator calls a step in the loop's own code ...
MIN_PER_TENSOR_CALLS = 16
#: ... an in-place operator (``aten::mul_``, ``aten::lerp_``, ``aten::copy_``...: the name ends in ``_``)
IN_PLACE = re.compile(r"^aten::[a-z][a-z0-9_]*[a-z0-9]_$")
#: The fix for a Python loop over tensors, by what the loop's in-place operators do. An average
#: (``mul_``/``add_``/``lerp_``...: an EMA of the weights): torch._foreach_lerp_ takes the two
#: lists and updates every tensor in one call (timm's ModelEmaV3 and
#: torch.optim.swa_utils.get_ema_multi_avg_fn do the same); benchmarks/loop_work_fixes.py on this
#: project's 2-core machine, 26 tensors of a 6-block MLP: 0.043 ms a call against 0.195 ms for the
#: Python loop of mul_ and add_ (medians of 7 alternated rounds).
FOREACH_CODE = """
# an exponential moving average of the weights, for example (ema = decay * ema + (1 - decay) * p):
ema_params, params = list(ema_model.parameters()), list(model.parameters())  # once, before the loop
# in the loop, after optimizer.step(): every tensor in one call
with torch.no_grad():
    torch._foreach_lerp_(ema_params, params, 1 - decay)
"""
#: Zeroing each gradient (``zero_``: ``model.zero_grad(set_to_none=False)`` runs one a parameter on
#: the CPU, as a loop of ``p.grad.zero_()`` does): dropping the gradients instead runs no operator.
ZERO_CODE = """
optimizer.zero_grad()   # set_to_none=True, the default since PyTorch 2.0: the gradients are dropped, not zeroed
# not: model.zero_grad(set_to_none=False), nor: for p in model.parameters(): p.grad.zero_()
"""
#: A weight clip (``clamp_``: a WGAN critic's ``p.data.clamp_(-c, c)``).
CLAMP_CODE = """
params = list(model.parameters())   # once, before the loop (the model whose weights are clipped)
# in the loop, after optimizer.step(): every tensor in one call
with torch.no_grad():
    torch._foreach_clamp_min_(params, -c)
    torch._foreach_clamp_max_(params, c)
"""
ZEROING = frozenset({"aten::zero_", "aten::fill_"})
CLAMPING = frozenset({"aten::clamp_", "aten::clamp_min_", "aten::clamp_max_", "aten::clip_"})
#: What building a tensor from Python data records (``torch.tensor``/``torch.as_tensor`` of a list:
#: ``internal_new_from_data`` sizes the list, allocates, fills element by element, converts; checked
#: on torch 2.13) ...
FROM_PYTHON = ("aten::empty", "aten::to", "aten::lift_fresh")
#: ... and from this share of the loop's own code in the filling alone (a lower bound of the
#: conversion: the scan of the list before the allocation is not counted) it is the loop's work.
MIN_FROM_PYTHON_SHARE = 0.25
#: The data as tensors once, indexed each step. benchmarks/loop_work_fixes.py on this project's
#: machine: a 512 x 64 batch took 5.46 ms through torch.tensor of the lists, 0.049 ms indexing tensors
#: converted once, 0.002 ms through torch.from_numpy of the same numpy array.
FROM_PYTHON_CODE = """
all_inputs = torch.tensor(data, dtype=torch.float32)   # once, before the loop (a numpy array: torch.from_numpy)
all_targets = torch.tensor(labels)
for epoch in range(epochs):
    order = torch.randperm(len(all_inputs))            # a new shuffle each epoch
    for start in range(0, len(all_inputs), batch_size):
        idx = order[start:start + batch_size]
        x, y = all_inputs[idx], all_targets[idx]       # indexing tensors: no Python object per element
"""
#: Where the main thread used less than this share of a core in the loop's time without operators
#: (the CPU samples), it mostly slept there: a wait, not Python computing.
MAX_WAITING_USE = 0.3
#: A slow call the loop waits on (an upload, a file write) handed to a thread: the loop goes on.
BACKGROUND_CODE = """
import concurrent.futures
background = concurrent.futures.ThreadPoolExecutor(max_workers=1)   # once, before the loop
# in the loop: hand the slow call to the thread and go on (numbers, not tensors: float(loss))
background.submit(log, {"step": step, "loss": float(loss)})
# after the loop: wait for what is still queued
background.shutdown(wait=True)
"""
#: Random-number operators (outermost, as the profiler records a call: ``aten::randn`` holds its
#: ``aten::empty`` and ``aten::normal_``): a loop that draws its inputs or noise each step.
RANDOM_OPS = frozenset({
    "aten::randn", "aten::rand", "aten::randint", "aten::randn_like", "aten::rand_like", "aten::randint_like",
    "aten::normal", "aten::normal_", "aten::uniform_", "aten::randperm", "aten::bernoulli", "aten::bernoulli_",
    "aten::multinomial", "aten::random_", "aten::exponential_", "aten::poisson",
})
#: From this share of the loop's own code in them, drawing random numbers is what it does ...
MIN_RANDOM_SHARE = 0.5
#: ... unless other operators (not bookkeeping's) take at least this share of it: the draws are
#: combined with the batch (a flip where a coin says so, a shift, a jitter, added noise), an
#: augmentation of real data, which a pool drawn once would freeze; it belongs in the
#: DataLoader's workers (the preparing fix). Synthetic inputs are the draws alone.
MIN_MIXING_SHARE = 0.25
RANDOM_MEASURED = "benchmarks/loop_work_fixes.py: an MLP step on 512 random rows, 0.154 saved by a pool"
#: Synthetic inputs drawn once: a few batches before the loop, cycled through; the generator's
#: time goes from the step.
RANDOM_POOL_CODE = """
# synthetic inputs: draw a few batches once, before the loop, and cycle through them
pool = [(torch.randn_like(x), torch.randint_like(y, 0, 10)) for _ in range(8)]   # your batch's shapes and labels
for step in range(100):
    x, y = pool[step % len(pool)]   # no random numbers drawn in the loop
    # ... the forward, backward and optimizer step on x, y as before
"""
#: Operators per-step bookkeeping calls on the model's output: a prediction, a comparison, a
#: reduction, a number brought to Python.
METRIC_OPS = frozenset({
    "aten::argmax", "aten::argmin", "aten::max", "aten::min", "aten::topk", "aten::eq", "aten::ne", "aten::sum",
    "aten::mean", "aten::item", "aten::_local_scalar_dense", "aten::softmax", "aten::_softmax", "aten::log_softmax",
    "aten::index_put_", "aten::bincount", "aten::histc", "aten::tolist", "aten::isfinite", "aten::isnan",
})
#: The same work each epoch on the inputs (a cast, a scaling, a normalization), done once on the
#: whole dataset before the loop; the loop indexes the result (a float32 copy takes 4x a uint8
#: dataset's memory: the why says so). Random work (augmentation) belongs in the DataLoader.
PREPARE_ONCE_CODE = """
# the same every epoch (a cast, a scaling, a normalization): once, before the loop, on the whole dataset
mean, std = 0.1307, 0.3081                                  # your normalization
all_inputs = (raw_inputs.float() / 255 - mean) / std        # raw_inputs: every sample as stored (uint8 here)
for start in range(0, len(all_inputs), batch_size):
    xb = all_inputs[start:start + batch_size]               # indexing only: no conversion each step
    # ... the forward, backward and optimizer step on xb as before
# random work instead (augmentation): in the Dataset's __getitem__ or a collate_fn, so that
# DataLoader(..., num_workers=2) runs it beside the training step
"""
#: Where random draws hold this share of the loop's preparing operators' time, the preparation
#: is an augmentation: moved, not done once ...
MIN_AUGMENT_SHARE = 0.25
#: ... into worker processes, which help only with a core to run on: below this many idle usable
#: cores on average (the CPU samples) the move is no gain.
MIN_IDLE_FOR_WORKERS = 1.0
#: benchmarks/augment_workers.py on this project's 2-core machine (both cores busy with the step's
#: two intra-op threads).
AUGMENT_MEASURED = ("benchmarks/augment_workers.py: a SimCLR-style epoch on 2 busy cores took 1.13x and 1.24x as "
                    "long with its augmentation in two workers")
#: The batch's augmentation, unchanged, as the loader's collate_fn: each worker process stacks
#: its batch (``default_collate``) and augments it while the main process trains on the one
#: before. Workers started by spawn or forkserver (macOS, Windows; Linux from Python 3.14) import
#: the collate_fn by name, which a function defined in a notebook cell does not allow: the
#: snippet says to put both functions in a .py file there.
AUGMENT_WORKERS_CODE = """
# in a notebook on macOS or Windows (or Python 3.14+), put augment and this function in a .py file and import them:
# workers started by spawn or forkserver cannot load functions defined in a cell
def collate_and_augment(samples):
    xb, yb = torch.utils.data.default_collate(samples)
    return augment(xb), yb      # your augmentation of a batch (two views for contrastive learning: augment(xb) twice)

loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, collate_fn=collate_and_augment,
                                     num_workers=2, persistent_workers=True)
for xb, yb in loader:          # augmented in the workers, while the step before ran
    ...                        # the forward, backward and optimizer step as before, without augment()
"""
PRUN_CODE = """
%%prun -s tottime -l 15
# the cell as it is: Python's profiler lists the functions that spend the most time themselves
"""


@rule("loop-host-work")
def loop_host_work(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a CPU-only training window (the steps have a backward) whose steps spend ≥ 10 %
    of the window and a median ≥ 0.5 ms a step in the ``other`` phase (``metrics.phases``)
    before their forward pass — after the last optimizer step, not waiting for data, not in
    ``zero_grad``, before the forward's first operator that the backward undoes; the gaps between
    the model's phases (gradient clipping before the optimizer) do not count — the loop's own code:
    metrics computed in Python, ``.tolist()``, logging, progress bars. ``torch.save`` calls the
    step timer saw are left out (``frequent-checkpoints``). Gain: that time's share of the
    window, an estimate (the profiler slows the model's operators, not the loop's Python, which
    pulls it low; the fix still costs a little, which pulls the saving low). Fixes:
    bookkeeping on tensors, reported every N steps; ``%%prun`` to find the lines. Where ≥ half of
    that time is in random-number operators (``torch.randn``, ``torch.randint``... outermost), the
    loop draws its inputs or noise each step: a pool of batches drawn once, for synthetic inputs
    (the why says fresh noise training needs is the step's own work), with that time's share as
    the estimate — unless other operators (not bookkeeping's) hold ≥ a quarter of that time or
    make as many calls as the draws: the draws then augment real data (a flip, a shift, a
    jitter, noise added to the batch: a denoising autoencoder's), a preparation of the batch. Where
    operators hold most of the time (< half without one running) and the bookkeeping's
    comparisons and reductions (``METRIC_OPS``: argmax, eq, sum, item...) under half of theirs,
    the loop prepares its batches (casts, scaling, normalization): the inputs prepared once on the
    whole dataset and indexed; where random draws hold ≥ a quarter of that time, an augmentation,
    moved into the loader's ``collate_fn`` (its workers), with no gain where the CPU samples show
    under one usable core idle on average (the workers would take the step's cores). False
    positives: work that belongs to the step but runs no operator the backward undoes before
    the forward (a Python-side augmentation of the batch outside the DataLoader) counts here."""
    if ctx.device >= 0 or not ctx.step_bounds or m.phases is None or not m.phases.found.backward:
        return None
    # the step's "other" time before its forward pass: after the last optimizer step (the step
    # begins in its hook), where a loop keeps its books; not the gaps between the model's phases
    # (gradient clipping, a scaler's unscale, between the backward and the optimizer)
    leading = [iv.clip(p["other"], lo, int(p["forward"][0][0]) if p["forward"][0].size else lo)
               for p, (lo, _hi) in zip(phase_intervals(ctx), ctx.step_bounds, strict=True)]
    other = iv.union_of(leading)
    saves = _saves(ctx)
    if saves[0].size:
        other = iv.subtract(other, saves)
    per_step = [iv.total(iv.clip(other, lo, hi)) / 1e6 for lo, hi in ctx.step_bounds]
    total = iv.total(other)
    frac = total / ctx.window_ns if ctx.window_ns else 0.0
    step_ms = median_of(per_step)
    if frac < MIN_FRAC or step_ms < MIN_STEP_MS:
        return None
    ops_ns, ops, op_ns, calls, from_python_ns, from_python_calls = _operators_in(ctx, other)
    # how much of a core the main thread wanted while no operator of its ran there (CPU samples)
    ev, mk = ctx.trace.events, ctx.masks
    use, samples = main_thread_use(ctx, iv.subtract(other, ops), ctx.intervals(mk["cpu_op"] & (ev.lane == ctx.main_lane)))
    slept = use is not None and use < MAX_WAITING_USE
    top = op_ns.most_common(TOP_OPS)
    python_frac = max(0.0, (total - ops_ns) / total) if total else 0.0
    waiting = slept and python_frac >= 0.5  # the waits are most of the loop's own code, not its operators
    named = ", ".join(f"{n} {c / 1e6:.2f} ms" for n, c in top if c >= MIN_OP_SHARE * total) or "none of note"
    in_place = Counter({n: c for n, c in calls.items() if IN_PLACE.match(n)})
    per_tensor = sum(in_place.values()) / len(ctx.step_bounds)
    # many a step, and most of the operators' time there
    tensor_loop = per_tensor >= MIN_PER_TENSOR_CALLS and 2 * sum(op_ns[n] for n in in_place) >= sum(op_ns.values())
    from_python = from_python_ns >= MIN_FROM_PYTHON_SHARE * total
    random_ns = sum(op_ns[n] for n in RANDOM_OPS)
    metric_ns = sum(op_ns[n] for n in METRIC_OPS)
    mixing_ns = sum(op_ns.values()) - random_ns - metric_ns  # what combines the draws with the batch
    # the draws are the inputs (synthetic data): not combined with anything, by time, and fewer
    # other calls than draws (noise added to real data, x + 0.3 * randn_like(x), is cheap beside
    # its draw but takes a call or two for each)
    random_calls, metric_calls = sum(calls[n] for n in RANDOM_OPS), sum(calls[n] for n in METRIC_OPS)
    mixing_calls = sum(calls.values()) - random_calls - metric_calls
    drawing = (random_ns >= MIN_RANDOM_SHARE * total and mixing_ns < MIN_MIXING_SHARE * total
               and mixing_calls < random_calls)
    # operators, not Python, are most of it, and not bookkeeping's: the loop prepares its batches
    preparing = python_frac < 0.5 and 2 * metric_ns < sum(op_ns.values())
    frames = [(n, c) for n, c in _python_frames_in(ctx, other) if c >= MIN_FRAME_SHARE * total]
    lines = ("; Python functions with the most of it (their own time, with_stack): "
             + ", ".join(f"{n} {c / 1e6:.2f} ms" for n, c in frames)) if frames else ""
    why = """Between one optimizer step and the next forward pass, each step ran code of the loop itself — not
        the data loader, not the model's forward or backward, not the optimizer. That is where per-step bookkeeping
        runs: metrics computed element by element in Python, tensors turned into lists, logging and progress bars.
        A Python loop over a batch pays the interpreter per element; a tensor reduction does the same work in one
        operator, and a number printed every hundred steps costs a hundredth."""
    summary = (f"{pct(frac)} of the window ({total / 1e6:.1f} ms; median {step_ms:.2f} ms a step) ran between the "
               f"optimizer step and the next forward pass, not waiting for data; {pct(python_frac)} of it with no "
               f"PyTorch operator running{'' if waiting else ' (Python)'}. Operators in it: {named}{lines}.")
    if use is not None:
        summary += (f" The main thread used {pct(use)} of a core in that time without operators (at most: from "
                    f"{samples} CPU samples)" + (": it mostly waited." if slept else "."))
    gain, method = frac, ("estimate: the share of the window the loop's own code took between the optimizer step "
                          "and the next forward pass (torch.save left out); the profiler slows the operators and not "
                          f"the Python between them, which pulls it low ({MEASURED})")
    if waiting:
        why += """ Here the main thread mostly slept in that time, by the CPU samples: the loop waits on something
        outside PyTorch — time.sleep, a synchronous write of logs or files, a network call (an experiment tracker's
        upload, a request), a lock, a subprocess — rather than computing. %%prun lists the waiting call (time.sleep,
        a socket's or a file's method) near the top by its own time; hand it to a background thread, or make it
        every N steps."""
        fix = pytorch("Hand the slow call to a background thread and go on", BACKGROUND_CODE)
    elif from_python:
        why += """ Here the loop builds its batches from Python data each step (torch.tensor or torch.as_tensor of
        lists): PyTorch walks the lists to find their shape, then converts every element, one Python object at a
        time. Converting the data once, before the loop, and indexing the tensors each step leaves only the
        indexing (from a numpy array, torch.from_numpy shares its memory without converting)."""
        summary += (f" {from_python_calls / len(ctx.step_bounds):.0f} tensors a step were built from Python data "
                    f"(aten::empty, a fill by element, aten::to, aten::lift_fresh, as torch.tensor of a list records "
                    f"it); the fills alone took {from_python_ns / 1e6:.1f} ms, {pct(from_python_ns / total)} of it "
                    f"(the walk through the lists before each allocation not counted).")
        fix = pytorch("Convert the data to tensors once, before the loop, and index them each step", FROM_PYTHON_CODE)
    elif drawing:
        why += """ Here most of that time went to drawing random numbers (torch.randn, torch.randint and kin), not to
        Python: the loop makes its inputs or its noise each step. Synthetic inputs (a benchmark, a toy problem, a
        smoke test) need not be new every step: a few batches drawn once before the loop and cycled through take
        the generator out of the step. Noise that training needs fresh each step (a diffusion model's noise,
        random masks) is the step's own work, not overhead: leave it, and read the time as its cost."""
        summary += (f" Random-number operators took {random_ns / 1e6:.1f} ms of it ({pct(random_ns / total)}).")
        fix = pytorch("Synthetic inputs: draw a few batches once, before the loop, and cycle through them",
                      RANDOM_POOL_CODE)
        gain = ctx.frac(random_ns)
        method = ("estimate: the share of the window in random-number operators in the loop's own code, which a "
                  f"pool drawn once takes out of the step ({RANDOM_MEASURED})")
    elif tensor_loop:
        why += """ Here most of the operators are in-place updates of one tensor each, many a step: a Python loop over
        tensors (an exponential moving average of the weights, a weight clip, a hand-written update), which pays the
        interpreter and PyTorch's per-operator cost once per tensor. The torch._foreach_ operators take the whole
        list in one call, and gradients need no zeroing at all (set_to_none=True drops them)."""
        summary += (f" {per_tensor:.0f} in-place operator calls a step there, most of its operator time ("
                    + ", ".join(f"{n} ×{c / len(ctx.step_bounds):.0f}" for n, c in in_place.most_common(TOP_OPS))
                    + "): a Python loop over tensors.")
        fix = _tensor_loop_fix(in_place)
    elif preparing and random_ns >= MIN_AUGMENT_SHARE * total:
        why += f""" Here most of that time is in PyTorch operators, not Python, and random-number operators hold
        {pct(random_ns / total)} of it, applied to the batch by the others: the loop augments its batches on the
        main thread (random flips, shifts, jitter, noise), between one step and the next. Random work cannot be
        done once; it can run elsewhere: a collate_fn applies the same function to each batch inside the
        DataLoader's worker processes, which prepare the next batches while the step runs (given a core for
        them)."""
        fix = pytorch("Augment in the DataLoader's workers: the same function as a collate_fn, beside the step "
                      "(where a core is free for them)", AUGMENT_WORKERS_CODE)
        host = m.host
        idle = (host.usable_cores - host.cpu_busy_cores
                if host.usable_cores is not None and host.cpu_busy_cores is not None else None)
        if idle is not None and idle < MIN_IDLE_FOR_WORKERS:
            why += f""" But the CPU samples show the cores busy through the window ({host.cpu_busy_cores:.1f} of
            {host.usable_cores:g} usable cores in use): workers would take their time from the step's own threads,
            and the move saves nothing here ({AUGMENT_MEASURED}). It pays on a machine with cores to spare."""
            gain, method = 0.0, (f"none while no core is free: {idle:.1f} of {host.usable_cores:g} usable cores idle "
                                 f"on average (CPU samples), and workers need one ({AUGMENT_MEASURED})")
    elif preparing:
        why += """ Here most of that time is in PyTorch operators, not Python, and not the comparisons and reductions
        of bookkeeping: the loop prepares its batches on the main thread (casts, scaling, normalization), between
        one step and the next. Work that is the same every epoch can be done once, on the whole dataset, before
        the loop, if the result fits in memory (float32 takes four times the bytes of uint8 images); random work
        (augmentation) belongs in the Dataset or a collate_fn, where DataLoader workers run it beside the step."""
        fix = pytorch("Prepare the inputs once, before the loop, and index the result each step (random "
                      "augmentation: in the DataLoader's workers)", PREPARE_ONCE_CODE)
    else:
        fix = pytorch("Keep per-step bookkeeping on tensors and bring it to Python only when you print it",
                      TENSOR_METRICS_CODE)
    prun = pytorch("Find the lines: profile the cell with Python's profiler (IPython's %%prun), slowest "
                   "functions by their own time first", PRUN_CODE, diagnostic=True)
    return finding(
        severity=severity_for(gain),
        title=f"The loop's own code outside the model takes {pct(frac)} of the time",
        why=why,
        summary=summary,
        numbers={"loop_work_frac": round(frac, 4), "loop_work_step_ms": round(step_ms, 4),
                 "no_operator_frac": round(python_frac, 4), "in_place_calls_per_step": round(per_tensor, 1),
                 "from_python_data_frac": round(from_python_ns / total, 4) if total else 0.0,
                 "random_ops_frac": round(random_ns / total, 4) if total else 0.0,
                 "bookkeeping_ops_frac": round(metric_ns / total, 4) if total else 0.0,
                 **({"main_thread_core_use": round(use, 4)} if use is not None else {}),
                 "threshold_frac": MIN_FRAC,
                 "threshold_loop_work_step_ms": MIN_STEP_MS},
        est_gain=gain,
        gain_method=method,
        fixes=(prun, fix) if waiting else (fix, prun),
        doc_url=DOC,
    )


def _tensor_loop_fix(in_place: Counter[str]) -> Fix:
    """The fix for a Python loop over tensors, by the in-place operator it calls most."""
    top = in_place.most_common(1)[0][0]
    if top in ZEROING:
        return pytorch("Drop the gradients instead of zeroing each one", ZERO_CODE)
    if top in CLAMPING:
        return pytorch("Clip the weights in one call: torch._foreach_ operators instead of a Python loop", CLAMP_CODE)
    return pytorch("Update the tensors in one call: torch._foreach_ operators instead of a Python loop", FOREACH_CODE)


def _saves(ctx: Context) -> iv.Intervals:
    """``torch.save`` calls the step timer saw, on the trace's clock (empty without a timer)."""
    block = everystep.block_of(ctx)
    if block is None:
        return iv.empty()
    spans = everystep.spans_ns(block, ctx.step_names, ctx.step_bounds, lambda e: e["kind"] == "torch.save")
    if not spans:
        return iv.empty()
    return iv.union(np.array([a for a, _ in spans], np.int64), np.array([b for _, b in spans], np.int64))


class _LoopOps(NamedTuple):
    """The main thread's operators inside the loop's own code (:func:`_operators_in`)."""

    ops_ns: int  # their time, each moment once
    ops: iv.Intervals  # that time
    time: Counter[str]  # the outermost ones' time, by name
    calls: Counter[str]  # the outermost ones' calls, by name
    from_python_ns: int  # tensors filled from Python data (:data:`FROM_PYTHON`): from allocation to lift_fresh
    from_python_calls: int


def _operators_in(ctx: Context, where: iv.Intervals) -> _LoopOps:
    """The main thread's operators inside ``where``."""
    ev, mk = ctx.trace.events, ctx.masks
    rows = np.flatnonzero(mk["cpu_op"] & (ev.lane == ctx.main_lane) & ctx.events_in_window(mk["cpu_op"]))
    if rows.size and where[0].size:
        rows = rows[iv.contains(where, ev.ts_ns[rows])]
    if rows.size == 0 or where[0].size == 0:
        return _LoopOps(0, iv.empty(), Counter(), Counter(), 0, 0)
    s, e = ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows]
    order, outer = iv.outermost(s, e)  # by start, the enclosing operator first
    rows, s, e = rows[order], s[order], e[order]
    ops = iv.intersect(iv.union(s[outer], e[outer]), where)
    ops_ns = iv.total(ops)
    by_name: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    names = [ctx.trace.names[i] for i in ev.name[rows[outer]].tolist()]
    for name, a, b in zip(names, s[outer].tolist(), e[outer].tolist(), strict=True):
        by_name[name] += b - a
        calls[name] += 1
    # torch.tensor(list) records aten::empty, then fills it from the Python objects (no operator),
    # then aten::to and aten::lift_fresh, one after another at the top level
    starts = s[outer].tolist()
    filled = [starts[k] - starts[k - 2] for k in range(2, len(names)) if tuple(names[k - 2:k + 1]) == FROM_PYTHON]
    return _LoopOps(ops_ns, ops, by_name, calls, int(sum(filled)), len(filled))


def _python_frames_in(ctx: Context, where: iv.Intervals) -> list[tuple[str, int]]:
    """With ``with_stack``: the main thread's Python functions (``python_function`` events) with
    the most time of their own — less the functions they called — inside ``where``, by name."""
    ev, mk = ctx.trace.events, ctx.masks
    rows = np.flatnonzero(mk["python"] & (ev.lane == ctx.main_lane))
    if rows.size == 0 or where[0].size == 0:
        return []
    s, e = ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows]
    near = (e > where[0][0]) & (s < where[1][-1])
    rows, s, e = rows[near], s[near], e[near]
    if rows.size == 0:
        return []
    order = np.lexsort((-e, s))  # by start, the caller before the functions it calls
    rows, s, e = rows[order], s[order], e[order]
    inside = iv.measure_in(where, s, e)  # each frame's time inside ``where``
    own = inside.astype(np.int64).copy()
    stack: list[int] = []
    for i in range(rows.size):
        while stack and e[stack[-1]] <= s[i]:
            stack.pop()
        if stack:
            own[stack[-1]] -= inside[i]  # the caller's own time excludes its callees'
        stack.append(i)
    by_name: Counter[str] = Counter()
    for r, t in zip(rows.tolist(), own.tolist(), strict=True):
        if t > 0:
            by_name[_ADDRESS.sub("", ctx.trace.names[ev.name[r]])[:100]] += t
    return by_name.most_common(TOP_OPS)


__all__ = ["loop_host_work"]
