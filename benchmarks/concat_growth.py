"""Does ``growing-concatenation`` hold? An inference loop gathers a small MLP's 768-wide outputs
for ``--batches`` batches of 32 rows on the CPU, once growing a tensor with
``embs = torch.cat([embs, out])`` at every batch, once the way the finding's fix does (a list,
one ``torch.cat`` at the end). Both give the same tensor (checked first).

The growing loop is profiled by ``gpumagic.profile()`` and the finding's gain read (an
estimate); then both loops are timed unprofiled, alternated round by round, and the saving
(1 − the list's time ÷ the growing loop's) printed beside it. Numbers depend on the machine and
on what else runs on it: this prints, it asserts nothing. ``--record DIR`` instead records the
bundle tests/data keeps (``cpu_concat_growth.json.gz``: 160 batches) and exits.

``--trainer ROWS`` times transformers' Trainer evaluating a tiny GPT-2 instead (its evaluation
loop grows the logits by concatenation) against the finding's Trainer fix.

    python benchmarks/concat_growth.py [--rounds 5] [--batches 400] [--record DIR] [--trainer ROWS]
"""

from __future__ import annotations

import argparse
import os

import torch
from steptime import alternated, medians


def _loops(batches: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 768)).eval()
    inputs = [torch.randn(32, 128) for _ in range(16)]

    def growing():
        embs = torch.empty(0, 768)
        with torch.inference_mode():
            for i in range(batches):
                embs = torch.cat([embs, model(inputs[i % 16])])
        return embs

    def listed():
        outputs = []
        with torch.inference_mode():
            for i in range(batches):
                outputs.append(model(inputs[i % 16]))
        return torch.cat(outputs)

    return {"growing torch.cat": growing, "list, one torch.cat": listed}


def _trainer_loops(rows: int):
    """transformers' Trainer evaluating a 2-layer GPT-2 (vocabulary 1,000, 64 wide, built from a
    config) on ``rows`` sequences of 32 tokens, 16 a batch, with a compute_metrics that needs the
    predicted ids: as is (its evaluation loop concatenates each batch's logits to the ones
    before), and with the finding's Trainer fix (preprocess_logits_for_metrics keeps the ids)."""
    import tempfile

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    tokens = torch.randint(0, 1000, (rows, 32))
    data = [{"input_ids": t, "labels": t} for t in tokens]

    def accuracy(pred):
        ids = pred.predictions.argmax(-1) if pred.predictions.ndim == 3 else pred.predictions
        return {"acc": float((ids[:, :-1] == pred.label_ids[:, 1:]).mean())}

    def trainer(keep_ids: bool):
        args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_eval_batch_size=16, report_to="none",
                                 disable_tqdm=True, use_cpu=True)
        return Trainer(model=model, args=args, eval_dataset=data, compute_metrics=accuracy,
                       preprocess_logits_for_metrics=(lambda logits, labels: logits.argmax(dim=-1)) if keep_ids else None)

    plain, fixed = trainer(False), trainer(True)
    return {"Trainer.evaluate": lambda: plain.evaluate()["eval_acc"],
            "with preprocess_logits_for_metrics": lambda: fixed.evaluate()["eval_acc"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    parser.add_argument("--trainer", type=int, metavar="ROWS",
                        help="instead, transformers' Trainer evaluating a tiny GPT-2 on ROWS sequences, and its fix")
    args = parser.parse_args()
    import gpumagic
    if args.record:
        loop = _loops(160)["growing torch.cat"]
        loop()
        with gpumagic.profile(save=os.path.join(args.record, "cpu_concat_growth.json.gz"), display=False):
            loop()
        print("recorded cpu_concat_growth.json.gz")
        return
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    loops = _trainer_loops(args.trainer) if args.trainer else _loops(args.batches)
    a, b = (loop() for loop in loops.values())
    if not (a == b if args.trainer else torch.equal(a, b)):
        raise SystemExit("the two loops gathered different results")
    first, second = loops
    with gpumagic.profile(max_seconds=600, display=False) as run:
        loops[first]()
    f = run.report.finding("growing-concatenation")
    med, line = medians(alternated(loops, args.rounds, 1))
    said = f"estimate {f.est_gain:.3f}" if f else "the rule is silent"
    print(line)
    print(f"saved: {1 - med[second] / med[first]:.3f}; {said}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
