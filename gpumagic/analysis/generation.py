"""Token-by-token generation in the window: a language model decoding one position a pass.

The main thread's operators tell: an attention operator (``scaled_dot_product_attention``, or a
softmax), at least :data:`MIN_TOKENS` tokens picked (``aten::argmax`` for greedy search,
``aten::multinomial`` for sampling, ``aten::topk``; a sampler's picks with no model operator
between them are one token), and at least as many ``aten::cat`` calls (the generated ids grow by
concatenation each token, and Hugging Face ``generate``'s key/value cache too). Read once per
context; the CPU rule (``cpu-op-overhead``) and the GPU rules that suggest compiling
(``launch-bound``, ``cpu-bound``) ask it, since compiling the module does not reach what
``generate()`` runs (:data:`GENERATE_COMPILE_CODE`). :func:`regrowth` reads, pass by pass, whether
the model's projections grow with the sequence: a model run on the whole sequence for each token,
without a key/value cache (``decoding-without-cache``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context

#: Fewer tokens picked than this is a classifier's argmax or two, not a decoding loop.
MIN_TOKENS = 16
TOKEN_PICKS = frozenset({"aten::argmax", "aten::multinomial", "aten::topk"})
#: Operators of a model's pass: a token's picks that no such operator separates are one token's
#: (a sampler's ``topk`` then ``multinomial``, which itself calls ``aten::argmax`` on torch 2.13).
PASS_OPS = frozenset({"aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "aten::bmm", "aten::embedding",
                      "aten::scaled_dot_product_attention"})


@dataclass(frozen=True)
class Generation:
    """What the main thread's operators in the window say about token-by-token decoding."""

    #: when each token was picked (ns, the end of its last pick), in time order
    token_ends: np.ndarray
    #: ``aten::cat`` calls
    cats: int
    #: whether an attention operator ran
    attention: bool

    @property
    def tokens(self) -> int:
        """Tokens picked: the outermost picks (:data:`TOKEN_PICKS`), those with no model operator
        (:data:`PASS_OPS`) between them counted as one."""
        return int(self.token_ends.size)

    @property
    def decoding(self) -> bool:
        return self.attention and self.tokens >= MIN_TOKENS and self.cats >= self.tokens


def generation(ctx: Context) -> Generation:
    """The window's tokens picked, concatenations and attention on the main thread (once per context)."""
    return ctx.memo("generation", _generation)


def _generation(ctx: Context) -> Generation:
    ev, names = ctx.trace.events, ctx.trace.name_ids
    mask = ctx.events_in_window(ctx.masks["cpu_op"] & (ev.lane == ctx.main_lane))
    here = ev.name[mask]
    return Generation(token_ends=_token_ends(ctx, mask),
                      cats=int(np.count_nonzero(names(lambda n: n == "aten::cat")[here])),
                      attention=bool(names(lambda n: "scaled_dot_product" in n or "softmax" in n)[here].any()))


def _token_ends(ctx: Context, ops: np.ndarray) -> np.ndarray:
    """End of each token's picks among the operators ``ops`` (one thread's): outermost picks, a run
    of them with no model operator starting in between counted as one token."""
    ev = ctx.trace.events
    rows = np.flatnonzero(ops & ctx.host_name_ids(TOKEN_PICKS.__contains__)[ev.name])
    if not rows.size:
        return np.zeros(0, np.int64)
    order, outer = iv.outermost(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows])
    rows = rows[order][outer]
    starts, ends = ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows]
    passes = np.sort(ev.ts_ns[np.flatnonzero(ops & ctx.host_name_ids(PASS_OPS.__contains__)[ev.name])])
    # a token's last pick: no model operator starts between its end and the next pick's start
    between = np.searchsorted(passes, starts[1:]) - np.searchsorted(passes, ends[:-1])
    last = np.append(between > 0, True)
    out: np.ndarray = ends[last]
    return out


