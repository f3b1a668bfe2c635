"""A 32-rank job built from a real rank trace, analysed three ways, side by side in one run.

The job: 32 copies of ``tests/data/a100_training_rank0.json.gz`` (rank 0 of a real 16-GPU A100 job,
109k events, 26 MB of JSON each) with their rank ids changed and a straggler injected on rank 5 by
``tests/jobbuilder.py``. Contenders, each a fresh interpreter, alternated round by round:

- ``1 process``: ``gpumagic.analyze_job(files, jobs=1)``: the ranks one after another;
- ``1 process, kept heap``: the same, after the ``mallopt(M_TOP_PAD)`` that each pool worker makes
  (``executors._keep_freed_memory``: glibc keeps freed memory for the next rank). The caller's
  process keeps its allocator's defaults, so ``1 process`` is what ``jobs=1`` costs; this one
  shows how much of the pool's speed-up is that setting rather than the second core;
- ``2 processes``: ``analyze_job(files, jobs=2)``: a local process pool;
- ``LocalCluster``: ``analyze_job(files, client=Client(LocalCluster(n_workers=2, threads_per_worker=1)))``:
  two Dask worker processes (the cluster's start-up is timed apart from the analysis);
- ``one rank``: ``summarize(file)`` on one rank file, in one process: the reference for the memory
  a process needs.

For each: the median wall time of the analysis (inside the process, after imports), and the peak
resident memory (``getrusage``'s ``ru_maxrss``, which each pool worker reports itself; VmHWM from /proc, polled
every quarter second, for a cluster's workers) of the largest process of the tree, next to the number
of processes. The claim checked: peak memory per process stays that of one rank's analysis, however
many ranks the job has. Linux only (it reads /proc).

Also printed: the 1-minute load average during the runs (the figures of a busy machine are not an
idle one's: read the ratios, of interleaved runs), the parent process's own CPU seconds (what of
the job serialises on it: reading the workers' summaries, building the job view) and whether the
job reports are identical across the contenders.

Run: ``python benchmarks/job_speed.py [--ranks 32] [--rounds 3] [--source a100|v100|mi300] [--no-cluster] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")

RUN = """
import glob, json, os, pickle, sys, time
mode, folder = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(folder + "/rank*.json.gz"))
t_import = time.perf_counter()
from gpumagic.jobs import analyze_job, executors, model
from gpumagic.jobs.summary import summarize
import_s = time.perf_counter() - t_import
# the parent's phases: the executor (dispatch, waiting, each rank's arrival) and the job view
marks = {}
real_run_local, real_run_dask, real_build = executors.run_local, executors.run_dask, model.build
def timed(key, fn):
    def run(*args, **kwargs):
        t, c = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            marks[key] = (time.perf_counter() - t, time.process_time() - c)
    return run
executors.run_local = timed("ranks", real_run_local)
executors.run_dask = timed("ranks", real_run_dask)
model.build = timed("job view", real_build)
arrivals = []
progress = lambda done, total: arrivals.append(time.perf_counter())
# each pool worker (forked: these patches reach it) writes its own CPU seconds, lifetime and peak
# RSS after every rank, so that nothing has to poll the machine while the workers use every core
import resource
stats = os.environ.get("JOB_BENCH_STATS")
real_start, real_rank = executors._worker_start, executors._summarize_rank
born = {}
def worker_start(*args):
    born["t"] = time.perf_counter()
    real_start(*args)
def rank_and_report(index, path):
    try:
        return real_rank(index, path)
    finally:
        if stats:
            u = resource.getrusage(resource.RUSAGE_SELF)
            with open(os.path.join(stats, str(os.getpid())), "w") as fh:
                json.dump([u.ru_utime + u.ru_stime, time.perf_counter() - born.get("t", 0.0), u.ru_maxrss * 1024], fh)
executors._worker_start, executors._summarize_rank = worker_start, rank_and_report
if mode == "cluster":
    from distributed import Client, LocalCluster
    t = time.perf_counter()
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    start_s = time.perf_counter() - t
    t = t_job = time.perf_counter()
    job = analyze_job(files, client=client, progress=progress)
    wall = time.perf_counter() - t
    client.close(); cluster.close()
elif mode == "one":
    start_s = 0.0
    t = time.perf_counter()
    s = summarize(files[0])
    wall = time.perf_counter() - t
    job = None
