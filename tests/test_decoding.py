"""``decoding-without-cache``: a language model decoding token by token that runs the whole
sequence through its layers again for each token (no key/value cache), and the token count
``analysis.generation`` gives the rules that read generation."""

from __future__ import annotations

import glob
import itertools
import os
import random

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.analysis.context import build_context
from gpumagic.analysis.generation import MIN_GROWTH, generation, regrowth
from gpumagic.trace import load

NOCACHE = os.path.join(DATA, "cpu_decode_nocache.json.gz")
GENERATE = os.path.join(DATA, "cpu_generate.json.gz")
LAYERS = 2


def _decoding(projection_us, tokens: int = 40, attention_us=lambda k: 5.0, sampler: bool = False,
              training: bool = False, gpu_kernel_us=None):
    """A window decoding ``tokens`` tokens, one pass each: an embedding, per layer a linear of
    ``projection_us(k)`` µs, an attention of ``attention_us(k)``, another linear, then the pick
    (``argmax``, or with ``sampler`` a ``topk`` then a ``multinomial`` that calls ``argmax``
    inside, as torch 2.13's does) and the ``cat`` that grows the ids. With ``gpu_kernel_us`` each
    linear launches a kernel of ``gpu_kernel_us(k)`` µs. Returns the builder and each pass's
    (start, end) in µs."""
    tb = TraceBuilder(cc=(8, 0) if gpu_kernel_us else None)
    t, gpu_t, passes = 0.0, 0.0, []
    for k in range(tokens):
        start = t
        tb.op("aten::embedding", t, 10)
        t += 12
        for _ in range(LAYERS):
            for name, dur in (("aten::linear", projection_us(k)), ("aten::scaled_dot_product_attention",
                                                                   attention_us(k)),
                              ("aten::linear", projection_us(k))):
                tb.op(name, t, dur)
                if gpu_kernel_us and name == "aten::linear":  # one stream: a kernel starts when the last ends
                    gpu_t = max(gpu_t, t + 3)
                    tb.kernel("gemm_kernel", gpu_t, gpu_kernel_us(k), launch_ts=t + 1)
                    gpu_t += gpu_kernel_us(k)
                t += dur + 2
        if sampler:
            tb.op("aten::topk", t, 4)
            tb.op("aten::multinomial", t + 6, 10)
            tb.op("aten::argmax", t + 8, 2)
            t += 18
        else:
            tb.op("aten::argmax", t, 3)
            t += 5
        tb.op("aten::cat", t, 3)
        t += 5
        passes.append((start, t))
    if training:
        tb.op("autograd::engine::evaluate_function: AddmmBackward0", t, 50)
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t + 60, dur=20)
    return tb, passes


def _context(tb: TraceBuilder, tmp_path):
    return build_context(load(tb.write(tmp_path / "t.json")))


def test_projections_that_grow_with_each_token_say_no_cache(tmp_path):
    tb, passes = _decoding(lambda k: 40 + 6 * k)
    r = analyze(tb.write(tmp_path / "t.json"))
    f = r.finding("decoding-without-cache")
    n = f.evidence.numbers
    assert n["tokens"] == 40 and n["projection_growth"] >= MIN_GROWTH and n["rank_correlation"] > 0.99
    # each pass (pick to pick) beyond the fastest of the first quarter's, summed, over the window
    ends = [e for _, e in passes]
    took = [b - a for a, b in itertools.pairwise(ends)]
    quarter = len(took) // 4
    excess = sum(max(d - min(took[:quarter]), 0) for d in took)
    window = (r.metrics.window.end_ns - r.metrics.window.start_ns) / 1e3
    assert f.est_gain == pytest.approx(excess / window, abs=0.01) and f.gain_method.startswith("estimate")
    assert "host time" in f.evidence.summary
    codes = "\n".join(fx.code for fx in f.fixes)
    assert "lm.generate(" in codes and "use_cache=True" in codes and "is_causal=cache is None" in codes


def test_projections_as_long_every_token_are_a_cache(tmp_path):
    """With a cache the projections run on one position a token; the attention over the cached
    keys still grows, and that is no sign of recomputation."""
    tb, _ = _decoding(lambda k: 40.0, attention_us=lambda k: 5 + 3 * k)
    ctx = _context(tb, tmp_path)
    assert generation(ctx).decoding and not regrowth(ctx).recomputing
    assert analyze(tb.write(tmp_path / "t.json")).finding("decoding-without-cache") is None


