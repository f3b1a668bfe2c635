"""tune_dataloader measures real DataLoaders on the CPU, in bounded time, and cleans up."""

from __future__ import annotations

import time

import pytest
import torch
from datasets_for_tuner import AlwaysFails, FailsInWorkers, Sleepy, pair_collate
from torch.utils.data import DataLoader

from gpumagic.capture.dataloader import READ_ON_BELOW, TuneResult, tune_dataloader

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="expectations are for the CPU-only path")


def test_workers_beat_the_single_process_loader():
    result = tune_dataloader(Sleepy(item_s=0.003), batch_size=4, num_workers=(0, 2), max_seconds_per_config=0.4)
    assert [r.status for r in result.rows] == ["ok", "ok"]
    assert result.baseline.config.num_workers == 0
    assert result.best.config.num_workers == 2
    assert result.speedup > 1.3  # two workers sleep in parallel: ideally 2×
    assert result.recommended_kwargs == {"batch_size": 4, "num_workers": 2, "pin_memory": False,
                                         "persistent_workers": True, "prefetch_factor": 2}
    assert "loader = DataLoader(dataset, batch_size=4, num_workers=2, pin_memory=False" in result.code
    for row in result.rows:
        assert row.startup_s > 0 and row.restart_s > 0 and row.batches > 0
        assert row.samples_per_s == pytest.approx(row.batches_per_s * 4, rel=1e-3)
    assert any("pin_memory=True was not measured" in n for n in result.notes)


def test_time_and_batch_limits_hold():
    t0 = time.perf_counter()
    slow = tune_dataloader(Sleepy(item_s=0.02), batch_size=4, num_workers=(0,), max_seconds_per_config=0.3)
    elapsed = time.perf_counter() - t0
    row = slow.rows[0]
    assert row.seconds <= 0.3 + 0.1  # the deadline is checked between batches of ~80 ms
    assert elapsed < 1.5
    few = tune_dataloader(Sleepy(item_s=0), batch_size=2, num_workers=(0,), max_batches=3, max_seconds_per_config=5)
    assert few.rows[0].batches == 3


def test_takes_a_dataloader_and_keeps_its_batching_and_collate():
    loader = DataLoader(Sleepy(n=60, item_s=0), batch_size=5, collate_fn=pair_collate, drop_last=True)
    result = tune_dataloader(loader, num_workers=(0, 1), max_seconds_per_config=0.2, persistent_workers=(False,))
    assert result.batch_size == 5
    assert all(r.status == "ok" for r in result.rows)
    assert result.rows[1].config.persistent_workers is False
    assert "batches" in result.to_text()


def test_a_short_epoch_is_followed_by_the_next_up_to_the_batch_limit():
    # a time limit far beyond the batches: the batch limit stops it, never the clock (with 1 s, a
    # busy machine's stall once ended the measurement before its one batch)
    t0 = time.perf_counter()
    result = tune_dataloader(Sleepy(n=8, item_s=0), batch_size=4, num_workers=(0,), max_seconds_per_config=60,
                             max_batches=30, rounds=1)
    assert time.perf_counter() - t0 < 60
    # two batches an epoch: read on as training would, until enough are measured (the epoch's end then stops it)
    assert READ_ON_BELOW <= result.rows[0].batches < READ_ON_BELOW + 2  # the epoch that reached it ends it
    # a rate however short the batch (four in-memory items: tens of µs, which rounded to 0 s
    # once gave no rate)
    assert result.rows[0].batches_per_s > 0


def test_workers_started_each_epoch_stop_at_its_end_and_say_so():
    """Without persistent workers a new epoch starts new processes (restart_s's to measure): the
    measurement ends with the epoch. Eight batches, one worker keeping two in flight: the first
    is the startup, two the warm-up, five are measured."""
    result = tune_dataloader(Sleepy(n=32, item_s=0), batch_size=4, num_workers=(1,), persistent_workers=(False,),
                             max_seconds_per_config=60, rounds=1)
    [row] = [r for r in result.rows if r.config.num_workers == 1]
    assert row.batches == 5 and row.batches_per_s > 0
    assert any("Fewer than 5 batches" in n for n in result.notes) is False


def test_a_short_epoch_read_by_many_workers_is_measured_at_their_rate():
    """Eight workers, two batches each in flight, an epoch of sixteen batches: the workers run in
    step, so the batches after the first come in bursts, and an epoch's tail read at once measured
    many times what they can make. With an item taking 2 ms and 8 items a batch, eight workers make
    at most 8 / 16 ms = 500 batches/s: the warm-up skips every batch in flight before the first
    arrived, and the measurement reads on into the next epochs."""
    result = tune_dataloader(Sleepy(n=8 * 16, item_s=0.002), batch_size=8, num_workers=(8,),
                             max_seconds_per_config=1.5, max_batches=60, rounds=1)
    [row] = result.rows
    assert row.status == "ok" and row.batches >= 1
    assert row.batches_per_s <= 8 / (8 * 0.002) * 1.05  # never above what eight workers can make


def test_failing_workers_are_reported_not_raised():
    result = tune_dataloader(FailsInWorkers(item_s=0), batch_size=4, num_workers=(0, 2), max_seconds_per_config=0.2)
    ok, failed = result.rows
    assert ok.status == "ok" and failed.status == "failed"
    assert "ValueError" in failed.error and failed.batches_per_s is None
    assert result.best is ok
    assert any("Some settings failed" in w for w in result.warnings)


