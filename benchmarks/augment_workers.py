"""Does ``loop-host-work``'s augmentation fix hold? A SimCLR-style step (a small convolutional
encoder, two augmented views of each batch of 128 3x32x32 images, a 256x256 similarity matrix,
cross-entropy) with its augmentation — a random flip, a random shift, brightness and contrast
jitter, added noise, in torch operators — once in the training loop, once the way the finding's
fix does (the same function in the loader's ``collate_fn``, run by ``--workers`` worker
processes). An epoch of each is timed unprofiled, alternated round by round, and the saving
printed (negative: slower), with the machine's cores and load, and the finding's verdict on a
profiled epoch of the first loop. Moving work into workers helps only where a core is free for
them. Numbers depend on the machine and on what else runs on it: this prints, it asserts nothing.

    python benchmarks/augment_workers.py [--rounds 5] [--batches 24] [--workers 2]
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from steptime import alternated, medians
from torch import nn


def augment(x: torch.Tensor) -> torch.Tensor:
    """One random view of a batch of images in [0, 1]."""
    b = x.shape[0]
    x = torch.where(torch.rand(b, 1, 1, 1) < 0.5, x.flip(-1), x)
    x = torch.roll(x, shifts=torch.randint(-4, 5, (2,)).tolist(), dims=(2, 3))
    mean = x.mean((1, 2, 3), keepdim=True)
    x = ((x - mean) * (torch.rand(b, 1, 1, 1) * 0.4 + 0.8) + mean + (torch.rand(b, 1, 1, 1) - 0.5) * 0.4).clamp(0, 1)
    return x + 0.02 * torch.randn_like(x)


def collate_two_views(samples):
    xb, yb = torch.utils.data.default_collate(samples)
    return augment(xb), augment(xb), yb


def _loops(batches: int, workers: int):
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    optimizer = torch.optim.SGD(encoder.parameters(), lr=1e-3)
    dataset = torch.utils.data.TensorDataset(torch.rand(128 * batches, 3, 32, 32), torch.zeros(128 * batches))

    def step(v1, v2):
        z = F.normalize(encoder(torch.cat([v1, v2])), dim=1)
        sim = z @ z.t() / 0.5
        sim.fill_diagonal_(float("-inf"))
        n = v1.shape[0]
        loss = F.cross_entropy(sim, torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    plain = torch.utils.data.DataLoader(dataset, batch_size=128, shuffle=True)
    moved = torch.utils.data.DataLoader(dataset, batch_size=128, shuffle=True, collate_fn=collate_two_views,
                                        num_workers=workers, persistent_workers=True)

    def in_the_loop():
        for xb, _ in plain:
            step(augment(xb), augment(xb))

    def in_workers():
        for v1, v2, _ in moved:
            step(v1, v2)

    return {"augmented in the loop": in_the_loop, "collate_fn in workers": in_workers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    import gpumagic
    cores = len(os.sched_getaffinity(0))
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; {cores} usable cores; "
          f"load average {os.getloadavg()[0]:.2f}")
    loops = _loops(args.batches, args.workers)
    first, second = loops
    loops[second]()  # the workers started once (persistent), as in a training run
    with gpumagic.profile(max_seconds=600, display=False) as run:
        loops[first]()
    f = run.report.finding("loop-host-work")
    med, line = medians(alternated(loops, args.rounds, 1))
    said = (f"estimate {f.est_gain:.3f} ({f.fixes[0].description[:60]}...)" if f else "the rule is silent")
    print(line.replace(" a step", " an epoch"))
    print(f"saved: {1 - med[second] / med[first]:.3f}; {said}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
