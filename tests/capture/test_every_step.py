"""Every step of the cell (``metrics.steps.all_ms``), the ``step-outliers`` finding, and the GPU's energy
(``metrics.gpu.energy_j_per_step``, ``idle_energy_frac``) from a fake NVML.

The live tests never assume one diagnosis that load could change: a step that sleeps 200 ms is
flagged whatever the machine does (the other steps would have to take over 100 ms to hide it), and
other steps may be flagged too on a busy machine, which the assertions allow.
"""

from __future__ import annotations

import gc
import json
import time
import weakref

import everystep_blocks as blocks
import pytest
import torch
from IPython.utils.capture import capture_output
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter as BaseIter
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as WorkersIter

from gpumagic import analyze
from gpumagic.analysis import everystep as es
from gpumagic.capture import CaptureOptions, CaptureSession
from gpumagic.capture.everystep import StepTimer
from gpumagic.capture.nvml import FakeNvml

CELL = """
import time, os, torch
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(30):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad(); loss.backward()
    if i == 20:
        time.sleep(0.2)
    if i == 24:
        torch.save(model.state_dict(), os.path.join({folder!r}, "ckpt.pt"))
        model.eval(); time.sleep(0.1); model.train()
    opt.step()
"""


def test_a_cell_of_30_steps_flags_the_step_that_slept(shell, tmp_path):
    with capture_output():
        result = shell.run_cell("%%gpuprofile -o rep --quiet\n" + CELL.format(folder=str(tmp_path)))
    assert result.success, result.error_in_exec
    steps = shell.user_ns["rep"].metrics.steps
    assert len(steps.all_ms) == 30  # every step, not only the five recorded
    assert steps.all_recorded == [1, 2, 3, 4, 5] and steps.all_profiled == 6  # --skip 1 --steps 5
    assert steps.all_ms[1:6] == pytest.approx(steps.durations_ms, rel=0.5, abs=5.0)  # the same steps, two clocks
    assert steps.all_ms[20] >= 200.0
    flagged = {o.index: o for o in steps.outliers}
    assert 20 in flagged and 24 in flagged  # 200 ms and 100 ms over a step of a few ms
    assert not set(flagged) & {0, 1, 2, 3, 4, 5}  # never the first step nor a profiled one
    kinds = {c.kind for c in flagged[24].causes}
    assert {"torch.save", "eval"} <= kinds
    assert next(c for c in flagged[24].causes if c.kind == "eval").ms >= 100.0
    f = shell.user_ns["rep"].finding("step-outliers")
    assert f is not None and "step 20" in f.evidence.summary
    fixes = " ".join(fx.description for fx in f.fixes)
    assert "Evaluation ran inside" in fixes and "record such a step" in fixes  # 20 slept: nothing explains it
    assert "%%gpuprofile --skip" in " ".join(fx.code for fx in f.fixes)


def test_the_timer_puts_back_what_it_wrapped(train):
    save, module_train, callbacks = torch.save, torch.nn.Module.train, list(gc.callbacks)
    start, stop = DataLoader.__dict__["_get_iterator"], WorkersIter.__dict__["_shutdown_workers"]
    next_batch = BaseIter.__dict__["__next__"]
    session = CaptureSession(CaptureOptions(nvml=False, cpu=False))
    session.start()
    assert torch.save is not save and torch.nn.Module.train is not module_train
    assert DataLoader.__dict__["_get_iterator"] is not start and WorkersIter.__dict__["_shutdown_workers"] is not stop
    train(3)
    run = session.finish()
    assert torch.save is save and torch.nn.Module.train is module_train and gc.callbacks == callbacks
    assert DataLoader.__dict__["_get_iterator"] is start and WorkersIter.__dict__["_shutdown_workers"] is stop
    assert BaseIter.__dict__["__next__"] is next_batch
    block = json.loads(run.bundle)["gpumagic"]["every_step"]
    assert len(block["step_ms"]) == len(block["start_ms"]) == 3


def _epochs(loader, n):
    for _ in range(n):
        for _batch in loader:
            pass


