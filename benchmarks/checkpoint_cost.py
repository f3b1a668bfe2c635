"""Does ``frequent-checkpoints`` hold? A CPU training loop that saves a checkpoint every step, against
the interval the finding suggests.

Two linear layers (512 → 2048 → 512, a batch of 64, Adam: about 25 MB of state) save
``{"model", "optimizer"}`` with ``torch.save`` after every step, profiled by ``gpumagic.profile()``;
the finding's upper bound and suggested interval are read. Then the plain loop (no profiler) is
timed saving every step and saving at the suggested interval, alternated round by round, and the
measured saving (1 − time per step at the interval ÷ every step) is printed beside the bound,
which it must not exceed. The checkpoint goes to a temporary folder, removed at the end.
Numbers depend on the machine, its disk and what else runs on it: this prints, it asserts
nothing. ``--record DIR`` instead records the bundle tests/data keeps
(``cpu_checkpoint_every_step.json.gz``) and exits.

    python benchmarks/checkpoint_cost.py [--rounds 5] [--steps 40] [--record DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import torch
from steptime import mean_ms

import gpumagic


def _loop(folder: str, every: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(64, 512)
    path = os.path.join(folder, "last.pt")
    count = [0]

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        count[0] += 1
        if count[0] % every == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    return step


def profiled(folder: str, path: str | None = None):
    step = _loop(folder, 1)
    with gpumagic.profile(steps=4, save=path, display=False) as run:
        for _ in range(10):
            step()
    return run.report


def timed(folder: str, every: int, steps: int) -> float:
    """Mean time per step (ms) of the plain loop saving every ``every`` steps."""
    return mean_ms(_loop(folder, every), steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.record:
            profiled(folder, os.path.join(args.record, "cpu_checkpoint_every_step.json.gz"))
            print("recorded cpu_checkpoint_every_step")
            return
        print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}; checkpoints in {folder}")
        f = profiled(folder).finding("frequent-checkpoints")
        if f is None:
            print("frequent-checkpoints did not fire")
            return
        every = int(f.evidence.numbers["suggested_every_steps"])
        times: dict[int, list[float]] = {1: [], every: []}
        for _ in range(args.rounds):
            for n in (1, every):
                times[n].append(timed(folder, n, max(args.steps, every if n > 1 else 0)))
        each, spaced = statistics.median(times[1]), statistics.median(times[every])
        print(f"every step {each:.2f} ms/step [{min(times[1]):.2f}–{max(times[1]):.2f}]  every {every} steps "
              f"{spaced:.2f} ms/step [{min(times[every]):.2f}–{max(times[every]):.2f}]  saved {1 - spaced / each:.3f}"
              f"  rule's bound {f.est_gain:.3f} (all steps {f.evidence.numbers['save_frac_of_steps']:.3f})")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