def test_a_broken_dataset_raises_from_the_single_process_setting():
    with pytest.raises(KeyError, match="item 0 is missing"):
        tune_dataloader(AlwaysFails(), batch_size=2, num_workers=(0, 2), max_seconds_per_config=0.2)


def test_spawn_with_a_notebook_dataset_skips_worker_settings(monkeypatch):
    import gpumagic.capture.dataloader as tuner

    monkeypatch.setattr(tuner, "start_method", lambda base: "spawn")
    monkeypatch.setattr(tuner, "interactive_main", lambda: True)
    monkeypatch.setattr(Sleepy, "__module__", "__main__")
    result = tune_dataloader(Sleepy(item_s=0), batch_size=4, num_workers=(0, 2), max_seconds_per_config=0.2)
    assert [r.status for r in result.rows] == ["ok", "skipped"]
    assert "the dataset class Sleepy is defined in the notebook (__main__)" in result.warnings[0]
    assert "'spawn'" in result.warnings[0]
    assert result.best.config.num_workers == 0


def test_bad_arguments_fail_before_any_measurement():
    with pytest.raises(ValueError, match="max_seconds_per_config"):
        tune_dataloader(Sleepy(), max_seconds_per_config=0)
    with pytest.raises(ValueError, match="max_batches"):
        tune_dataloader(Sleepy(), max_batches=0)
    with pytest.raises(ValueError, match="batch_size"):
        tune_dataloader(Sleepy(), batch_size=0)
    with pytest.raises(TypeError, match="takes a Dataset or a DataLoader"):
        tune_dataloader(42)


def test_result_renders(tmp_path):
    result = tune_dataloader(Sleepy(n=100, item_s=0.001), batch_size=4, num_workers=(0, 1), max_seconds_per_config=0.2)
    assert isinstance(result, TuneResult)
    text = result.to_text()
    # one worker sleeps as long per batch as the main process does: whether the measured difference
    # is a clear one depends on the machine, so either summary may come (see the next test for "Best")
    assert text.startswith(("gpumagic DataLoader tuning\nBest: ", "gpumagic DataLoader tuning\nNo change: "))
    assert "◀ best" in text and ("Recommended:" in text) == bool(result.code)
    png = result.png()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    bundle = result._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert 'aria-label="batches per second by setting"' in bundle["text/html"] and "<script" not in bundle["text/html"]
    assert "batches/s \u00b7 best" in bundle["text/html"]  # the best setting is named, not only coloured
    d = result.to_dict()
    assert d["best"]["num_workers"] == result.best.config.num_workers
    assert [r["status"] for r in d["rows"]] == ["ok", "ok"]


def test_a_clearly_faster_setting_is_named_best_with_its_code():
    """The text of a result whose two-worker setting is faster beyond doubt (every batch twice as
    fast): "Best:", the table's mark, and the DataLoader arguments to use."""
    from gpumagic.capture.dataloader import TuneConfig, TuneRow

    rows = [TuneRow(TuneConfig(0, False), batches=20, seconds=0.2, batches_per_s=100.0,
                    batch_s=[0.010 + 0.0001 * (k % 3) for k in range(20)]),
            TuneRow(TuneConfig(2, False, True, 2), batches=40, seconds=0.2, batches_per_s=200.0,
                    batch_s=[0.005 + 0.0001 * (k % 3) for k in range(40)])]
    result = TuneResult(rows=rows, batch_size=4, elapsed_s=0.5)
    text = result.to_text()
    assert result.best is rows[1]
    assert text.startswith("gpumagic DataLoader tuning\nBest: ")
    assert "◀ best" in text and "Recommended:" in text and "num_workers=2" in text


def test_workers_are_shut_down_when_interrupted(monkeypatch):
    import gpumagic.capture.dataloader as tuner

    calls = {"n": 0}

    def interrupt_on_third(batch, device, non_blocking):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return batch

    monkeypatch.setattr(tuner, "_to_device", interrupt_on_third)
    with pytest.raises(KeyboardInterrupt):
        tune_dataloader(Sleepy(item_s=0.001), batch_size=2, num_workers=(2,), max_seconds_per_config=1)
    # the autouse fixture then checks that no worker process is left


def test_an_explicit_device_is_fed_each_batch():
    result = tune_dataloader(Sleepy(n=40, item_s=0), batch_size=4, num_workers=(0,), device="cpu", max_seconds_per_config=0.2)
    assert result.rows[0].status == "ok" and result.rows[0].batches > 0


def test_restart_is_timed_at_a_real_epoch_end_for_persistent_workers(monkeypatch):
    """A persistent iterator restarted mid-epoch first drains the abandoned epoch's prefetched
    batches; the restart must be timed after an epoch that ended, with nothing left in flight."""
    import gpumagic.capture.dataloader as dl

    seen = []
    real_iter = DataLoader.__iter__

    def spy(self):
        inner = getattr(self, "_iterator", None)
        outstanding = getattr(inner, "_tasks_outstanding", None) if self.persistent_workers else None
        seen.append((self.persistent_workers, outstanding))
        return real_iter(self)

    monkeypatch.setattr(DataLoader, "__iter__", spy)
    result = dl.tune_dataloader(Sleepy(item_s=0.002), batch_size=2, num_workers=(2,),
                                persistent_workers=(True,), max_seconds_per_config=0.3)
    assert result.rows[0].status == "ok" and result.rows[0].restart_s is not None
    restarts = [o for persistent, o in seen if persistent and o is not None]
    assert restarts == [0, 0]  # each round's persistent restart found no batch of the old epoch in flight
