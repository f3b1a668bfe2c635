"""What a batch from a DataLoader worker costs the main process, and whether the advice for a
cheap in-memory batch holds.

1. Hand-off: for batches of one, two and four tensors (small, and one of 64 images of 3×64×64),
   the main thread's time in ``next(loader)`` with ``num_workers=0`` (it loads the batch itself)
   and with one worker that is always ahead (the loop sleeps between batches, so the batch is
   ready and only its hand-off is left: the pickled handles through a queue and, under the
   default ``file_descriptor`` sharing strategy, each tensor's shared memory fetched from the
   worker over a socket and mapped). Modes alternate round by round; medians per round, then the
   median and range over rounds. ``analysis.loaderwait.HANDOFF_MS`` comes from this table.
2. Advice: a training loop over a ``TensorDataset`` (64 samples of 128 floats a batch), profiled
   with ``num_workers=0`` by ``gpumagic.profile()``; the ``dataloader-bound`` finding's advice
   (workers or not, and its gain), then the plain loop timed with ``num_workers=0``, with one
   worker and with the batched-indexing fix (``BatchSampler``, ``batch_size=None``), alternated.
   The same for a batch close to a hand-off (256 floats a sample, shuffled, a deeper MLP): the wait
   per batch between one and two hand-offs, where the finding leads with the batch made in one call.
   And (2b) a batch above that line, 128 images of 3×64×64, beside a small CNN whose intra-op
   threads keep the cores busy: each of the finding's fixes timed as given (the worker fix with the
   thread count it sets), where the batch made in one call leads.

3. Pin thread: the same loop with one and two workers and ``pin_memory=True``, whose pin-memory
   thread receives the batches instead of the main thread (on a machine without an accelerator the
   thread is started by making ``torch.accelerator`` report one and pinning a no-op: only its
   hand-off is timed), against ``num_workers=0``.

Numbers depend on the machine and on what else runs on it: this prints, it asserts nothing.
``--record DIR`` instead records the three bundles tests/data keeps of such loops (under
``gpumagic.profile()``, the iterator made before it): ``cpu_tensordataset_workers0.json.gz``
(``num_workers=0``), ``cpu_tensordataset_workers2.json.gz`` (two persistent workers), and
``cpu_tensordataset_marginal.json.gz`` (256 floats a sample, ``num_workers=0``, twelve steps) and
``cpu_tensordataset_images.json.gz`` (the image case, ``num_workers=0``, eight steps).

    python benchmarks/loader_handoff.py [--rounds 5] [--batches 60] [--steps 300] [--record DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset

import gpumagic


class Ready(Dataset):
    """Every item is the same ``k`` tensors of ``shape``: loading costs indexing and collation only."""

    def __init__(self, k: int, shape: tuple[int, ...]):
        self.k, self.x = k, torch.randn(*shape)

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        return tuple(self.x for _ in range(self.k))


def next_times(loader, batches: int, pause_s: float) -> float:
    """Median main-thread time (ms) of ``next()`` over ``batches`` batches, the loop pausing
    ``pause_s`` before each (a worker then has the batch ready)."""
    it = iter(loader)
    for _ in range(5):
        next(it)
    out = []
    for _ in range(batches):
        time.sleep(pause_s)
        t = time.perf_counter()
        next(it)
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e3


def handoff(rounds: int, batches: int) -> None:
    cases = [("1 tensor of 128", 1, (128,), 64), ("2 tensors of 128", 2, (128,), 64),
             ("4 tensors of 128", 4, (128,), 64), ("2 tensors, 64 images 3×64×64", 2, (3, 64, 64), 64)]
    print("1. hand-off: main thread's time in next(loader), ms (median of rounds, [min–max])")
    for name, k, shape, bs in cases:
        loaders = {w: DataLoader(Ready(k, shape), batch_size=bs, num_workers=w, persistent_workers=w > 0,
                                 prefetch_factor=4 if w else None) for w in (0, 1)}
        got: dict[int, list[float]] = {0: [], 1: []}
        for _ in range(rounds):
            for w, loader in loaders.items():
                got[w].append(next_times(loader, batches, 0.004))
        main, worker = got[0], got[1]
        print(f"   {name:30} num_workers=0 {statistics.median(main):6.3f} [{min(main):.3f}–{max(main):.3f}]   "
              f"from a worker {statistics.median(worker):6.3f} [{min(worker):.3f}–{max(worker):.3f}]")
        del loaders


def _model(features: int = 128):
    """The cheap case's MLP (128 features); for 256, the marginal case's deeper one."""
    torch.manual_seed(0)
    if features == 128:
        return torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    return torch.nn.Sequential(torch.nn.Linear(features, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                               torch.nn.ReLU(), torch.nn.Linear(512, 10))


def loop(loader, steps: int, features: int = 128, model: torch.nn.Module | None = None, warm: int = 20) -> float:
    """Mean step time (ms) of a plain training loop of ``model`` (default: the MLP for ``features``)
    over ``loader``, after ``warm`` warm-up steps."""
    model = _model(features) if model is None else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(loader)
    t = 0.0
    for i in range(steps + warm):
        if i == warm:
            t = time.perf_counter()
        x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (time.perf_counter() - t) / steps * 1e3


def advice(rounds: int, steps: int, features: int = 128) -> None:
    data = TensorDataset(torch.randn(100_000, features), torch.randint(0, 10, (100_000,)))
    loaders = {
        "num_workers=0": DataLoader(data, batch_size=64, shuffle=True),
        "num_workers=1": DataLoader(data, batch_size=64, shuffle=True, num_workers=1, persistent_workers=True),
        "batched (the fix)": DataLoader(data, sampler=BatchSampler(RandomSampler(data), 64, False), batch_size=None),
    }
    with gpumagic.profile(skip=5, steps=8, display=False) as run:
        loop(loaders["num_workers=0"], 20, features)
    f = run.report.finding("dataloader-bound")
    case = "cheap batch" if features == 128 else "a batch close to a hand-off"
    if f is None:
        print(f"2. advice ({case}, {features} features a sample): dataloader-bound did not fire")
    else:
        n = f.evidence.numbers
        print(f"2. advice ({case}, {features} features a sample): dataloader-bound, gain {f.est_gain:.2f} "
              f"({f.gain_method.split(':')[0]}), suggested num_workers {n.get('suggested_num_workers')}, "
              f"wait per batch {n.get('wait_per_batch_ms')} ms; first fix: {f.fixes[0].description[:90]}")
    got: dict[str, list[float]] = {k: [] for k in loaders}
    for _ in range(rounds):
        for k, loader in loaders.items():
            got[k].append(loop(loader, steps, features))
    base = statistics.median(got["num_workers=0"])
    for k, v in got.items():
        med = statistics.median(v)
        print(f"   {k:20} {med:6.3f} ms a step [{min(v):.3f}–{max(v):.3f}]  gain {1 - med / base:+.2f}")


def _cnn():
    """The image case's small CNN (strided convolutions on 3×64×64 images), whose step keeps both
    cores busy through its intra-op threads."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, stride=2), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 16, 3, padding=1, stride=4), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))


