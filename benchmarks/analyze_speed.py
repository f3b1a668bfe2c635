"""Speed and memory of ``gpumagic analyze`` on NVIDIA, AMD ROCm and 1 GB traces, side by side in one run.

Each contender runs as its own process (interpreter start-up included), alternated round by
round so that machine noise hits all of them alike; the script prints medians, MB/s of inflated
JSON and the ratios:

- ``gpumagic``: ``python -m gpumagic analyze FILE --format json -o /dev/null`` (by default runs of
  pieces of a large file are decoded side by side, one process per core)
- ``gpumagic -j 1``: the same in one process
- ``typed decode``: the bare typed decode: gunzip (with the same library gpumagic uses: ISA-L when
  installed, else zlib) plus a msgspec decode of each event's ``ph``, ``name``, ``cat``, ``ts``,
  ``dur``, ``pid``, ``tid`` (no ``args``), in one process, nothing else
- ``HTA``: HolisticTraceAnalysis (when installed): load + temporal breakdown + idle time breakdown

Cases (``--cases``, all by default):

- ``nvidia``: the 216k-event V100 fixture (54 MB of JSON), or the TRACE given;
- ``rocm``: the MI300X fixture (``"bytes"`` written as strings, as ROCm's roctracer does)
  repeated end to end to ~60 MB, with shifted timestamps and unique ids;
- ``1gb``: the 216k-event fixture repeated 20 times (~1 GB of JSON), gpumagic and the typed
  decode only, ``--big-rounds`` rounds (1 by default: it is heavy); the memory of each whole
  process tree (parent and piece workers, summed PSS) is sampled while the timed run goes.

The repeated inputs are built on the fly in a temporary folder, and removed afterwards.
gpumagic's modules are byte-compiled first (as ``pip install`` does), as HTA's and numpy's are.

Targets (issues 2 and 13): gpumagic ≤ 2× the typed decode on NVIDIA and ROCm, ≤ 1.6× at 1 GB;
≥ 8× faster than HTA; peak memory ≤ 4× the JSON (≤ 2.5× at 1 GB).
Run: ``python benchmarks/analyze_speed.py [--rounds 5] [--cases nvidia,rocm,1gb] [TRACE]``.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data")
DEFAULT = os.path.join(DATA, "v100_large_216k_events.json.gz")
ROCM = os.path.join(DATA, "mi300_bert_small_infer.json.gz")

TYPED_DECODE = """
import sys
import msgspec
try:
    from isal.isal_zlib import decompress
except ImportError:
    from zlib import decompress

class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str | None = None
    ts: float = 0.0
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0

class File(msgspec.Struct):
    traceEvents: list[Event] = []

with open(sys.argv[1], 'rb') as fh:
    msgspec.json.Decoder(File, strict=False).decode(decompress(fh.read(), wbits=31))
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

#: Per-event args that number things across the trace; shifted in each repetition so that the
#: copies do not share ids.
ID_ARGS = ("correlation", "External id", "Ev Idx", "Python id", "Python parent id")


def repeat_trace(src: str, copies: int, dst: str) -> tuple[int, int]:
    """Write ``src`` repeated ``copies`` times end to end as one gzip trace: timestamps shifted
    by the span of the trace each time, correlation/external/flow ids made unique. Metadata
    events are written once. Returns (events, bytes of JSON)."""
    import msgspec

    with gzip.open(src, "rb") as fh:
        d = json.load(fh)
    events = d.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    ends = [float(e.get("ts", 0)) + float(e.get("dur", 0) or 0) for e in body]
    starts = [float(e.get("ts", 0)) for e in body]
    span = max(ends) - min(starts) + 1000.0
    id_span = 1 + max([int(e["id"]) for e in body if isinstance(e.get("id"), int)] +
                      [int(v) for e in body for k, v in (e.get("args") or {}).items() if k in ID_ARGS and isinstance(v, int)] + [0])
    enc = msgspec.json.Encoder()
    total, n = 0, 0
    with gzip.open(dst, "wb", compresslevel=6) as out:
        head = enc.encode(d)[:-1] + (b',"traceEvents":[' if d else b'{"traceEvents":[')
        out.write(head)
        total += len(head)
        chunk = enc.encode(meta)[1:-1]
        out.write(chunk)
        total += len(chunk)
        n += len(meta)
        for k in range(copies):
            if k:
                for e in body:
                    e["ts"] = e["ts"] + span
                    if isinstance(e.get("id"), int):
                        e["id"] += id_span
                    args = e.get("args")
                    if args:
                        for key in ID_ARGS:
                            if isinstance(args.get(key), int) and args[key] >= 0:
                                args[key] += id_span
            chunk = b"," + enc.encode(body)[1:-1] if (meta or k) else enc.encode(body)[1:-1]
            out.write(chunk)
            total += len(chunk)
            n += len(body)
        out.write(b"]}")
        total += 2
    return n, total


