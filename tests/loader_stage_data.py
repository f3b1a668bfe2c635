"""Datasets for the data-loader stage tests (tests/capture/test_loader_stages.py), in a module
of their own so that worker processes can import them under any start method."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset

#: The slow transform sleeps this long per sample: ``time.sleep`` waits at least this long, so the
#: stage's measured time has a floor that no machine load can lower.
SLOW_S = 0.03
#: Set in each worker by :func:`mark_worker` (the user's own worker_init_fn).
WORKER_MARK = 0.0


class SlowTransform:
    def __call__(self, x):
        time.sleep(SLOW_S)
        return x * 2


class FastTransform:
    def __call__(self, x):
        return x + 1


class Chain:
    """A composed transform that is not torchvision's: an object with a ``transforms`` list."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class TransformedDataset(Dataset):
    def __init__(self, n: int):
        self.n = n
        self.transform = Chain([SlowTransform(), FastTransform()])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.transform(torch.full((3,), float(i) + WORKER_MARK))


def mark_worker(worker_id: int) -> None:
    """A user's worker_init_fn: every sample a worker makes then carries 100 + its id."""
    global WORKER_MARK
    WORKER_MARK = 100.0 + worker_id


class FrozenDataset(Dataset):
    """A dataset that refuses every attribute change after it is made (a frozen object)."""

    def __init__(self, n: int):
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "transform", Chain([FastTransform()]))

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __len__(self):
        return self.n

    def scale(self, x):
        return x * 3

    def __getitem__(self, i):
        return self.scale(self.transform(torch.full((2,), float(i))))


class Stream(torch.utils.data.IterableDataset):
    """An iterable dataset: its samples come from ``__iter__``, each through the slow transform."""

    def __init__(self, n: int):
        self.n = n
        self.transform = SlowTransform()

    def __iter__(self):
        for i in range(self.n):
            yield self.transform(torch.full((2,), float(i)))


def failing_init(worker_id: int) -> None:
    raise ValueError(f"worker {worker_id} refuses to start")