def image_loop(loader, steps: int, threads: int | None = None) -> float:
    """Mean step time (ms) of the CNN over ``loader`` after 10 warm-up steps, under ``threads``
    intra-op threads (None: as set)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return loop(loader, steps, model=_cnn(), warm=10)
    finally:
        torch.set_num_threads(before)


def image_data(n: int = 24_000):
    torch.manual_seed(0)
    return TensorDataset(torch.randn(n, 3, 64, 64), torch.randint(0, 10, (n,)))


def image_advice(rounds: int, steps: int) -> None:
    """A batch above the marginal line (128 images of 3×64×64 from a ``TensorDataset``) beside a
    CNN whose intra-op threads keep the cores busy: the finding's fixes in order, then each timed
    as given (the worker fix with the thread count it sets), alternated."""
    data = image_data()
    shuffled = dict(batch_size=128, shuffle=True)
    loaders = {
        "num_workers=0": (DataLoader(data, **shuffled), None),
        "batched (one call)": (DataLoader(data, sampler=BatchSampler(RandomSampler(data), 128, False), batch_size=None),
                               None),
    }
    with gpumagic.profile(skip=5, steps=8, display=False) as run:
        image_loop(loaders["num_workers=0"][0], 20)
    f = run.report.finding("dataloader-bound")
    if f is None:
        print("2b. advice (128 images of 3×64×64 a batch, a CNN): dataloader-bound did not fire")
    else:
        n = f.evidence.numbers
        workers, threads = n.get("suggested_num_workers") or 1, n.get("suggested_num_threads")
        loaders[f"{workers} worker(s), {threads or 'all'} thread(s)"] = (
            DataLoader(data, **shuffled, num_workers=int(workers), persistent_workers=True), threads)
        print(f"2b. advice (128 images of 3×64×64 a batch, a CNN): dataloader-bound, gain {f.est_gain:.2f}, wait per "
              f"batch {n.get('wait_per_batch_ms')} ms; fixes: " + " | ".join(x.description[:60] for x in f.fixes))
    got: dict[str, list[float]] = {k: [] for k in loaders}
    for _ in range(rounds):
        for k, (loader, threads) in loaders.items():
            got[k].append(image_loop(loader, steps, threads))
    base = statistics.median(got["num_workers=0"])
    for k, v in got.items():
        med = statistics.median(v)
        print(f"   {k:26} {med:7.3f} ms a step [{min(v):.3f}–{max(v):.3f}]  gain {1 - med / base:+.2f}")


def _ahead_loaders(data, workers: int) -> DataLoader:
    return DataLoader(data, batch_size=64, shuffle=True, num_workers=workers, persistent_workers=workers > 0)


def ahead_advice(rounds: int, steps: int) -> None:
    """(2c) Workers that are ahead: 64 images of 3×64×64 a batch from a ``TensorDataset`` in two
    persistent workers, which make a batch in a small share of the CNN's step, so the loop waits
    only to receive each one. The finding's reading, then two workers, four, and the batch made
    at once in the main process (its stage fix, ``num_workers=0``), alternated."""
    data = image_data()
    loaders = {"2 workers": _ahead_loaders(data, 2), "4 workers": _ahead_loaders(data, 4),
               "batched, main process": DataLoader(data, sampler=BatchSampler(RandomSampler(data), 64, False),
                                                   batch_size=None)}
    with gpumagic.profile(skip=5, steps=8, display=False) as run:
        image_loop(loaders["2 workers"], 20)
    f = run.report.finding("dataloader-bound")
    said = f.evidence.summary if f is not None else "dataloader-bound did not fire"
    ahead = said[said.find("The 2 worker(s) make"):].split(": more workers")[0] if "they are ahead" in said else said
    print(f"2c. workers ahead (64 images of 3×64×64 a batch, 2 workers, a CNN): {ahead}"
          + (f"; gain {f.est_gain:.2f}; fixes: " + " | ".join(x.description[:60] for x in f.fixes) if f else ""))
    got: dict[str, list[float]] = {k: [] for k in loaders}
    for _ in range(rounds):
        for k, loader in loaders.items():
            got[k].append(image_loop(loader, steps))
    base = statistics.median(got["2 workers"])
    for k, v in got.items():
        med = statistics.median(v)
        print(f"   {k:26} {med:7.3f} ms a step [{min(v):.3f}–{max(v):.3f}]  gain {1 - med / base:+.2f}")


def pin_thread(rounds: int, steps: int) -> None:
    if not torch.accelerator.is_available():  # emulate: start the thread, make pinning a no-op
        import torch.utils.data._utils.pin_memory as pm

        pm.pin_memory = lambda data, device=None: data
        torch.accelerator.is_available = lambda: True
        torch.accelerator.current_accelerator = lambda *a, **k: torch.device("cpu")
        torch.accelerator.current_device_index = lambda: 0
        torch.accelerator.set_device_index = lambda i: None
    data = TensorDataset(torch.randn(100_000, 128), torch.randint(0, 10, (100_000,)))
    loaders = {"num_workers=0": DataLoader(data, batch_size=64, shuffle=True)}
    for w in (1, 2):
        loaders[f"{w} worker(s), pin thread"] = DataLoader(data, batch_size=64, shuffle=True, num_workers=w,
                                                           persistent_workers=True, pin_memory=True)
    got: dict[str, list[float]] = {k: [] for k in loaders}
    for _ in range(rounds):
        for k, loader in loaders.items():
            got[k].append(loop(loader, steps))
    print("3. pin thread: the batches received by DataLoader's pin-memory thread")
    for k, v in got.items():
        print(f"   {k:26} {statistics.median(v):6.3f} ms a step [{min(v):.3f}–{max(v):.3f}]")


def record(folder: str) -> None:
    """The bundles of tests/data: a ``TensorDataset`` loop, 64 samples of 128 floats a batch,
    with ``num_workers=0`` and 2; and the marginal case's loop (256 floats a sample, shuffled,
    the deeper MLP), ``num_workers=0``."""
    for features, workers, name in ((128, 0, "workers0"), (128, 2, "workers2"), (256, 0, "marginal")):
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(4096, features), torch.randint(0, 10, (4096,)))
        loader = DataLoader(data, batch_size=64, num_workers=workers, persistent_workers=workers > 0,
                            shuffle=features != 128)
        model = _model(features)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        it = iter(loader)
        path = os.path.join(folder, f"cpu_tensordataset_{name}.json.gz")
        with gpumagic.profile(steps=5 if features == 128 else 12, save=path, display=False):
            for _ in range(8 if features == 128 else 15):
                x, y = next(it)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                loss.item()
        print("recorded", path)
        del it, loader
    data = image_data(2_048)
    _record_cnn(DataLoader(data, batch_size=128, shuffle=True),
                os.path.join(folder, "cpu_tensordataset_images.json.gz"))


def _record_cnn(loader, path: str, start_inside: bool = False) -> None:
    """Eight steps of the CNN over ``loader`` recorded into ``path`` (eleven run); with
    ``start_inside`` the iterator, and its workers, start under the capture, which then times the
    workers' stages (the first step, which waits for them, is skipped)."""
    model = _cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = None if start_inside else iter(loader)
    with gpumagic.profile(steps=8, save=path, display=False):
        it = iter(loader) if it is None else it
        for _ in range(11):
            x, y = next(it)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    print("recorded", path)


