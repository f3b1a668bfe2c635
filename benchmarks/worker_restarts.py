"""Does ``dataloader-worker-restarts`` hold? A CPU loop whose DataLoader starts its workers every
epoch, against the same loader with ``persistent_workers=True``.

A small convolution network trains on a map-style dataset of 64 random 3×32×32 images (a batch of
16: four steps an epoch) through a DataLoader with two workers. The loop without persistent
workers is profiled by ``gpumagic.profile()`` over eight steps (two epoch ends inside); the
finding's upper bound is read. Then both loops run plain (no profiler), alternated round by round,
each timed over the epochs after its first (the first start is paid either way), and the measured
saving (1 − persistent time ÷ restarting time) is printed beside the bound, which it must not
exceed. Numbers depend on the machine and on what else runs on it: this prints, it asserts
nothing. ``--record DIR`` instead records the bundle tests/data keeps
(``cpu_loader_restarts.json.gz``) and exits.

    python benchmarks/worker_restarts.py [--rounds 5] [--epochs 6] [--record DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
from steptime import mean_ms
from torch.utils.data import DataLoader, Dataset

import gpumagic


class Images(Dataset):
    """64 random images, made on demand (a sample costs what a small decode would)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 32, 32, generator=g), i % 10


def _setup(persistent: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Images(), batch_size=16, num_workers=2, persistent_workers=persistent)

    def epoch():
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return epoch


def profiled(path: str | None = None):
    epoch = _setup(False)
    with gpumagic.profile(steps=8, save=path, display=False) as run:
        for _ in range(4):
            epoch()
    return run.report


def timed(persistent: bool, epochs: int) -> float:
    """Mean time per epoch (ms) after the first."""
    return mean_ms(_setup(persistent), epochs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    if args.record:
        profiled(os.path.join(args.record, "cpu_loader_restarts.json.gz"))
        print("recorded cpu_loader_restarts")
        return
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
    f = profiled().finding("dataloader-worker-restarts")
    if f is None:
        print("dataloader-worker-restarts did not fire")
        return
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for persistent in (False, True):
            times[persistent].append(timed(persistent, args.epochs))
    again, kept = statistics.median(times[False]), statistics.median(times[True])
    print(f"restarting {again:.1f} ms/epoch [{min(times[False]):.1f}–{max(times[False]):.1f}]  persistent "
          f"{kept:.1f} ms/epoch [{min(times[True]):.1f}–{max(times[True]):.1f}]  saved {1 - kept / again:.3f}  "
          f"rule's bound {f.est_gain:.3f}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
