"""Does ``host-cores-idle`` hold? A CPU training loop on one intra-op thread against the usable cores.

An MLP (two 1024×1024 linear layers, a batch of 512, SGD) is profiled with
``torch.set_num_threads(1)`` by ``gpumagic.profile()`` (10 steps); the finding's upper bound and
suggested thread count are read, then the plain loop (no profiler) is timed with one thread and
with the suggested count, alternated round by round, and the measured saving (1 − median step
with the threads ÷ with one) is printed beside the bound, which it must not exceed.
Numbers depend on the machine and on what else runs on it: this prints, it asserts nothing.
``--oversubscribe N`` runs the loop on ``N`` intra-op threads instead of one (more than the usable
cores, for ``threads-oversubscribed``) and times it against the finding's suggested count.
``--record DIR`` instead records the bundles tests/data keeps (``cpu_threads1.json.gz``: one
thread; ``cpu_threads2.json.gz``: the default count; ``cpu_threads16.json.gz``: 16 threads) and
exits.

    python benchmarks/threads_speedup.py [--rounds 5] [--steps 20] [--oversubscribe N] [--record DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

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
    parser.add_argument("--record", metavar="DIR", help="record the bundles tests/data keeps into DIR instead")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if args.record:
        for threads, name in ((1, "cpu_threads1"), (cores, "cpu_threads2"), (16, "cpu_threads16")):
            profiled(threads, os.path.join(args.record, f"{name}.json.gz"))
            print("recorded", name)
        return
    print(f"{cores} usable cores; torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
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
