"""Datasets that hang, for the tuner's time-bound tests (a module, so worker processes import it)."""

from __future__ import annotations

import threading

import torch
from torch.utils.data import Dataset, get_worker_info

NEVER = threading.Event()  # never set: waiting on it blocks for ever


class Items(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int):
        return torch.full((4,), float(i))


class HangsInMainProcess(Items):
    """Blocks for ever in the main process (``num_workers=0``); fine in a worker."""

    def __getitem__(self, i: int):
        if get_worker_info() is None:
            NEVER.wait()
        return super().__getitem__(i)


class HangsInWorkers(Items):
    """Fine in the main process; blocks for ever in a worker process."""

    def __getitem__(self, i: int):
        if get_worker_info() is not None:
            NEVER.wait()
        return super().__getitem__(i)
