"""What the critical path (``metrics.critical_path``) adds to ``gpumagic analyze``.

Two contenders, each a whole process (interpreter start-up, load and analysis), alternated
round by round so that machine noise hits both alike:

- ``with``: ``gpumagic.analyze(FILE)`` as shipped;
- ``without``: the same with the critical path replaced by a constant (no walk, no host
  timeline; the rules' caps then change nothing).

Prints each contender's median wall time and the ratio with ÷ without. Target (issue 25): at
most 1.15 on the 216k-event V100 fixture (54 MB of JSON), the default TRACE.
Run: ``python benchmarks/critical_path_speed.py [--rounds 7] [TRACE]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "..", "tests", "data", "v100_large_216k_events.json.gz")

CHILD = """
import sys
import gpumagic.analysis.metrics as metrics
from gpumagic.analysis.critical_path import KINDS
if sys.argv[2] == "without":
    stub = {"kinds": list(KINDS), "frac": dict.fromkeys(KINDS, 1.0), "ms": dict.fromkeys(KINDS, 0.0),
            "per_step_ms": [], "per_step_bound": [], "bound": None, "top": [], "host_unrecorded_ms": 0.0,
            "links": {}, "notes": []}
    metrics.critical_path_metrics = lambda ctx: stub
from gpumagic import analyze
analyze(sys.argv[1])
"""


def run(trace: str, mode: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHILD, trace, mode], check=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    run(args.trace, "with")  # warm the page cache and byte-compile
    times: dict[str, list[float]] = {"with": [], "without": []}
    for i in range(args.rounds):
        for mode in (("with", "without") if i % 2 == 0 else ("without", "with")):
            times[mode].append(run(args.trace, mode))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"trace: {os.path.basename(args.trace)}, {args.rounds} rounds, whole processes")
    for k, v in med.items():
        print(f"  {k:<8} median {v:.3f} s  (runs: {', '.join(f'{x:.3f}' for x in times[k])})")
    print(f"  ratio with / without: {med['with'] / med['without']:.3f} (target ≤ 1.15)")


if __name__ == "__main__":
    main()