def _children(root: int) -> list[int]:
    """``root`` and its descendants (from /proc/PID/task/TID/children, which the kernel keeps)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except OSError:
            continue
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


def _memfd_bytes(pids: list[int]) -> int:
    """The sizes of the in-memory files (``memfd_create``) the processes hold open, each counted
    once: a piece decoder leaves its result in one, which no process maps until the parent reads
    it, so PSS alone would miss it (while the parent maps it, it is counted twice: an upper bound)."""
    sizes: dict[int, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if os.readlink(path).startswith("/memfd:"):
                    st = os.stat(path)
                    sizes[st.st_ino] = st.st_size
            except OSError:
                continue
    return sum(sizes.values())


def timed_with_memory(cmd: list[str], interval: float = 0.02) -> tuple[float, int]:
    """(wall seconds, peak of the summed PSS of the command's whole process tree, plus the
    in-memory files it holds open (:func:`_memfd_bytes`), sampled every ``interval`` s while it
    runs). PSS counts a page shared by k processes as 1/k to each, so the sum is the memory the
    tree uses (a forked child's shared copy of the text is counted once). Linux only; the peak
    is 0 elsewhere."""
    peak = [0]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if os.path.exists("/proc/self/smaps_rollup"):
        def sample() -> None:
            while proc.poll() is None:
                tree = _children(proc.pid)
                peak[0] = max(peak[0], sum(_pss(p) for p in tree) + _memfd_bytes(tree))
                time.sleep(interval)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
    code = proc.wait()
    wall = time.perf_counter() - t
    if code:
        raise subprocess.CalledProcessError(code, cmd)
    return wall, peak[0]


def run(cmd: list[str]) -> float | None:
    t = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if p.returncode:
        print(f"  ! {cmd[2][:20] if cmd[1] == '-c' else ' '.join(cmd[1:4])} failed: {p.stderr.decode()[-300:]}")
        return None
    return time.perf_counter() - t


def contenders(py: str, trace: str, tmp: str, hta: bool, one_process: bool = True) -> dict[str, list[str]]:
    out = {"gpumagic analyze": [py, "-m", "gpumagic", "analyze", trace, "--format", "json", "-o", os.devnull]}
    if one_process:
        out["gpumagic -j 1"] = out["gpumagic analyze"] + ["-j", "1"]
    out["typed decode"] = [py, "-c", TYPED_DECODE, trace]
    if hta and importlib.util.find_spec("hta") is not None:
        folder = os.path.join(tmp, "hta-" + os.path.basename(trace).split(".")[0])
        os.makedirs(folder, exist_ok=True)
        shutil.copy(trace, os.path.join(folder, "rank-1.json.gz"))
        out["HTA 0.5"] = [py, "-c", HTA, folder]
    return out


def json_size(trace: str) -> int:
    size = 0
    with gzip.open(trace, "rb") as fh:
        while chunk := fh.read(64 << 20):
            size += len(chunk)
    return size


def bench_case(title: str, trace: str, rounds: int, tmp: str, py: str) -> None:
    """Speed (alternated rounds) and memory of the contenders on one trace, with ratios."""
    json_bytes = json_size(trace)
    cmds = contenders(py, trace, tmp, hta=True)
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(rounds):
        for name, cmd in cmds.items():
            t = run(cmd)
            if t is not None:
                times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print(f"\n== {title}: {os.path.basename(trace)}, {json_bytes / 1e6:.1f} MB of JSON, {rounds} rounds (medians of whole processes)")
    for k, v in med.items():
        print(f"  {k:18s} {v:7.3f} s  {json_bytes / 1e6 / v:6.0f} MB/s   (runs: {', '.join(f'{x:.2f}' for x in times[k])})")
    g = med["gpumagic analyze"]
    print(f"  gpumagic / typed decode = {g / med['typed decode']:.2f}x   (target <= 2)")
    if "gpumagic -j 1" in med:
        print(f"  gpumagic -j 1 / typed decode = {med['gpumagic -j 1'] / med['typed decode']:.2f}x")
    if "HTA 0.5" in med:
        print(f"  HTA / gpumagic = {med['HTA 0.5'] / g:.1f}x   (target >= 8);  HTA / gpumagic -j 1 = "
              f"{med['HTA 0.5'] / med['gpumagic -j 1']:.1f}x")
    elif importlib.util.find_spec("hta") is None:
        print("  HTA not installed (pip install HolisticTraceAnalysis==0.5.0) - skipped")
    peak = int(subprocess.run([py, "-c", PEAK_RSS, *cmds["gpumagic analyze"]], check=True,
                              capture_output=True, text=True).stdout.strip())
    print(f"  peak RSS of gpumagic analyze (its largest process) = {peak / 1e6:.0f} MB = {peak / json_bytes:.2f}x the JSON")
    pss = max(timed_with_memory(cmds["gpumagic analyze"], 0.001)[1] for _ in range(3))
    if pss:
        print(f"  peak memory of gpumagic analyze, all its processes (summed PSS, max of 3 runs) = {pss / 1e6:.0f} MB"
              f" = {pss / json_bytes:.2f}x the JSON   (target <= 4)")


def bench_big(trace: str, rounds: int, py: str, check_answer: bool = True) -> None:
    """The ~1 GB case: gpumagic and the typed decode, each timed with its memory sampled."""
    json_bytes = json_size(trace)
    cmds = {"gpumagic analyze": [py, "-m", "gpumagic", "analyze", trace, "--format", "json", "-o", os.devnull],
            "typed decode": [py, "-c", TYPED_DECODE, trace]}
    res: dict[str, list[tuple[float, int]]] = {k: [] for k in cmds}
    for _ in range(rounds):
        for name, cmd in cmds.items():
            res[name].append(timed_with_memory(cmd))
    print(f"\n== 1 GB: the 216k-event fixture x20, {json_bytes / 1e6:.0f} MB of JSON, "
          f"{os.path.getsize(trace) / 1e6:.0f} MB gzip ({json_bytes / os.path.getsize(trace):.1f}:1), {rounds} round(s)")
    med = {}
    for k, v in res.items():
        med[k] = statistics.median(t for t, _ in v)
        peak = max(m for _, m in v)
        print(f"  {k:18s} {med[k]:7.2f} s  {json_bytes / 1e6 / med[k]:6.0f} MB/s   peak memory (summed PSS, sampled) "
              f"{peak / 1e9:.2f} GB = {peak / json_bytes:.2f}x the JSON")
    print(f"  gpumagic / typed decode = {med['gpumagic analyze'] / med['typed decode']:.2f}x   (target <= 1.6);"
          f" memory target <= 2.0x the JSON (issue 28); 1-minute load average {os.getloadavg()[0]:.1f}"
          + (" (under load: not a quiet machine)" if os.getloadavg()[0] > 0.5 else ""))
    if check_answer:
        same = _report(py, trace, []) == _report(py, trace, ["-j", "1"])
        print(f"  report identical to -j 1 (JSON, byte for byte): {'yes' if same else 'NO'}")


def _report(py: str, trace: str, extra: list[str]) -> bytes:
    return subprocess.run([py, "-m", "gpumagic", "analyze", trace, "--format", "json", *extra],
                          check=True, capture_output=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--big-rounds", type=int, default=1)
    ap.add_argument("--cases", default="nvidia,rocm,1gb")
    ap.add_argument("--big", help="the 1 GB input: built there when missing and kept (never in the checkout)")
    ap.add_argument("--no-answer-check", action="store_true", help="skip comparing the 1 GB report with -j 1's")
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    py = sys.executable
    # pip compiles an installed package's modules to bytecode; an editable checkout run with
    # PYTHONDONTWRITEBYTECODE=1 (as on this project's machines) would recompile gpumagic in
    # every process. Compile once, as an install would, so that all contenders start alike.
    subprocess.run([py, "-m", "compileall", "-q", os.path.join(HERE, "..", "gpumagic")], check=True)
    inflate = "ISA-L (isal)" if importlib.util.find_spec("isal") else "zlib"
    print(f"{os.cpu_count()} cores; gunzip by {inflate} for gpumagic and the typed decode alike")
    tmp = tempfile.mkdtemp(prefix="gpumagic-bench-")
    try:
        if "nvidia" in cases:
            bench_case("NVIDIA", os.path.abspath(args.trace), args.rounds, tmp, py)
        if "rocm" in cases:
            rocm = os.path.join(tmp, "mi300_bert_small_x88.json.gz")
            events, size = repeat_trace(ROCM, 88, rocm)
            print(f"\n(built the ROCm input: mi300_bert_small_infer x88 = {events:,} events, {size / 1e6:.0f} MB of JSON)")
            bench_case("AMD MI300X (ROCm)", rocm, args.rounds, tmp, py)
        if "1gb" in cases:
            big = args.big or os.path.join(tmp, "v100_216k_x20.json.gz")
            if not os.path.exists(big):
                events, size = repeat_trace(DEFAULT, 20, big)
                print(f"\n(built the 1 GB input: v100_large_216k_events x20 = {events:,} events, {size / 1e6:.0f} MB of JSON)")
            bench_big(big, args.big_rounds, py, check_answer=not args.no_answer_check)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