#: The operators whose work grows with the positions a pass runs on, not with the key/value
#: cache's length: the projections (``nn.Linear`` records ``aten::linear``, transformers' GPT-2
#: ``Conv1D`` calls ``aten::addmm``, ``x @ w`` with a 2-D weight ``aten::mm``). Attention over
#: the cache (``aten::bmm``, ``scaled_dot_product_attention``) grows with or without one.
PROJECTION_OPS = frozenset({"aten::linear", "aten::addmm", "aten::mm"})
#: A pass's projections growing by this much from the first tokens' passes to the last ones', in
#: step with the token's place (a rank correlation of at least :data:`MIN_RANK_CORRELATION`), is a
#: model run over the whole sequence again for each token: with a cache the projections run on the
#: new position only, the same work every token.
MIN_GROWTH = 1.5
MIN_RANK_CORRELATION = 0.5
#: The growth must come gradually: each quarter of a sequence's passes above the quarter before by
#: at least this share of the first-to-last growth (a straight line gives a third each). A
#: neighbour process that takes the cores mid-way makes one jump: two quarters as slow as the
#: first (a cached GPT-2 loop read a growth of 2.6× and a rank correlation of 0.51 when two
#: busy-looping processes started half-way on this project's 2-core machine).
MIN_QUARTER_SHARE = 1 / 6
#: A new sequence (the next prompt of a loop over prompts): the projections' work falls under this
#: share of the median of the :data:`RESET_PASSES` passes before and stays there (their median)
#: for as many passes. Without a cache each sequence's passes grow from its prompt's length; with
#: one, the next prompt's prefill is one longer pass, not a fall.
RESET_FRAC = 0.6
RESET_PASSES = 3
#: A sequence is judged from this many passes (a quarter of them, two, against the last two).
MIN_SEQUENCE_PASSES = 8


@dataclass(frozen=True)
class Regrowth:
    """How the work of the model's projections per token grows along a decoding window, judged
    in each sequence it decodes (:data:`RESET_FRAC`) of at least :data:`MIN_SEQUENCE_PASSES`
    passes."""

    #: passes judged: from one token's pick to the next one's
    passes: int
    #: sequences judged (a loop over prompts decodes one after another)
    sequences: int
    #: the projections' work in a pass (ns: host time, or GPU time of the kernels they launched):
    #: the median over the first quarter of each sequence's passes, the second, third and last
    quarters: tuple[float, float, float, float]
    #: Spearman's rank correlation of that work with the pass's place in its sequence (the
    #: sequences' own, weighted by their passes)
    rho: float
    #: what each pass took beyond the fastest of its sequence's first quarter, summed (ns): a pass's
    #: time is its host time from pick to pick, or the GPU time of the kernels it launched where longer
    excess_ns: int
    #: whether the projections' work is the GPU's (kernels they launched)
    gpu: bool

    @property
    def first_ns(self) -> float:
        return self.quarters[0]

    @property
    def last_ns(self) -> float:
        return self.quarters[-1]

    @property
    def growth(self) -> float:
        return self.last_ns / self.first_ns

    @property
    def gradual(self) -> bool:
        """Each quarter's median above the one before by at least :data:`MIN_QUARTER_SHARE` of the
        whole growth: a sequence one position longer each pass, not one jump."""
        q = np.asarray(self.quarters)
        return bool(q[-1] > q[0] and (np.diff(q) >= MIN_QUARTER_SHARE * (q[-1] - q[0])).all())

    @property
    def recomputing(self) -> bool:
        """The projections' work grows with the sequence, steadily: no key/value cache."""
        return self.growth >= MIN_GROWTH and self.rho >= MIN_RANK_CORRELATION and self.gradual


def regrowth(ctx: Context) -> Regrowth | None:
    """The projections' work per pass of a decoding window (:func:`generation`), once per
    context; None when the window does not decode or its passes run no projection."""
    return ctx.memo("generation.regrowth", _regrowth)


