"""Does ``cpu-float64`` hold? A training step in float64 against the same step in float32 on this CPU.

Four small CPU training loops, each with Adam — an MLP of 1024-wide layers (a batch of 128), a
convolution network (two 3×3 convolutions on 32 images of 32×32), a transformer encoder (2
layers of width 128, 4 heads, 16 sequences of 64) and a tiny MLP (20 → 64 → 1, a batch of 64,
whose step is mostly per-operator overhead) — are made float64 with ``.double()`` and profiled
by ``gpumagic.profile()``; the finding's upper bound is read (or its absence reported). Then the
plain loops (no profiler) are timed in float64 and in float32, alternated round by round (each
round's mean over ``--steps`` steps; ``steptime.alternated``), and the measured saving of float32
(1 − float32 step ÷ float64 step) is printed beside the bound, which it must not exceed. Numbers
depend on the machine and on what else runs on it: this prints, it asserts nothing. ``--record
DIR`` instead records the bundle tests/data keeps (``cpu_float64.json.gz``: the MLP in float64)
and exits. ``--calls`` instead times one ``nn.Linear`` call on a batch of 64 in both types, from
16 to 512 features (alternated rounds): the call length from which float64 costs more than a
call's fixed cost, the rule's ``LONG_CALL_NS``.

    python benchmarks/cpu_float64.py [--rounds 7] [--steps 10] [--record DIR | --calls]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from steptime import alternated, medians

import gpumagic
from gpumagic.capture.machine import machine_info


def _mlp():
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    return model, torch.randn(128, 256)


def _conv():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(64, 10))
    return model, torch.randn(32, 3, 32, 32)


def _transformer():
    layer = torch.nn.TransformerEncoderLayer(128, 4, 256, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(16, 64, 128)


def _tiny():
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)), torch.randn(64, 20)


LOOPS = {"mlp": _mlp, "conv": _conv, "transformer": _transformer, "tiny": _tiny}


def _step(kind: str, dtype: torch.dtype):
    torch.manual_seed(0)
    model, x = LOOPS[kind]()
    model, x = model.to(dtype), x.to(dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def profiled(kind: str, path: str | None = None):
    step = _step(kind, torch.float64)
    with gpumagic.profile(steps=5, save=path, display=False) as run:
        for _ in range(7):
            step()
    return run.report


def calls(rounds: int) -> None:
    """One ``nn.Linear`` call on a batch of 64, float64 against float32, by width."""
    for n in (16, 32, 64, 128, 256, 512):
        times: dict[torch.dtype, list[float]] = {torch.float32: [], torch.float64: []}
        layers = {}
        for dtype in times:
            torch.manual_seed(0)
            layers[dtype] = (torch.nn.Linear(n, n).to(dtype), torch.randn(64, n, dtype=dtype))
        with torch.no_grad():
            for _ in range(rounds):
                for dtype, (layer, x) in layers.items():
                    layer(x)
                    t = time.perf_counter()
                    for _ in range(200):
                        layer(x)
                    times[dtype].append((time.perf_counter() - t) / 200 * 1e6)
        f32, f64 = statistics.median(times[torch.float32]), statistics.median(times[torch.float64])
        print(f"Linear({n}, {n}) on 64 rows: float32 {f32:7.1f} µs  float64 {f64:7.1f} µs  ({f64 / f32:.2f}×)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    parser.add_argument("--calls", action="store_true", help="time one Linear call by width instead")
    args = parser.parse_args()
    if args.calls:
        calls(args.rounds)
        return
    if args.record:
        profiled("mlp", os.path.join(args.record, "cpu_float64.json.gz"))
        print("recorded cpu_float64")
        return
    machine = machine_info()
    print(f"{machine['cpu_model']}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"load average {os.getloadavg()[0]:.2f}")
    for kind in LOOPS:
        f = profiled(kind).finding("cpu-float64")
        bound = None if f is None else f.est_gain
        med, line = medians(alternated({"float32": _step(kind, torch.float32), "float64": _step(kind, torch.float64)},
                                       args.rounds, args.steps))
        print(f"{kind}: {line}")
        print(f"  {med['float64'] / med['float32']:.2f}× slower in float64; saved by float32 "
              f"{1 - med['float32'] / med['float64']:.3f}; rule's bound {'(silent)' if bound is None else f'{bound:.3f}'}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
