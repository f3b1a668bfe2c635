"""What the data-loader stage timers (``gpumagic.capture.stages``, on whenever a capture records)
cost a DataLoader's throughput. Target (issue 29): at most 5 %.

Each configuration reads the same loader for ``--batches`` batches with the timers off and on,
alternated (off, on, on, off, ...) for ``--rounds`` rounds, so that a change in the machine's
load hits both alike. It prints two measures, each the median over rounds of the on / off ratio
of that round's pair:

- ``CPU on/off``: CPU seconds per batch, of this process and its worker processes
  (``resource.getrusage``; the workers are shut down, so their time is counted, after each read). The timers add CPU work
  and never wait, so for a CPU-bound loader this is what they take from its throughput; it is
  also the measure a busy machine disturbs least (other jobs delay a process, they do not add to
  its CPU time);
- ``wall off/on``: batches per second, off over on (above 1: slower with the timers), which other
  jobs on a shared machine make noisy.

The timers
cost a fixed time per timed call (two clock reads and a few list operations, about a microsecond),
so their share depends on how much work a call does:

- ``image``: a 3×224×224 uint8 image per sample and the standard ImageNet training transform in
  plain torch, a composed chain of four (random resized crop to 176, flip, scale to 0..1,
  normalise) — per-sample work well under a millisecond, less than decoding the JPEG alone
  would cost;
- ``tiny``: a 16-element tensor and two trivial transforms per sample — a few microseconds of
  work per call, the worst case, where the timers' fixed cost shows.

Both with ``num_workers`` 0 (timed in the main process) and 2 (timed in the workers). Run:
``python benchmarks/loader_stages_overhead.py [--rounds 5] [--batches 40]``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from gpumagic.capture.stages import LoaderStages


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class RandomResizedCrop:
    """torchvision's standard training crop, in plain torch: a random region of 35-100 % of the
    image's area, resized (bilinear) to ``size`` × ``size``."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, img):
        h, w = img.shape[-2:]
        side = int(min(h, w) * (0.6 + 0.4 * float(torch.rand(()))))
        top = int(torch.randint(0, h - side + 1, ()))
        left = int(torch.randint(0, w - side + 1, ()))
        crop = img[..., top:top + side, left:left + side].unsqueeze(0).float()
        return F.interpolate(crop, size=(self.size, self.size), mode="bilinear", align_corners=False)[0]


class RandomFlip:
    def __call__(self, img):
        return img.flip(-1) if torch.rand(()) < 0.5 else img


class ToFloat:
    def __call__(self, img):
        return img.div_(255)


class Normalize:
    def __init__(self):
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def __call__(self, img):
        return (img - self.mean) / self.std


class AddOne:
    def __call__(self, x):
        return x + 1


class Images(Dataset):
    """``n`` samples drawn from 64 distinct images (memory stays small)."""

    def __init__(self, n: int, size: int = 224):
        g = torch.Generator().manual_seed(0)
        self.n = n
        self.data = torch.randint(0, 256, (64, 3, size, size), dtype=torch.uint8, generator=g)
        self.transform = Compose([RandomResizedCrop(176), RandomFlip(), ToFloat(), Normalize()])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.transform(self.data[i % len(self.data)]), i % 10


class Tiny(Dataset):
    def __init__(self, n: int):
        self.data = torch.randn(n, 16)
        self.transform = Compose([AddOne(), AddOne()])

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.transform(self.data[i])


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def rate(loader: DataLoader, batches: int, timed: bool) -> tuple[float, float]:
    """(batches per second after the first batch, CPU seconds per batch over the whole read:
    worker start, every batch and the workers' shutdown)."""
    stages = LoaderStages() if timed else None
    cpu0 = _cpu_s()
    if stages is not None:
        stages.start()
    try:
        it = iter(loader)
        next(it)
        t0 = time.perf_counter()
        for _ in range(batches):
            next(it)
        elapsed = time.perf_counter() - t0
        stop = getattr(it, "_shutdown_workers", None)
        if stop is not None:
            stop()  # joins the workers: their CPU time then counts in RUSAGE_CHILDREN
        del it
    finally:
        if stages is not None:
            stages.stop()
    return batches / elapsed, (_cpu_s() - cpu0) / (batches + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    n = (args.batches + 2) * 32
    cases = {"image": Images(n), "tiny": Tiny(n)}
    print(f"{'case':<7}{'workers':>8}{'CPU ms/batch off':>18}{'on':>8}{'CPU on/off':>12}{'wall off/on':>13}")
    for name, ds in cases.items():
        for workers in (0, 2):
            loader = DataLoader(ds, batch_size=32, num_workers=workers)
            off: list[tuple[float, float]] = []
            on: list[tuple[float, float]] = []
            for r in range(args.rounds):
                order = (False, True) if r % 2 == 0 else (True, False)
                for timed in order:
                    (on if timed else off).append(rate(loader, args.batches, timed))
            cpu = statistics.median(a[1] / b[1] for a, b in zip(on, off))
            wall = statistics.median(b[0] / a[0] for a, b in zip(on, off))
            print(f"{name:<7}{workers:>8}{statistics.median(b[1] for b in off) * 1e3:>18.2f}"
                  f"{statistics.median(a[1] for a in on) * 1e3:>8.2f}{cpu:>12.3f}{wall:>13.3f}")


if __name__ == "__main__":
    main()
