"""Does ``host-cores-idle`` hold? A CPU training loop on one intra-op thread against the usable cores.

An MLP (two 1024×1024 linear layers, a batch of 512, SGD) is profiled with
``torch.set_num_threads(1)`` by ``gpumagic.profile()`` (10 steps); the finding's upper bound and
suggested thread count are read, then the plain loop (no profiler) is timed with one thread and
with the suggested count, alternated round by round, and the measured saving (1 − median step
with the threads ÷ with one) is printed beside the bound, which it must not exceed.
Numbers depend on the machine and on what else runs on it: this prints, it asserts nothing.
``--oversubscribe N`` runs the loop on ``N`` intra-op threads instead of one (more than the usable
cores, for ``threads-oversubscribed``) and times it against the finding's suggested count.
``--loader`` runs a small CNN fed by a DataLoader whose dataset makes each sample with a few
small operators (one intra-op thread, no workers: ``host-cores-idle`` and ``dataloader-bound``
both fire, and both count on the one idle core), and times one and two threads, each with no
worker and with one, alternated round by round: whether a worker still pays once the threads
take the idle core.
``--record DIR`` instead records the bundles tests/data keeps (``cpu_threads1.json.gz``: one
thread; ``cpu_threads2.json.gz``: the default count; ``cpu_threads16.json.gz``: 16 threads;
``cpu_threads1_loader.json.gz``: the ``--loader`` loop on one thread, no workers) and exits.

    python benchmarks/threads_speedup.py [--rounds 5] [--steps 20] [--oversubscribe N] [--loader] [--record DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from steptime import alternated, medians, profile_steps

import gpumagic


def _loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(512, 1024)

    def step():
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


class _Samples(torch.utils.data.Dataset):
    """Each sample made with a few small operators (below ATen's parallel grain: one thread each)."""

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        x = torch.randn(3, 32, 32)
        for _ in range(3):
            x = torch.nn.functional.avg_pool2d(x.unsqueeze(0), 3, 1, 1)[0]
        return x, i % 10


def _loader_loop(threads: int, workers: int, batch: int = 64):
    """A small CNN's SGD step on the next batch from a DataLoader of :class:`_Samples`, on
    ``threads`` intra-op threads (set at each call: the loops alternate), after three warm-up
    steps."""
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    batches = iter(torch.utils.data.DataLoader(_Samples(), batch_size=batch, num_workers=workers,
                                               persistent_workers=workers > 0))

    def step() -> None:
        torch.set_num_threads(threads)
        x, y = next(batches)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for _ in range(3):
        step()
    return step


def loader_case(rounds: int, steps: int, path: str | None = None) -> None:
    """``--loader``: the findings on one thread without workers, then the four settings timed."""
    # enough CPU samples (every 100 ms): eight steps recorded
    r = profile_steps(_loader_loop(1, 0), 8, path, warm=0)
    if path:
        return
    for rule in ("host-cores-idle", "dataloader-bound"):
        f = r.finding(rule)
        print(f"{rule}: " + (f"up to {f.est_gain:.3f}; first fix {f.fixes[0].description[:70]!r}" if f else "silent"))
    loops = {f"{t} thread(s), {w} worker(s)": _loader_loop(t, w) for t in (1, 2) for w in (0, 1)}
    med, line = medians(alternated(loops, rounds, steps))
    print(line)
    one, two = "1 thread(s), ", "2 thread(s), "
    print(f"  a worker: {med[one + '1 worker(s)'] / med[one + '0 worker(s)']:.2f}× the step on one thread, "
          f"{med[two + '1 worker(s)'] / med[two + '0 worker(s)']:.2f}× on two; two threads and no worker "
          f"{1 - med[two + '0 worker(s)'] / med[one + '0 worker(s)']:.3f} saved; load average "
          f"{os.getloadavg()[0]:.2f}")


def profiled(threads: int, path: str | None = None):
    torch.set_num_threads(threads)
    step = _loop()
    with gpumagic.profile(steps=10, save=path, display=False) as run:
        for _ in range(13):
            step()
    return run.report


def timed(threads: int, steps: int) -> float:
    """Median step time (ms) of the plain loop on ``threads`` intra-op threads."""
    torch.set_num_threads(threads)
    step = _loop()
    for _ in range(3):
        step()
    out = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--oversubscribe", type=int, metavar="N", help="N intra-op threads, against the suggestion")
    parser.add_argument("--loader", action="store_true", help="the loop with a DataLoader: threads against workers")
    parser.add_argument("--record", metavar="DIR", help="record the bundles tests/data keeps into DIR instead")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if args.record:
        for threads, name in ((1, "cpu_threads1"), (cores, "cpu_threads2"), (16, "cpu_threads16")):
            profiled(threads, os.path.join(args.record, f"{name}.json.gz"))
            print("recorded", name)
        loader_case(1, 1, os.path.join(args.record, "cpu_threads1_loader.json.gz"))
        print("recorded cpu_threads1_loader")
        return
    print(f"{cores} usable cores; torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
    if args.loader:
        loader_case(args.rounds, args.steps)
        return
    start, rule = (args.oversubscribe, "threads-oversubscribed") if args.oversubscribe else (1, "host-cores-idle")
    f = profiled(start).finding(rule)
    if f is None:
        print(f"{rule} did not fire")
        return
    n = int(f.evidence.numbers["suggested_num_threads"])
    one, many = [], []
    for _ in range(args.rounds):
        one.append(timed(start, args.steps))
        many.append(timed(n, args.steps))
    saved = 1 - statistics.median(many) / statistics.median(one)
    print(f"{rule}: up to {f.est_gain:.3f}, {n} threads suggested")
    print(f"  {start} thread(s) {statistics.median(one):7.2f} ms a step [{min(one):.2f}–{max(one):.2f}]")
    print(f"  {n} threads  {statistics.median(many):7.2f} ms a step [{min(many):.2f}–{max(many):.2f}]")
    print(f"  measured saving {saved:.3f} against the bound {f.est_gain:.3f}: "
          f"{'within it' if saved <= f.est_gain else 'ABOVE IT'}; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
