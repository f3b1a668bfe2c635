"""The grid, the choice of the best setting and the fragility checks, without measuring."""

from __future__ import annotations

import pytest
from datasets_for_tuner import Sleepy, pair_collate

from gpumagic.capture.dataloader import TuneConfig, TuneResult, TuneRow, build_grid, default_workers, fragility


def test_default_workers_are_zero_then_powers_of_two_up_to_the_cpus(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    assert default_workers() == (0, 2, 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert default_workers() == (0,)


def test_grid_collapses_worker_options_for_zero_workers_and_drops_pinning_without_cuda():
    notes: list[str] = []
    grid = build_grid((2, 0, 2), (False, True), (False, True), (2, 4), cuda=False, notes=notes)
    assert grid[0] == TuneConfig(0, False)
    assert len(grid) == 1 + 2 * 2  # workers 2 × persistent 2 × prefetch 2, unpinned only
    assert all(not c.pin_memory for c in grid)
    assert "pin_memory=True was not measured" in notes[0]
    with_cuda = build_grid((0, 2), (False, True), (True,), (2,), cuda=True, notes=[])
    assert [(c.num_workers, c.pin_memory) for c in with_cuda] == [(0, False), (0, True), (2, False), (2, True)]


@pytest.mark.parametrize("kwargs, message", [
    ({"num_workers": (-1,)}, "num_workers must be integers >= 0"),
    ({"num_workers": ("2",)}, "num_workers"),
    ({"prefetch_factor": (0,)}, "prefetch_factor must be integers >= 1"),
    ({"pin_memory": ("yes",)}, "pin_memory must be True and/or False"),
    ({"persistent_workers": ()}, "persistent_workers"),
])
def test_grid_validation(kwargs, message):
    args = {"num_workers": (0,), "pin_memory": (False,), "persistent_workers": (True,), "prefetch_factor": (2,)}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        build_grid(args["num_workers"], args["pin_memory"], args["persistent_workers"], args["prefetch_factor"], False, [])


def test_config_kwargs_and_labels():
    assert TuneConfig(0, True).loader_kwargs() == {"num_workers": 0, "pin_memory": True}
    assert TuneConfig(4, True, True, 2).loader_kwargs() == {"num_workers": 4, "pin_memory": True,
                                                            "persistent_workers": True, "prefetch_factor": 2}
    assert TuneConfig(1, False, False, 4).label == "1 worker, prefetch 4"
    assert TuneConfig(4, True, True, 2).label == "4 workers, pinned, persistent, prefetch 2"


def _row(workers: int, rate: float | None, status: str = "ok") -> TuneRow:
    return TuneRow(TuneConfig(workers, False, True, 2 if workers else None), status=status, batches_per_s=rate)


def test_best_prefers_fewer_workers_when_nearly_as_fast():
    result = TuneResult(rows=[_row(0, 100.0), _row(2, 150.0), _row(4, 152.0), _row(8, None, "failed")], batch_size=32)
    assert result.best.config.num_workers == 2  # 150 is within 5 % of 152
    assert result.speedup == pytest.approx(1.5)
    assert result.recommended_kwargs["num_workers"] == 2
    clear = TuneResult(rows=[_row(0, 100.0), _row(2, 150.0), _row(4, 200.0)], batch_size=None)
    assert clear.best.config.num_workers == 4
    assert "batch_size" not in clear.recommended_kwargs
    assert TuneResult(rows=[_row(2, None, "failed")], batch_size=1).best is None


def test_fragility_under_spawn_in_a_notebook(monkeypatch):
    monkeypatch.setattr(Sleepy, "__module__", "__main__")
    base = {"dataset": Sleepy(), "collate_fn": lambda b: b}
    notes: list[str] = []
    warnings, workers_ok = fragility(base, notes, method="spawn", interactive=True)
    assert not workers_ok and notes == []
    assert "the dataset class Sleepy is defined in the notebook (__main__)" in warnings[0]
    assert "collate_fn cannot be pickled" in warnings[0]


def test_fragility_under_fork_is_a_portability_note(monkeypatch):
    monkeypatch.setattr(Sleepy, "__module__", "__main__")
    notes: list[str] = []
    warnings, workers_ok = fragility({"dataset": Sleepy()}, notes, method="fork", interactive=True)
    assert workers_ok and warnings == []
    assert "on macOS and Windows ('spawn') it would fail" in notes[0]


def test_no_fragility_for_importable_definitions():
    notes: list[str] = []
    base = {"dataset": Sleepy(), "collate_fn": pair_collate}
    assert fragility(base, notes, method="spawn", interactive=True) == ([], True)
    assert notes == []
    # a script's __main__ can be re-imported by spawned workers
    assert fragility({"dataset": Sleepy()}, notes, method="spawn", interactive=False) == ([], True)


def test_batches_are_copied_to_the_device_through_nesting():
    from collections import namedtuple

    import torch

    from gpumagic.capture.dataloader import _to_device

    Pair = namedtuple("Pair", "x y")
    batch = {"a": [torch.ones(2), (torch.zeros(1), 3)], "p": Pair(torch.ones(1), "label")}
    moved = _to_device(batch, "cpu", False)
    assert isinstance(moved["p"], Pair) and moved["p"].y == "label"
    assert isinstance(moved["a"], list) and isinstance(moved["a"][1], tuple) and moved["a"][1][1] == 3
    assert torch.equal(moved["a"][0], torch.ones(2))
    assert _to_device(batch, None, False) is batch


def test_overlapping_intervals_keep_the_single_process_loader_and_separate_ones_pick_workers():
    import numpy as np

    from gpumagic.tuning.tuner import TuneConfig, TuneResult, TuneRow

    def row(workers: int, mean_s: float, spread: float) -> TuneRow:
        times = list(mean_s * (1 + spread * np.tile([-1.0, 1.0], 20)))  # bursty arrivals, mean exactly mean_s
        return TuneRow(TuneConfig(workers, False, workers > 0, 2 if workers else None), batches=40,
                       seconds=sum(times), batches_per_s=40 / sum(times), batch_s=times)

    noisy = TuneResult(rows=[row(0, 0.010, 0.6), row(2, 0.0095, 0.6)], batch_size=4)
    assert noisy.best.config.num_workers == 0  # 5 % faster inside the noise: "no change"
    assert noisy.change_of(noisy.rows[1]) == "no clear change"
    assert "No change" in noisy.to_text()
    clear = TuneResult(rows=[row(0, 0.010, 0.05), row(2, 0.005, 0.05)], batch_size=4)
    assert clear.best.config.num_workers == 2 and clear.change_of(clear.rows[1]) == "faster"
    assert clear.to_dict()["rows"][1]["change"] == "faster"


def test_the_grid_is_measured_interleaved(monkeypatch):
    from gpumagic.capture import dataloader as dl

    order = []

    def fake_measure(base, config, seconds, batches, device, start_s=0.0):
        order.append(config.num_workers)
        return dl.TuneRow(config, batches=5, seconds=0.05, batches_per_s=100.0, batch_s=[0.01] * 5)

    monkeypatch.setattr(dl, "_measure", fake_measure)
    monkeypatch.setattr(dl, "worker_start_s", lambda base: 0.0)
    result = dl.tune_dataloader(list(range(20)), batch_size=2, num_workers=(0, 1), rounds=3)
    assert order == [0, 1, 0, 1, 0, 1]  # ABABAB, not AAABBB
    assert result.rows[0].batches == 15 and len(result.rows[0].batch_s) == 15


def _scaling(monkeypatch, rate_of, cpus=2):
    """tune_dataloader with the default worker counts on ``cpus`` CPUs, each setting's batches taking
    1 / rate_of(workers) s (a little noise, so the intervals are intervals); the order measured."""
    import os

    import numpy as np

    from gpumagic.capture import dataloader as dl

    order = []
    rng = np.random.default_rng(0)

    def fake_measure(base, config, seconds, batches, device, start_s=0.0):
        order.append(config.num_workers)
        rate = rate_of(config.num_workers)
        batch_s = list((1 / rate) * (1 + 0.05 * rng.standard_normal(20)))
        return dl.TuneRow(config, batches=20, seconds=sum(batch_s), batches_per_s=20 / sum(batch_s), batch_s=batch_s)

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    monkeypatch.setattr(dl, "_measure", fake_measure)
    monkeypatch.setattr(dl, "worker_start_s", lambda base: 0.0)
    return dl.tune_dataloader(list(range(20)), batch_size=2, rounds=2), order


def test_a_loader_that_waits_gets_more_workers_than_cpus_while_doubling_pays(monkeypatch):
    """A loader that waits on reads: each worker adds its rate up to 8 of them (the main process's
    limit), on 2 CPUs. The grid goes on past the CPUs — 4, 8, then 16, which gains nothing and ends
    it — and recommends 8, with a note saying why more processes than cores were measured."""
    result, order = _scaling(monkeypatch, lambda w: 10.0 * max(1, min(w, 8)))
    assert order == [0, 2, 0, 2, 4, 4, 8, 8, 16, 16]  # the defaults interleaved, then each doubling on its own
    assert result.best.config.num_workers == 8
    assert any(n.startswith("Up to 16 workers, more than the 2 CPUs here, were measured") and
               "More processes than cores were faster" in n for n in result.notes)


def test_a_loader_bound_by_its_cpu_stops_after_one_doubling(monkeypatch):
    """Two workers on two CPUs are 1.8× one process; four are no faster: one doubling tried, two kept."""
    result, order = _scaling(monkeypatch, lambda w: {0: 10.0, 2: 18.0}.get(w, 18.0))
    assert order == [0, 2, 0, 2, 4, 4]
    assert result.best.config.num_workers == 2
    assert any("More than 2 were not clearly faster: the loading computes" in n for n in result.notes)


def test_no_doubling_when_the_cpus_workers_are_not_clearly_faster_or_counts_are_given(monkeypatch):
    result, order = _scaling(monkeypatch, lambda w: 10.0)  # workers do not help at all
    assert order == [0, 2, 0, 2] and not any("were measured" in n for n in result.notes)
    from gpumagic.capture import dataloader as dl

    given = []
    monkeypatch.setattr(dl, "_measure", lambda base, config, *a, **k: given.append(config.num_workers) or dl.TuneRow(
        config, batches=20, seconds=20 / (10.0 * max(1, config.num_workers)),
        batches_per_s=10.0 * max(1, config.num_workers), batch_s=[1 / (10.0 * max(1, config.num_workers))] * 20))
    dl.tune_dataloader(list(range(20)), batch_size=2, num_workers=(0, 2), rounds=1)
    assert given == [0, 2]  # counts the caller chose are the grid: nothing added
