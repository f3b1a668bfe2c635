"""Datasets for the example notebooks, in a module so that DataLoader worker processes can import them.

A DataLoader worker started with ``spawn`` (the default on macOS and Windows) or ``forkserver``
(the default on Linux from Python 3.14) unpickles the dataset, which means importing its class by
module and name. A class defined in a notebook cell lives in ``__main__``, which a worker cannot import,
so the notebooks import their datasets from here.

Every item is computed from its index (a seeded generator), so the data is the same in every
process and in every run, and the datasets cost no memory.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset

#: Items in a dataset unless told otherwise: more than any notebook reads, so no epoch ends mid-profile.
DEFAULT_ITEMS = 100_000


def _generator(index: int, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


class SlowImages(Dataset):
    """Small "images" whose loading costs ``item_s`` seconds each, as decoding and augmenting a
    JPEG does (typically a few milliseconds per image on one core).

    The cost is a ``time.sleep``: it stands for work the main process would wait on, and it runs
    in parallel across worker processes whatever the number of cores, so the data-loader lesson
    shows the same effect on a 2-core CI machine as on a workstation. Real decoding uses a core
    per worker: there, more workers than cores stop helping.

    Items are ``(image, label)``: a float tensor of ``shape`` and a 0-d int64 class in ``[0, classes)``.
    The label depends on the image (the sign of its mean), so a model can learn it.
    """

    def __init__(self, n: int = DEFAULT_ITEMS, item_s: float = 0.001, shape: tuple[int, ...] = (3, 32, 32),
                 classes: int = 2, seed: int = 0) -> None:
        if n < 1 or item_s < 0 or classes < 2:
            raise ValueError(f"SlowImages needs n >= 1, item_s >= 0 and classes >= 2, not {n}, {item_s}, {classes}")
        self.n, self.item_s, self.shape, self.classes, self.seed = n, item_s, tuple(shape), classes, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} items")
        if self.item_s:
            time.sleep(self.item_s)  # "decode and augment"
        image = torch.randn(self.shape, generator=_generator(index, self.seed))
        # tensor arithmetic only: int(tensor) would run aten::item, which the timeline marks as a sync
        label = (image.mean() > 0).long() % self.classes
        return image, label


class RandomTokens(Dataset):
    """Tokenised "sentences" for a Hugging Face model: ``input_ids``, ``attention_mask`` and a
    ``labels`` class, each item costing ``item_s`` seconds (on-the-fly tokenisation or augmentation).

    ``vocab_size`` must not exceed the model's; token id 0 is left for padding.
    """

    def __init__(self, n: int = DEFAULT_ITEMS, seq_len: int = 32, vocab_size: int = 1000, classes: int = 2,
                 item_s: float = 0.0, seed: int = 0) -> None:
        if n < 1 or seq_len < 1 or vocab_size < 2 or classes < 2 or item_s < 0:
            raise ValueError("RandomTokens needs n, seq_len >= 1, vocab_size, classes >= 2 and item_s >= 0")
        self.n, self.seq_len, self.vocab_size, self.classes = n, seq_len, vocab_size, classes
        self.item_s, self.seed = item_s, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} items")
        if self.item_s:
            time.sleep(self.item_s)  # "tokenise"
        ids = torch.randint(1, self.vocab_size, (self.seq_len,), generator=_generator(index, self.seed))
        return {"input_ids": ids, "attention_mask": torch.ones(self.seq_len, dtype=torch.long),
                "labels": ids[0] % self.classes}


class HeavyAugment:
    """An augmentation that costs ``item_s`` seconds per image: a ``time.sleep`` standing for CPU
    work (see :class:`SlowImages`), then a real, cheap change of the pixels."""

    def __init__(self, item_s: float = 0.004) -> None:
        self.item_s = item_s

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        time.sleep(self.item_s)
        return image * 0.5


class Flip:
    """A cheap augmentation: mirror the image left to right."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.flip(-1)


class Pipeline:
    """A composed transform that is not torchvision's: a ``transforms`` list applied in order (what
    ``torchvision.transforms.Compose`` is, too)."""

    def __init__(self, transforms: list) -> None:
        self.transforms = list(transforms)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        for t in self.transforms:
            image = t(image)
        return image


class AugmentedImages(Dataset):
    """``(transform(image), label)`` items: a seeded random image (as :class:`SlowImages`, with no
    cost of its own) through ``transform``."""

    def __init__(self, transform, n: int = DEFAULT_ITEMS, shape: tuple[int, ...] = (3, 32, 32), seed: int = 0) -> None:
        self.transform, self.n, self.shape, self.seed = transform, n, tuple(shape), seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} items")
        image = torch.randn(self.shape, generator=_generator(index, self.seed))
        label = (image.mean() > 0).long()
        return self.transform(image), label
