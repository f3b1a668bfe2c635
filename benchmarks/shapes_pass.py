"""What reading operators' shapes costs: loading a trace that recorded them three ways, side by
side, round by round.

    python benchmarks/shapes_pass.py [TRACE] [--rounds N]

- ``no shapes``: the load with the operators' shapes left unread (``columns._op_columns``
  replaced by an empty table), the floor;
- ``one pass``: as shipped: the typed decode reads the shapes' raw text with the events
  (``schema.OpArgs``) and :func:`~gpumagic.trace.columns.extract` decodes the operators' only;
- ``second pass``: as before issue 28: the events without shapes, then a second decode of the
  whole text for the shapes (``ops.attach``), kept for lenient and repaired decodes.

The default trace is the ResNet-50 fixture (75k events, 23.6k operators with shapes, 35 MB of
JSON). All three run in this process, alternated, on the same bytes; the tables of the last two are
checked equal. Prints each median and the ratios to ``no shapes``, and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_TRACE = REPO / "tests" / "data" / "resnet50_v100_workers0.json.gz"


def main() -> int:
    from gpumagic.trace import columns, kineto
    from gpumagic.trace.files import read_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=str(DEFAULT_TRACE))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    raw = read_bytes(args.trace)
    shipped = columns._op_columns

    def empty(kind, op_args):
        return columns.OpColumns(np.zeros(0, np.int64), np.zeros(0), [], [], [])

    def second_pass(kind, op_args):
        return None  # Part.ops None: kineto falls back to ops.attach, the second decode

    modes = {"no shapes": empty, "one pass": shipped, "second pass": second_pass}
    times: dict[str, list[float]] = {k: [] for k in modes}
    tables = {}
    for r in range(args.rounds):
        for label in (list(modes) if r % 2 == 0 else list(reversed(modes))):
            columns._op_columns = modes[label]
            t0 = time.perf_counter()
            trace = kineto.from_bytes(raw, args.trace)
            times[label].append(time.perf_counter() - t0)
            tables[label] = trace.ops
    columns._op_columns = shipped
    a, b = tables["one pass"], tables["second pass"]
    assert tables["no shapes"] is None and a is not None and b is not None
    assert a.name == b.name and a.dims == b.dims and (a.ts_ns == b.ts_ns).all() and (a.lane == b.lane).all()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{os.path.basename(args.trace)}: {len(a):,} operators with shapes; {args.rounds} rounds; "
          f"1-minute load average {os.getloadavg()[0]:.1f} (on a busy machine read the ratios)")
    for label, m in med.items():
        print(f"{label:>12}: median {m:.3f} s  ({m / med['no shapes']:.2f}x no shapes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