def _regrowth(ctx: Context) -> Regrowth | None:
    gen = generation(ctx)
    if not gen.decoding:
        return None
    ev, lane = ctx.trace.events, ctx.main_lane
    ends = gen.token_ends
    rows = np.flatnonzero(ctx.events_in_window(ctx.masks["cpu_op"] & (ev.lane == lane))
                          & ctx.host_name_ids(PROJECTION_OPS.__contains__)[ev.name])
    if not rows.size:
        return None
    projections = iv.union(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows])  # one nested in another counted once
    work = iv.measure_in(projections, ends[:-1], ends[1:]).astype(np.float64)
    took = np.diff(ends).astype(np.float64)
    gpu = False
    if ctx.device >= 0:
        kernels = np.flatnonzero(ctx.masks["kernel"] & ctx.on_device & (ctx.launch_row >= 0))
        kernels = kernels[ev.lane[ctx.launch_row[kernels]] == lane]
        launched = ctx.launch_ts[kernels]
        place = np.searchsorted(ends, launched, side="right") - 1
        inside = (place >= 0) & (place < ends.size - 1)
        kernels, launched, place = kernels[inside], launched[inside], place[inside]
        dur = ev.dur_ns[kernels].astype(np.float64)
        took = np.maximum(took, np.bincount(place, weights=dur, minlength=took.size))
        mine = iv.contains(projections, launched)
        if mine.any():
            work = np.bincount(place[mine], weights=dur[mine], minlength=took.size).astype(np.float64)
            gpu = True
    starts = _sequence_starts(work)
    spans = [(a, b) for a, b in zip(starts, [*starts[1:], work.size]) if b - a >= MIN_SEQUENCE_PASSES]
    if not spans:
        return None
    parts: list[list[np.ndarray]] = [[], [], [], []]
    rhos, sizes, excess = [], [], 0.0
    for a, b in spans:
        for part, values in zip(parts, np.array_split(work[a:b], 4)):
            part.append(values)
        rhos.append(rank_correlation(work[a:b]))
        sizes.append(b - a)
        excess += float(np.maximum(took[a:b] - took[a:a + (b - a) // 4].min(), 0).sum())
    q1, q2, q3, q4 = (median_of(np.concatenate(part)) for part in parts)
    if q1 <= 0:
        return None
    return Regrowth(passes=int(sum(sizes)), sequences=len(spans), quarters=(q1, q2, q3, q4),
                    rho=float(np.dot(rhos, sizes) / sum(sizes)), excess_ns=int(excess), gpu=gpu)


def _sequence_starts(work: np.ndarray) -> list[int]:
    """Where each decoded sequence starts among the passes: 0, and every pass whose work falls
    under :data:`RESET_FRAC` of the median of the :data:`RESET_PASSES` passes before it, the
    median of it and the next ones staying there."""
    n, k = work.size, RESET_PASSES
    starts = [0]
    if n < 2 * k:
        return starts
    windows = np.sort(np.lib.stride_tricks.sliding_window_view(work, k), axis=1)[:, k // 2]  # medians of k
    for p in range(k, n - k + 1):
        before, after = windows[p - k], windows[p]
        if work[p] < RESET_FRAC * before and after < RESET_FRAC * before and p - starts[-1] >= k:
            starts.append(p)
    return starts


def rank_correlation(values: np.ndarray) -> float:
    """Spearman's rank correlation of ``values`` with their order (0 when they are all equal)."""
    if values.size < 3 or np.all(values == values[0]):
        return 0.0
    ranks = np.argsort(np.argsort(values, kind="stable"), kind="stable").astype(np.float64)
    return float(np.corrcoef(np.arange(values.size, dtype=np.float64), ranks)[0, 1])


#: ``generate()`` (transformers' GenerationMixin) calls the module itself, ``self(**inputs)``; the
#: wrapper ``torch.compile(lm)`` returns compiles only calls made through it, and its
#: ``.generate`` is the original module's (``OptimizedModule.__getattr__``): nothing is compiled
#: (checked on torch 2.13, transformers 5.25, CPU: ``python benchmarks/op_overhead.py --generation``,
#: 8 prompts of 40 tokens from a 2-layer GPT-2, 298 ms eager, 292 ms through the wrapper with no
#: frame compiled, 200 ms with ``lm.forward`` compiled).
GENERATE_COMPILE_CODE = """
# generate() calls the model's own forward: compile that (torch.compile(lm) returns a wrapper
# whose .generate() still runs the uncompiled model). The first calls compile: seconds.
lm.forward = torch.compile(lm.forward)
# a decoding loop of your own that calls the model for each token: model = torch.compile(model)
"""
#: On a GPU, transformers compiles the forward ``generate()`` runs by itself when the key/value
#: cache is one whose shapes do not grow (``GenerationMixin._valid_auto_compile_criteria``: a CUDA,
#: XPU or other accelerator device and a compileable cache — a ``StaticCache``, not the default
#: ``DynamicCache``; read in transformers 5.25), with CUDA graphs (its default ``CompileConfig``,
#: ``mode="reduce-overhead"``): a static cache is the one line.
GENERATE_GPU_CODE = """
# generate() calls the model's own forward, which torch.compile(lm) does not reach (the wrapper's
# .generate() runs the uncompiled model). A static key/value cache keeps every token's shapes the
# same; with it, generate() compiles the forward itself on a GPU, with CUDA graphs (the first
# calls compile: seconds)
lm.generation_config.cache_implementation = "static"
# a transformers without that: lm.forward = torch.compile(lm.forward, mode="reduce-overhead", fullgraph=True)
"""

__all__ = ["GENERATE_COMPILE_CODE", "GENERATE_GPU_CODE", "MIN_GROWTH", "MIN_QUARTER_SHARE", "MIN_RANK_CORRELATION",
           "MIN_SEQUENCE_PASSES", "MIN_TOKENS", "PASS_OPS", "PROJECTION_OPS", "RESET_FRAC", "RESET_PASSES",
           "TOKEN_PICKS", "Generation", "Regrowth", "generation", "rank_correlation", "regrowth"]
