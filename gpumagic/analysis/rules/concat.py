"""``growing-concatenation``: a tensor grown by concatenation, one piece at a time, copies
everything gathered so far at every call: the copying grows with the count, quadratically in all."""

from __future__ import annotations

import numpy as np

from gpumagic._arrays import distinct, median_of
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.generation import generation, rank_correlation
from gpumagic.analysis.loaderwait import main_waits
from gpumagic.analysis.rules.base import finding, huggingface, pct, pytorch, rule, severity_for, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: The operators that copy their inputs into a new tensor (``torch.cat`` and the functions that
#: call it: ``torch.stack``, ``vstack``/``hstack``..., ``concat``/``concatenate``); a call nested
#: in another (``stack`` calls ``cat``) counts once.
CONCAT_OPS = frozenset({"aten::cat", "aten::concat", "aten::concatenate", "aten::stack", "aten::vstack",
                        "aten::hstack", "aten::row_stack", "aten::column_stack", "aten::dstack"})
#: A finding from this share of the window: the TensorBoard profiler plugin's 5 % line for a
#: bottleneck worth naming, doubled (a model that concatenates its features spends some time so).
MIN_FRAC = 0.10
#: At least this many calls in a growing series (a quarter of it holds two or more).
MIN_CALLS = 8
#: The last quarter's median call at least this many times the first quarter's (copying what was
#: gathered grows linearly with the count: 7x from the first quarter to the last when it
#: starts from nothing) ...
MIN_GROWTH = 2.0
#: ... ranking with the call's place at least this well (Spearman), each quarter's median at or
#: above the one before.
MIN_RANK_CORRELATION = 0.5
#: Where a model's own concatenations (a mask, a feature map: the same size every call) run
#: between the growing ones, the series is read again from the calls at least this many times
#: the median call: Hugging Face's evaluation loop grows its logits by concatenation after every
#: batch (``EvalLoopContainer.add``, ``nested_concat``) among GPT-2's small concatenations of
#: 4 to 30 µs a call.
BIG_CALL = 4.0
DOC = "https://pytorch.org/docs/stable/generated/torch.cat.html"
#: benchmarks/concat_growth.py on this project's 2-core machine, alternated rounds.
MEASURED = ("benchmarks/concat_growth.py: 400 batches of 768-wide outputs on the CPU, 1,207 ms grown by torch.cat, "
            "135 ms in a list with one torch.cat (0.89 saved), for an estimate of 0.73; a Trainer evaluating a tiny "
            "GPT-2, 0.73 saved by keeping the predicted ids, for an estimate of 0.52")
LIST_CODE = """
outputs = []                               # a Python list: appending copies nothing
with torch.inference_mode():
    for x in batches:                      # your loop, as before
        outputs.append(model(x))           # keep each batch's result (.cpu() it to free GPU memory)
result = torch.cat(outputs)                # one copy, once, at the end
"""

#: transformers' Trainer grows each evaluation's logits by concatenation after every batch
#: (``EvalLoopContainer.add`` calls ``nested_concat`` while ``eval_do_concat_batches`` is True,
#: transformers 5.25 ``trainer_pt_utils.py``); ``preprocess_logits_for_metrics`` runs "right
#: before caching them at each evaluation step" (its docstring), so what is kept, and copied again
#: at every batch, is the predicted ids: a vocabulary-wide row per token becomes one number.
TRAINER_CODE = """
# compute_metrics then gets the ids as eval_pred.predictions: drop its own argmax
trainer = Trainer(..., preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(dim=-1))
"""


@rule("growing-concatenation")
def growing_concatenation(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the window's outermost concatenations on the main thread (:data:`CONCAT_OPS`: a
    ``torch.cat``, ``torch.stack``... , each call's host time, or the GPU time of the kernels it
    launched where longer) grow with their order, as a tensor grown by ``x = torch.cat([x, new])``
    in a loop does: all the window's calls in order, or else each step's (a sequence built anew
    in every forward, an evaluation inside a step), or else the same of each DataLoader batch's
    longest call (a loop that concatenates several things a batch), or of the calls ≥ 4× the
    median call (the growing ones among a model's own small concatenations); series of ≥ 8
    calls whose last quarter's median is ≥ 2× the first quarter's, each quarter's at or above the
    one before, with a rank correlation ≥ 0.5; those calls take ≥ 10 % of the window. Silent
    where the window decodes token by token (``generation``: its key/value cache and token ids
    grow so by design; ``decoding-without-cache`` and ``cpu-op-overhead`` speak there). Gain, an estimate: the growing calls' time less
    one call as long as each series' longest (the single concatenation at the end that replaces
    them). False positives: concatenations that grow for another reason (a batch size that rises
    through the window)."""
    if generation(ctx).decoding:
        return None
    ev = ctx.trace.events
    rows = np.flatnonzero(ctx.events_in_window(ctx.masks["cpu_op"] & (ev.lane == ctx.main_lane))
                          & ctx.host_name_ids(CONCAT_OPS.__contains__)[ev.name])
    if rows.size < MIN_CALLS:
        return None
    starts, ends = iv.union(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows])  # a nested call counted once
    work = (ends - starts).astype(np.float64)
    gpu = False
    if ctx.device >= 0:
        kernels = ctx.launched_by_main()
        launched = ctx.launch_ts[kernels]
        place = np.searchsorted(starts, launched, side="right") - 1
        inside = (place >= 0) & (launched < ends[np.maximum(place, 0)])
        if inside.any():
            on_gpu = np.bincount(place[inside], weights=ev.dur_ns[kernels[inside]].astype(np.float64),
                                 minlength=work.size)
            gpu = bool((on_gpu > work).sum() * 2 > work.size)
            work = np.maximum(work, on_gpu)
    everything = np.arange(work.size)
    per_step: list[np.ndarray] = []
    if len(ctx.step_bounds) > 1:  # a sequence built anew in every step (in a forward, an evaluation)
        step_of = np.searchsorted([lo for lo, _ in ctx.step_bounds], starts, side="right")
        per_step = [everything[step_of == k] for k in distinct(step_of).tolist()]
    per_batch = _batch_maxima(ctx, starts, work)  # each batch's longest call: the growing one
    longest_of_batch = np.zeros(work.size, dtype=bool)
    longest_of_batch[per_batch] = True
    big = work >= BIG_CALL * median_of(work)  # the growing calls among a model's own small ones
    grown = (_growing(work, [everything]) or _growing(work, per_step)
             or _growing(work, [per_batch]) or _growing(work, [idx[longest_of_batch[idx]] for idx in per_step])
             or _growing(work, [everything[big]]) or _growing(work, [idx[big[idx]] for idx in per_step]))
    if not grown:
        return None
    parts = [np.concatenate([np.array_split(work[idx], 4)[k] for idx in grown]) for k in range(4)]
    sizes = [idx.size for idx in grown]
    rhos = [rank_correlation(work[idx]) for idx in grown]
    longest = sum(float(work[idx].max()) for idx in grown)
    calls = int(sum(sizes))
    total = float(sum(work[idx].sum() for idx in grown))
    share = total / ctx.window_ns
    if share < MIN_FRAC:
        return None
    q1, q4 = median_of(parts[0]), median_of(parts[3])
    rho = float(np.dot(rhos, sizes) / sum(sizes))
    gain = max(0.0, total - longest) / ctx.window_ns
    picked = np.concatenate(grown)
    where = "the GPU's copies" if gpu else "each call's host time"
    return finding(
        severity=severity_for(gain),
        title=f"A tensor grown by concatenation copies everything gathered so far at each of {calls:,} calls",
        why=f"""torch.cat (and torch.stack, which calls it) makes a new tensor and copies every input into it.
        A loop that grows a tensor with x = torch.cat([x, new]) therefore copies all it has gathered again at every
        call: the copying grows with the count, quadratically in all. Here {calls:,} concatenations grew from
        {q1 / 1e3:,.0f} µs to {q4 / 1e3:,.0f} µs a call ({where}, first quarter to last, medians)
        {'' if len(grown) == 1 else f'in each of {len(grown)} series that start again, '}taking {pct(share)} of the
        window. Appending to a Python list copies nothing: one torch.cat of the list at the end copies each piece
        once. A sequence built one time step at a time inside a model is the same: a list of the steps and one
        torch.stack.""",
        summary=(f"{calls:,} concatenation calls (torch.cat, torch.stack...) grew {q4 / q1:.1f}× from the first "
                 f"quarter to the last (median {q1 / 1e3:,.0f} → {q4 / 1e3:,.0f} µs, rank correlation {rho:.2f}) and "
                 f"took {pct(share)} of the window."),
        numbers={"concat_frac": round(share, 4), "calls": calls, "series": len(grown),
                 "first_quarter_us": round(q1 / 1e3, 3), "last_quarter_us": round(q4 / 1e3, 3),
                 "growth": round(q4 / q1, 2), "rank_correlation": round(rho, 3),
                 "measured_on": "GPU kernels" if gpu else "host",
                 "threshold_frac": MIN_FRAC, "threshold_growth": MIN_GROWTH},
        windows=windows(starts[picked], ends[picked], "cpu", label="a growing concatenation"),
        est_gain=gain,
        gain_method=("estimate: the growing concatenations' time less one call as long as each series' longest "
                     f"(the one concatenation at the end that replaces them) ({MEASURED})"),
        fixes=(pytorch("Collect the pieces in a list and concatenate once, at the end", LIST_CODE),
               huggingface("Trainer evaluation: it concatenates each batch's logits to the ones before; keep the "
                           "predicted ids instead, far smaller", TRAINER_CODE)),
        doc_url=DOC,
    )


def _batch_maxima(ctx: Context, starts: np.ndarray, work: np.ndarray) -> np.ndarray:
    """The longest call between one DataLoader batch's wait and the next (indices, in order):
    where a loop concatenates several things a batch (Hugging Face's evaluation: the logits, then
    the labels), the largest is the one that grows fastest. Empty without such waits."""
    waits = main_waits(ctx)
    if waits.size < MIN_CALLS:
        return np.empty(0, dtype=np.int64)
    batch = np.searchsorted(waits, starts, side="right")
    order = np.lexsort((-work, batch))  # by batch, the longest first
    first = np.concatenate([[True], batch[order][1:] != batch[order][:-1]])
    return np.sort(order[first])


def _growing(work: np.ndarray, series: list[np.ndarray]) -> list[np.ndarray]:
    """The series (indices of calls, in order) of at least :data:`MIN_CALLS` calls that grow:
    the last quarter's median ≥ :data:`MIN_GROWTH` × the first's, each quarter's at or above the
    one before, a rank correlation with their order ≥ :data:`MIN_RANK_CORRELATION`."""
    out = []
    for idx in series:
        if idx.size < MIN_CALLS:
            continue
        q = [median_of(x) for x in np.array_split(work[idx], 4)]
        if (q[0] > 0 and q[3] >= MIN_GROWTH * q[0] and q[0] <= q[1] <= q[2] <= q[3]
                and rank_correlation(work[idx]) >= MIN_RANK_CORRELATION):
            out.append(idx)
    return out


__all__ = ["growing_concatenation"]