@pytest.mark.parametrize("persistent", [False, True])
def test_a_loader_starting_and_stopping_its_workers_is_seen(persistent):
    """Each epoch of a loader without persistent workers starts two processes (the event runs until
    the first batch is in) and stops them at its end; persistent workers start once and stop with
    their iterator, after the cell. No batch after the first passes through the timer."""
    loader = DataLoader(TensorDataset(torch.arange(32.0)), batch_size=8, num_workers=2, persistent_workers=persistent)
    timer = StepTimer().install()
    try:
        _epochs(loader, 3)
    finally:
        timer.remove()
    loaders = [e for e in timer.events if e[0] == "loader"]
    starts = [e for e in loaders if e[3] == "2 worker(s)"]
    stops = [e for e in loaders if e[3] == "workers stopped"]
    assert len(starts) == (1 if persistent else 3) and len(stops) == (0 if persistent else 3)
    assert all(end > begin for _, begin, end, _ in loaders)
    if not persistent:  # each epoch stops its workers before the next starts its own
        assert [e[3] for e in sorted(loaders, key=lambda e: e[1])] == ["2 worker(s)", "workers stopped"] * 3
    it = iter(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, num_workers=1))  # timer removed: untouched
    assert "_next_data" not in it.__dict__
    del it


class _SlowItems(torch.utils.data.Dataset):
    """Items that take at least 5 ms each (a read)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.tensor(float(i))


def test_each_steps_wait_for_the_loader_is_kept():
    """Four steps, each after a batch of two 5 ms items loaded in the main process: each step
    waited at least 10 ms in next() (a lower bound the sleeps guarantee, whatever the load). A
    cell without a DataLoader writes no waits."""
    timer = StepTimer().install()
    try:
        for _batch in DataLoader(_SlowItems(), batch_size=2):
            timer.step_end()
            timer.resume()
    finally:
        timer.remove()
    waits = timer.section()["wait_ms"]
    assert len(waits) == 4 and all(w >= 10.0 for w in waits)
    plain = StepTimer().install()
    try:
        for _ in range(3):
            plain.step_end()
            plain.resume()
    finally:
        plain.remove()
    assert "wait_ms" not in plain.section()


def test_the_first_batch_wrapper_leaves_the_iterator_free():
    """The wrapper on the iterator's first batch holds it weakly: dropped, it is freed at once (its
    __del__ stops the workers), with no cycle for a garbage collection to find; after the first
    batch the wrapper is gone from the instance."""
    timer = StepTimer().install()
    try:
        loader = DataLoader(TensorDataset(torch.arange(16.0)), batch_size=4, num_workers=1)
        it = iter(loader)
        assert "_next_data" in it.__dict__
        next(it)
        assert "_next_data" not in it.__dict__
        unused = iter(loader)
        ref = weakref.ref(unused)
        gc.disable()
        try:
            del unused
            assert ref() is None  # reference counting freed it
        finally:
            gc.enable()
        del it
    finally:
        timer.remove()


def test_garbage_collections_of_a_millisecond_or_more_are_kept():
    timer = StepTimer()
    timer._on_gc("start", {"generation": 0})
    timer._on_gc("stop", {"generation": 0, "collected": 3})  # microseconds: not kept
    timer._on_gc("start", {"generation": 2})
    time.sleep(0.002)
    timer._on_gc("stop", {"generation": 2, "collected": 10})
    assert [(e[0], e[3]) for e in timer.events] == [("gc", "generation 2, 10 objects collected")]
    timer.install()
    try:
        junk = []
        for _ in range(300_000):  # tracked objects a full collection must walk
            a = []
            a.append(a)
            junk.append(a)
        del junk
        t0 = time.perf_counter_ns()
        gc.collect()
        took = time.perf_counter_ns() - t0
    finally:
        timer.remove()
    if took < 2_000_000:
        pytest.skip("this machine collected in under 2 ms")
    assert any(e[0] == "gc" and "generation 2" in e[3] for e in timer.events[1:])


def test_compilations_are_seen_through_dynamo_callbacks():
    import torch._dynamo

    timer = StepTimer().install()
    try:
        fn = torch.compile(lambda x: x * 2 + 1, backend="eager")
        fn(torch.ones(3))
        timer.step_end()
    finally:
        timer.remove()
        torch._dynamo.reset()
    assert [e[0] for e in timer.events].count("compile") >= 1
    from torch._dynamo.callback import callback_handler

    assert timer._on_compile_start not in callback_handler.start_callbacks


# ---- the outlier rule on blocks built by hand (no clock involved) ---------------------------------

_block = blocks.block


def _outliers(block):
    return es.outliers(es.read(block, []))


def test_outlier_criteria_all_three_must_hold():
    base = [10.0, 10.5, 9.5, 10.2, 9.8, 10.1, 9.9, 10.3, 9.7, 10.0] * 3
    assert _outliers(_block(base)) == []
    big = list(base)
    big[15] = 40.0  # 4× the median, 30 ms longer, far beyond the spread
    assert [o["index"] for o in _outliers(_block(big))] == [15]
    short = list(base)
    short[15] = 25.0  # 2.5×, beyond the spread, but only 15 ms longer: no pause worth a finding
    assert _outliers(_block(short)) == []
    tiny = [0.5] * 30
    tiny[15] = 19.0  # 38×, yet under 20 ms longer
    assert _outliers(_block(tiny)) == []
    spread = [10.0, 60.0] * 15  # steps that vary this much: 70 ms is not beyond their spread
    spread[15] = 70.0
    assert _outliers(_block(spread)) == []


def test_the_first_and_profiled_steps_are_never_flagged():
    steps = [10.0] * 30
    steps[0] = steps[2] = steps[4] = 500.0
    assert _outliers(_block(steps, recorded=(1, 2), profiled=5)) == []
    assert [o["index"] for o in _outliers(_block(steps, recorded=(), profiled=0))] == [2, 4]


def test_the_first_step_after_the_profiler_stopped_is_not_judged():
    """Compiled code pays the profiler's stop in its next call (benchmarks/profiler_aftermath.py):
    that step is the profiler's, not the loop's; the ones after it are judged as before."""
    steps = [10.0] * 30
    steps[5] = 500.0  # the first step after five profiled ones
    assert _outliers(_block(steps, recorded=(1, 2, 3, 4), profiled=5)) == []
    steps[6] = 500.0
    assert [o["index"] for o in _outliers(_block(steps, recorded=(1, 2, 3, 4), profiled=5))] == [6]


def test_several_outliers_do_not_hide_each_other():
    steps = [10.0] * 60
    for i in range(10, 60, 10):  # every 10th step: a periodic save
        steps[i] = 300.0
    assert [o["index"] for o in _outliers(_block(steps))] == [10, 20, 30, 40, 50]


def test_causes_are_what_overlapped_the_step():
    steps = [10.0] * 20
    steps[12] = 200.0
    block = _block(steps)
    start = block["start_ms"][12]
    block["events"] = [{"kind": "gc", "start_ms": start + 5, "dur_ms": 150.0, "detail": "generation 2"},
                       {"kind": "torch.save", "start_ms": start - 50, "dur_ms": 10.0, "detail": ""}]
    (o,) = _outliers(block)
    assert [c.kind for c in o["causes"]] == ["gc"] and o["causes"][0].ms == pytest.approx(150.0)


def _waiting_block(wait_ms, events=()):
    steps = [10.0] * 30
    steps[20] = 250.0
    b = _block(steps, events=events)
    b["wait_ms"] = [1.0] * 30
    b["wait_ms"][20] = wait_ms
    return b


def test_a_step_that_waited_for_its_batch_names_the_loader():
    """Step 20 took 250 ms, 235 of them in the DataLoader's next(): the cause is the wait, and the
    finding suggests measuring the loader's settings."""
    [o] = _outliers(_waiting_block(235.0))
    assert [(c.kind, c.ms) for c in o["causes"]] == [("data", 235.0)]
    r = analyze(with_every_step(_waiting_block(235.0)))
    assert r.metrics.steps.all_wait_ms[20] == 235.0
    f = r.finding("step-outliers")
    assert f.evidence.numbers["explained_by_data"] == 1
    assert "the loop waiting for the DataLoader's next batch" in f.evidence.summary
    [fix] = f.fixes
    assert fix.diagnostic and "gpumagic.tune_dataloader(loader)" in fix.code


