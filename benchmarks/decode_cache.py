"""Does ``decoding-without-cache`` hold? A 4-layer GPT-2 built from a config (transformers, no
download) decodes greedily on the CPU, token by token in a loop of its own: once calling the
model on the whole sequence each token (``use_cache=False``), once the way the finding's second
fix does (the cache passed back, the new token alone), and once through ``generate()`` (its
first fix).

The loop without the cache is profiled by ``gpumagic.profile()`` and the finding's gain read
(an estimate); then the three are timed unprofiled, alternated round by round, and each saving
(1 − time ÷ the loop without the cache's) printed beside it. The three decode the same tokens
(checked first). Numbers depend on the machine and on what else runs on it: this prints, it
asserts nothing. ``--record DIR`` instead records the bundle tests/data keeps
(``cpu_decode_nocache.json.gz``: 64 tokens of a 2-layer model, 128 wide) and exits.

    python benchmarks/decode_cache.py [--rounds 5] [--tokens 200] [--width 256] [--record DIR]
"""

from __future__ import annotations

import argparse
import os

import torch
from steptime import alternated, medians

from gpumagic.analysis.rules.decoding import cache_argument

PROMPT = [5, 6, 7, 8]


def _model(width: int, layers: int = 4):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=1000, n_positions=512, n_embd=width, n_layer=layers, n_head=4, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def _loops(lm, tokens: int):
    name = cache_argument()

    def without_cache():
        ids = torch.tensor([PROMPT])
        with torch.inference_mode():
            for _ in range(tokens):
                next_id = lm(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, next_id], dim=1)
        return ids

    def cache_passed_back():
        ids, cache = torch.tensor([PROMPT]), None
        with torch.inference_mode():
            for _ in range(tokens):
                out = lm(ids if cache is None else ids[:, -1:], use_cache=True, **{name: cache})
                cache = out[name]
                ids = torch.cat([ids, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids

    def generate():
        with torch.inference_mode():
            return lm.generate(torch.tensor([PROMPT]), max_new_tokens=tokens, min_new_tokens=tokens,
                               do_sample=False, pad_token_id=0)

    return {"no cache": without_cache, "cache passed back": cache_passed_back, "generate": generate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    import gpumagic
    if args.record:
        loop = _loops(_model(128, layers=2), 64)["no cache"]
        loop()
        with gpumagic.profile(save=os.path.join(args.record, "cpu_decode_nocache.json.gz"), display=False):
            loop()
        print("recorded cpu_decode_nocache.json.gz")
        return
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    loops = _loops(_model(args.width), args.tokens)
    outs = [loop() for loop in loops.values()]
    if not all(torch.equal(outs[0], o) for o in outs[1:]):
        raise SystemExit("the three loops decoded different tokens")
    with gpumagic.profile(max_seconds=600, display=False) as run:
        loops["no cache"]()
    f = run.report.finding("decoding-without-cache")
    med, line = medians(alternated(loops, args.rounds, 1))
    said = f"estimate {f.est_gain:.3f}" if f else "the rule is silent"
    print(line)
    print(f"saved: cache passed back {1 - med['cache passed back'] / med['no cache']:.3f}, generate "
          f"{1 - med['generate'] / med['no cache']:.3f}; {said}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
