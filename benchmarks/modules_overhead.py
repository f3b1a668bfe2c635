"""What ``--modules`` (time per nn.Module) and the torch.compile watch cost, side by side in one run.

A CPU training step of a model of many small modules (``--blocks`` blocks of Linear, LayerNorm,
GELU and a residual add: 4 module calls per block, plus the outer Sequential) runs under a
recording ``torch.profiler.profile()`` (what gpumagic records by default: CPU activity) in two
ways, alternated step by step so that drift hits both alike:

- ``profiler``: the profiler alone;
- ``profiler + modules``: the same with gpumagic's global module hooks installed
  (:class:`gpumagic.capture.modules.ModuleRanges`: one ``record_function`` range per module call).

It prints the median step time of each, the median of the paired ratios with their spread, and
the cost per module call. Small modules on small tensors are the worst case: the hooks' cost is
per call, the step's work per element. Then the torch.compile watch
(:class:`gpumagic.capture.dynamo.DynamoWatch`: dynamo's counters read before and after, a log
handler during), which every capture runs: the time of one start + facts, in microseconds.
Run: ``python benchmarks/modules_overhead.py [--blocks 24] [--width 64] [--rounds 40]``.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch

from gpumagic.capture.dynamo import DynamoWatch
from gpumagic.capture.modules import ModuleRanges


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.act = torch.nn.GELU()

    def forward(self, x):
        return x + self.act(self.norm(self.fc(x)))


def make_step(blocks: int, width: int, batch: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(width) for _ in range(blocks)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width)
    calls = 1 + 4 * blocks  # the Sequential, then per block: the block, fc, norm, act

    def step() -> float:
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        return time.perf_counter() - t

    return step, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    step, calls = make_step(args.blocks, args.width, args.batch)
    for _ in range(5):
        step()  # warm-up: lazy initialisation, allocator
    plain: list[float] = []
    hooked: list[float] = []
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.start()
    try:
        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            for with_hooks in order:
                ranges = ModuleRanges().install() if with_hooks else None
                try:
                    (hooked if with_hooks else plain).append(step())
                finally:
                    if ranges is not None:
                        ranges.remove()
    finally:
        prof.stop()
    ratios = sorted(h / p for h, p in zip(hooked, plain, strict=True))
    mp, mh = statistics.median(plain), statistics.median(hooked)
    q = max(len(ratios) // 4, 0)
    print(f"model: {args.blocks} blocks of width {args.width}, batch {args.batch}: {calls} module calls per step")
    print(f"{'profiler':>20}: {mp * 1e3:8.2f} ms per step (median of {len(plain)})")
    print(f"{'profiler + modules':>20}: {mh * 1e3:8.2f} ms per step (median of {len(hooked)})")
    print(f"ratio (paired, median): {statistics.median(ratios):.2f}x  (interquartile {ratios[q]:.2f}x .. "
          f"{ratios[-q - 1]:.2f}x)")
    print(f"cost per module call: {(mh - mp) / calls * 1e6:.1f} us")
    importlib.import_module("torch._dynamo")  # imported, as in a cell that compiles: its counters are read
    costs = []
    for _ in range(50):
        t = time.perf_counter()
        watch = DynamoWatch().start()
        watch.stop()
        watch.facts()
        costs.append(time.perf_counter() - t)
    print(f"torch.compile watch (start + stop + facts): {statistics.median(costs) * 1e6:.0f} us per cell")


if __name__ == "__main__":
    main()
