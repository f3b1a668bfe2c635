"""Does ``loop-host-work`` hold? A CPU training loop whose per-step accuracy is counted in Python,
against the same loop with the count kept on tensors (the finding's fix) and with no count at all.

Three linear layers (256 → 512 → 512 → 10, a batch of 64, cross-entropy, SGD). After each
optimizer step the loop builds a 10 × 10 confusion matrix from ``.tolist()`` in a Python loop,
``--passes`` times over the batch (a stand-in for heavier bookkeeping). The loop is profiled by
``gpumagic.profile()`` and the finding's gain read (the share of the window outside the data
wait, forward, backward and optimizer); then the three loops are timed, alternated round by round,
and the measured saving (1 − time per step ÷ the Python loop's) printed beside the finding's
estimate. Numbers depend on the machine and on what else runs on it: this prints,
it asserts nothing. ``--record DIR`` instead records the bundle tests/data keeps
(``cpu_loop_host_work.json.gz``) and exits.

    python benchmarks/loop_work.py [--rounds 5] [--steps 50] [--passes 40] [--record DIR]
"""

from __future__ import annotations

import argparse
import os

import torch
from steptime import alternated, medians, profile_steps


def _loop(bookkeeping: str, passes: int):
    """One training step with ``bookkeeping`` "python" (a confusion matrix from lists), "tensor"
    (the finding's fix: a running count on tensors) or "none"."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    state = {"correct": 0, "seen": 0, "step": 0}

    def step():
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if bookkeeping == "python":
            preds, labels = logits.argmax(1).tolist(), y.tolist()
            matrix = [[0] * 10 for _ in range(10)]
            for _ in range(passes):
                for p, t in zip(preds, labels, strict=True):
                    matrix[t][p] += 1
            state["correct"] += sum(matrix[k][k] for k in range(10)) // passes
        elif bookkeeping == "tensor":
            state["correct"] = state["correct"] + (logits.argmax(dim=1) == y).sum()
            state["seen"] += y.numel()
            state["step"] += 1
            if state["step"] % 100 == 0:
                float(state["correct"])
    return step


def profiled(passes: int, path: str | None = None):
    return profile_steps(_loop("python", passes), 10, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--passes", type=int, default=40)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    if args.record:
        profiled(args.passes, os.path.join(args.record, "cpu_loop_host_work.json.gz"))
        print("recorded cpu_loop_host_work.json.gz")
        return
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}; {args.passes} passes")
    f = profiled(args.passes).finding("loop-host-work")
    loops = {k: _loop(k, args.passes) for k in ("python", "tensor", "none")}
    med, line = medians(alternated(loops, args.rounds, args.steps))
    said = f"estimate {f.est_gain:.3f}" if f else "the rule is silent"
    print(line)
    print(f"saved with the tensor fix {1 - med['tensor'] / med['python']:.3f}, with no bookkeeping "
          f"{1 - med['none'] / med['python']:.3f}; {said}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
