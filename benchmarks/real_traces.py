"""``gpumagic analyze`` against a bare typed decode and HolisticTraceAnalysis, on every real trace.

Every real trace in ``tests/data`` (the shared NVIDIA and AMD ones; or the files given), and
larger inputs built by repeating a real trace's events end to end (timestamps shifted by the
trace's span, correlation/flow ids made unique: ``analyze_speed.repeat_trace``; no event is
synthesised). Each contender is a whole process (interpreter start-up included), the
contenders alternated round by round so that the machine's noise hits all of them alike:

- ``gpumagic``: ``python -m gpumagic analyze FILE --format json -o /dev/null`` (default ``-j``);
- ``typed decode``: gunzip + a msgspec decode of each event's ``ph name cat ts dur pid tid``
  (``analyze_speed.TYPED_DECODE``), nothing else;
- ``start-up``: ``python -c "import numpy, msgspec"``, the floor under any numpy-based
  analysis of a small file (printed so that the ratio on a tiny trace can be read; the summary
  counts the files where it alone exceeds 1.5 typed decodes, where the target is out of reach);
- ``HTA``: HolisticTraceAnalysis's ``TraceAnalysis`` load + temporal breakdown + idle-time
  breakdown (``analyze_speed.HTA``), when ``hta`` is importable;
- ``HTA critical path``: ``TraceAnalysis`` load + ``critical_path_analysis`` over all the
  ``ProfilerStep`` instances (the whole trace when it has none, as gpumagic's window); its own
  seconds in ``critical_path_analysis`` are printed beside gpumagic's seconds in
  ``metrics.critical_path`` (``--critical-path``, on by default when ``hta`` is importable).

Every figure is printed with the 1-minute load average beside it: on a shared machine the
absolute times are not a quiet machine's; the ratios, of interleaved runs, are the figures to read.
Each process's CPU seconds (user + system, with every process it forked) are printed too: under
load they vary less than the wall clock. gpumagic forks piece decoders for a file of 16 MB or more
(two cores here), so its wall time can be below its CPU time.
Targets (issue 28): gpumagic ≤ 1.5× the typed decode, and ≥ 10× faster than HTA, on every file.
``--ref FOLDER`` adds another checkout's ``gpumagic`` (e.g. the previous commit's, from ``git
archive``; compile it first) as one more contender, for a before/after of the wall and CPU times. Each
gpumagic contender runs in its own checkout's folder (see :func:`timed`).
Run: ``python benchmarks/real_traces.py [--rounds 3] [--no-hta] [--repeat-rounds 1] [--ref FOLDER] [FILES...]``
(HTA: ``pip install -e .[benchmark]``, which pins HolisticTraceAnalysis 0.5 and pandas < 3:
HTA 0.5's critical path calls a pandas API that pandas 3 removed).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from analyze_speed import HTA, TYPED_DECODE, json_size, repeat_trace  # noqa: E402
from compare_reports import checkout_env  # noqa: E402

ROOT = os.path.dirname(HERE)
DATA = os.path.join(ROOT, "tests", "data")

#: (source trace, copies): the larger inputs, each a real trace's events repeated end to end.
REPEATS = (("mi300_vllm_decode_fullgraph_capture.json.gz", 4),  # AMD MI300X, ~109 MB
           ("mi300_falconsai_infer.json.gz", 40),  # AMD MI300X, one ProfilerStep repeated: ~57 MB
           ("v100_large_216k_events.json.gz", 2),  # NVIDIA V100, ~107 MB
           # NVIDIA V100, ~270 MB: past pieces.EARLY_MIN_BYTES, so decoding starts while it inflates
           ("v100_large_216k_events.json.gz", 5))

HTA_CP = """
import sys, time, warnings, logging
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
rank = sorted(a.t.traces)[0]
steps = [n for n in a.t.symbol_table.sym_table if isinstance(n, str) and n.startswith("ProfilerStep#")]
# all the steps, as gpumagic's window; a trace without steps: the whole trace (annotation "")
annotation, instance = ("ProfilerStep", (0, len(steps) - 1) if len(steps) > 1 else 0) if steps else ("", 0)
t = time.perf_counter()
graph, ok = a.critical_path_analysis(rank=rank, annotation=annotation, instance_id=instance)
print(time.perf_counter() - t if ok else "nan")
"""

GPUMAGIC_CP = """
import sys, time
from gpumagic.analysis.context import build_context
from gpumagic.analysis.metrics import critical_path_metrics
from gpumagic.trace import load
ctx = build_context(load(sys.argv[1]))
t = time.perf_counter()
critical_path_metrics(ctx)
print(time.perf_counter() - t)
"""


def load_avg() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def timed(cmd: list[str], checkout: str | None = None) -> tuple[float | None, float, str]:
    """(wall seconds of the whole process, its CPU seconds with every process it forked, its last
    line of standard output); None on failure. With ``checkout``, the process imports that
    folder's gpumagic: it runs there, with the folder first on ``PYTHONPATH``
    (:func:`compare_reports.checkout_env`)."""
    env = checkout_env(checkout) if checkout else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=checkout, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if p.returncode:
        return None, cpu, p.stderr.strip().splitlines()[-1][:160] if p.stderr.strip() else f"exit {p.returncode}"
    lines = p.stdout.strip().splitlines()
    return wall, cpu, lines[-1] if lines else ""


def contenders(py: str, trace: str, tmp: str, hta: bool, critical: bool, ref: str = "") -> dict[str, list[str]]:
    out = {"gpumagic": [py, "-m", "gpumagic", "analyze", trace, "--format", "json", "-o", os.devnull],
           "typed decode": [py, "-c", TYPED_DECODE, trace],
           # the floor: the interpreter with numpy and msgspec, numpy's OpenBLAS held to one thread
           # as the gpumagic command holds it (shells.cli.run)
           "start-up": [py, "-c", "import os; os.environ.setdefault('OPENBLAS_NUM_THREADS', '1'); import numpy, msgspec"]}
    if ref:
        out["gpumagic ref"] = list(out["gpumagic"])
    if hta:
        folder = os.path.join(tmp, "hta-" + os.path.basename(trace).split(".")[0])
        os.makedirs(folder, exist_ok=True)
        dst = os.path.join(folder, "rank-0.json.gz")
        if not os.path.exists(dst):
            shutil.copy(trace, dst)
        out["HTA"] = [py, "-c", HTA, folder]
        if critical:
            out["HTA critical path"] = [py, "-c", HTA_CP, folder]
    if critical:
        out["gpumagic critical path"] = [py, "-c", GPUMAGIC_CP, trace]
    return out


def bench(trace: str, rounds: int, tmp: str, py: str, hta: bool, critical: bool, title: str = "", ref: str = "") -> dict:
    cmds = contenders(py, trace, tmp, hta, critical, ref)
    # the contenders that run gpumagic's code, and the checkout each imports
    where = {"gpumagic": ROOT, "gpumagic critical path": ROOT, "gpumagic ref": ref}
    walls: dict[str, list[float]] = {k: [] for k in cmds}
    cpus: dict[str, list[float]] = {k: [] for k in cmds}
    inner: dict[str, list[float]] = {k: [] for k in cmds}
    errors: dict[str, str] = {}
    loads = []
    for r in range(rounds):
        order = list(cmds) if r % 2 == 0 else list(reversed(cmds))
        for name in order:
            wall, cpu, last = timed(cmds[name], where.get(name))
            if wall is None:
                errors[name] = last
                continue
            walls[name].append(wall)
            cpus[name].append(cpu)
            with contextlib.suppress(ValueError):  # the child's own seconds, when it prints them
                inner[name].append(float(last))
        loads.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in walls.items() if v}
    cpu = {k: statistics.median(v) for k, v in cpus.items() if v}
    mb = json_size(trace) / 1e6
    g, d = med.get("gpumagic"), med.get("typed decode")
    line = f"{title or os.path.basename(trace):44s} {mb:7.1f} MB"
    if g and d:
        line += (f"  gpumagic {g:6.2f} s  decode {d:6.2f} s  start-up {med.get('start-up', float('nan')):4.2f} s"
                 f"  gpumagic/decode {g / d:5.2f}x wall, {cpu['gpumagic'] / cpu['typed decode']:5.2f}x CPU"
                 f" ({cpu['gpumagic']:.2f} / {cpu['typed decode']:.2f} s; start-up {cpu.get('start-up', float('nan')):.2f} s)")
    if "gpumagic ref" in cpu and cpu.get("typed decode"):
        line += (f"  ref {med['gpumagic ref']:.2f} s wall, {cpu['gpumagic ref']:.2f} s CPU = "
                 f"{cpu['gpumagic ref'] / cpu['typed decode']:5.2f}x decode"
                 f" (this/ref {g / med['gpumagic ref']:.2f} wall, {cpu['gpumagic'] / cpu['gpumagic ref']:.2f} CPU)")
    if "HTA" in med and g:
        line += f"  HTA {med['HTA']:6.1f} s  HTA/gpumagic {med['HTA'] / g:5.1f}x"
    elif hta:
        line += f"  HTA failed: {errors.get('HTA', '?')}"
    line += f"  [{rounds} rounds, load {min(loads):.1f}-{max(loads):.1f}]"
    print(line, flush=True)
    if critical:
        gi = [x for x in inner.get("gpumagic critical path", []) if x == x]
        hi = [x for x in inner.get("HTA critical path", []) if x == x]
        cp = "    critical path: gpumagic metrics.critical_path "
        cp += f"{statistics.median(gi) * 1000:7.1f} ms" if gi else "-"
        if hi:
            h = statistics.median(hi)
            cp += f"  HTA critical_path_analysis {h:7.2f} s  ratio {h / statistics.median(gi):6.0f}x" if gi else ""
            whole = med["HTA critical path"]
            cp += f"  (whole processes: HTA load+cp {whole:6.1f} s vs gpumagic analyze {g:5.2f} s = {whole / g:5.1f}x)"
        elif hta:
            cp += f"  HTA critical path: {errors.get('HTA critical path', 'no annotation to analyse')}"
        print(cp, flush=True)
    return {"gpumagic": g, "decode": d, "hta": med.get("HTA"), "errors": errors, "start-up": med.get("start-up"),
            "cpu": cpu.get("gpumagic", 0) / cpu["typed decode"] if cpu.get("typed decode") else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat-rounds", type=int, default=1, help="rounds on the larger, repeated inputs")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--no-critical-path", action="store_true")
    ap.add_argument("--no-repeats", action="store_true")
    ap.add_argument("--ref", default="", help="also time another checkout's gpumagic (a folder holding gpumagic/, put "
                                               "first on PYTHONPATH), alternated with this one: a before/after of CPU ratios")
    args = ap.parse_args()
    py = sys.executable
    hta = not args.no_hta and importlib.util.find_spec("hta") is not None
    if not args.no_hta and not hta:
        print("HTA not installed (pip install -e .[benchmark]): HTA columns skipped")
    critical = not args.no_critical_path
    ref = os.path.abspath(args.ref) if args.ref else ""
    if ref and os.path.realpath(ref) == os.path.realpath(ROOT):
        sys.exit("real_traces: --ref is this checkout itself")
    # PYTHONDONTWRITEBYTECODE=1 (as on this project's machines) would recompile a checkout's
    # modules in every run (0.1 to 0.2 s of CPU here): compile both, or the side without .pyc
    # files (a fresh `git archive` for --ref) is timed compiling
    for checkout in (ROOT, ref) if ref else (ROOT,):
        subprocess.run([py, "-m", "compileall", "-q", os.path.join(checkout, "gpumagic")], check=True)
    files = [os.path.abspath(f) for f in args.files] or sorted(glob.glob(os.path.join(DATA, "*.json.gz")), key=os.path.getsize)
    print(f"{os.cpu_count()} cores, {load_avg()} at the start (a shared machine: absolute times are under load; "
          f"read the ratios of interleaved runs)")
    tmp = tempfile.mkdtemp(prefix="gpumagic-real-")
    results = {}
    try:
        for f in files:
            results[os.path.basename(f)] = bench(f, args.rounds, tmp, py, hta, critical, ref=ref)
        if not args.no_repeats and not args.files:
            for src, copies in REPEATS:
                dst = os.path.join(tmp, src.replace(".json.gz", f"_x{copies}.json.gz"))
                events, _ = repeat_trace(os.path.join(DATA, src), copies, dst)
                title = f"{src.split('.')[0]} x{copies} ({events:,} ev)"
                results[title] = bench(dst, args.repeat_rounds, tmp, py, hta, critical, title, ref=ref)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratios = [r["gpumagic"] / r["decode"] for r in results.values() if r["gpumagic"] and r["decode"]]
    hta_x = [r["hta"] / r["gpumagic"] for r in results.values() if r["hta"] and r["gpumagic"]]
    cpu_ratios = [r["cpu"] for r in results.values() if r["cpu"]]
    print(f"\ngpumagic / typed decode: {min(ratios):.2f}x to {max(ratios):.2f}x wall, {min(cpu_ratios):.2f}x to "
          f"{max(cpu_ratios):.2f}x CPU (target <= 1.5 on every file)")
    # the interpreter with numpy and msgspec, before any byte is read: where it alone is more
    # than 1.5 typed decodes, no numpy-based analysis can meet the target on that file
    floor = {t: r["start-up"] / r["decode"] for t, r in results.items() if r.get("start-up") and r["decode"]}
    out_of_reach = sorted((t for t, x in floor.items() if x > 1.5), key=floor.__getitem__)
    if floor:
        print(f"start-up alone / typed decode: {min(floor.values()):.2f}x to {max(floor.values()):.2f}x; over 1.5x "
              f"(the target out of reach for any numpy-based analysis) on {len(out_of_reach)} of {len(floor)} file(s)"
              + (f" (the nearest to 1.5x: {out_of_reach[0]}, {floor[out_of_reach[0]]:.2f}x)" if out_of_reach else ""))
    if hta_x:
        print(f"HTA / gpumagic: {min(hta_x):.1f}x to {max(hta_x):.1f}x (target >= 10 on every file); "
              f"HTA failed on {sum(1 for r in results.values() if 'HTA' in r['errors'])} file(s)")
    print(f"{load_avg()} at the end")


if __name__ == "__main__":
    main()
