"""What profiling a training loop costs: bare vs the profiler alone vs ``gpumagic.profile()`` vs torch recording everything.

A CPU training loop (an MLP on in-memory batches, 300 steps, about 4 s bare on one intra-op
thread) runs in four ways, alternated round by round in one process so that drift (thermal,
other load) hits all of them alike:

- ``bare``: the loop alone;
- ``profiler``: a bare ``torch.profiler.profile()`` with the activities gpumagic uses (CPU, and
  CUDA when there is a GPU), recording what gpumagic records by default (started after the first
  step, stopped after five more, ``prof.step()`` at each) and exporting its trace to a file;
- ``gpumagic``: inside ``gpumagic.profile()`` with its defaults (skip 1 step, record 5, CPU
  sampling); the time includes stopping, exporting, loading, analysing: the report is ready;
- ``torch_all``: inside ``torch.profiler.profile(record_shapes=True, with_stack=True,
  profile_memory=True)`` for the whole loop, timed to the end of the ``with`` block (its
  post-processing included, no export: generous to it).

A first untimed round pays one-off costs (imports, the profiler's first start) and reports them.
Each run is timed on the wall clock and in process CPU time (all threads, gpumagic's samplers
included). What gpumagic adds on top of the profiler itself (step hook, samplers, loading and
analysing) is ``gpumagic / profiler``, computed per round (the modes of a round ran side by side)
and printed as the median of those paired ratios with their spread. On a shared machine the
wall clock is noisy; the minimum over rounds and the CPU time are the steadier figures. One
intra-op thread by default (``--threads``): with several, a preempted OpenMP thread stalls the
others and a busy neighbour dominates the measurement.
``--phases N`` then times, over N more ``gpumagic.profile()`` runs, each step gpumagic takes after
the profiler's export, and what ``%%gpuprofile`` does next in a live kernel (the run history, the
static report, the live view), each as a share of the bare loop: what is on the cell's path
after the user's code.
Run: ``python benchmarks/overhead.py [--steps 300] [--rounds 7] [--threads 1] [--phases 7]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

#: Sizes chosen for ~13 ms per step on one thread of the 2-core dev VM (300 steps ≈ 4 s).
BATCH, IN, HIDDEN, OUT = 128, 512, 960, 10
N_BATCHES = 16


def make_workload(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    data = [(torch.randn(BATCH, IN), torch.randint(0, OUT, (BATCH,))) for _ in range(N_BATCHES)]

    def loop(steps: int, after_step=None) -> float:
        total = 0.0
        for i in range(steps):
            x, y = data[i % N_BATCHES]
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach()
            if after_step is not None:
                after_step(i)
        return float(total)

    return loop


def run_bare(loop, steps: int) -> None:
    loop(steps)


#: gpumagic.profile()'s defaults: skip this many optimizer steps, then record this many.
SKIP, RECORD = 1, 5


def run_profiler(loop, steps: int) -> None:
    """The profiler alone over the window gpumagic records, its trace exported to a file."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)

    def after_step(i: int) -> None:
        if i == SKIP - 1:
            prof.start()
        elif SKIP <= i < SKIP + RECORD:
            prof.step()
            if i == SKIP + RECORD - 1:
                prof.stop()
                prof.export_chrome_trace(path)

    try:
        loop(steps, after_step)
    finally:
        os.unlink(path)


def run_gpumagic(loop, steps: int) -> None:
    import gpumagic

    with gpumagic.profile(display=False) as run:
        loop(steps)
    assert run.report is not None and run.report.metrics["steps"]["count"] == 5


def run_torch_all(loop, steps: int) -> None:
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, record_shapes=True, with_stack=True, profile_memory=True):
        loop(steps)


MODES = {"bare": run_bare, "profiler": run_profiler, "gpumagic": run_gpumagic, "torch_all": run_torch_all}


