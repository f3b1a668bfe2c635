"""``metrics.phases`` on a real torch.profiler capture (CPU): a loader that sleeps a known
time per batch shows up as the ``data`` phase, and the five phases add up to each step."""

from __future__ import annotations

import time

import pytest

import gpumagic.shells.api as api

torch = pytest.importorskip("torch")

SLEEP_S = 0.03


class SlowDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(SLEEP_S)  # one sample per batch: the loader waits this long per step
        return torch.randn(16), torch.randn(1)


def test_phases_of_a_real_cpu_capture_with_a_sleeping_loader():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=1, num_workers=0)
    with api.profile(display=False, skip=1, steps=4) as run:
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i == 6:
                break
    m = run.report.to_dict()["metrics"]
    ph = m["phases"]
    assert len(ph["per_step"]) == m["steps"]["count"] >= 3
    for parts, dur in zip(ph["per_step"], m["steps"]["durations_ms"]):
        assert sum(parts.values()) == pytest.approx(dur, abs=1e-3)
        assert parts["forward"] > 0 and parts["backward"] > 0 and parts["optimizer"] > 0
    # the sleep is inside the loader's __next__ span: each step waits at least that long for data
    # (every step but possibly the one whose batch was fetched before the recording began)
    waits = sorted(p["data"] for p in ph["per_step"])
    assert waits[-2] >= SLEEP_S * 1000
    assert ph["median_ms"]["data"] >= SLEEP_S * 1000
    assert ph["found"] == {"dataloader": True, "backward": True, "optimizer": True}
