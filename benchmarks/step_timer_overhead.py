"""What the every-step timer costs a training step, and the floor of ``%gputimeit``'s per-call time.

1. Step timer (issue 30, ``gpumagic.capture.everystep.StepTimer``). A tiny CPU training loop
   (``nn.Linear(16, 1)``, batch 8: a step of about 100 µs, so that a per-step cost shows) runs
   ``--steps`` optimizer steps under three set-ups, interleaved round by round (ABC, then CBA…):

   - ``bare``: no hook at all;
   - ``hook``: gpumagic's optimizer step hook calling a function that does nothing;
   - ``timer``: the hook calling ``StepTimer.step_end()`` and ``resume()`` as the capture does,
     with the timer installed (``gc.callbacks``, the wrapped ``torch.save`` and ``Module.train``).

   Printed: the median time per step of each, and ``timer`` ÷ ``hook`` and ``timer`` − ``hook``
   per step (the timer's own cost), with the spread over rounds; then the timer's two calls alone,
   100,000 times (on a busy machine the loop's own noise is far larger than the timer's cost);
   then what its ``DataLoader`` ``next()`` wrapper (each step's wait for its batch) adds to a
   batch of a cheap loader, with and without the timer installed, interleaved.

2. ``%gputimeit``'s floor: the per-call time it reports for ``pass`` (the ``exec`` of a compiled
   statement in the user's namespace), beside ``timeit``'s for the same statement.

Run: ``python benchmarks/step_timer_overhead.py [--steps 2000] [--rounds 15]``. Energy (issue 30)
adds one NVML read per sample of the sampler thread, off the training thread; it needs a driver
to measure and is not measured here.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit


def loop(steps: int):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return (time.perf_counter() - t0) / steps

    run()  # warm-up
    return run


def one(kind: str, run) -> float:
    from gpumagic.capture.everystep import StepTimer
    from gpumagic.capture.steps import OptimizerStepHook

    if kind == "bare":
        return run()
    timer = StepTimer().install() if kind == "timer" else None

    def on_step(_completed: int) -> None:
        if timer is not None:
            timer.step_end()
            timer.resume()

    hook = OptimizerStepHook(on_step)
    hook.install()
    try:
        return run()
    finally:
        hook.remove()
        if timer is not None:
            timer.remove()


def _next_cost(rounds: int, batches: int = 20_000) -> tuple[float, float]:
    """Seconds per batch of a cheap DataLoader without and with the step timer installed (its
    ``_BaseDataLoaderIter.__next__`` wrapper keeps each step's wait), interleaved."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from gpumagic.capture.everystep import StepTimer

    loader = DataLoader(TensorDataset(torch.arange(float(batches))), batch_size=1)

    def epoch() -> float:
        t0 = time.perf_counter()
        for _batch in loader:
            pass
        return (time.perf_counter() - t0) / batches

    bare, timed = [], []
    for i in range(rounds):
        for kind in (("bare", "timed") if i % 2 == 0 else ("timed", "bare")):
            if kind == "bare":
                bare.append(epoch())
                continue
            timer = StepTimer().install()
            try:
                timed.append(epoch())
            finally:
                timer.remove()
    return statistics.median(bare), statistics.median(timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    run = loop(args.steps)
    kinds = ["bare", "hook", "timer"]
    per: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for k in kinds if r % 2 == 0 else kinds[::-1]:
            per[k].append(one(k, run))
    med = {k: statistics.median(v) for k, v in per.items()}
    print(f"step timer: {args.rounds} interleaved rounds of {args.steps} steps")
    for k in kinds:
        print(f"  {k:6s} {med[k] * 1e6:8.2f} µs per step (rounds: {min(per[k]) * 1e6:.2f}–{max(per[k]) * 1e6:.2f})")
    diffs = [(t - h) * 1e6 for t, h in zip(per["timer"], per["hook"], strict=True)]
    ratios = [t / h for t, h in zip(per["timer"], per["hook"], strict=True)]
    print(f"  timer ÷ hook: {statistics.median(ratios):.4f}× (rounds {min(ratios):.4f}–{max(ratios):.4f}); "
          f"timer − hook: {statistics.median(diffs):+.2f} µs per step")

    from gpumagic.capture.everystep import StepTimer

    timer = StepTimer()
    calls = 100_000
    t0 = time.perf_counter()
    for _ in range(calls):
        timer.step_end()
        timer.resume()
    per_call = (time.perf_counter() - t0) / calls
    print(f"  the timer's calls alone: {per_call * 1e9:.0f} ns per step (step_end + resume, {calls:,} steps)")
    bare_next, timed_next = _next_cost(args.rounds)
    print(f"  a DataLoader batch (TensorDataset, batch 1, main process): {bare_next * 1e9:.0f} ns bare, "
          f"{timed_next * 1e9:.0f} ns with the timer's next() wrapper: {(timed_next - bare_next) * 1e9:+.0f} ns a batch "
          f"(medians of {args.rounds} interleaved rounds)")

    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpumagic")
    ip.run_line_magic("gputimeit", "-q -o _floor --max-seconds 2 pass")
    floor = ip.user_ns["_floor"]
    n, total = timeit.Timer("pass").autorange()
    print(f"%gputimeit floor: {floor.median_s * 1e9:.0f} ns per call for `pass` (timeit: {total / n * 1e9:.1f} ns): "
          "the exec of the compiled statement in the user's namespace")


if __name__ == "__main__":
    main()
