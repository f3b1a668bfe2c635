"""Does ``unfused-optimizer`` hold? CPU training loops with torch.optim's for-loop step, against
the fused step the finding suggests.

For each case (a model, a batch, an optimizer), the loop with the default (for-loop) optimizer is
profiled by ``gpumagic.profile()`` and the finding's bound read (the optimizer steps' share of
the window); then the plain loop (no profiler) is timed with the for-loop, ``foreach=True`` and
``fused=True`` optimizers, alternated round by round, and the measured saving of each (1 − time
per step ÷ the for-loop's) is printed beside the bound, which the fused saving must not exceed.
SGD with momentum is one of the cases: its fused kernel exists on the CPU, but the rule suggests
``foreach=True`` for it, and this case says why. Numbers depend on the machine and what else runs
on it: this prints, it asserts nothing. ``--record DIR`` instead records the bundles tests/data
keeps (``cpu_adam_forloop.json.gz`` and ``cpu_adam_fused.json.gz``: the first case, eight steps;
``cpu_sgd_momentum.json.gz``: the SGD case's for-loop, eight steps) and exits.

    python benchmarks/optimizer_fused.py [--rounds 5] [--steps 60] [--record DIR]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics

import torch
from steptime import mean_ms, profile_steps

#: (name, layer widths, batch, optimizer class, its arguments)
CASES = (
    ("batch-1 MLP, 7 layers of 32, Adam", (32,) * 7 + (1,), 1, torch.optim.Adam, {"lr": 1e-3}),
    ("MLP 256-512-512-10, batch 64, AdamW", (256, 512, 512, 10), 64, torch.optim.AdamW, {"lr": 1e-3}),
    ("MLP 1024-1024-1024-10, batch 512, AdamW", (1024, 1024, 1024, 10), 512, torch.optim.AdamW, {"lr": 1e-3}),
    ("MLP 256-512-512-10, batch 64, Adagrad", (256, 512, 512, 10), 64, torch.optim.Adagrad, {"lr": 1e-2}),
    ("MLP 256-512-512-10, batch 64, SGD momentum", (256, 512, 512, 10), 64, torch.optim.SGD,
     {"lr": 1e-3, "momentum": 0.9}),
)
IMPLS = {"for-loop": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def _loop(widths, batch: int, opt_cls, kwargs: dict, impl: dict):
    """One training step of an MLP of ``widths`` under ``opt_cls(**kwargs, **impl)``."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = opt_cls(model.parameters(), **kwargs, **impl)
    x, y = torch.randn(batch, widths[0]), torch.randn(batch, widths[-1])

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def profiled(case, impl: dict, steps: int = 20, path: str | None = None):
    _, widths, batch, opt_cls, kwargs = case
    return profile_steps(_loop(widths, batch, opt_cls, kwargs, impl), steps, path)


def timed(step, steps: int) -> float:
    """Mean time per step (ms)."""
    return mean_ms(step, steps, warm=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--record", metavar="DIR", help="record the bundles tests/data keeps into DIR instead")
    args = parser.parse_args()
    if args.record:
        for name, impl in (("forloop", {}), ("fused", {"fused": True})):
            profiled(CASES[0], impl, steps=8, path=os.path.join(args.record, f"cpu_adam_{name}.json.gz"))
            print("recorded", f"cpu_adam_{name}.json.gz")
        profiled(CASES[-1], {}, steps=8, path=os.path.join(args.record, "cpu_sgd_momentum.json.gz"))
        print("recorded cpu_sgd_momentum.json.gz")
        return
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    for case in CASES:
        name, widths, batch, opt_cls, kwargs = case
        f = profiled(case, {}).finding("unfused-optimizer")
        bound = f"rule's bound {f.est_gain:.3f}" if f else "the rule is silent"
        steps = {k: _loop(widths, batch, opt_cls, kwargs, impl) for k, impl in IMPLS.items()}
        n = max(5, args.steps if batch < 512 else args.steps // 4)
        for s in steps.values():
            timed(s, 3)
        got: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(args.rounds):
            for k, s in steps.items():
                got[k].append(timed(s, n))
        base = statistics.median(got["for-loop"])
        cells = "  ".join(f"{k} {statistics.median(v):.3f} ms (saved {1 - statistics.median(v) / base:+.3f})"
                          for k, v in got.items())
        print(f"{name}: {cells}; {bound}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
