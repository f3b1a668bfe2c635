"""``%gputimeit`` / ``%%gputimeit`` through a real IPython shell, and its measurement with fake clocks.

Nothing here depends on how fast the machine is: statements are timed, but the assertions are about
what was measured (samples, warm-up, the device, which clock calls happened in which order) and about
verdicts on scripted clocks, never about a real duration.
"""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpumagic.capture import timeit as ti
from gpumagic.tuning import stats


def run(shell, source):
    with capture_output() as out:
        result = shell.run_cell(source)
    return result, out


# ---- the magic in a real shell ---------------------------------------------------------------------

def test_line_magic_stores_a_result_object_and_keeps_assignments(shell):
    shell.run_cell("calls = []")
    result, out = run(shell, "%gputimeit -o t --max-seconds 0.3 calls.append(1); y = sum(range(100))")
    assert result.success, result.error_in_exec
    t = shell.user_ns["t"]
    assert isinstance(t, ti.TimeitResult) and t.device == "cpu"
    assert shell.user_ns["y"] == 4950  # the statement ran in the user's namespace
    # warm-up call(s), calibration and every sample's calls all ran the statement
    assert len(shell.user_ns["calls"]) >= len(t.warmup_s) + t.number * len(t.samples_s)
    assert len(t.warmup_s) == ti.DEFAULT_WARMUP and t.samples_s and t.median_s > 0
    assert t.median_s == pytest.approx(stats.median_of(t.samples_s))
    if t.ci_s is not None:
        assert t.ci_s[0] <= t.median_s <= t.ci_s[1]
    assert t.stopped in ("tight", "budget", "repetitions")
    assert "per call on cpu" in out.stdout and "warm-up" in out.stdout


def test_cell_magic_times_the_cell_and_prints_the_warm_up_apart(shell):
    result, out = run(shell, "%%gputimeit --max-seconds 0.2 --warmup 3 -o c\nz = [i * i for i in range(50)]\n")
    assert result.success, result.error_in_exec
    c = shell.user_ns["c"]
    assert len(c.warmup_s) == 3 and shell.user_ns["z"][-1] == 49 * 49
    assert out.stdout.count("\n") == 2 and "not in the samples" in out.stdout


def test_compare_interleaves_and_gives_a_verdict_on_the_ratio(shell):
    shell.run_cell("import time\nseq = []")
    result, out = run(shell, '%gputimeit -o r --max-seconds 0.5 --compare "seq.append(\'B\')" seq.append("A")')
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    assert r.comparison is not None and r.comparison.other.statement == "seq.append('B')"
    assert len(r.samples_s) == len(r.comparison.other.samples_s)
    assert r.comparison.verdict in (stats.FASTER, stats.SLOWER, stats.NO_CLEAR_CHANGE)
    assert ("A is" in out.stdout) or ("no clear difference" in out.stdout)
    seq = shell.user_ns["seq"]
    assert seq.count("A") >= len(r.samples_s) and seq.count("B") >= len(r.samples_s)


def test_the_statements_error_propagates_and_bad_options_are_usage_errors(shell):
    result, _ = run(shell, "%gputimeit 1 / 0")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    for line in ("%gputimeit", "%gputimeit -o print 1", "%gputimeit --max-seconds 0 1", "%%gputimeit x\n1\n",
                 '%gputimeit --compare "" 1'):
        result, _ = run(shell, line)
        assert isinstance(result.error_in_exec, UsageError), line
    result, _ = run(shell, "%gputimeit 1 +")  # a syntax error before anything runs
    assert not result.success


def test_unload_removes_the_magic(shell):
    assert "gputimeit" in shell.magics_manager.magics["cell"]
    shell.run_line_magic("unload_ext", "gpumagic")
    try:
        assert "gputimeit" not in shell.magics_manager.magics["line"]
        assert "gputimeit" not in shell.magics_manager.magics["cell"]
    finally:
        shell.run_line_magic("load_ext", "gpumagic")


# ---- the measurement, with scripted clocks -----------------------------------------------------------

class ScriptedClock:
    """Returns each side's scripted per-repetition times in turn (by the function's identity)."""

    device = "scripted"

    def __init__(self, times):
        self.times = {k: list(v) for k, v in times.items()}
        self.calls = []

    def time(self, fn, number):
        self.calls.append(fn.__name__)
        seq = self.times[fn.__name__]
        return seq.pop(0) if len(seq) > 1 else seq[0]

    def settle(self):
        pass


def _fn(name):
    def f():
        pass
    f.__name__ = name
    return f


def test_repetitions_stop_when_the_interval_is_tight():
    clock = ScriptedClock({"a": [0.002]})  # every repetition identical: tight at the first check
    r = ti.measure("a", _fn("a"), clock=clock, warmup=0, max_seconds=60)
    assert r.stopped == "tight" and len(r.samples_s) == stats.MIN_STEPS
    assert r.median_s == pytest.approx(0.002) and r.ci_s == (pytest.approx(0.002), pytest.approx(0.002))


