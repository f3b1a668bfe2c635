"""What reading operators' shapes costs: loading a trace that recorded them, with and without the
second pass (``gpumagic.trace.ops``), side by side, round by round.

    python benchmarks/shapes_pass.py [TRACE] [--rounds N]

The default trace is the ResNet-50 fixture (75k events, 23.6k operators with shapes, 35 MB of
JSON). A trace without shapes skips the pass after one byte search, so its cost is not measured.
Prints the median of each and their ratio; both run in this process, alternated, on the same bytes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_TRACE = REPO / "tests" / "data" / "resnet50_v100_workers0.json.gz"


def main() -> int:
    from gpumagic.trace import kineto, ops
    from gpumagic.trace.files import read_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=str(DEFAULT_TRACE))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    raw = read_bytes(args.trace)
    original = ops.attach
    times: dict[str, list[float]] = {"without the shapes pass": [], "with the shapes pass": []}
    for _ in range(args.rounds):
        for label in times:
            ops.attach = original if label.startswith("with ") else (lambda trace, raw: None)
            t0 = time.perf_counter()
            trace = kineto.from_bytes(raw, args.trace)
            times[label].append(time.perf_counter() - t0)
            assert (trace.ops is not None) == label.startswith("with ")
    ops.attach = original
    med = {k: statistics.median(v) for k, v in times.items()}
    for label, m in med.items():
        print(f"{label:>26}: median {m:.3f} s over {args.rounds} rounds")
    print(f"ratio with / without: {med['with the shapes pass'] / med['without the shapes pass']:.2f}x "
          f"({len(trace.ops):,} operators with shapes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