def record_ahead(folder: str) -> None:
    """The bundle of case 2c: the CNN fed by two persistent workers that are ahead, started under
    the capture so that their stages are timed."""
    _record_cnn(_ahead_loaders(image_data(2_048), 2), os.path.join(folder, "cpu_images_workers_ahead.json.gz"),
                start_inside=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--record", metavar="DIR", help="record the bundles tests/data keeps into DIR instead")
    parser.add_argument("--record-ahead", metavar="DIR", help="record case 2c's bundle into DIR instead")
    parser.add_argument("--ahead", action="store_true", help="run case 2c alone")
    args = parser.parse_args()
    if args.record:
        record(args.record)
        return
    if args.record_ahead:
        record_ahead(args.record_ahead)
        return
    if args.ahead:
        ahead_advice(args.rounds, max(20, args.steps // 5))
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cores} usable cores; torch {torch.__version__}; sharing strategy "
          f"{torch.multiprocessing.get_sharing_strategy()}; load average {os.getloadavg()[0]:.2f}")
    handoff(args.rounds, args.batches)
    advice(args.rounds, args.steps)
    advice(args.rounds, args.steps, features=256)
    image_advice(args.rounds, max(20, args.steps // 5))
    ahead_advice(args.rounds, max(20, args.steps // 5))
    pin_thread(args.rounds, args.steps)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