def test_noisy_repetitions_run_until_the_budget():
    import itertools

    noisy = list(itertools.islice(itertools.cycle([0.001, 0.004, 0.002, 0.008]), 100_000))
    r = ti.measure("a", _fn("a"), clock=ScriptedClock({"a": noisy}), warmup=0, max_seconds=0.05)
    assert r.stopped in ("budget", "repetitions") and not stats.is_tight(r.median_s, r.ci_s)


def test_calibration_runs_short_statements_many_times_per_repetition():
    class PerCall(ScriptedClock):
        def time(self, fn, number):
            return 2e-6 * number  # 2 µs a call

    r = ti.measure("a", _fn("a"), clock=PerCall({}), warmup=0, max_seconds=60)
    assert r.number == 1000 and r.median_s == pytest.approx(2e-6)


def test_compare_alternates_the_order_and_finds_the_faster_side():
    clock = ScriptedClock({"a": [0.001], "b": [0.0015]})
    r = ti.measure("a", _fn("a"), other=("b", _fn("b")), clock=clock, warmup=0, max_seconds=60)
    c = r.comparison
    assert c.verdict == stats.FASTER and c.speedup == pytest.approx(1.5)
    assert c.sentence().startswith("A is 1.5") and "faster than B" in c.sentence()
    rounds = clock.calls[2 * ti.CALIBRATION_TRIES:]  # after the calibration repetitions of each
    assert rounds[:4] == ["a", "b", "b", "a"]  # AB, then BA: a drift falls on both alike


def test_compare_within_the_noise_is_no_clear_difference():
    clock = ScriptedClock({"a": [0.001, 0.00101] * 50, "b": [0.00101, 0.001] * 50})
    r = ti.measure("a", _fn("a"), other=("b", _fn("b")), clock=clock, warmup=0, max_seconds=60)
    assert r.comparison.verdict == stats.NO_CLEAR_CHANGE
    assert r.comparison.sentence().startswith("no clear difference")


class FakeEvent:
    def __init__(self, cuda):
        self.cuda, self.t = cuda, None

    def record(self):  # the event completes once the work queued before it has run
        self.cuda.log.append("record")
        self.t = self.cuda.now + self.cuda.queued

    def elapsed_time(self, other):
        return (other.t - self.t) * 1000.0  # ms, as torch's


class FakeCuda:
    """torch.cuda as far as the CUDA clock uses it: a GPU whose queued work takes 5 ms per call,
    which only a synchronise waits for."""

    def __init__(self):
        self.log, self.now, self.queued = [], 0.0, 0.0

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def current_device(self):
        return 0

    def Event(self, enable_timing=False):
        assert enable_timing
        return FakeEvent(self)

    def synchronize(self):
        self.log.append("sync")
        self.now += self.queued
        self.queued = 0.0

    def launch(self):
        self.log.append("launch")
        self.queued += 0.005


def test_the_cuda_clock_synchronises_around_events_and_times_the_gpu_work():
    cuda = FakeCuda()

    class FakeTorch:
        pass

    FakeTorch.cuda = cuda
    clock = ti.choose_clock("auto", FakeTorch)
    assert isinstance(clock, ti.CudaEventClock) and clock.device == "cuda:0"
    cuda.log.clear()
    elapsed = clock.time(cuda.launch, 1)
    # sync first (earlier work is not this repetition's), events around the call, sync after
    assert cuda.log == ["sync", "record", "launch", "record", "sync"]
    assert elapsed == pytest.approx(0.005)  # the GPU's 5 ms, though the call itself returned at once
    assert clock.time(cuda.launch, 3) == pytest.approx(0.015)
    cuda.queued = 1.0  # work left over from before the repetition is not counted
    assert clock.time(cuda.launch, 1) == pytest.approx(0.005)


def test_auto_uses_the_wall_clock_without_cuda_and_cuda_is_refused_without_it():
    class NoCuda:
        class cuda:
            @staticmethod
            def is_available():
                return False

            @staticmethod
            def is_initialized():
                return False

    assert isinstance(ti.choose_clock("auto", NoCuda), ti.WallClock)
    with pytest.raises(ValueError, match="no CUDA device"):
        ti.choose_clock("cuda", NoCuda)
    with pytest.raises(ValueError):
        ti.choose_clock("tpu", NoCuda)


def test_format_seconds():
    assert ti.fmt_seconds(0.00123) == "1.23 ms" and ti.fmt_seconds(8.45e-7) == "845 ns"
    assert ti.fmt_seconds(2.5) == "2.5 s" and ti.fmt_seconds(None) == "—"
