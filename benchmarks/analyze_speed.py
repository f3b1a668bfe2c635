"""Speed and memory of ``gpumagic analyze`` on the 216k-event fixture, side by side in one run.

Each contender runs as its own process (interpreter start-up included), alternated round by
round so that machine noise hits all of them alike; the script prints medians and the ratios:

- ``gpumagic``: ``python -m gpumagic analyze FILE --format json -o /dev/null`` (by default the
  pieces of a large file are decoded side by side, one process per core)
- ``gpumagic -j 1``: the same in one process
- ``typed decode``: gunzip + msgspec decode of the whole file, in one process, with the schema
  gpumagic decodes first (``FAST_DECODER``), nothing else
- ``HTA``: HolisticTraceAnalysis (when installed): load + temporal breakdown + idle time breakdown

gpumagic's modules are byte-compiled first (as ``pip install`` does), as HTA's and numpy's are.

Targets (issue 2): gpumagic ≤ 2× the typed decode, ≥ 8× faster than HTA, peak memory ≤ 4× the
uncompressed JSON (summed over gpumagic's processes when it decodes in pieces). Run: ``python benchmarks/analyze_speed.py [--rounds 5] [TRACE]``.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "..", "tests", "data", "v100_large_216k_events.json.gz")

TYPED_DECODE = """
import gzip, sys
from gpumagic.trace.schema import FAST_DECODER
with open(sys.argv[1], 'rb') as fh:
    FAST_DECODER.decode(gzip.decompress(fh.read()))
"""

HTA = """
import sys, warnings
warnings.filterwarnings('ignore')
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
ranks = sorted(a.t.traces)
a.get_temporal_breakdown(visualize=False)
a.get_idle_time_breakdown(ranks=ranks, visualize=False)
"""

PEAK_RSS = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def _children(root: int) -> list[int]:
    """``root`` and its descendants, from /proc."""
    parent: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parent.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parent.get(pid, []))
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_pss(cmd: list[str]) -> int:
    """The peak, polled every millisecond, of the proportional set size summed over the
    command's processes (PSS counts a page shared by k processes as 1/k to each, so the sum is
    the memory the whole tree uses; a forked child's shared copy of the text is not counted
    twice). Linux only; 0 elsewhere."""
    if not os.path.exists("/proc/self/smaps_rollup"):
        return 0
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, sum(_pss(p) for p in _children(proc.pid)))
        time.sleep(0.001)
    return peak


def run(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    trace = os.path.abspath(args.trace)
    with gzip.open(trace, "rb") as fh:
        json_bytes = len(fh.read())
    py = sys.executable
    # pip compiles an installed package's modules to bytecode; an editable checkout run with
    # PYTHONDONTWRITEBYTECODE=1 (as on this project's machines) would recompile gpumagic in
    # every process. Compile once, as an install would, so that all contenders start alike.
    package = os.path.join(HERE, "..", "gpumagic")
    subprocess.run([py, "-m", "compileall", "-q", package], check=True)
    contenders = {
        "gpumagic analyze": [py, "-m", "gpumagic", "analyze", trace, "--format", "json", "-o", os.devnull],
        "gpumagic -j 1": [py, "-m", "gpumagic", "analyze", trace, "--format", "json", "-o", os.devnull, "-j", "1"],
        "typed decode": [py, "-c", TYPED_DECODE, trace],
    }
    tmp = tempfile.mkdtemp()
    if importlib.util.find_spec("hta") is not None:
        shutil.copy(trace, os.path.join(tmp, "rank-1.json.gz"))
        contenders["HTA 0.5"] = [py, "-c", HTA, tmp]
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        for name, cmd in contenders.items():
            times[name].append(run(cmd))
    shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    peak = int(subprocess.run([py, "-c", PEAK_RSS, *contenders["gpumagic analyze"]], check=True,
                              capture_output=True, text=True).stdout.strip())
    print(f"trace: {os.path.basename(trace)} ({json_bytes / 1e6:.1f} MB of JSON), {args.rounds} rounds, medians of whole processes,"
          f" {os.cpu_count()} cores")
    for k, v in med.items():
        print(f"  {k:18s} {v:7.3f} s   (runs: {', '.join(f'{x:.2f}' for x in times[k])})")
    print(f"gpumagic / typed decode = {med['gpumagic analyze'] / med['typed decode']:.2f}x   (target <= 2)")
    if "HTA 0.5" in med:
        print(f"HTA / gpumagic          = {med['HTA 0.5'] / med['gpumagic analyze']:.1f}x   (target >= 8)")
        print(f"HTA / gpumagic -j 1     = {med['HTA 0.5'] / med['gpumagic -j 1']:.1f}x   (one process)")
    else:
        print("HTA not installed (pip install HolisticTraceAnalysis==0.5.0) - skipped")
    print(f"peak RSS of gpumagic analyze (its largest process) = {peak / 1e6:.0f} MB = {peak / json_bytes:.2f}x the JSON")
    pss = max(peak_pss(contenders["gpumagic analyze"]) for _ in range(3))
    if pss:
        print(f"peak memory of gpumagic analyze, all its processes (summed PSS, max of 3 runs) = {pss / 1e6:.0f} MB"
              f" = {pss / json_bytes:.2f}x the JSON   (target <= 4)")


if __name__ == "__main__":
    main()
