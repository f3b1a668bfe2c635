"""Record the host CPU samples of a loading thread beside busy neighbours, for
tests/test_loader_demand.py (issue 21: is a loader that sleeps, then waits for a core, CPU-bound?).

Two scenarios, each on the main thread (``num_workers=0``) while two spawned neighbour processes per
usable core spin: ``sleeping`` — each item sleeps 10 ms (I/O-like), then does 0.1 ms of
arithmetic; ``cpu`` — each item computes without sleeping. The sampler (``capture.cpu``, reading
``/proc`` every 100 ms) writes the rows gpumagic records in a bundle. Run::

    python benchmarks/record_loader_samples.py tests/data/loader_samples_busy_neighbours.json

Numbers depend on the machine and its load; the test asserts only what the classification must
say of them (the sleeping loader wanted little CPU; the computing one wanted a core).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time

from gpumagic.capture.cpu import ProcReader, cpu_row

SECONDS = 2.0
PERIOD_S = 0.1


def _spin(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(10_000):
            x += 1


def _work(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    x = 0
    while time.perf_counter() < end:
        x += 1


def _scenario(kind: str) -> list[dict]:
    reader = ProcReader()
    hz = reader.ticks_per_second()
    rows, last = [], (time.time_ns(), reader.read())
    t_end = time.perf_counter() + SECONDS
    next_sample = time.perf_counter() + PERIOD_S
    while time.perf_counter() < t_end:
        if kind == "sleeping":
            time.sleep(0.010)
            _work(0.1)
        else:
            _work(2.0)
        if time.perf_counter() >= next_sample:
            now = (time.time_ns(), reader.read())
            rows.append(cpu_row(last[1], now[1], (now[0] - last[0]) / 1e9, hz, now[0]))
            last, next_sample = now, next_sample + PERIOD_S
    return rows


def main(out: str) -> None:
    cores = len(os.sched_getaffinity(0))
    stop = mp.Event()
    neighbours = [mp.Process(target=_spin, args=(stop,)) for _ in range(2 * cores)]
    for p in neighbours:
        p.start()
    try:
        time.sleep(0.3)
        data = {"usable_cores": cores, "neighbours": len(neighbours), "period_s": PERIOD_S,
                "scenarios": {k: _scenario(k) for k in ("sleeping", "cpu")}}
    finally:
        stop.set()
        for p in neighbours:
            p.join()
    with open(out, "x") as fh:  # never overwrite a recording
        json.dump(data, fh, indent=None, separators=(",", ":"))
    for k, rows in data["scenarios"].items():
        mean = {c: sum(r[c] for r in rows) / len(rows) for c in ("main", "main_demand", "main_wait", "total")}
        print(k, {c: round(v, 1) for c, v in mean.items()})


if __name__ == "__main__":
    main(sys.argv[1])
