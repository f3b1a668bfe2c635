"""Issue 29: the data pipeline's stages timed in the main process and in the DataLoader's workers
(gpumagic.capture.stages), into the bundle and ``metrics.host.loader_stages``.

The slow transform sleeps :data:`loader_stage_data.SLOW_S` per sample, so its measured time has a
floor no machine load can lower; the tests assert that floor and the order of the stages, never
a duration's upper bound."""

from __future__ import annotations

import gc
import gzip
import json

import pytest

torch = pytest.importorskip("torch")

import loader_stage_data as lsd  # noqa: E402
from reliability.capture_state import stage_timer_leftovers  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import gpumagic  # noqa: E402
from gpumagic.capture import CaptureOptions, CaptureSession  # noqa: E402
from gpumagic.capture.stages import LoaderStages  # noqa: E402

BATCH = 4


def _rows(block):
    return {(r["name"], r["where"]): r for r in block["stages"]}


def _batches(loader, limit=None):
    out = []
    for i, batch in enumerate(loader):
        out.append(batch)
        if limit is not None and i + 1 >= limit:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_the_slow_transform_is_named_first_and_results_do_not_change(workers):
    ds = lsd.TransformedDataset(8)
    items = list(ds.transform.transforms)
    init = lsd.mark_worker if workers else None
    plain = _batches(DataLoader(ds, batch_size=BATCH, num_workers=workers, worker_init_fn=init))
    stages = LoaderStages()
    stages.start()
    try:
        timed = _batches(DataLoader(ds, batch_size=BATCH, num_workers=workers, worker_init_fn=init))
        ds.transform(torch.zeros(3))  # the loop calling a transform itself, outside a fetch: not a stage
    finally:
        block = stages.stop()
    assert [b.tolist() for b in timed] == [b.tolist() for b in plain]  # same batches, the user's init ran
    if workers:
        assert all(b.min() >= 100 for b in timed)
    where = "worker" if workers else "main"
    rows = _rows(block)
    assert block["batches"] == 2 and block["workers"] == workers
    assert block["stages"][0]["name"] == "SlowTransform" and block["stages"][0]["where"] == where
    assert rows[("SlowTransform", where)]["calls"] == 8
    assert rows[("SlowTransform", where)]["self_ns"] >= 8 * lsd.SLOW_S * 1e9
    for name in ("FastTransform", "TransformedDataset.__getitem__", "default_collate", "other"):
        assert (name, where) in rows, name  # self time of each: __getitem__ without its transforms
    assert rows[("TransformedDataset.__getitem__", where)]["calls"] == 8
    assert rows[("default_collate", where)]["calls"] == rows[("other", where)]["calls"] == 2
    # everything in the main process is put back
    assert ds.transform.transforms == items and all(type(t) in (lsd.SlowTransform, lsd.FastTransform) for t in items)
    assert "transform" not in vars(ds) or type(vars(ds)["transform"]) is lsd.Chain
    assert stage_timer_leftovers() == []


def test_workers_report_as_they_go_so_an_early_break_keeps_their_timings():
    ds = lsd.TransformedDataset(64)
    stages = LoaderStages()
    stages.start()
    try:
        loader = DataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True)
        _batches(loader, limit=2)  # break after two batches; the workers keep prefetching, unjoined
        block = stages.stop()
    finally:
        stages.stop()
        loader._iterator._shutdown_workers()
    rows = _rows(block)
    assert block["batches"] >= 2
    assert rows[("SlowTransform", "worker")]["self_ns"] >= 2 * BATCH * lsd.SLOW_S * 1e9
    assert stage_timer_leftovers() == []


def test_a_profiled_loop_records_the_stages_in_the_bundle_and_analyze_reads_them(tmp_path):
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(lsd.TransformedDataset(16), batch_size=BATCH, num_workers=2)
    path = tmp_path / "run.json.gz"
    with gpumagic.profile(skip=0, steps=2, nvml=False, save=str(path)) as run:
        for x in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    stages = run.report.metrics.host.loader_stages
    assert stages[0].name == "SlowTransform" and stages[0].where == "worker"
    assert sum(s.share for s in stages) == pytest.approx(1.0, abs=1e-3)
    assert stages[0].ms_per_batch >= BATCH * lsd.SLOW_S * 1e3
    assert [s.share for s in stages] == sorted((s.share for s in stages), reverse=True)
    section = json.loads(gzip.decompress(path.read_bytes()))["gpumagic"]
    assert section["capture"]["loader_stages"] is True and section["loader_stages"]["workers"] >= 1
    again = gpumagic.analyze(str(path)).to_dict()["metrics"]["host"]["loader_stages"]
    assert again == [s.to_dict() if hasattr(s, "to_dict") else {k: v for k, v in s.items()} for s in stages]
    assert stage_timer_leftovers() == []


def test_loader_stages_off_records_none():
    session = CaptureSession(CaptureOptions(nvml=False, cpu=False, loader_stages=False))
    session.start()
    _batches(DataLoader(lsd.TransformedDataset(4), batch_size=BATCH))
    run = session.finish()
    assert run.report.metrics.host.loader_stages is None
    assert '"loader_stages":{' not in run.bundle[:4000].decode("utf-8", "replace")


def test_a_dataset_that_refuses_the_timers_loads_as_before():
    ds = lsd.FrozenDataset(8)
    plain = _batches(DataLoader(ds, batch_size=BATCH))
    stages = LoaderStages()
    stages.start()
    try:
        timed = _batches(DataLoader(ds, batch_size=BATCH))
    finally:
        block = stages.stop()
    assert [b.tolist() for b in timed] == [b.tolist() for b in plain]
    rows = _rows(block)
    assert ("FrozenDataset.__getitem__", "main") in rows and ("FastTransform", "main") in rows  # the list took timers
    assert ("FrozenDataset.scale", "main") not in rows  # the methods could not be
    assert stage_timer_leftovers() == [] and type(ds.transform.transforms[0]) is lsd.FastTransform


