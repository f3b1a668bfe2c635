"""Datasets for the tuner tests, in a module of their own so that worker processes can import them."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset, get_worker_info


class Sleepy(Dataset):
    """``n`` items that each take ``item_s`` to produce (a stand-in for decoding and augmenting)."""

    def __init__(self, n: int = 400, item_s: float = 0.003) -> None:
        self.n, self.item_s = n, item_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.item_s:
            time.sleep(self.item_s)
        return torch.full((4,), float(i)), i % 2


class FailsInWorkers(Sleepy):
    """Works in the main process, raises in a worker process."""

    def __getitem__(self, i: int):
        if get_worker_info() is not None:
            raise ValueError("boom in a worker")
        return super().__getitem__(i)


class AlwaysFails(Sleepy):
    def __getitem__(self, i: int):
        raise KeyError(f"item {i} is missing")


def pair_collate(batch):
    """A named, picklable collate function: stacks the tensors, lists the labels."""
    xs, ys = zip(*batch)
    return torch.stack(xs), list(ys)
