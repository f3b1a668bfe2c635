"""Does ``l2-penalty-in-loss`` hold? CPU training loops that add ``lam * sum(p.pow(2).sum())`` to
the loss, against the optimizer's ``weight_decay = 2 * lam`` that the finding suggests.

For each case (an MLP, a batch, an optimizer), the loop with the penalty in the loss is profiled
by ``gpumagic.profile()`` and the finding's estimate read; then both loops run unprofiled,
alternated round by round, and the measured saving (1 − time per step with weight_decay ÷ time
with the penalty) is printed beside the estimate, with the largest difference between the two
loops' parameters after the same steps from the same start (float64: the fix must give the same
update). Numbers depend on the machine and what else runs on it: this prints, it asserts nothing.
``--record DIR`` instead records the bundle tests/data keeps (``cpu_l2_penalty.json.gz``: the
first case, eight steps) and exits.

    python benchmarks/weight_decay.py [--rounds 5] [--steps 60] [--record DIR]
"""

from __future__ import annotations

import argparse
import itertools
import os

import torch
from steptime import alternated, medians, profile_steps

LAM = 1e-4
#: (name, layer widths, batch, optimizer class, its arguments)
CASES = (
    ("MLP 7 layers of 64, batch 32, SGD momentum (foreach)", (64,) * 7 + (10,), 32, torch.optim.SGD,
     {"lr": 1e-2, "momentum": 0.9, "foreach": True}),
    ("MLP 7 layers of 64, batch 32, Adam (for-loop)", (64,) * 7 + (10,), 32, torch.optim.Adam,
     {"lr": 1e-3, "foreach": False}),
    ("MLP 256-512-512-10, batch 64, Adam (foreach)", (256, 512, 512, 10), 64, torch.optim.Adam,
     {"lr": 1e-3, "foreach": True}),
)


def _model(widths, dtype=torch.float32):
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).to(dtype)


def loop(widths, batch: int, opt_cls, kwargs: dict, penalty: bool, dtype=torch.float32):
    """One training step, the penalty in the loss (``penalty``) or as ``weight_decay = 2 * LAM``;
    returns the step and the model."""
    model = _model(widths, dtype)
    opt = opt_cls(model.parameters(), **kwargs, **({} if penalty else {"weight_decay": 2 * LAM}))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, widths[0], generator=gen, dtype=dtype)
    y = torch.randint(0, widths[-1], (batch,), generator=gen)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if penalty:
            loss = loss + LAM * sum(p.pow(2).sum() for p in model.parameters())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step, model


def max_difference(case, steps: int = 20) -> float:
    """The largest absolute difference between the two loops' parameters after ``steps`` steps
    from the same start, in float64."""
    _, widths, batch, opt_cls, kwargs = case
    runs = [loop(widths, batch, opt_cls, kwargs, penalty, torch.float64) for penalty in (True, False)]
    for step, _ in runs:
        for _ in range(steps):
            step()
    return max(float((a - b).detach().abs().max()) for a, b in zip(runs[0][1].parameters(), runs[1][1].parameters(), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    if args.record:
        _, widths, batch, opt_cls, kwargs = CASES[0]
        profile_steps(loop(widths, batch, opt_cls, kwargs, True)[0], 8, os.path.join(args.record, "cpu_l2_penalty.json.gz"))
        print("recorded cpu_l2_penalty.json.gz")
        return
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    for case in CASES:
        name, widths, batch, opt_cls, kwargs = case
        f = profile_steps(loop(widths, batch, opt_cls, kwargs, True)[0], 20).finding("l2-penalty-in-loss")
        estimate = f"rule's estimate {f.est_gain:.3f}" if f else "the rule is silent"
        loops = {"penalty": loop(widths, batch, opt_cls, kwargs, True)[0],
                 "weight_decay": loop(widths, batch, opt_cls, kwargs, False)[0]}
        med, line = medians(alternated(loops, args.rounds, args.steps))
        print(f"{name}: {line}; saved {1 - med['weight_decay'] / med['penalty']:+.3f}; {estimate}; "
              f"parameters after 20 steps differ by at most {max_difference(case):.1e}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