def test_projections_that_vary_without_a_trend_are_not_growth(tmp_path):
    """The same pass times as the growing case, shuffled: a busy machine's noise, not a sequence
    one position longer each token."""
    times = [40 + 6 * k for k in range(40)]
    random.Random(7).shuffle(times)
    tb, _ = _decoding(lambda k: times[k])
    ctx = _context(tb, tmp_path)
    assert abs(regrowth(ctx).rho) < 0.5
    assert analyze(tb.write(tmp_path / "t.json")).finding("decoding-without-cache") is None


def test_a_loop_over_prompts_is_judged_sequence_by_sequence(tmp_path):
    """Three prompts decoded one after another without a cache: each sequence's passes grow from
    its prompt's length, so the window's passes saw up and down (their rank correlation with the
    place in the window is low); judged in each sequence, they grow."""
    tb, _ = _decoding(lambda k: 40 + 6 * (k % 30), tokens=90)
    ctx = _context(tb, tmp_path)
    grown = regrowth(ctx)
    assert grown.sequences == 3 and grown.passes == 89 and grown.rho > 0.99
    f = analyze(tb.write(tmp_path / "t.json")).finding("decoding-without-cache")
    assert f.evidence.numbers["sequences"] == 3 and "90 tokens in 3 sequences" in f.title


def test_prompts_decoded_with_a_cache_are_one_long_pass_each(tmp_path):
    """With a cache, the next prompt's prefill is one longer pass, then one position a pass
    again: no new sequence is cut there, and nothing grows."""
    tb, _ = _decoding(lambda k: 400.0 if k % 30 == 0 else 40.0, tokens=90)
    ctx = _context(tb, tmp_path)
    grown = regrowth(ctx)
    assert grown.sequences == 1 and not grown.recomputing
    assert analyze(tb.write(tmp_path / "t.json")).finding("decoding-without-cache") is None


def test_a_machine_that_slows_down_half_way_is_not_growth(tmp_path):
    """A neighbour process taking the cores half-way through a cached decoding: the passes jump
    to 2.5× their time at once (a rank correlation of 0.87 with the place, growth 2.5×), where a
    sequence one position longer each pass grows through every quarter."""
    tb, _ = _decoding(lambda k: 40.0 if k < 20 else 100.0, tokens=40)
    ctx = _context(tb, tmp_path)
    grown = regrowth(ctx)
    assert grown.growth >= MIN_GROWTH and grown.rho >= 0.5 and not grown.gradual and not grown.recomputing
    assert analyze(tb.write(tmp_path / "t.json")).finding("decoding-without-cache") is None


def test_a_training_window_is_not_judged(tmp_path):
    """Batches that grow in a training loop (sorted by length) are not decoding."""
    tb, _ = _decoding(lambda k: 40 + 6 * k, training=True)
    assert analyze(tb.write(tmp_path / "t.json")).finding("decoding-without-cache") is None


def test_a_samplers_picks_are_one_token(tmp_path):
    """top-k then multinomial, which calls argmax inside: three picks, one token."""
    tb, _ = _decoding(lambda k: 40 + 6 * k, tokens=30, sampler=True)
    ctx = _context(tb, tmp_path)
    assert generation(ctx).tokens == 30
    f = analyze(tb.write(tmp_path / "t.json")).finding("decoding-without-cache")
    assert f.evidence.numbers["tokens"] == 30


def test_on_a_gpu_the_kernels_the_projections_launch_are_the_work(tmp_path):
    """The host launches at the same pace every token; the matrix products' kernels grow."""
    tb, _ = _decoding(lambda k: 40.0, gpu_kernel_us=lambda k: 30 + 8 * k)
    ctx = _context(tb, tmp_path)
    grown = regrowth(ctx)
    assert grown.gpu and grown.recomputing
    f = analyze(tb.write(tmp_path / "t.json")).finding("decoding-without-cache")
    assert "GPU time" in f.evidence.summary
    flat, _ = _decoding(lambda k: 40.0, gpu_kernel_us=lambda k: 30.0)
    assert analyze(flat.write(tmp_path / "f.json")).finding("decoding-without-cache") is None


def test_a_recorded_decoding_loop_without_a_cache():
    """benchmarks/decode_cache.py --record: a 2-layer GPT-2, 128 wide, called on the whole
    sequence for each of 64 tokens (use_cache=False); passing the cache back saved 0.76 of a
    bigger model's 200 tokens for an estimate of 0.67."""
    r = analyze(NOCACHE)
    f = r.finding("decoding-without-cache")
    n = f.evidence.numbers
    assert n["tokens"] == 64 and n["projection_growth"] >= MIN_GROWTH and f.est_gain >= 0.1
    over = r.finding("cpu-op-overhead")
    assert over is None or "for want of a key/value cache" in over.why


