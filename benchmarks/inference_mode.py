"""Do ``inference-grad-enabled`` and ``inference-train-mode`` hold? An inference loop over a small
transformer-style MLP stack (Linear → GELU → Dropout → LayerNorm blocks, a 10-way head) on the
CPU, run three ways: as many notebooks run it (grad mode on, the model in eval mode), under
``torch.no_grad()``, and under ``torch.inference_mode()`` (the finding's fix).

Each loop is profiled by ``gpumagic.profile()`` and whether the rule fires printed; then the three
are timed unprofiled, alternated round by round, and each one's time per batch printed with the
saving against grad mode (1 − time ÷ grad mode's). Numbers depend on the machine and on what else
runs on it: this prints, it asserts nothing. ``--record DIR`` instead records the bundles
tests/data keeps (``cpu_infer_grad.json.gz``: grad mode on, eval mode; ``cpu_infer_train_mode.json.gz``:
``torch.no_grad()`` with the model left in training mode; ``cpu_compiled_infer_grad.json.gz`` and
``cpu_compiled_infer_nograd.json.gz``: a ``torch.compile``'d MLP called six times with grad mode
on, and under ``torch.no_grad()``, after three warm-up calls that compile it) and exits.

    python benchmarks/inference_mode.py [--rounds 7] [--batches 30] [--width 512] [--batch 64] [--record DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
from steptime import alternated, medians, profile_steps


def _model(width: int, blocks: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.LayerNorm(width)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def _loop(width: int, batch: int, mode: str, train: bool = False):
    """One batch of inference: ``mode`` is "grad" (no context), "no_grad" or "inference_mode"."""
    model = _model(width).train(train)
    x = torch.randn(batch, width)
    guard = {"grad": contextlib.nullcontext, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]

    def infer():
        with guard():
            return model(x).argmax(dim=1)
    return infer


def _record_compiled(path: str, grad: bool) -> None:
    """Six calls of a compiled MLP under ``gpumagic.profile()`` (no steps: the whole call), after
    three that compile it (Inductor on the CPU: seconds)."""
    import gpumagic

    torch.manual_seed(0)
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10)))
    x = torch.randn(64, 256)
    guard = contextlib.nullcontext if grad else torch.no_grad

    def call():
        with guard():
            return model(x)
    for _ in range(3):
        call()
    with gpumagic.profile(save=path, display=False):
        for _ in range(6):
            call()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--record", metavar="DIR", help="record the bundles tests/data keeps into DIR instead")
    args = parser.parse_args()
    if args.record:
        for name, loop in (("cpu_infer_grad.json.gz", _loop(256, 32, "grad")),
                           ("cpu_infer_train_mode.json.gz", _loop(256, 32, "no_grad", train=True))):
            profile_steps(loop, 3, os.path.join(args.record, name))
            print(f"recorded {name}")
        for name, grad in (("cpu_compiled_infer_grad.json.gz", True), ("cpu_compiled_infer_nograd.json.gz", False)):
            _record_compiled(os.path.join(args.record, name), grad)
            print(f"recorded {name}")
        return
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    loops = {mode: _loop(args.width, args.batch, mode) for mode in ("grad", "no_grad", "inference_mode")}
    for mode, loop in loops.items():
        report = profile_steps(loop, 8)
        fired = [f.id for f in report.findings if f.id.startswith("inference-")]
        print(f"{mode}: {', '.join(fired) or 'no inference finding'}")
    train = profile_steps(_loop(args.width, args.batch, "no_grad", train=True), 8)
    print(f"no_grad, training mode: {', '.join(f.id for f in train.findings if f.id.startswith('inference-')) or 'none'}")
    med, line = medians(alternated(loops, args.rounds, args.batches))
    print(line.replace("a step", "a batch"))
    print(f"saved against grad mode: no_grad {1 - med['no_grad'] / med['grad']:.3f}, "
          f"inference_mode {1 - med['inference_mode'] / med['grad']:.3f}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
