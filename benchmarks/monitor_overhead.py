"""What the live monitor (``%gpumonitor``) costs: CPU time of its thread per second, as % of one core.

The target (issue 15): under 1 % of a core at the default period (1,000 ms). Each configuration
runs the real monitor (``gpumagic.shells.monitor.Monitor``: the sampler thread, NVML when there is
a driver, ``/proc``, and, with a widget, the sparkline HTML re-rendered after every sample) for
``--seconds``, with the ring buffer already full (five minutes of samples: the most expensive
redraw), and measures:

- ``thread CPU``: CPU time spent inside the sampler thread's samples, with ``time.thread_time``
  (the thread's own CPU clock, CLOCK_THREAD_CPUTIME_ID), divided by the wall time;
- ``process CPU``: the whole process's CPU time over the same wall time (``time.process_time``),
  beside the same measure for an idle stretch of equal length, so that what the interpreter
  costs anyway shows.

``--fake-gpus N`` adds N scripted NVML devices (``FakeNvml``) when the machine has no driver, so the GPU
series are drawn too (their reads are cheaper than real driver calls). Run:
``python benchmarks/monitor_overhead.py [--seconds 20] [--fake-gpus 8]``.
"""

from __future__ import annotations

import argparse
import itertools
import time

from gpumagic.capture.nvml import FakeNvml, NvmlUnavailable, PynvmlBackend
from gpumagic.shells.monitor import Monitor

GIB = 2**30


def nvml_backend(fake_gpus: int):
    """The real NVML when it initialises, else ``fake_gpus`` scripted devices (or none)."""
    real = PynvmlBackend()
    try:
        real.init()
        real.shutdown()
        return real, "NVML (real driver)"
    except NvmlUnavailable:
        pass
    if not fake_gpus:
        return FakeNvml({}, init_error="no NVML driver on this machine"), "no GPUs"
    readings = [{"gpu_util": u, "mem_used_bytes": m * GIB, "mem_total_bytes": 80 * GIB, "power_w": 100.0 + 5 * u,
                 "sm_clock_mhz": 1400 + 5 * u} for u, m in ((10, 3), (95, 70), (50, 40))]
    return FakeNvml({f"GPU-{i}": readings for i in range(fake_gpus)}), f"{fake_gpus} scripted GPUs"


def fill(mon: Monitor) -> None:
    """Fill the ring buffer with copies of the latest row, one period apart (five minutes of samples)."""
    sampler = mon.sampler
    last = sampler.latest()
    step_ns = int(sampler.interval_s * 1e9)
    with sampler._lock:
        sampler.rows.clear()
        for i in range(sampler.rows.maxlen, 0, -1):
            sampler.rows.append(dict(last, t_epoch_ns=last["t_epoch_ns"] - i * step_ns))


def measure(interval_ms: int, widget: bool, seconds: float, fake_gpus: int) -> dict:
    backend, gpus = nvml_backend(fake_gpus)
    mon = Monitor(interval_ms)
    mon.sampler._nvml = backend
    spent = [0.0, 0]
    original = mon.sampler._sample

    def timed() -> None:
        t0 = time.thread_time()
        original()
        spent[0] += time.thread_time() - t0
        spent[1] += 1

    mon.sampler._sample = timed
    mon.start()
    time.sleep(2 * interval_ms / 1000)  # two samples: CPU percentages need a pair
    fill(mon)
    if widget:
        mon.widget()
    spent[:] = [0.0, 0]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    done = spent[:]
    mon.stop()
    return {"gpus": gpus, "samples": done[1], "thread_pct": 100 * done[0] / wall, "process_pct": 100 * cpu / wall,
            "per_sample_ms": 1000 * done[0] / max(1, done[1])}


def idle(seconds: float) -> float:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    return 100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="measured time per configuration (default 20)")
    ap.add_argument("--fake-gpus", type=int, default=8, help="scripted GPUs when there is no NVML driver (default 8)")
    args = ap.parse_args()
    baseline = idle(args.seconds)
    print(f"idle process, no monitor: {baseline:.3f} % of a core ({args.seconds:g} s)")
    print(f"{'period':>8}  {'widget':>6}  {'GPUs':<22}{'samples':>8}  {'ms/sample':>9}  {'thread CPU':>10}  {'process CPU':>11}  target")
    for interval_ms, widget in itertools.product((1000, 100), (True, False)):
        r = measure(interval_ms, widget, args.seconds, args.fake_gpus)
        target = ("< 1 %: " + ("met" if r["thread_pct"] < 1 else "MISSED")) if interval_ms == 1000 else ""
        print(f"{interval_ms:>6}ms  {'yes' if widget else 'no':>6}  {r['gpus']:<22}{r['samples']:>8}  {r['per_sample_ms']:>9.2f}  "
              f"{r['thread_pct']:>8.3f} %  {r['process_pct']:>9.3f} %  {target}")


if __name__ == "__main__":
    main()
