"""Does ``cpu-low-precision-slow`` hold? bfloat16 autocast against FP32 on this CPU.

Three small CPU training loops — two linear layers (512 → 1024 → 512, a batch of 128, AdamW), a
convolution network (two 3×3 convolutions of 32 channels on 16 images of 64×64, SGD) and a
transformer encoder (2 layers of width 128, 4 heads, 8 sequences of 64, AdamW) — are
profiled under ``torch.autocast("cpu", dtype=torch.bfloat16)`` by ``gpumagic.profile()``; the
finding's upper bound is read (or its absence reported: on a CPU with bf16 instructions the rule
stays silent, as it should). Then the plain loops (no profiler) are timed in FP32 and in bf16
autocast, alternated round by round, and the measured saving of FP32 (1 − FP32 step ÷ bf16
step) is printed beside the bound, which it must not exceed. The CPU's features as gpumagic
records them are printed first. Numbers depend on the machine and on what else runs on it: this
prints, it asserts nothing. ``--record DIR`` instead records the bundles tests/data keeps
(``cpu_autocast_bf16.json.gz`` and ``cpu_autocast_fp32.json.gz``: the linear loop;
``cpu_model_half.json.gz``: the linear loop with the model cast to float16) and exits. Last, the
linear loop with the model and its input cast with ``.half()`` (no autocast), profiled without
``--shapes`` (the optimizer's parameters give the type), against FP32.

    python benchmarks/cpu_low_precision.py [--rounds 5] [--steps 5] [--record DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import gpumagic
from gpumagic.analysis.cpuprecision import support
from gpumagic.capture.machine import machine_info


def _linear():
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    return model, torch.optim.AdamW(model.parameters()), torch.randn(128, 512)


def _conv():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(32, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(16, 3, 64, 64)


def _transformer():
    layer = torch.nn.TransformerEncoderLayer(128, 4, 256, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return model, torch.optim.AdamW(model.parameters()), torch.randn(8, 64, 128)


LOOPS = {"linear": _linear, "conv": _conv, "transformer": _transformer}


def _step(kind: str, bf16: bool, half: bool = False):
    """A step of loop ``kind``: in FP32, under bf16 autocast (``bf16``), or with the model and its
    input cast to float16 (``half``: ``model.half()``, no autocast)."""
    torch.manual_seed(0)
    model, opt, x = LOOPS[kind]()
    if half:
        model, x = model.half(), x.half()

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def profiled(kind: str, bf16: bool, path: str | None = None, half: bool = False):
    step = _step(kind, bf16, half)
    with gpumagic.profile(steps=3, save=path, display=False) as run:
        for _ in range(5):
            step()
    return run.report


def timed(kind: str, bf16: bool, steps: int, half: bool = False) -> float:
    """Median step time (ms) of the plain loop."""
    step = _step(kind, bf16, half)
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
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--record", metavar="DIR", help="record the bundles tests/data keeps into DIR instead")
    args = parser.parse_args()
    if args.record:
        for bf16, name in ((True, "cpu_autocast_bf16"), (False, "cpu_autocast_fp32")):
            profiled("linear", bf16, os.path.join(args.record, f"{name}.json.gz"))
            print("recorded", name)
        profiled("linear", False, os.path.join(args.record, "cpu_model_half.json.gz"), half=True)
        print("recorded cpu_model_half")
        return
    machine = machine_info()
    print(f"{machine['cpu_model']}; features {machine['cpu_flags']}; 16-bit support {support(machine)}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    for kind in LOOPS:
        f = profiled(kind, True).finding("cpu-low-precision-slow")
        bound = None if f is None else f.est_gain
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for bf16 in (False, True):
                times[bf16].append(timed(kind, bf16, args.steps))
        fp32, bf16 = statistics.median(times[False]), statistics.median(times[True])
        print(f"{kind:11s} FP32 {fp32:8.1f} ms  bf16 autocast {bf16:8.1f} ms  ({bf16 / fp32:.1f}× slower in bf16)"
              f"  saved by FP32 {1 - fp32 / bf16:.3f}  rule's bound "
              f"{'(silent)' if bound is None else f'{bound:.3f}'}  [rounds: FP32 "
              f"{min(times[False]):.1f}–{max(times[False]):.1f}, bf16 {min(times[True]):.1f}–{max(times[True]):.1f} ms]")
    f = profiled("linear", False, half=True).finding("cpu-low-precision-slow")  # no --shapes: the parameters tell
    bound = None if f is None else f.est_gain
    times = {False: [], True: []}
    for _ in range(args.rounds):
        for half in (False, True):
            times[half].append(timed("linear", False, args.steps, half=half))
    fp32, fp16 = statistics.median(times[False]), statistics.median(times[True])
    print(f"linear, model.half(): FP32 {fp32:.1f} ms  float16 {fp16:.1f} ms  saved by FP32 {1 - fp32 / fp16:.3f}  "
          f"rule's bound {'(silent)' if bound is None else f'{bound:.3f}'}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