else:
    start_s = 0.0
    if mode.endswith("k"):  # one process whose allocator keeps freed memory, as each pool worker's does
        executors._keep_freed_memory()
    t = t_job = time.perf_counter()
    job = analyze_job(files, jobs=int(mode.rstrip("k")), progress=progress)
    wall = time.perf_counter() - t
import hashlib
me = resource.getrusage(resource.RUSAGE_SELF)  # the parent alone (all its threads), not its workers
kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the largest waited-for descendant's peak
out = {"self_peak_bytes": me.ru_maxrss * 1024, "children_peak_bytes": kids.ru_maxrss * 1024,
       "wall_s": wall, "start_s": start_s, "parent_cpu_s": me.ru_utime + me.ru_stime, "import_s": import_s,
       "answer": hashlib.sha256(job.to_json().encode()).hexdigest()[:16] if job else None,
       "load": os.getloadavg()[0],
       "stragglers": job.stragglers if job else None, "ranks": len(job.analysed) if job else 1}
if job is not None:
    blobs = [pickle.dumps(r) for r in job.ranks]
    t = time.perf_counter()
    for b in blobs:
        pickle.loads(b)
    out.update(summary_bytes=sum(map(len, blobs)) / len(blobs), unpickle_all_s=time.perf_counter() - t,
               phases={k: list(v) for k, v in marks.items()},
               arrivals_s=[a - t_job for a in arrivals])  # each rank's arrival, from the job's start
print(json.dumps(out))
"""


def _descendants(root: int) -> list[int]:
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


def _hwm(pid: int) -> int:
    """Peak resident set size of ``pid`` so far (VmHWM), in bytes; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far (all its threads); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) * TICK_S


#: How often :func:`measure` reads /proc. Reading every process's stat and status costs about 1 ms of
#: CPU here, which a 20 ms poll took from the contender using both cores (6 % of a core, about
#: 0.5 s of a 9 s job), and not from the one-process contender, which leaves a core free: a bias
#: against the pool. Pool workers report their own figures (``JOB_BENCH_STATS``); the poll is
#: only needed for a Dask cluster's spawned workers, which live on idle after the job, so a slow
#: poll loses none of their CPU.
POLL_S = 0.25


