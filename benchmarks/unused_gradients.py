"""Does ``unused-gradients``' gain hold? Fine-tuning the head of an MLP backbone on the CPU, the
optimizer given the head only, three ways: the backbone left trainable (the finding's case), the
backbone frozen with ``requires_grad_(False)`` (the fix: a frozen prefix, so the backward stops at
the head), and the middle blocks frozen (frozen layers between trainable ones: their weights' gradients
are skipped, the gradient still flows through them).

The trainable-backbone loop is profiled by ``gpumagic.profile()`` and the finding's estimate
printed; then the loops are timed unprofiled, alternated round by round, and the saving of each
fix printed (1 − its time ÷ the first loop's). For the middle case the estimate is taken from its
own profile (the optimizer holding the first and last blocks and the head). Numbers depend on the
machine and on what else runs on it: this prints, it asserts nothing.

    python benchmarks/unused_gradients.py [--rounds 7] [--steps 20] [--width 512] [--blocks 6] [--batch 128]
"""

from __future__ import annotations

import argparse
import os

import torch
from steptime import alternated, medians, profile_steps


def _loop(width: int, blocks: int, batch: int, trained: str, freeze: bool):
    """One training step. The optimizer holds the head (``trained`` "head") or the first and last
    blocks and the head ("ends"); with ``freeze`` the parameters it does not hold are frozen
    (``requires_grad_(False)``: the whole backbone, a prefix, or the middle blocks)."""
    torch.manual_seed(0)
    backbone = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                                     for _ in range(blocks)))
    model = torch.nn.Sequential(backbone, torch.nn.Linear(width, 10))
    rest = list((backbone if trained == "head" else backbone[1:-1]).parameters())
    opt = torch.optim.SGD([p for p in model.parameters() if all(p is not q for q in rest)], lr=1e-3)
    if freeze:
        for p in rest:
            p.requires_grad_(False)
    x, y = torch.randn(batch, width), torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def _estimate(step) -> str:
    f = profile_steps(step, 8).finding("unused-gradients")
    return "silent" if f is None else f"estimate {f.est_gain:.3f} ({f.evidence.numbers['unused_gradients']:.0f} unused)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    shape = (args.width, args.blocks, args.batch)
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    print(f"head only, backbone trainable: {_estimate(_loop(*shape, 'head', False))}; "
          f"backbone frozen: {_estimate(_loop(*shape, 'head', True))}")
    print(f"middle blocks trainable, not in the optimizer: {_estimate(_loop(*shape, 'ends', False))}")
    loops = {"trainable": _loop(*shape, "head", False), "prefix frozen": _loop(*shape, "head", True),
             "middle unfrozen": _loop(*shape, "ends", False), "middle frozen": _loop(*shape, "ends", True)}
    med, line = medians(alternated(loops, args.rounds, args.steps))
    print(line)
    print(f"saved: freezing the backbone {1 - med['prefix frozen'] / med['trainable']:.3f}; "
          f"freezing the middle blocks {1 - med['middle frozen'] / med['middle unfrozen']:.3f}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
