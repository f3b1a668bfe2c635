"""``decoding-without-cache``: a language model that generates token by token runs the whole
sequence through every layer again for each new token, without a key/value cache."""

from __future__ import annotations

from gpumagic.analysis.advice.huggingface import transformers_source
from gpumagic.analysis.context import Context
from gpumagic.analysis.generation import MIN_GROWTH, MIN_RANK_CORRELATION, generation, regrowth
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: A finding from this share of the window (the TensorBoard profiler plugin's 5 % line for a
#: bottleneck worth naming).
MIN_FRAC = 0.05
DOC = "https://huggingface.co/docs/transformers/main/en/kv_cache"
#: benchmarks/decode_cache.py on this project's 2-core machine (profiled, then timed unprofiled).
MEASURED = ("benchmarks/decode_cache.py: a 4-layer GPT-2, 256 wide, built from a config, decoding 200 tokens "
            "greedily on the CPU: passing the cache back saved 0.76 of the time and generate() 0.72, for an "
            "estimate of 0.67")

#: ``generate()`` reads ``generation_config.use_cache`` (transformers 5.25: a model whose
#: ``config.use_cache`` is False, as training with gradient checkpointing leaves it, still decodes
#: with the cache while ``generation_config.use_cache`` is True; with both False it runs the whole
#: sequence each token). tests/test_decoding.py runs this with the cache switched off first.
GENERATE_CODE = """
# transformers' generate() keeps every layer's keys and values and runs the model on the new
# token only, while its generation config says use_cache (a model trained with gradient
# checkpointing may have been saved with it off)
lm.generation_config.use_cache = True
with torch.inference_mode():
    ids = lm.generate(ids, max_new_tokens=max_new_tokens)   # your sampling arguments as before
"""
#: transformers 5.25 takes and returns the cache as ``cache`` ("`past_key_values`/`cache_params` are
#: deprecated. Use `cache` instead", ``transformers/utils/generic.py``); 4.x as ``past_key_values``.
LOOP_CODE = """
# a loop of your own around a transformers model: give it back its cache and only the new token
cache = None
with torch.inference_mode():
    for _ in range(max_new_tokens):
        out = lm(ids if cache is None else ids[:, -1:], {name}=cache, use_cache=True)
        cache = out.{name}
        next_id = out.logits[:, -1].argmax(-1, keepdim=True)   # or your sampling, as before
        ids = torch.cat([ids, next_id], dim=1)
# an attention_mask, if you pass one, gains a column of ones each token
"""
#: ``scaled_dot_product_attention(..., is_causal=True)`` aligns its mask to the top left: a single
#: query with a longer key sequence would see the first key alone ("is_causal ... top-left causal
#: bias", torch.nn.functional.scaled_dot_product_attention's documentation, torch 2.13), so a new
#: position attends without a mask. tests/test_decoding.py checks that a model of this form
#: decodes the same tokens with the cache as without.
ATTENTION_CODE = """
# attention of your own (nanoGPT-style): keep the keys and values of the positions already seen
def forward(self, x, cache=None):          # x: (B, T, C): the prompt, then the new position alone
    B, T, C = x.size()
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    if cache is not None:                  # the earlier positions' keys and values
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    # the prompt attends causally; a new position attends to every earlier one (is_causal=True
    # would align its mask with the first key, not the last)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
    return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)), (k, v)
# each block hands its attention's (k, v) back, the position embedding starts at the cache's
# length (torch.arange(past, past + T)), and the loop feeds only the newest token; stop at the
# model's block size, which a cache does not crop
"""


def cache_argument() -> str:
    """The name a transformers model's forward takes and returns its key/value cache by, in the
    installed transformers: ``cache`` where ``utils/generic.py`` calls the old names deprecated
    (5.25), else ``past_key_values`` (4.x; also without transformers: 5.25 still accepts it)."""
    text = transformers_source("utils/generic.py")
    return "cache" if text is not None and "deprecated. Use `cache` instead" in text else "past_key_values"


@rule("decoding-without-cache")
def decoding_without_cache(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: an inference window that decodes token by token (``analysis.generation``:
    attention, at least 16 tokens picked, a concatenation a token) whose passes — from one
    token's pick to the next one's — spend more and more on the model's projections
    (``aten::linear``, ``aten::addmm``, ``aten::mm``: host time on a CPU-only trace, the GPU time
    of the kernels they launched with a GPU): the last quarter's median ≥ 1.5× the first
    quarter's (``generation.MIN_GROWTH``), each quarter's above the one before by ≥ 1/6 of that
    growth (``generation.MIN_QUARTER_SHARE``: a sequence one position longer each pass grows
    through every quarter, a neighbour taking the cores mid-way makes one jump) and a rank
    correlation with the token's place ≥ 0.5,
    in each sequence the window decodes (a loop over prompts: a new sequence where the work falls
    under 0.6× the three passes before and stays there, ``generation.RESET_FRAC``; sequences of
    at least 8 passes judged).
    With a key/value cache the projections run on the new position alone, the same work every
    token; without one each pass runs them on the whole sequence, one position longer each time.
    Threshold: the passes' time beyond the fastest of their sequence's first quarter's (a pass's time: host
    time from pick to pick, or the GPU time of the kernels it launched where longer), summed, ≥
    5 % of the window. Gain: that sum's share, an estimate: what decoding would save if every pass
    took what the first ones take, which a cache nearly gives (attention over the cached keys
    still grows, and the first passes' own recomputation of the prompt is not counted;
    ``benchmarks/decode_cache.py``). Not in training or serving windows (a serving
    engine keeps its own cache; a training loop's batches can grow on purpose). False positives:
    a pass that grows for another reason as decoding goes on (a batch of sequences widened each
    token); false negatives: a long prompt with few tokens (the growth stays under 1.5× however
    much is recomputed) and a GPU whose small matrix products take the same time at any length."""
    if ctx.workload != "inference":
        return None
    gen, rg = generation(ctx), regrowth(ctx)
    if rg is None or not rg.recomputing:
        return None
    frac = rg.excess_ns / ctx.window_ns if ctx.window_ns else 0.0
    if frac < MIN_FRAC:
        return None
    where = "GPU time of the kernels they launched" if rg.gpu else "host time"
    tokens = gen.tokens
    over = f"{tokens:,} tokens" + (f" in {rg.sequences} sequences" if rg.sequences > 1 else "")
    whose = "each sequence's" if rg.sequences > 1 else "the"
    return finding(
        severity=severity_for(frac),
        title=(f"Each token runs the model over the whole sequence again: its matrix products grew {rg.growth:.1f}× "
               f"over {over}"),
        why=f"""A language model generating token by token needs, for each new token, the keys and values of
        every earlier position; a key/value cache keeps them, so each pass runs the layers on the new position
        alone. Here the work of the model's projections (its linear layers) grew pass after pass, from
        {rg.first_ns / 1e6:.2f} ms a pass over the first quarter of {whose} tokens to {rg.last_ns / 1e6:.2f} ms a
        pass over the last (rank correlation with the token's place {rg.rho:.2f}): each pass runs them on the whole sequence,
        one position longer each time, so the total grows with the square of the length instead of linearly.
        transformers' generate() uses a cache by default; generate() with use_cache off (a model trained with
        gradient checkpointing may have been saved so), a loop calling the model with use_cache=False, or a model
        of your own without one recomputes everything.""",
        summary=(f"{over} decoded: the projections took {rg.first_ns / 1e6:.2f} ms a pass at first and "
                 f"{rg.last_ns / 1e6:.2f} ms at the end ({where}); the passes' time beyond the fastest first "
                 f"ones', summed, is {pct(frac)} of the window."),
        numbers={"tokens": tokens, "sequences": rg.sequences, "projection_growth": round(rg.growth, 3), "rank_correlation": round(rg.rho, 3),
                 "excess_frac": round(frac, 4), "threshold_growth": MIN_GROWTH,
                 "threshold_rank_correlation": MIN_RANK_CORRELATION, "threshold_frac": MIN_FRAC},
        est_gain=frac,
        gain_method=("estimate: the passes' time beyond the fastest of the first quarter's, summed, as a share of "
                     "the window: each pass as short as the first ones, which a cache nearly gives (attention over "
                     f"the cached keys still grows; the first passes' recomputation of the prompt is not counted; "
                     f"{MEASURED})"),
        fixes=(pytorch("A transformers model: let generate() decode, with its cache", GENERATE_CODE),
               pytorch("A decoding loop of your own around a transformers model: pass the cache back",
                       LOOP_CODE.format(name=cache_argument())),
               pytorch("A model of your own: keep each attention layer's keys and values", ATTENTION_CODE)),
        doc_url=DOC,
    )


__all__ = ["cache_argument", "decoding_without_cache"]