def timed(fn, loop, steps: int) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one run."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn(loop, steps)
    return time.perf_counter() - w0, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--phases", type=int, default=7, metavar="N",
                        help="time the steps after the export over N more runs (0: skip)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loop = make_workload()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.steps} steps, {args.rounds} rounds")
    first = {name: timed(fn, loop, args.steps)[0] for name, fn in MODES.items()}
    print("first (untimed) round, one-off costs included: " + ", ".join(f"{k} {v:.2f} s" for k, v in first.items()))

    wall: dict[str, list[float]] = {name: [] for name in MODES}
    cpu: dict[str, list[float]] = {name: [] for name in MODES}
    names = list(MODES)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate who goes first
        for name in order:
            w, c = timed(MODES[name], loop, args.steps)
            wall[name].append(w)
            cpu[name].append(c)
    print(report(wall, cpu))
    print(paired(wall, "wall"))
    print(paired(cpu, "cpu"))
    if args.phases:
        print(phases(loop, args.steps, args.phases, statistics.median(wall["bare"])))
    print(f"1-minute load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


#: The steps after the export, as (label, module, attribute): each is wrapped with a timer.
AFTER_EXPORT = [
    ("torch export_chrome_trace", "gpumagic.capture.recorder", "TorchRecorder.export"),
    ("nest step markers", "gpumagic.capture.session", "nest_step_markers"),
    ("scrub host name, temp path", "gpumagic.capture.bundle", "scrub_identity"),
    ("shorten paths", "gpumagic.capture.bundle", "shorten_paths"),
    ("package versions", "gpumagic.capture.session", "versions"),
    ("load + analyse the bundle", "gpumagic.capture.session", "_analyse"),
]


def phases(loop, steps: int, runs: int, bare_s: float) -> str:
    """Median milliseconds of each step after the export (and of what %%gpuprofile adds), over ``runs``."""
    import importlib

    import gpumagic
    from gpumagic.render.html import report_html
    from gpumagic.render.widget import build_widget
    from gpumagic.shells.api import record_run

    times: dict[str, list[float]] = {}

    def wrap(owner, attr: str, label: str):
        real = getattr(owner, attr)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                times.setdefault(label, []).append(time.perf_counter() - t)
        setattr(owner, attr, timed)
        return owner, attr, real

    undo = []
    for label, module, attr in AFTER_EXPORT:
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        undo.append(wrap(owner, name, label))
    home = tempfile.mkdtemp(prefix="gpumagic-overhead-")  # a history of its own, never the user's
    old_home = os.environ.get("GPUMAGIC_HOME")
    os.environ["GPUMAGIC_HOME"] = home
    try:
        for _ in range(runs):
            t = time.perf_counter()
            with gpumagic.profile(display=False) as run:
                loop(steps)
            times.setdefault("(whole profiled block)", []).append(time.perf_counter() - t)
            for label, step in [("%%gpuprofile: run history write", lambda: record_run(run, source="magic", warn=False)),
                                ("%%gpuprofile: text report", run.report.to_text),
                                ("%%gpuprofile: static HTML report", lambda: report_html(run.report, live_token="t")),
                                ("%%gpuprofile: live view (widgets)", lambda: build_widget(run.report, live_token="t").close())]:
                t = time.perf_counter()
                step()
                times.setdefault(label, []).append(time.perf_counter() - t)
    finally:
        for owner, attr, real in undo:
            setattr(owner, attr, real)
        if old_home is None:
            os.environ.pop("GPUMAGIC_HOME", None)
        else:
            os.environ["GPUMAGIC_HOME"] = old_home
        import shutil

        shutil.rmtree(home, ignore_errors=True)
    lines = [f"after the export, median of {runs} runs ({len(run.bundle) / 1e6:.2f} MB bundle; bare loop {bare_s:.2f} s):"]
    after = 0.0
    for label, values in times.items():
        if label.startswith("("):
            continue
        ms = statistics.median(values) * 1e3
        after += ms if label != "torch export_chrome_trace" else 0.0
        lines.append(f"  {label:<36} {ms:8.1f} ms  {ms / 1e3 / bare_s:7.2%} of the bare loop")
    lines.append(f"  {'gpumagic after the export, in all':<36} {after:8.1f} ms  {after / 1e3 / bare_s:7.2%} of the bare loop")
    return "\n".join(lines)


def paired(values: dict[str, list[float]], clock: str) -> str:
    """Per-round ratios of modes that ran side by side: median and spread (min .. max)."""
    def line(what: str, num: str, den: str, target: str) -> str:
        r = [a / b - 1 for a, b in zip(values[num], values[den])]
        return (f"  {what:<34} median {statistics.median(r):+6.1%}   spread {min(r):+6.1%} .. {max(r):+6.1%}"
                f"   over {len(r)} rounds   {target}")

    return "\n".join([f"paired per-round ratios ({clock} clock):",
                      line("gpumagic on top of the profiler", "gpumagic", "profiler", "(target <= +5 %)"),
                      line("gpumagic total vs bare", "gpumagic", "bare", "(target <= +15 %)"),
                      line("the profiler alone vs bare", "profiler", "bare", ""),
                      line("torch recording everything vs bare", "torch_all", "bare", "")])


def report(wall: dict[str, list[float]], cpu: dict[str, list[float]]) -> str:
    """A table of wall and CPU seconds per mode, each with its ratio to ``bare``."""
    def stats(values: dict[str, list[float]], name: str, fn) -> tuple[float, float]:
        v = fn(values[name])
        return v, v / fn(values["bare"]) - 1

    lines = [f"{'mode':<10} {'wall min':>9} {'vs bare':>8} {'wall med':>9} {'vs bare':>8} "
             f"{'cpu min':>8} {'vs bare':>8} {'cpu med':>8} {'vs bare':>8}"]
    for name in wall:
        cells = [stats(wall, name, min), stats(wall, name, statistics.median),
                 stats(cpu, name, min), stats(cpu, name, statistics.median)]
        lines.append(f"{name:<10} " + " ".join(f"{v:>{9 if i < 2 else 8}.3f} {r:>+8.1%}" for i, (v, r) in enumerate(cells)))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
