"""Does ``dataloader-bound``'s fix for a collate function of the user's own pay? Padding variable-length
token sequences in a ``collate_fn`` for every batch, against padding the whole dataset once and
indexing each batch, trimmed to its longest sequence (the fix's code, ``PAD_ONCE_CODE``).

The dataset: ``--samples`` sequences of 5 to 200 token ids; the model: an ``EmbeddingBag`` (mean
over 64-dimensional embeddings) and a linear head, Adam, batches of ``--batch`` (32). Both loops
are checked to give the same batches (the same indices, the same padded tensors) before timing,
then timed in alternated rounds (``steptime.alternated``: a machine that slows down slows both);
the medians and their ratio are printed with the load average. Numbers depend on the machine and
on what else runs on it: this prints, it asserts nothing.

``--record DIR`` instead records the bundle tests/data keeps (``cpu_collate_pad.json.gz``, the
padding loop) and exits.

    python benchmarks/pad_once.py [--rounds 7] [--calls 100] [--samples 4000] [--batch 32] [--record DIR]
"""

from __future__ import annotations

import argparse
import os
import random

import torch
from steptime import alternated, medians, profile_steps
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader


def pad_batch(batch):
    """The collate function the loop replaces: each batch padded to its longest sequence."""
    xs, ys = zip(*batch, strict=True)
    return pad_sequence(list(xs), batch_first=True), torch.tensor(ys)


def data(samples: int):
    random.seed(0)
    torch.manual_seed(0)
    sequences = [torch.randint(1, 1000, (random.randint(5, 200),)) for _ in range(samples)]
    labels = [random.randrange(2) for _ in sequences]
    return sequences, labels


def pad_pair(samples: int, batch: int):
    sequences, labels = data(samples)
    emb, head = torch.nn.EmbeddingBag(1000, 64, padding_idx=0), torch.nn.Linear(64, 2)
    opt = torch.optim.Adam([*emb.parameters(), *head.parameters()], 1e-3)

    def train(x, y):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head(emb(x)), y).backward()
        opt.step()

    # the loop as written: a DataLoader whose collate_fn pads every batch
    loader = DataLoader(list(zip(sequences, labels, strict=True)), batch_size=batch, shuffle=True, collate_fn=pad_batch)
    batches = iter(())

    def per_batch():
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        train(x, y)

    # the fix: padded once, indexed, each batch trimmed to its longest
    lengths = torch.tensor([len(s) for s in sequences])
    padded = pad_sequence(sequences, batch_first=True)
    all_labels = torch.tensor(labels)
    starts = iter(range(10**9))
    order = torch.randperm(len(padded))

    def once():
        nonlocal order
        start = next(starts) * batch % len(padded)
        if start + batch > len(padded):
            order = torch.randperm(len(padded))
            start = 0
        idx = order[start:start + batch]
        width = int(lengths[idx].max())
        train(padded[idx, :width], all_labels[idx])

    check(sequences, labels, lengths, padded, all_labels, batch)
    return {"pad each batch": per_batch, "pad once": once}


def check(sequences, labels, lengths, padded, all_labels, batch: int) -> None:
    """The fix's batch is the collate function's batch, for the same indices."""
    idx = torch.randperm(len(sequences))[:batch]
    x, y = pad_batch([(sequences[i], labels[i]) for i in idx.tolist()])
    width = int(lengths[idx].max())
    assert torch.equal(padded[idx, :width], x) and torch.equal(all_labels[idx], y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--record", metavar="DIR", help="record the padding loop's bundle into DIR instead")
    args = parser.parse_args()
    if args.record:
        profile_steps(pad_pair(args.samples, args.batch)["pad each batch"], 12,
                      os.path.join(args.record, "cpu_collate_pad.json.gz"))
        print("recorded cpu_collate_pad")
        return
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    med, line = medians(alternated(pad_pair(args.samples, args.batch), args.rounds, args.calls))
    print(f"batches of {args.batch} sequences of 5-200 tokens: {line}")
    print(f"  padding once saves {1 - med['pad once'] / med['pad each batch']:.3f} of the step")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
