"""The live monitor: its sampler (fake NVML, real /proc), its views, ``%gpumonitor`` in an IPython shell."""

from __future__ import annotations

import threading
import time

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpumagic.capture import monitor as capture_monitor
from gpumagic.capture.monitor import MonitorSampler, profiled_window
from gpumagic.capture.nvml import FakeNvml
from gpumagic.render import monitor as view
from gpumagic.shells import monitor as shell_monitor

GIB = 2**30
READINGS = [
    {"gpu_util": 10, "mem_util": 3, "mem_used_bytes": 1 * GIB, "mem_total_bytes": 80 * GIB, "power_w": 90.0, "sm_clock_mhz": 1400},
    {"gpu_util": 95, "mem_util": 40, "mem_used_bytes": 9 * GIB, "mem_total_bytes": 80 * GIB, "power_w": 650.0, "sm_clock_mhz": 1980},
]


def wait_for(predicate, timeout_s=10.0):
    """Poll until ``predicate()`` holds (the sampler runs on its own clock); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the monitor"
        time.sleep(0.01)


@pytest.fixture
def sampler():
    started = []

    def make(**kwargs):
        kwargs.setdefault("nvml", FakeNvml({"GPU-a": READINGS, "GPU-b": READINGS[::-1]}))
        s = MonitorSampler(kwargs.pop("interval_s", 0.02), **kwargs)
        started.append(s)
        s.start()
        return s

    yield make
    for s in started:
        s.stop()


def test_samples_every_gpu_the_cpu_and_the_process(sampler):
    s = sampler()
    wait_for(lambda: len(s.rows) >= 4)
    s.stop()
    rows = list(s.rows)
    assert [g["device"] for g in rows[0]["gpus"]] == [0, 1]
    assert {r["gpus"][0]["gpu_util"] for r in rows} == {10, 95}  # the values change from sample to sample
    assert set(rows[0]["gpus"][0]) == {"device", "gpu_util", "mem_used_bytes", "mem_total_bytes", "power_w", "sm_clock_mhz"}
    assert all(r["rss_bytes"] > 10 * 2**20 for r in rows)
    assert all(0 <= r["total"] <= 100 and r["main"] >= 0 and len(r["per_core"]) >= 1 for r in rows[1:])
    assert "total" not in rows[0]  # CPU percentages need two readings
    assert not s.running and capture_monitor.active() is None


def test_the_ring_buffer_keeps_only_the_last_minutes(sampler):
    s = sampler(interval_s=0.01, history_s=0.05)
    assert s.rows.maxlen == 5
    wait_for(lambda: s.rows[-1]["t_epoch_ns"] - s.rows[0]["t_epoch_ns"] > 0 and len(s.rows) == 5 and s.rows[0] is not None)
    first = s.rows[0]["t_epoch_ns"]
    wait_for(lambda: s.rows[0]["t_epoch_ns"] > first)
    assert len(s.rows) == 5


def test_without_nvml_it_says_so_and_samples_the_host(sampler):
    s = sampler(nvml=FakeNvml({}, init_error="NVML Shared Library Not Found"))
    wait_for(lambda: len(s.rows) >= 2)
    assert s.notes == ["No GPU samples: NVML Shared Library Not Found."]
    assert s.rows[-1]["gpus"] == [] and "total" in s.rows[-1]
    assert [x["name"] for x in s.snapshot()["series"]] == ["CPU (all cores)", "CPU (this process)",
                                                           "CPU (DataLoader workers)", "memory (resident)"]


def test_a_failing_gpu_read_drops_the_gpu_only(sampler):
    s = sampler(nvml=FakeNvml({"GPU-a": READINGS}, fail_after=3))
    wait_for(lambda: any(n.startswith("GPU sampling stopped") for n in s.notes) and len(s.rows) >= 6)
    assert s.running and s.error is None
    assert s.rows[-1]["gpus"] == [] and s.rows[-1]["rss_bytes"] > 0


def test_a_failing_view_does_not_stop_sampling(sampler):
    def broken(_):
        raise RuntimeError("comm closed")

    s = sampler(on_sample=broken)
    n = len(s.rows)
    wait_for(lambda: len(s.rows) >= n + 3)
    assert s.notes == ["The monitor's view stopped updating: RuntimeError: comm closed."] and s.on_sample is None


def test_profiled_windows_are_marked(sampler):
    s = sampler()
    with profiled_window("baseline"):
        wait_for(lambda: s.rows[-1]["profiling"] == "baseline")
    wait_for(lambda: s.rows[-1]["profiling"] is None)
    (start, end, label), = s.snapshot()["marks"]
    assert label == "baseline" and start < end <= 0
    s.stop()
    with profiled_window("nothing"):  # no monitor running: nothing to mark, nothing fails
        pass
    assert len(s.marks) == 1


def test_snapshot_series_and_the_views(sampler):
    s = sampler()
    wait_for(lambda: len(s.rows) >= 3)
    s.mark_start("lr=1e-3")
    s.mark_end()
    s.stop()
    snap = s.snapshot()
    names = [(x["group"], x["name"]) for x in snap["series"]]
    assert names[:4] == [("GPU 0", "utilisation"), ("GPU 0", "memory used"), ("GPU 0", "power"), ("GPU 0", "SM clock")]
    assert names[-1] == ("process", "memory (resident)")
    last = s.rows[-1]["gpus"][0]["gpu_util"]
    line = view.summary(snap)
    assert line.startswith(f"gpumagic monitor: GPU 0 {last} % · ") and "/80.0 GiB" in line and " | CPU " in line
    html = view.render_html(snap)
    assert html.count("<svg") == len(snap["series"]) + 1  # a sparkline per series + the per-core bars
    assert "<title>lr=1e-3</title>" in html and "(stopped;" in html


def test_a_sparkline_breaks_where_a_value_is_missing_and_keeps_spikes():
    columns = view.pixel_columns([-4, -3, -2, -1, 0], span_s=4, width=9)
    assert columns == [0, 2, 4, 6, 8]
    assert view.pixel_columns([-4, -3, -2, -1, 0], span_s=4, width=5, step=1) == [0, 1, 2, 3, 4]
    svg = view.sparkline_svg(columns, [1, None, 2, 3, 3], vmax=None)
    assert svg.count("<polyline") == 2
    assert view.sparkline_svg([], [], vmax=100).count("<polyline") == 0
    # three samples in one pixel column: drawn as the highest
    svg = view.sparkline_svg([7, 7, 7, 8], [10, 100, 20, 0], vmax=100)
    assert 'points="7,1 8,27"' in svg


def test_monitor_rejects_a_bad_interval():
    for bad in (0, 10, 10**6, 1.5, True):
        with pytest.raises(ValueError, match="interval_ms must be a whole number of milliseconds from 50 to 60000"):
            shell_monitor.monitor(bad)
    assert shell_monitor.current() is None


@pytest.fixture
def stop_monitor():
    yield
    shell_monitor.stop()


def test_gpumonitor_in_a_terminal_shell_prints_a_summary_and_stops(shell, stop_monitor):
    with capture_output() as out:
        shell.run_line_magic("gpumonitor", "--interval-ms 50")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("gpumagic: no widget frontend here") and lines[1].startswith("gpumagic monitor: ")
    mon = shell_monitor.current()
    assert mon.running and mon.interval_ms == 50
    assert [t.name for t in threading.enumerate() if t.name == "gpumagic-monitor"] == ["gpumagic-monitor"]
    with capture_output() as out:
        shell.run_line_magic("gpumonitor", "")  # again: the latest values, same monitor
    assert shell_monitor.current() is mon and out.stdout.splitlines()[1].startswith("gpumagic monitor: ")
    shell.run_line_magic("gpumonitor", "--interval-ms 100")  # another period: a new monitor, the old one stopped
    assert not mon.running and shell_monitor.current().interval_ms == 100
    shell.run_line_magic("gpumonitor", "stop")
    assert shell_monitor.current() is None
    assert [t.name for t in threading.enumerate() if t.name.startswith("gpumagic-")] == []
    with capture_output() as out:
        shell.run_line_magic("gpumonitor", "stop")
    assert out.stdout == "gpumagic: no monitor is running\n"


@pytest.mark.parametrize("line, message", [
    ("--interval-ms 5", "--interval-ms needs a whole number of milliseconds from 50 to 60000, not '5'"),
    ("--interval-ms soon", "not 'soon'"),
    ("start now", "unexpected 'start now'; usage: %gpumonitor [--interval-ms MS] | %gpumonitor stop"),
])
def test_gpumonitor_usage_errors(shell, line, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]").replace("|", r"\|")):
        shell.run_line_magic("gpumonitor", line)
    assert shell_monitor.current() is None


def test_a_profiled_cell_is_marked_on_the_monitor(shell, stop_monitor):
    with capture_output():
        shell.run_line_magic("gpumonitor", "--interval-ms 50")
    mon = shell_monitor.current()
    with capture_output():
        result = shell.run_cell("%%gpuprofile --quiet --no-nvml --label marked\nimport time\ntime.sleep(0.2)\n")
    assert result.success
    marks = mon.snapshot()["marks"]
    assert [m[2] for m in marks] == ["marked"] and 0.15 < marks[0][1] - marks[0][0] < 1.0
    with capture_output():
        shell.run_cell("%%gpuprofile --quiet --no-nvml\nraise ValueError('x')\n")
    assert len(mon.snapshot()["marks"]) == 2 and mon.snapshot()["marks"][1][1] is not None  # closed after an error too


def _host_snapshot(total_pct: float, own_pct: float, cores: int = 2) -> dict:
    n = 12
    return {"span_s": 60.0, "interval_s": 0.5, "t_s": [-0.5 * (n - 1 - i) for i in range(n)], "marks": [], "notes": [],
            "running": True, "per_core": [total_pct] * cores,
            "series": [{"group": "host", "name": "CPU (all cores)", "unit": "%", "values": [total_pct] * n, "max": 100},
                       {"group": "process", "name": "CPU (this process)", "unit": "% of a core",
                        "values": [own_pct] * n, "max": None},
                       {"group": "process", "name": "CPU (DataLoader workers)", "unit": "% of a core",
                        "values": [0.0] * n, "max": None}]}


@pytest.mark.parametrize(("total_pct", "own_pct", "shown"), [(100.0, 40.0, True), (60.0, 100.0, False)])
def test_the_monitor_says_when_other_processes_share_the_machine(total_pct, own_pct, shown):
    """2 cores all busy while this process uses 0.4 of one: others use 1.6 — said in the header;
    the process itself filling 1 of 1.2 busy cores is not a shared machine."""
    html = view.render_html(_host_snapshot(total_pct, own_pct))
    assert ("shared machine: other processes use 1.6 of 2 cores" in html) is shown
    assert ("shared machine" in html) is shown