def test_a_restart_inside_the_wait_is_the_restarts_not_the_waits():
    """The workers stopping and starting run inside next(): that time is the loader cause's, and
    only the rest of the wait counts as waiting for a batch."""
    start = _block([10.0] * 30)["start_ms"][20]
    restart = {"kind": "loader", "start_ms": start + 1, "dur_ms": 200.0, "detail": "2 worker(s)"}
    [o] = _outliers(_waiting_block(235.0, events=[restart]))
    assert [(c.kind, c.ms) for c in o["causes"]] == [("loader", 200.0), ("data", 35.0)]


def test_waits_that_do_not_fit_the_steps_are_ignored_with_a_note():
    b = _waiting_block(235.0)
    b["wait_ms"] = b["wait_ms"][:10]
    notes: list[str] = []
    block = es.read(b, notes)
    assert block is not None and block["wait_ms"] is None
    assert notes == ["The every_step block's DataLoader waits (wait_ms) are not valid; they were ignored."]


def test_a_malformed_block_is_left_out_with_a_note():
    notes = []
    assert es.read({"step_ms": [1.0, "x"], "start_ms": [0, 1]}, notes) is None and notes
    assert es.read(None, notes) is None


def test_the_rule_in_a_report_from_a_bundle():
    steps = [10.0] * 30
    steps[20] = 250.0
    block = _block(steps)
    block["events"] = [{"kind": "gc", "start_ms": block["start_ms"][20] + 1, "dur_ms": 230.0, "detail": "generation 2"}]
    r = analyze(with_every_step(block))
    assert r.metrics.steps.all_ms == steps and r.metrics.steps.outliers[0].index == 20
    f = r.finding("step-outliers")
    assert f is not None and "gc.freeze()" in "".join(fx.code for fx in f.fixes)
    assert f.est_gain == 0.0  # the outliers are outside the recorded window
    assert r.to_dict()["metrics"]["steps"]["outliers"][0]["causes"][0]["kind"] == "gc"



