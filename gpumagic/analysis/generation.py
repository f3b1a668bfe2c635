"""Token-by-token generation in the window: a language model decoding one position a pass.

The main thread's operators tell: an attention operator (``scaled_dot_product_attention``, or a
softmax), at least :data:`MIN_TOKENS` tokens picked (``aten::argmax`` for greedy search,
``aten::multinomial`` for sampling, ``aten::topk``), and at least as many ``aten::cat`` calls (the
generated ids and the key/value cache grow by concatenation each token: Hugging Face
``generate`` does both). Read once per context; the CPU rule (``cpu-op-overhead``) and the GPU
rules that suggest compiling (``launch-bound``, ``cpu-bound``) ask it, since compiling the module
does not reach what ``generate()`` runs (:data:`GENERATE_COMPILE_CODE`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic.analysis.context import Context

#: Fewer tokens picked than this is a classifier's argmax or two, not a decoding loop.
MIN_TOKENS = 16
TOKEN_PICKS = frozenset({"aten::argmax", "aten::multinomial", "aten::topk"})


@dataclass(frozen=True)
class Generation:
    """What the main thread's operators in the window say about token-by-token decoding."""

    #: tokens picked (:data:`TOKEN_PICKS` calls)
    picks: int
    #: ``aten::cat`` calls
    cats: int
    #: whether an attention operator ran
    attention: bool

    @property
    def decoding(self) -> bool:
        return self.attention and self.picks >= MIN_TOKENS and self.cats >= self.picks


def generation(ctx: Context) -> Generation:
    """The window's token picks, concatenations and attention on the main thread (once per context)."""
    return ctx.memo("generation", _generation)


def _generation(ctx: Context) -> Generation:
    ev, names = ctx.trace.events, ctx.trace.name_ids
    mask = ctx.events_in_window(ctx.masks["cpu_op"] & (ev.lane == ctx.main_lane))
    here = ev.name[mask]
    return Generation(picks=int(np.count_nonzero(names(TOKEN_PICKS.__contains__)[here])),
                      cats=int(np.count_nonzero(names(lambda n: n == "aten::cat")[here])),
                      attention=bool(names(lambda n: "scaled_dot_product" in n or "softmax" in n)[here].any()))


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

__all__ = ["GENERATE_COMPILE_CODE", "GENERATE_GPU_CODE", "MIN_TOKENS", "TOKEN_PICKS", "Generation", "generation"]
