"""What the profiler's start and stop cost the steps around them, eager and compiled.

A small CPU training loop (an MLP of seven 32-wide layers, one sample a step, Adam), its optimizer
step run eagerly and through ``torch.compile(opt.step)``, warmed up, then: steps timed before,
under a bare ``torch.profiler.profile`` (CPU activity) and after it. The first steps after the
profiler starts and the first after it stops are printed beside the median step, for each mode,
over ``--rounds`` repetitions (each a fresh process, so that nothing compiled carries over). With
the compiled step, the calls right after a start or a stop took tens of milliseconds on this
project's machine where a step takes one: ``everystep.judged`` leaves the first step after the
profiler out of the outlier check for that reason. Numbers depend on the machine: this prints, it
asserts nothing.

    python benchmarks/profiler_aftermath.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CHILD = r"""
import statistics, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(32, 32), torch.nn.Tanh())],
                            torch.nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), 1e-3)
step = torch.compile(opt.step) if sys.argv[1] == "compiled" else opt.step
data = [(torch.randn(1, 32), torch.randn(1, 1)) for _ in range(30)]
def run():
    out = []
    for x, y in data:
        t = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); step()
        out.append((time.perf_counter() - t) * 1e3)
    return out
run(); run()
quiet = run()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
    under = run()
after = run()
print(statistics.median(quiet), max(under[:3]), after[0], statistics.median(after[1:]))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for mode in ("eager", "compiled"):
        rows = []
        for _ in range(args.rounds):
            out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
            rows.append([float(v) for v in out.stdout.split()[-4:]])
        cols = list(zip(*rows))
        print(f"{mode:9} median step {statistics.median(cols[0]):.2f} ms; slowest of the first 3 under the profiler "
              f"{statistics.median(cols[1]):.2f} ms; first after it {statistics.median(cols[2]):.2f} ms "
              f"(then {statistics.median(cols[3]):.2f} ms); rounds: "
              + ", ".join(f"{r[2]:.1f}" for r in rows))


if __name__ == "__main__":
    main()
