"""Does ``dense-embedding-grad`` hold? A bag-of-words classifier on the CPU: an ``nn.EmbeddingBag`` of
200,000 rows × 32 (a batch of 64 bags of 20 ids touches at most 1,280 rows) and a linear head,
trained with Adam three ways: the table's gradient dense (the default) with Adam's default
(for-loop) implementation, dense with ``fused=True`` (what ``unfused-optimizer`` suggests), and
sparse (``sparse=True``) with ``SparseAdam`` for the table and Adam for the head (the finding's fix).

The dense loop is profiled by ``gpumagic.profile()`` and the finding's gain read; then the three
are timed unprofiled, alternated round by round, and each saving (1 − time per step ÷ the dense
loop's) printed beside it. Numbers depend on the machine and on what else runs on it: this
prints, it asserts nothing. ``--record DIR`` instead records the bundle tests/data keeps
(``cpu_dense_embedding.json.gz``: three steps of the dense loop) and exits.

    python benchmarks/sparse_embedding.py [--rounds 5] [--steps 10] [--record DIR]
"""

from __future__ import annotations

import argparse
import os

import torch
from steptime import alternated, medians, profile_steps

ROWS, DIM, BAGS, IDS = 200_000, 32, 64, 20


def _step(sparse: bool = False, fused: bool = False):
    torch.manual_seed(0)
    table = torch.nn.EmbeddingBag(ROWS, DIM, mode="mean", sparse=sparse)
    head = torch.nn.Linear(DIM, 2)
    if sparse:
        optimizers = [torch.optim.SparseAdam(table.parameters(), lr=1e-3), torch.optim.Adam(head.parameters(), lr=1e-3)]
    else:
        optimizers = [torch.optim.Adam([*table.parameters(), *head.parameters()], lr=1e-3, fused=fused or None)]
    generator = torch.Generator().manual_seed(1)

    def step():
        ids = torch.randint(0, ROWS, (BAGS, IDS), generator=generator)
        labels = torch.randint(0, 2, (BAGS,), generator=generator)
        loss = torch.nn.functional.cross_entropy(head(table(ids)), labels)
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        for opt in optimizers:
            opt.step()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    if args.record:
        profile_steps(_step(), 3, os.path.join(args.record, "cpu_dense_embedding.json.gz"), warm=2)
        print("recorded cpu_dense_embedding.json.gz")
        return
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
    f = profile_steps(_step(), 5, None, warm=2).finding("dense-embedding-grad")
    said = f"upper bound {f.est_gain:.3f}" if f else "the rule is silent"
    med, line = medians(alternated({"dense": _step(), "dense fused": _step(fused=True), "sparse": _step(sparse=True)},
                                   args.rounds, args.steps))
    print(line)
    print(f"saved: fused {1 - med['dense fused'] / med['dense']:.3f}, sparse {1 - med['sparse'] / med['dense']:.3f}; "
          f"{said}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
