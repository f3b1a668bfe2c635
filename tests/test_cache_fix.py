"""The "preprocess once and cache" fix (``rules.cachefix``) keeps the dataset's samples as they were:
(input, label) pairs, or one tensor a sample (an unlabelled inference set), written once and read
back on the next run."""

from __future__ import annotations

import pytest
import torch

from gpumagic.analysis.rules.cachefix import CACHE_CODE


class _Lone(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.arange(40.0).reshape(10, 4)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] * 2


class _Pairs(_Lone):
    def __getitem__(self, i):
        return self.x[i] * 2, i % 3


@pytest.mark.parametrize("make", [_Lone, _Pairs])
def test_the_cache_keeps_the_batches_the_loader_made(make, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    original = make()
    before = list(torch.utils.data.DataLoader(original, batch_size=4))
    for _ in range(2):  # the first run writes the cache, the second reads it
        ns = {"torch": torch, "dataset": original}
        exec(compile(CACHE_CODE, "<fix>", "exec"), ns)
        after = list(torch.utils.data.DataLoader(ns["dataset"], batch_size=4))
        assert len(after) == len(before)
        for a, b in zip(after, before):
            if isinstance(b, list):
                assert all(torch.equal(x, y) for x, y in zip(a, b))
            else:
                assert torch.equal(a, b)
    assert (tmp_path / ".cache" / "my_dataset" / "preprocessed.pt").exists()
