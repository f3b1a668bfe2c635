"""Does ``anomaly-detection-on`` hold? A CPU training loop with autograd's anomaly mode on and off.

Three linear layers (256 → 512 → 512 → 10, a batch of 64, cross-entropy, fused AdamW): the loop
is profiled by ``gpumagic.profile()`` with ``torch.autograd.set_detect_anomaly(True)`` and the
finding's estimate read (the NaN checks' share of the window); then the plain loop is timed with
the mode on and off, alternated round by round, and the measured saving (1 − time per step off ÷
on) printed beside the estimate. Numbers depend on the machine and on what else runs on it: this
prints, it asserts nothing. ``--record DIR`` instead records the bundle tests/data keeps
(``cpu_anomaly_mode.json.gz``: five steps with the mode on) and exits.

    python benchmarks/anomaly_mode.py [--rounds 5] [--steps 50] [--record DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
from steptime import mean_ms, profile_steps


def _loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def profiled(path: str | None = None):
    torch.autograd.set_detect_anomaly(True)
    try:
        return profile_steps(_loop(), 5, path)
    finally:
        torch.autograd.set_detect_anomaly(False)


def timed(step, anomaly: bool, steps: int) -> float:
    """Mean time per step (ms) with anomaly mode ``anomaly``."""
    torch.autograd.set_detect_anomaly(anomaly)
    try:
        return mean_ms(step, steps)
    finally:
        torch.autograd.set_detect_anomaly(False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    if args.record:
        profiled(os.path.join(args.record, "cpu_anomaly_mode.json.gz"))
        print("recorded cpu_anomaly_mode.json.gz")
        return
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
    f = profiled().finding("anomaly-detection-on")
    step = _loop()
    got: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for mode in got:
            got[mode].append(timed(step, mode, args.steps))
    on, off = statistics.median(got[True]), statistics.median(got[False])
    said = f"estimate {f.est_gain:.3f}" if f else "the rule is silent"
    print(f"anomaly mode on {on:.3f} ms a step [{min(got[True]):.3f}-{max(got[True]):.3f}], off {off:.3f} ms "
          f"[{min(got[False]):.3f}-{max(got[False]):.3f}]: {on / off:.2f}x, saved {1 - off / on:.3f}; {said}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
