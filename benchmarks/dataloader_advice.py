"""Does the data-loader advice hold when applied as written? Promised against measured gain.

Three scenarios on this machine's CPU (issue 21):

1. ``io``: an I/O-like loader (each item sleeps 3 ms), nothing else running;
2. ``cpu-busy-cores``: a CPU-bound loader (numpy work per item) beside a training step whose
   intra-op threads use every core;
3. ``io-neighbours``: the I/O-like loader beside CPU-bound neighbours (one spinning process per
   core, started and stopped here);
4. ``io-workers``: the I/O-like loader already in two workers (one per core here), which a short
   window once read as "the workers running already take what the cores allow: more would not
   help" while they slept; the fix's count is timed against the two.

Each scenario profiles the loop with ``num_workers=0``, reads the finding that advises on the loader
(``dataloader-bound`` or ``host-cpu-saturated``) — its estimated gain, and the fix's
``num_workers`` and ``torch.set_num_threads`` — then times the plain loop (no profiler) before and
after the fix, interleaved (before, after, before, after), and prints the promised gain, the
measured one (1 − mean step after ÷ before: batches from workers arrive in bursts, so the mean is
the rate) and whether they agree within 0.15 of step time.
Numbers depend on the machine and on what else runs on it: this prints, it asserts nothing.

    python benchmarks/dataloader_advice.py [--rounds 3] [--steps 12]
    python benchmarks/dataloader_advice.py --record tests/data   # the io-workers profile the tests keep
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import gpumagic

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
TOLERANCE = 0.15
SPIN = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end:\n    pass\n"


class SleepyItems(torch.utils.data.Dataset):
    """An I/O-like dataset: each item waits without using the CPU."""

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.full((64,), float(i % 7)), torch.tensor(0.0)


class NumpyItems(torch.utils.data.Dataset):
    """A CPU-bound dataset: a few ms of numpy per item."""

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        a = np.random.default_rng(i).random((96, 96))
        for _ in range(12):
            a = np.sqrt(a * a + 1.0)
        return torch.from_numpy(a[:, 0].astype(np.float32)[:64].copy()), torch.tensor(0.0)


def _model(width: int):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))


def train(dataset, steps: int, workers: int, width: int, batch_size: int = 16) -> list[float]:
    """Step times (s) of a plain training loop, after the batches the workers prefetched while
    starting (``prefetch_factor`` 2 per worker) are used up: the steady state."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                                         persistent_workers=workers > 0)
    model = _model(width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times, last = [], time.perf_counter()
    for step, (x, y) in enumerate(loader):
        loss = (model(x).squeeze(1) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        now = time.perf_counter()
        skip = 2 + 2 * workers
        if step >= skip:
            times.append(now - last)
        last = now
        if step == steps + skip:
            break
    return times


def advice(dataset, width: int, workers: int = 0, save: str | None = None) -> tuple[float | None, int, int | None, str]:
    """(promised gain, num_workers, set_num_threads, finding id) from a profile of the loop with
    ``workers`` (the batches they prefetched while starting used up before the recorded steps)."""
    with gpumagic.profile(skip=2 + 2 * workers, steps=8, interval_ms=20, display=False, save=save) as run:
        train(dataset, 12 + 2 * workers, workers, width)
    for fid in ("host-cpu-saturated", "dataloader-bound"):
        f = run.report.finding(fid)
        if f is None:
            continue
        n = f.evidence.numbers
        code = " ".join(fx.code for fx in f.fixes)
        workers = n.get("suggested_num_workers")
        if workers is None and "num_workers=" in code:
            workers = int(code.split("num_workers=")[1].split(",")[0].split(")")[0].split()[0])
        return f.est_gain, int(workers or 0), n.get("suggested_num_threads"), fid
    return None, 0, None, "none"


def scenario(name: str, dataset, width: int, threads: int, neighbours: int, rounds: int, steps: int,
             running: int = 0) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(neighbours)]
    try:
        time.sleep(0.5 if procs else 0)
        torch.set_num_threads(threads)
        promised, workers, fix_threads, fid = advice(dataset, width, running)
        if not workers:  # the finding says workers cannot help: the plain fix (one worker) must gain ≤ 0.15
            promised, workers = 0.0, running + 1
        before, after = [], []
        for _ in range(rounds):  # interleaved
            torch.set_num_threads(threads)
            before += train(dataset, steps, running, width)
            torch.set_num_threads(fix_threads or threads)
            after += train(dataset, steps, workers, width)
        gain = 1 - statistics.fmean(after) / statistics.fmean(before)  # mean: batches from workers come in bursts
        ok = promised is not None and abs(gain - promised) <= TOLERANCE
        fix = f"num_workers={workers}" + (f", set_num_threads({fix_threads})" if fix_threads else "")
        print(f"{name:16} {fid:20} {fix:34} promised {promised:5.2f}  measured {gain:5.2f}  "
              f"{'holds' if ok else 'DOES NOT HOLD'} (±{TOLERANCE})  "
              f"[mean step {statistics.fmean(before) * 1e3:.1f} → {statistics.fmean(after) * 1e3:.1f} ms]")
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        torch.set_num_threads(CORES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--record", metavar="DIR", help="record the io-workers profile tests/data keeps into DIR instead")
    args = parser.parse_args()
    if args.record:  # three steps of the io-workers loop: a short window, few CPU samples
        torch.set_num_threads(1)
        with gpumagic.profile(steps=3, display=False, save=os.path.join(args.record, "cpu_io_loader_workers.json.gz")):
            train(SleepyItems(), 12, CORES, 64)
        print("recorded cpu_io_loader_workers")
        return
    print(f"{CORES} usable cores; torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
    scenario("io", SleepyItems(), 64, 1, 0, args.rounds, args.steps)
    scenario("cpu-busy-cores", NumpyItems(), 2048, CORES, 0, args.rounds, args.steps)
    scenario("io-neighbours", SleepyItems(), 64, 1, CORES, args.rounds, args.steps)
    scenario("io-workers", SleepyItems(), 64, 1, 0, args.rounds, args.steps, running=CORES)


if __name__ == "__main__":
    main()