def _busy_samples(bundle: dict, main_wait_pct: float, other_pct: float) -> dict:
    """The bundle with a 2-core machine record and CPU samples every 2 ms over its 30 ms: this
    process's main thread at 60 % of a core, waiting for one ``main_wait_pct`` of the time, the
    machine ``other_pct`` busier than that."""
    times = list(range(0, 32_000_000, 2_000_000))
    n = len(times)
    bundle["gpumagic"]["machine"] = {"cpu_count": 2, "cpu_affinity": [0, 1], "cpu_quota_cores": None,
                                     "usable_cores": 2.0, "usable_cores_source": "affinity"}
    total = (60.0 + other_pct) / 2
    bundle["gpumagic"]["samples"] = {"cpu": {"t_epoch_ns": times, "total": [total] * n, "per_core": [[total] * 2] * n,
                                             "main": [60.0] * n, "workers": [0.0] * n, "worker_count": [0] * n,
                                             "main_demand": [60.0 + main_wait_pct] * n, "main_wait": [main_wait_pct] * n,
                                             "workers_demand": [0.0] * n, "workers_wait": [0.0] * n}}
    return bundle


@pytest.mark.parametrize(("wait", "other", "said"), [(40.0, 120.0, True), (1.0, 5.0, False)])
def test_unexplained_outliers_on_a_busy_machine_say_the_neighbours_may_be_why(wait, other, said):
    """Nothing seen in the slow step; the recorded steps show the loop's thread waiting for a core
    40 % of the time beside 1.2 cores of other work (a busy machine), or barely (a quiet one)."""
    steps = [10.0] * 30
    steps[20] = 250.0
    r = analyze(_busy_samples(with_every_step(_block(steps)), wait, other))
    f = r.finding("step-outliers")
    assert f is not None
    busy = "While the steps were recorded the machine was busy (other processes used 1.2 of 2 cores and the " \
           "loop's thread waited for a core 40.0 % of the time)"
    assert (busy in f.evidence.summary) is said
    assert ("waited for the neighbours" in f.evidence.summary) is said
    # nothing explains the step, and other processes used the machine: low, and the title says why
    assert (f.severity, f.title.endswith(", on a busy machine")) == (("low", True) if said else ("high", False))


with_every_step = blocks.with_every_step


# ---- energy, from a fake NVML --------------------------------------------------------------------

class CountingNvml(FakeNvml):
    """A fake NVML whose energy counter grows by 25 J per read (250 W at 0.1 s a sample)."""

    def __init__(self, counter=True):
        super().__init__({"GPU-x": [{"gpu_util": 50, "power_w": 250.0}]})
        self.counter = counter
        self.mj = 1_000_000

    def read(self, handle, only=None):
        out = super().read(handle, only)
        if self.counter:
            self.mj += 25_000
            out["energy_mj"] = self.mj
        return out


@pytest.mark.parametrize("counter", [True, False])
def test_energy_from_a_fake_nvml(train, counter):
    fake = CountingNvml(counter)
    session = CaptureSession(CaptureOptions(interval_ms=10), nvml_backend=fake, nvml_devices=[(0, "x")])
    session.start()
    train(8)
    run = session.finish()
    gpu = run.report.metrics.gpu
    assert gpu.energy_source == ("counter" if counter else "power")
    assert gpu.energy_j > 0 and gpu.energy_j_per_step == pytest.approx(gpu.energy_j / run.report.metrics.steps.count,
                                                                       rel=1e-3)
    assert gpu.idle_energy_frac == 1.0  # no kernel ran (CPU torch): every joule was spent idle
    assert gpu.energy_j_per_sample is None  # no batch size told


def test_energy_per_sample_from_the_batch_size_told(train):
    fake = CountingNvml(True)
    session = CaptureSession(CaptureOptions(interval_ms=10, batch_size=4), nvml_backend=fake,
                             nvml_devices=[(0, "x")])
    session.start()
    train(8)
    run = session.finish()
    gpu = run.report.metrics.gpu
    assert gpu.energy_j_per_step > 0
    assert gpu.energy_j_per_sample == pytest.approx(gpu.energy_j_per_step / 4, rel=1e-3)
    assert run.report.to_dict()["metrics"]["gpu"]["energy_j_per_sample"] == gpu.energy_j_per_sample


