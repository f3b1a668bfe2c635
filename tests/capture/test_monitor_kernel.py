"""``%gpumonitor`` in a real Jupyter kernel: it samples while other cells run, and leaves nothing behind."""

from __future__ import annotations

import ast

import pytest
from kernelclient import execute, running_kernel, value

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")
pytest.importorskip("ipywidgets")

pytestmark = pytest.mark.slow

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
THREADS = "sorted(t.name for t in __import__('threading').enumerate() if t.name.startswith('gpumagic-'))"
#: Runs a cell for ``seconds`` (busy: hashing on the CPU; else sleeping), then returns what the
#: monitor sampled meanwhile: (samples, highest CPU of this process, widget redrawn, still running).
#: The busy cell works as training code does, in native calls that release the GIL (hashlib does
#: for large buffers, as torch kernels do): a pure-Python spin would hold the GIL and slow every
#: other thread's file reads, the monitor's included, to one per switch interval (5 ms).
WATCH = """
import hashlib
import time
block = bytes(1 << 20)
from gpumagic.shells import monitor as M
mon = M.current(); html0 = mon._widgets[0].root.value
t0 = time.time_ns()
while time.time_ns() - t0 < {seconds} * 1e9:
    {body}
t1 = time.time_ns()
rows = [r for r in mon.sampler.rows if t0 < r["t_epoch_ns"] < t1]
(len(rows), max(r.get("main", 0) for r in rows), mon._widgets[0].root.value != html0, mon.running)
"""


def test_the_monitor_samples_while_another_cell_runs_and_stops(tmp_path):
    at_exit = tmp_path / "threads-at-exit.txt"
    with running_kernel(graceful=True) as kc:
        # registered before the monitor's own handler, so it runs after it (atexit is last-in, first-out)
        assert execute(kc, f"import atexit\natexit.register(lambda: open({str(at_exit)!r}, 'w').write(repr({THREADS})))")[0] == "ok"
        assert execute(kc, "%load_ext gpumagic")[0] == "ok"
        status, outputs = execute(kc, "%gpumonitor --interval-ms 100")
        assert status == "ok"
        (kind, content), = outputs
        assert kind == "display_data" and WIDGET_MIME in content["data"]
        assert content["data"]["text/plain"].startswith("gpumagic monitor: ") and "<svg" in content["data"]["text/html"]

        busy = ast.literal_eval(value(kc, WATCH.format(seconds=1.5, body="hashlib.sha256(block).digest()")))
        idle = ast.literal_eval(value(kc, WATCH.format(seconds=1.5, body="time.sleep(0.05)")))
        assert busy[0] >= 5 and idle[0] >= 5  # sampled during the cells: the kernel was never waiting for it
        assert busy[2] and idle[2] and busy[3]  # the widget was redrawn meanwhile
        assert busy[1] > idle[1] and busy[1] >= 30  # the values follow what the kernel does

        assert execute(kc, "%gpumonitor stop")[0] == "ok"
        assert ast.literal_eval(value(kc, THREADS)) == []
        assert value(kc, "M.current() is None and not mon.running") == "True"

        assert execute(kc, "%gpumonitor --interval-ms 100")[0] == "ok"
        assert ast.literal_eval(value(kc, THREADS)) == ["gpumagic-monitor"]
    # the kernel was shut down through a shutdown request while the monitor ran
    assert at_exit.read_text() == "[]"
