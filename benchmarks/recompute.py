"""Does ``activation-recompute`` hold? A stack of residual MLP blocks (256 → 1024 → 256, GELU)
trained on the CPU with every block under ``torch.utils.checkpoint`` (``use_reentrant=False``),
against the same blocks called directly (the finding's first fix) and every other block
checkpointed (its second).

The checkpointed loop is profiled by ``gpumagic.profile()`` and the finding's gain read (the
recomputation's share of the window, an estimate); then the three are timed unprofiled,
alternated round by round, and each saving (1 − time per step ÷ the checkpointed loop's)
printed beside it. Numbers depend on the machine and on what else runs on it: this prints, it
asserts nothing. ``--record DIR`` instead records the bundle tests/data keeps
(``cpu_checkpointed_blocks.json.gz``: three steps) and exits.

    python benchmarks/recompute.py [--rounds 5] [--steps 20] [--blocks 4] [--batch 64] [--record DIR]
"""

from __future__ import annotations

import argparse
import os

import torch
from steptime import alternated, medians, profile_steps
from torch.utils.checkpoint import checkpoint

WIDTH, HIDDEN = 256, 1024


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, WIDTH))

    def forward(self, x):
        return x + self.f(x)


class Stack(torch.nn.Module):
    """``blocks`` residual blocks and a 10-way head; ``every``: checkpoint every n-th block (0: none)."""

    def __init__(self, blocks: int, every: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(blocks))
        self.head = torch.nn.Linear(WIDTH, 10)
        self.every = every

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = checkpoint(block, x, use_reentrant=False) if self.every and i % self.every == 0 else block(x)
        return self.head(x)


def _step(blocks: int, batch: int, every: int):
    torch.manual_seed(0)
    model = Stack(blocks, every)
    x, y = torch.randn(batch, WIDTH), torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    if args.record:
        profile_steps(_step(args.blocks, args.batch, 1), 3, os.path.join(args.record, "cpu_checkpointed_blocks.json.gz"))
        print("recorded cpu_checkpointed_blocks.json.gz")
        return
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    f = profile_steps(_step(args.blocks, args.batch, 1), 8).finding("activation-recompute")
    loops = {"every block": _step(args.blocks, args.batch, 1), "none": _step(args.blocks, args.batch, 0),
             "every other": _step(args.blocks, args.batch, 2)}
    med, line = medians(alternated(loops, args.rounds, args.steps))
    said = f"estimate {f.est_gain:.3f}" if f else "the rule is silent"
    print(line)
    print(f"saved: none {1 - med['none'] / med['every block']:.3f}, every other "
          f"{1 - med['every other'] / med['every block']:.3f}; {said}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