def test_an_iterable_dataset_is_timed_per_sample():
    stages = LoaderStages()
    stages.start()
    try:
        timed = _batches(DataLoader(lsd.Stream(4), batch_size=2))
    finally:
        block = stages.stop()
    assert [b.tolist() for b in timed] == [[[0.0, 0.0], [2.0, 2.0]], [[4.0, 4.0], [6.0, 6.0]]]
    rows = _rows(block)
    assert block["batches"] == 2 and rows[("SlowTransform", "main")]["calls"] == 4
    assert ("Stream.__iter__", "main") in rows  # the generator's own time, per next()


def test_the_users_worker_init_fn_fails_as_without_the_timers():
    def message():
        with pytest.raises(ValueError) as info:
            _batches(DataLoader(lsd.TransformedDataset(4), batch_size=BATCH, num_workers=1,
                                worker_init_fn=lsd.failing_init))
        text = str(info.value).splitlines()[0]
        info.value.__traceback__ = None  # its frames hold the loader's iterator: let it shut its worker down now
        del info
        gc.collect()
        return text

    plain = message()
    stages = LoaderStages()
    stages.start()
    try:
        timed = message()
    finally:
        stages.stop()
    assert timed == plain and "ValueError" in plain


def test_when_the_timers_would_cost_a_noticeable_share_they_time_only_some_batches(monkeypatch):
    """A timer whose own cost is a large share of a batch (here made so by declaring each timed
    call to cost a second, so that no clock decides the test) times the first MIN_TIMED batches
    and then one in MAX_EVERY; the batches are unchanged, and a fetch stage's time is per timed
    batch (pin_memory's, timed on every batch outside the fetch, is per batch made: no pinning
    happens without an accelerator, so that half is checked on a bundle block in
    test_per_batch_times_follow_each_stage_s_own_batches_and_old_bundles_still_read)."""
    import test_diagnoses as td
    from test_loader_stages_analysis import bundle

    from gpumagic.capture import stages as st

    monkeypatch.setattr(st, "timer_cost_ns", lambda: 10**9)
    ds = lsd.TransformedDataset(40)
    ds.transform = lsd.Chain([lsd.FastTransform(), lsd.FastTransform()])  # microseconds per sample
    plain = _batches(DataLoader(ds, batch_size=1))
    stages = LoaderStages()
    stages.start()
    try:
        timed = _batches(DataLoader(ds, batch_size=1))
    finally:
        block = stages.stop()
    assert [b.tolist() for b in timed] == [b.tolist() for b in plain]
    # batches 1 and 2 timed (MIN_TIMED), then one in MAX_EVERY: 18 and 34 of 40
    assert block["fetched"] == 40 and block["batches"] == st.MIN_TIMED + 2 == 4
    rows = _rows(block)
    get = rows[("TransformedDataset.__getitem__", "main")]
    assert get["calls"] == 4 and get["batches"] == 4  # one sample per timed batch, none from the untimed ones
    report = gpumagic.analyze(bundle(td._loader_trace(True), block))
    listed = {s.name: s for s in report.metrics.host.loader_stages}
    assert listed["TransformedDataset.__getitem__"].ms_per_batch == pytest.approx(get["self_ns"] / 4 / 1e6, abs=1e-4)
    assert sum(s.share for s in listed.values()) == pytest.approx(1, abs=1e-3)


def test_a_cheap_timer_times_every_batch(monkeypatch):
    from gpumagic.capture import stages as st

    monkeypatch.setattr(st, "timer_cost_ns", lambda: 1)
    stages = LoaderStages()
    stages.start()
    try:
        ds = lsd.TransformedDataset(12)
        ds.transform = lsd.Chain([lsd.FastTransform()])
        _batches(DataLoader(ds, batch_size=2))
    finally:
        block = stages.stop()
    assert block["fetched"] == block["batches"] == 6


def test_the_timer_cost_is_measured_once_and_positive():
    from gpumagic.capture.stages import timer_cost_ns

    first = timer_cost_ns()
    assert type(first) is int and first >= 1 and timer_cost_ns() == first


def test_per_batch_times_follow_each_stage_s_own_batches_and_old_bundles_still_read():
    """The analysis divides each stage by the batches its time covers, and shares are of those
    per-batch times; a bundle from before sampling (no ``fetched``, no row ``batches``) reads as
    every stage covering every batch."""
    import test_diagnoses as td
    from test_loader_stages_analysis import bundle

    def report(block):
        return {s.name: s for s in gpumagic.analyze(bundle(td._loader_trace(True), block)).metrics.host.loader_stages}

    sampled = report({"batches": 2, "fetched": 8, "workers": 0, "stages": [
        {"name": "Decode", "where": "main", "self_ns": 6_000_000, "calls": 2, "batches": 2},
        {"name": "pin_memory", "where": "main", "self_ns": 8_000_000, "calls": 8, "batches": 8}]})
    assert sampled["Decode"].ms_per_batch == 3.0 and sampled["pin_memory"].ms_per_batch == 1.0
    assert sampled["Decode"].share == 0.75 and sampled["pin_memory"].share == 0.25
    old = report({"batches": 2, "workers": 0, "stages": [
        {"name": "Decode", "where": "main", "self_ns": 6_000_000, "calls": 2},
        {"name": "pin_memory", "where": "main", "self_ns": 2_000_000, "calls": 2}]})
    assert old["Decode"].ms_per_batch == 3.0 and old["pin_memory"].share == 0.25