def measure(mode: str, folder: str) -> dict:
    """Run one contender; its result plus the peak RSS of its largest process and how many it had,
    and each worker's CPU seconds and lifetime (reported by pool workers themselves; a cluster's
    polled from /proc every :data:`POLL_S`)."""
    with tempfile.TemporaryDirectory() as stats:
        proc = subprocess.Popen([sys.executable, "-c", RUN, mode, folder], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, cwd=ROOT,  # run here: -c puts the working directory first on sys.path
                                env={**os.environ, "PYTHONPATH": os.path.abspath(ROOT), "JOB_BENCH_STATS": stats})
        peaks: dict[int, int] = {}
        cpu: dict[int, float] = {}
        seen: dict[int, list[float]] = {}
        while proc.poll() is None:
            now = time.perf_counter()
            for pid in _descendants(proc.pid):
                peaks[pid] = max(peaks.get(pid, 0), _hwm(pid))
                used = _cpu_s(pid)
                if used is not None:
                    cpu[pid] = max(cpu.get(pid, 0.0), used)
                    seen.setdefault(pid, [now, now])[1] = now
            time.sleep(POLL_S)
        out = proc.stdout.read()
        reported = {}
        for name in os.listdir(stats):
            with open(os.path.join(stats, name)) as fh:
                reported[int(name)] = json.load(fh)
    if proc.returncode:
        raise SystemExit(f"{mode} failed with status {proc.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    for pid, (used, life, peak) in reported.items():  # exact: each pool worker's own last report
        cpu[pid], seen[pid], peaks[pid] = used, [0.0, life], max(peaks.get(pid, 0), peak)
    peaks[proc.pid] = max(peaks.get(proc.pid, 0), result["self_peak_bytes"])
    busy = {pid: p for pid, p in peaks.items() if p > 0}
    # the largest process: polled, reported, or the largest reaped child's (a cluster's workers)
    result["peak_bytes"] = max(max(busy.values()), result["children_peak_bytes"])
    result["processes"] = max(len(busy), 1 + len(reported))
    # the children that did work (a Dask nanny's worker, a pool worker; not a resource tracker)
    result["children"] = sorted(([cpu[pid], seen[pid][1] - seen[pid][0]] for pid in cpu
                                 if pid != proc.pid and cpu[pid] >= 0.2), reverse=True)
    return result


#: The real rank traces a job can be built from (tests/data): rank size is the other axis of scaling.
SOURCES = {"a100": "a100_training_rank0.json.gz",  # 109k events, 26 MB of JSON
           "v100": "v100_large_216k_events.json.gz",  # 216k events, 54 MB
           "mi300": "mi300_falconsai_infer.json.gz"}  # 5k events, 1.4 MB (AMD)


def build(folder: str, ranks: int, source: str = SOURCES["a100"]) -> None:
    if len([n for n in os.listdir(folder) if n.startswith("rank")]) == ranks:
        return
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from jobbuilder import DATA, build_job

    t = time.perf_counter()
    build_job(folder, ranks=ranks, source=os.path.join(DATA, source), straggler=5, delay_us=2000)
    print(f"built {ranks} rank traces in {folder} in {time.perf_counter() - t:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="job folder (default: a folder in the temp dir, per --ranks/--source)")
    ap.add_argument("--source", default="a100", choices=sorted(SOURCES), help="the real rank trace repeated")
    ap.add_argument("--no-cluster", action="store_true", help="skip the Dask LocalCluster")
    args = ap.parse_args()
    args.dir = args.dir or os.path.join(tempfile.gettempdir(), f"gpumagic-job-bench-{args.source}-{args.ranks}")
    os.makedirs(args.dir, exist_ok=True)
    build(args.dir, args.ranks, SOURCES[args.source])
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "gpumagic")], check=True)
    modes = {"1 process": "1", "1 process, kept heap": "1k", "2 processes": "2", "LocalCluster (2 workers)": "cluster",
             "one rank alone": "one"}
    if args.no_cluster:
        del modes["LocalCluster (2 workers)"]
    runs: dict[str, list[dict]] = {k: [] for k in modes}
    start_load = os.getloadavg()[0]
    for r in range(args.rounds):
        for name in (list(modes) if r % 2 == 0 else list(reversed(modes))):
            runs[name].append(measure(modes[name], args.dir))
    size = sum(os.path.getsize(os.path.join(args.dir, n)) for n in os.listdir(args.dir))
    loads = [x["load"] for rs in runs.values() for x in rs]
    print(f"job: {args.ranks} ranks, {size / 1e6:.0f} MB gzip on disk; {args.rounds} rounds; {os.cpu_count()} cores; "
          f"1-minute load average {start_load:.1f} at the start, {min(loads):.1f}-{max(loads):.1f} during the runs"
          + " (the runs' own processes count in it, up to one per core)"
          # other jobs: load before the runs, or more than the runs' own processes account for
          + (" (UNDER LOAD: not an idle machine; the ratios are of interleaved runs)"
             if start_load > 0.5 or max(loads) > (os.cpu_count() or 1) + 0.5 else " (otherwise idle)"))
    print(report(runs, modes))


def _job_cpu(r: dict) -> float:
    """The parent's CPU seconds while the job ran: the executor's phase and the job view (imports and
    a cluster's start left out)."""
    phases = r.get("phases") or {}
    return sum(v[1] for v in phases.values()) if phases else r["parent_cpu_s"]


