"""Does ``host-contended`` hold? A CPU training loop beside processes that take the cores.

For one and for as many spinning neighbour processes as there are usable cores (each a busy loop,
started and stopped here), the loop (two linear layers, 512 → 1024 → 512, a batch of 256, fused
AdamW, PyTorch's default thread count) is profiled by ``gpumagic.profile()`` and the finding read:
its estimate (the main thread's run-queue wait) and the thread count it suggests. Then, with the
neighbours still running, the plain loop is timed with the default thread count and with the
suggested one, alternated round by round; and once more with the neighbours stopped (the quiet
machine the estimate speaks of). Printed: each time per step, the measured saving of the
suggested count (1 − its time ÷ the default's) and of a quiet machine, beside the estimate.
Numbers depend on the machine and on what else runs on it: this prints, it asserts nothing.
``--record DIR`` instead records the bundles tests/data keeps (``cpu_contended.json.gz``: the
loop beside one spinning process per usable core; ``cpu_contended_loader.json.gz``: the same loop
fed by a ``DataLoader`` over a ``TensorDataset``, no workers, beside one more neighbour than cores)
and exits.

    python benchmarks/contention.py [--rounds 5] [--steps 20] [--record DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time

import torch
from steptime import mean_ms, profile_steps

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
SPIN = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def neighbours(n: int):
    """``n`` processes spinning on the CPU while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]
    try:
        time.sleep(0.5)  # let them start
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    x = torch.randn(256, 512)

    def step():
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _loader_loop():
    """A narrower step (512 → 256 → 512), its batches from a DataLoader (TensorDataset, no workers)
    made in the loop: the loader's share of the window is larger than in :func:`_loop`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 512))
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    data = torch.utils.data.TensorDataset(torch.randn(8192, 512))
    loader = torch.utils.data.DataLoader(data, batch_size=256, shuffle=True)
    batches = iter(())

    def step():
        nonlocal batches
        try:
            (x,) = next(batches)
        except StopIteration:
            batches = iter(loader)
            (x,) = next(batches)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def profiled(path: str | None = None, steps: int = 12):
    return profile_steps(_loop(), steps, path)


def timed(step, threads: int, steps: int) -> float:
    """Mean time per step (ms) with ``threads`` intra-op threads."""
    torch.set_num_threads(threads)
    return mean_ms(step, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    default = torch.get_num_threads()
    if args.record:
        with neighbours(CORES):
            profiled(os.path.join(args.record, "cpu_contended.json.gz"))
        with neighbours(CORES + 1):
            profile_steps(_loader_loop(), 12, os.path.join(args.record, "cpu_contended_loader.json.gz"))
        print("recorded cpu_contended.json.gz, cpu_contended_loader.json.gz")
        return
    print(f"torch {torch.__version__}; {CORES} usable cores; {default} intra-op threads by default; "
          f"load average {os.getloadavg()[0]:.2f}")
    step = _loop()
    for n in sorted({1, CORES}):
        with neighbours(n):
            f = profiled().finding("host-contended")
            suggested = int(f.evidence.numbers.get("suggested_num_threads") or default) if f else default
            got: dict[int, list[float]] = {default: [], suggested: []}
            for _ in range(args.rounds):
                for t in got:
                    got[t].append(timed(step, t, args.steps))
        quiet = [timed(step, default, args.steps) for _ in range(args.rounds)]
        torch.set_num_threads(default)
        base = statistics.median(got[default])
        said = (f"estimate {f.est_gain:.2f}, suggests {suggested} thread(s)" if f else "the rule is silent")
        cells = "  ".join(f"{t} thread(s) {statistics.median(v):.2f} ms" for t, v in got.items())
        print(f"{n} neighbour(s): {said}; {cells}; saved by the suggestion {1 - statistics.median(got[suggested]) / base:+.2f}; "
              f"quiet machine {statistics.median(quiet):.2f} ms, saved {1 - statistics.median(quiet) / base:+.2f}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