def test_generate_with_its_cache_is_silent():
    """transformers' generate() with its default cache: the same projections every token."""
    r = analyze(GENERATE)
    assert r.finding("decoding-without-cache") is None
    assert "every new token is a pass through the model for one position" in r.finding("cpu-op-overhead").why


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz"))) - {NOCACHE}))
def test_silent_on_every_other_recorded_trace(path):
    assert analyze(path).finding("decoding-without-cache") is None


def _gpt2(torch, transformers):
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=60, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)).eval()


def _without_cache(torch, lm, ids, tokens):
    with torch.inference_mode():
        for _ in range(tokens):
            ids = torch.cat([ids, lm(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # importing transformers
def test_the_transformers_fixes_decode_the_same_tokens():
    """The loop fix, with the cache's name the installed transformers takes, and the generate()
    fix, run as given: the same greedy tokens as the model run on the whole sequence each token."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from gpumagic.analysis.rules.decoding import GENERATE_CODE, LOOP_CODE, cache_argument

    lm = _gpt2(torch, transformers)
    prompt = torch.tensor([[3, 4, 5]])
    expected = _without_cache(torch, lm, prompt, 12)
    space = {"lm": lm, "ids": prompt, "max_new_tokens": 12, "torch": torch}
    exec(LOOP_CODE.format(name=cache_argument()), space)
    assert torch.equal(space["ids"], expected)
    lm.generation_config.do_sample = False
    lm.generation_config.eos_token_id = None
    lm.generation_config.pad_token_id = 0
    lm.config.use_cache = lm.generation_config.use_cache = False  # as gradient checkpointing can leave it
    positions: list[int] = []  # the positions each pass runs on
    lm.transformer.wte.register_forward_hook(lambda mod, args, out: positions.append(args[0].shape[1]))
    space = {"lm": lm, "ids": prompt, "max_new_tokens": 12, "torch": torch}
    exec(GENERATE_CODE, space)
    assert torch.equal(space["ids"], expected)
    assert positions == [3] + [1] * 11  # the prompt, then the new token alone


def test_the_cache_name_follows_the_installed_transformers(monkeypatch):
    import gpumagic.analysis.rules.decoding as decoding

    monkeypatch.setattr(decoding, "transformers_source", lambda path: "def forward(past_key_values=None): ...")
    assert decoding.cache_argument() == "past_key_values"
    monkeypatch.setattr(decoding, "transformers_source", lambda path: None)
    assert decoding.cache_argument() == "past_key_values"  # 5.25 still takes the old name
    monkeypatch.setattr(decoding, "transformers_source",
                        lambda path: 'warning_once("`past_key_values`/`cache_params` are deprecated. Use `cache` instead.")')
    assert decoding.cache_argument() == "cache"


def test_the_attention_fix_decodes_the_same_tokens_as_the_model_without_it():
    """The fix for a model of one's own: a nanoGPT-style model whose attention is the fix's
    ``forward``, the blocks passing their caches and the positions starting at the cache's
    length, as its closing comment says. Decoding one token a pass with the cache gives the
    logits and the tokens of running the whole sequence each time."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.nn import functional as F

    from gpumagic.analysis.rules.decoding import ATTENTION_CODE

    space = {"torch": torch, "F": F}
    exec(ATTENTION_CODE, space)

    class Attention(nn.Module):
        forward = space["forward"]

        def __init__(self, n_embd, n_head):
            super().__init__()
            self.n_embd, self.n_head = n_embd, n_head
            self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)

    class Block(nn.Module):
        def __init__(self, n_embd, n_head):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.attn = Attention(n_embd, n_head)
            self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

        def forward(self, x, cache=None):
            y, cache = self.attn(self.ln1(x), cache)
            x = x + y
            return x + self.mlp(self.ln2(x)), cache

    class GPT(nn.Module):
        def __init__(self, vocab=50, block_size=32, n_embd=32, n_head=4, layers=2):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
            self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(layers))
            self.head = nn.Linear(n_embd, vocab)

        def forward(self, idx, caches=None):
            past = 0 if caches is None else caches[0][0].size(2)
            x = self.tok(idx) + self.pos(torch.arange(past, past + idx.size(1)))
            new = []
            for i, block in enumerate(self.blocks):
                x, c = block(x, None if caches is None else caches[i])
                new.append(c)
            return self.head(x), new

    torch.manual_seed(0)
    model = GPT().eval()
    prompt = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        ids, full = prompt, []
        for _ in range(20):
            logits = model(ids)[0][:, -1]
            full.append(logits)
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        cached_ids, caches, steps = prompt, None, []
        for _ in range(20):
            logits, caches = model(cached_ids if caches is None else cached_ids[:, -1:], caches)
            steps.append(logits[:, -1])
            cached_ids = torch.cat([cached_ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached_ids, ids)
    for a, b in zip(full, steps):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