def report(runs: dict[str, list[dict]], modes: dict[str, str]) -> str:
    """The table of contenders, then where each one's parent and workers spent their time."""
    med = statistics.median
    lines = [f"{'contender':26s} {'analysis':>9s} {'vs 1':>6s} {'vs 1k':>6s} {'parent CPU':>11s} {'workers CPU':>17s} "
             f"{'idle estimate':>14s} {'peak RSS, largest process':>26s} {'procs':>5s}"]
    base = med(r["wall_s"] for r in runs["1 process"])
    kept = runs.get("1 process, kept heap")  # the same allocator setting as the pool's workers
    base_k = med(r["wall_s"] for r in kept) if kept else float("nan")
    one_cpu = med(_job_cpu(r) for r in runs["1 process"])  # one process: its CPU is its idle wall time
    one_rank_peak = max(r["peak_bytes"] for r in runs["one rank alone"])
    for name, rs in runs.items():
        wall = med(r["wall_s"] for r in rs)
        peak = max(r["peak_bytes"] for r in rs)
        parent = med(_job_cpu(r) for r in rs)
        kids = [r["children"] for r in rs]
        total = med(sum(c for c, _ in k) for k in kids)
        largest = med(max((c for c, _ in k), default=0.0) for k in kids)
        # on an idle machine with a core per worker: the busiest worker plus all of the parent's CPU
        # (an upper bound: the parent's waiting overlaps the workers)
        estimate = f"{one_cpu / (parent + largest):13.2f}x" if name != "one rank alone" else f"{'':14s}"
        workers = f"{total:6.2f} s (max {largest:5.2f})" if total else f"{'-':>17s}"
        extra = f"  (+ cluster start {med(r['start_s'] for r in rs):.1f} s)" if modes[name] == "cluster" else ""
        lines.append(f"{name:26s} {wall:7.2f} s {base / wall:5.2f}x {base_k / wall:5.2f}x {parent:9.2f} s {workers} {estimate} "
                     f"{peak / 1e6:10.0f} MB ({peak / one_rank_peak:.2f}x one rank) {max(r['processes'] for r in rs):5d}{extra}")
    # paired by round (the contenders of a round ran one after another): less exposed to the
    # machine's drift than a ratio of medians
    for ref in ("1 process", "1 process, kept heap"):
        if ref in runs and "2 processes" in runs:
            pairs = sorted(a["wall_s"] / b["wall_s"] for a, b in zip(runs[ref], runs["2 processes"]))
            lines.append(f"2 processes vs {ref}, paired by round: median {statistics.median(pairs):.2f}x "
                         f"(rounds: {', '.join(f'{x:.2f}' for x in pairs)})")
    lines.append("")
    lines.append("where the time goes (medians): the parent's executor phase and job view (wall / CPU), the ranks' "
                 "arrivals, each worker's CPU and lifetime (the rest of its lifetime it waited: for a rank or a core)")
    for name, rs in runs.items():
        if name == "one rank alone":
            continue
        ph = {k: (med(r["phases"][k][0] for r in rs), med(r["phases"][k][1] for r in rs)) for k in rs[0]["phases"]}
        arrivals = [r["arrivals_s"] for r in rs]
        first, last = med(a[0] for a in arrivals), med(a[-1] for a in arrivals)
        kids = rs[len(rs) // 2]["children"]
        lines.append(f"  {name}: ranks {ph['ranks'][0]:.2f} s wall / {ph['ranks'][1]:.2f} s CPU, job view "
                     f"{ph['job view'][0] * 1e3:.0f} ms / {ph['job view'][1] * 1e3:.0f} ms; first rank back at {first:.2f} s, "
                     f"last at {last:.2f} s; summaries {med(r['summary_bytes'] for r in rs) / 1e3:.1f} kB each, all "
                     f"unpickled in {med(r['unpickle_all_s'] for r in rs) * 1e3:.1f} ms"
                     + ("; workers (CPU / lifetime): " + ", ".join(f"{c:.2f} / {t:.2f} s" for c, t in kids) if kids else ""))
    named = {tuple(r["stragglers"]) for name, rs in runs.items() if name != "one rank alone" for r in rs}
    lines.append(f"stragglers named: {sorted(named)} (injected: rank 5)")
    answers = {r["answer"] for name, rs in runs.items() if name != "one rank alone" for r in rs}
    lines.append(f"job reports (JSON, sha256): {'identical' if len(answers) == 1 else 'DIFFERENT'} across "
                 f"{', '.join(n for n in modes if n != 'one rank alone')} ({len(answers)} distinct)")
    lines.append("parent CPU: user+sys seconds of the parent process alone (its threads, a LocalCluster's scheduler "
                 "included; its workers not) from the job's start to its end: what of the job serialises on it. "
                 "idle estimate: the 1-process CPU over (parent CPU + the busiest worker's CPU): the ratio an idle "
                 "machine with a core per worker would show, from CPU times (an estimate, not a measurement). "
                 "vs 1k: against one process whose allocator keeps freed memory as the pool's workers do")
    return "\n".join(lines)

if __name__ == "__main__":
    main()