def test_energy_split_by_busy_time():
    """A built trace: 3 steps of 10 ms, a kernel busy 8 ms of each; power constant at 200 W."""
    from tracebuilder import TraceBuilder

    tb = TraceBuilder()
    for i in range(3):
        tb.step(i + 1, i * 10_000, 10_000)
        tb.kernel("k", i * 10_000 + 1_000, 8_000, launch_ts=i * 10_000 + 500)
    d = tb.to_dict()
    times = list(range(-5_000_000, 40_000_001, 5_000_000))  # every 5 ms, ns, around the 30 ms window
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "machine": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None},
                     "samples": {"gpu": {"t_epoch_ns": times, "device": [0] * len(times),
                                         "power_w": [200.0] * len(times),
                                         "energy_mj": [1e6 + 200.0 * (t + 5_000_000) / 1e6 for t in times]}}}
    d["traceEvents"][0]["ts"] = 0  # the trace origin at 0: samples on the same clock
    gpu = analyze(d).metrics.gpu
    assert gpu.energy_source == "counter"
    assert gpu.energy_j == pytest.approx(200.0 * 0.030, rel=1e-3)  # 200 W over the 30 ms window
    assert gpu.energy_j_per_step == pytest.approx(2.0, rel=1e-3)
    assert gpu.idle_energy_frac == pytest.approx(0.2, abs=1e-3)  # idle 2 ms of every 10
    assert gpu.energy_j_per_sample is None
    d["gpumagic"]["capture"] = {"batch_size": 8}
    report = analyze(d)
    assert report.metrics.gpu.energy_j_per_sample == pytest.approx(2.0 / 8, rel=1e-3)
    shown = "Energy 6 J, 2 J/step, 0.25 J/sample, 20 % idle"  # the header, text and HTML
    assert shown in report.to_text(width=120).replace("\n ", " ") and "0.25 J/sample" in report.to_html()
    d["gpumagic"]["capture"] = {"batch_size": 8, "accumulation_steps": 2}  # 16 samples per optimizer step
    assert analyze(d).metrics.gpu.energy_j_per_sample == pytest.approx(2.0 / 16, rel=1e-3)


def test_a_plain_trace_has_no_energy():
    from tracebuilder import TraceBuilder

    tb = TraceBuilder()
    tb.step(1, 0, 10_000)
    gpu = analyze(tb.to_dict()).metrics.gpu
    assert gpu.energy_j is None and gpu.energy_j_per_step is None and gpu.idle_energy_frac is None
    assert "J/step" not in analyze(tb.to_dict()).to_text()
    assert "energy_j" not in analyze(tb.to_dict()).to_dict()["metrics"]["gpu"] or \
        analyze(tb.to_dict()).to_dict()["metrics"]["gpu"]["energy_j"] is None


def test_an_evaluation_loops_waits_are_the_evaluations():
    """Step 20's 235 ms in next() lie inside a 230 ms evaluation loop (its validation loader): the
    evaluation explains the step, and only 5 ms count as the loop waiting for its batch; the steps
    after the recorded ones are judged the same way."""
    start = _block([10.0] * 30)["start_ms"][20]
    evaluation = {"kind": "eval", "start_ms": start + 1, "dur_ms": 230.0, "detail": ""}
    b = _waiting_block(235.0, events=[evaluation])
    b["step_ms"][21:] = [10.0] * 9
    [o] = _outliers(b)
    assert [(c.kind, c.ms) for c in o["causes"]] == [("eval", 230.0), ("data", 5.0)]
    waited, _total, steps = es.later_waits(es.read(b, []))
    assert waited == pytest.approx(5.0 + 1.0 * (steps - 1))  # 1 ms of waiting in every other judged step


def test_a_prefetching_threads_waits_are_no_steps():
    """A thread that pulls batches into a queue waits in next() beside the steps, blocking none:
    only the cell's own thread's waits are kept."""
    import queue
    import threading

    timer = StepTimer().install()
    try:
        batches: queue.Queue = queue.Queue()
        feeder = threading.Thread(target=lambda: [batches.put(b) for b in DataLoader(_SlowItems(), batch_size=2)])
        feeder.start()
        feeder.join()
        for _ in range(4):
            batches.get()
            timer.step_end()
            timer.resume()
    finally:
        timer.remove()
    assert "wait_ms" not in timer.section()  # the cell's thread never called next()
