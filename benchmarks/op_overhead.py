"""Does ``cpu-op-overhead`` hold? A recurrent cell written as a Python loop over 64 time steps
(hidden size 32, a batch of 8, SGD) trained on the CPU: eager, compiled with ``torch.compile``
(the finding's first fix) and as ``nn.RNN`` (its second).

The eager loop is profiled by ``gpumagic.profile()`` and the finding's gain read (the forward and
backward's share of the window, an upper bound); then the three are timed unprofiled, alternated
round by round, and each saving (1 − time per step ÷ the eager loop's) printed beside it. The
first compiled call compiles (seconds), before the timing. Numbers depend on the machine and on
what else runs on it: this prints, it asserts nothing. ``--record DIR`` instead records the
bundle tests/data keeps (``cpu_rnn_loop.json.gz``: three steps of 32 time steps, a smaller
file) and exits.

    python benchmarks/op_overhead.py [--rounds 5] [--steps 30] [--record DIR]
"""

from __future__ import annotations

import argparse
import os

import torch
from steptime import alternated, medians, profile_steps

T, B, D = 64, 8, 32


class LoopCell(torch.nn.Module):
    """h ← tanh(W_ih x_t + W_hh h), one time step at a time in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.ih, self.hh, self.out = torch.nn.Linear(D, D), torch.nn.Linear(D, D), torch.nn.Linear(D, 4)

    def forward(self, x):
        h = torch.zeros(x.shape[1], D)
        for t in range(x.shape[0]):
            h = torch.tanh(self.ih(x[t]) + self.hh(h))
        return self.out(h)


class FusedCell(torch.nn.Module):
    """The same recurrence as PyTorch's fused layer."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.out = torch.nn.RNN(D, D), torch.nn.Linear(D, 4)

    def forward(self, x):
        return self.out(self.rnn(x)[1][0])


def _step(model, call=None, time_steps: int = T):
    torch.manual_seed(0)
    x, y = torch.randn(time_steps, B, D), torch.randint(0, 4, (B,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    call = model if call is None else call

    def step():
        loss = torch.nn.functional.cross_entropy(call(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def profiled(path: str | None = None, steps: int = 5, time_steps: int = T):
    torch.manual_seed(0)
    return profile_steps(_step(LoopCell(), time_steps=time_steps), steps, path, warm=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    if args.record:
        profiled(os.path.join(args.record, "cpu_rnn_loop.json.gz"), steps=3, time_steps=32)  # a smaller file
        print("recorded cpu_rnn_loop.json.gz")
        return
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
    f = profiled().finding("cpu-op-overhead")
    torch.manual_seed(0)
    compiled_model = LoopCell()
    loops = {"eager": _step(LoopCell()), "compiled": _step(compiled_model, torch.compile(compiled_model)),
             "nn.RNN": _step(FusedCell())}
    loops["compiled"]()  # compiles
    med, line = medians(alternated(loops, args.rounds, args.steps))
    said = f"upper bound {f.est_gain:.3f}" if f else "the rule is silent"
    print(line)
    print(f"saved: compiled {1 - med['compiled'] / med['eager']:.3f}, nn.RNN {1 - med['nn.RNN'] / med['eager']:.3f}; "
          f"{said}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
