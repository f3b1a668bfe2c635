"""Do ``loop-host-work``'s specific fixes pay? Each against the code it replaces, on the CPU.

- EMA: an exponential moving average of a model's weights, a Python loop of ``mul_`` and ``add_``
  over its parameters, against the fix's one ``torch._foreach_lerp_`` over the two lists (the
  6-block MLP of 26 parameter tensors the rule's comments cite; ``--blocks`` changes it). Both are
  checked to give the same average before timing.
- Batches from lists: a ``--rows`` × 64 list of floats and its labels turned into tensors with
  ``torch.tensor`` (as a loop that builds each batch from Python data does), against indexing
  tensors converted once (the fix), and against ``torch.from_numpy`` of the same data as a numpy
  array.
- Synthetic inputs: a training step of an MLP (512 → 512 → 10, a batch of ``--rows``, SGD) that
  draws its inputs and labels with ``torch.randn``/``torch.randint`` every step, against the same
  step cycling through 8 batches drawn once before the loop (the fix).
- Batches prepared each step: an MLP (784 → 32 → 10, SGD), each batch of ``--images`` images cut from
  a uint8 dataset of 8,192 and cast and normalized on the main thread every step, against the
  dataset normalized once before the loop and indexed (the fix).

``--record DIR`` instead records the bundles tests/data keeps (``cpu_loop_random_inputs.json.gz``,
the drawing loop; ``cpu_loop_prepare.json.gz``, the preparing one; ``cpu_loop_from_lists.json.gz``,
a linear layer trained on a list of lists converted with ``torch.tensor`` each step) and exits.

Each pair is timed in alternated rounds (``steptime.alternated``: a machine that slows down slows
both); the medians and their ratio are printed with the load average. Numbers depend on the
machine and on what else runs on it: this prints, it asserts nothing.

    python benchmarks/loop_work_fixes.py [--rounds 7] [--calls 200] [--blocks 6] [--rows 512] [--images 2048]
                                         [--record DIR]
"""

from __future__ import annotations

import argparse
import copy
import os
import random

import numpy as np
import torch
from steptime import alternated, medians, profile_steps


def ema_pair(blocks: int):
    torch.manual_seed(0)
    layers = [m for _ in range(blocks) for m in (torch.nn.Linear(128, 128), torch.nn.LayerNorm(128), torch.nn.GELU())]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(128, 10))
    ema_loop, ema_fused = copy.deepcopy(model), copy.deepcopy(model)
    params = list(model.parameters())
    loop_params, fused_params = list(ema_loop.parameters()), list(ema_fused.parameters())
    decay = 0.999

    def python_loop():
        with torch.no_grad():
            for e, p in zip(loop_params, params, strict=True):
                e.mul_(decay).add_(p, alpha=1 - decay)

    def foreach():
        with torch.no_grad():
            torch._foreach_lerp_(fused_params, params, 1 - decay)

    with torch.no_grad():  # the same average either way: move the weights, update both, compare
        for p in params:
            p.add_(torch.randn_like(p))
    python_loop()
    foreach()
    for a, b in zip(loop_params, fused_params, strict=True):
        torch.testing.assert_close(a, b)
    return {"python loop": python_loop, "_foreach_lerp_": foreach}, len(params)


def batch_pair(rows: int):
    rng = random.Random(0)
    data = [[rng.random() for _ in range(64)] for _ in range(rows)]
    labels = [rng.randrange(10) for _ in range(rows)]
    all_inputs, all_targets = torch.tensor(data, dtype=torch.float32), torch.tensor(labels)
    array, label_array = np.asarray(data, dtype=np.float32), np.asarray(labels)
    order = torch.randperm(rows)

    def from_lists():
        return torch.tensor(data), torch.tensor(labels)

    def indexed():
        return all_inputs[order], all_targets[order]

    def from_numpy():
        return torch.from_numpy(array), torch.from_numpy(label_array)

    return {"torch.tensor(lists)": from_lists, "index tensors": indexed, "torch.from_numpy": from_numpy}


def random_pair(rows: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    pool = [(torch.randn(rows, 512), torch.randint(0, 10, (rows,))) for _ in range(8)]
    step_of = iter(range(10**9))

    def train(x, y):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def drawn():
        train(torch.randn(rows, 512), torch.randint(0, 10, (rows,)))

    def pooled():
        train(*pool[next(step_of) % len(pool)])

    return {"drawn each step": drawn, "pool drawn once": pooled}


def lists_loop():
    """The loop tests/data/cpu_loop_from_lists.json.gz records: a linear layer (64 → 4, SGD) trained on
    a 256 × 64 list of floats and its labels, turned into tensors with ``torch.tensor`` every step."""
    random.seed(0)
    torch.manual_seed(0)
    data = [[random.random() for _ in range(64)] for _ in range(256)]
    labels = [random.randrange(4) for _ in range(256)]
    model = torch.nn.Linear(64, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        x, y = torch.tensor(data), torch.tensor(labels)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def prepare_pair(rows: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    raw = torch.randint(0, 256, (8192, 784), dtype=torch.uint8)
    labels = torch.randint(0, 10, (8192,))
    mean, std = 0.1307, 0.3081
    prepared = (raw.float() / 255 - mean) / std
    starts = iter(range(10**9))

    def train(x, y):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def each_step():
        at = next(starts) * rows % (len(raw) - rows)
        train((raw[at:at + rows].float() / 255 - mean) / std, labels[at:at + rows])

    def once():
        at = next(starts) * rows % (len(raw) - rows)
        train(prepared[at:at + rows], labels[at:at + rows])

    return {"prepared each step": each_step, "prepared once": once}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--record", metavar="DIR", help="record the drawing loop's bundle into DIR instead")
    args = parser.parse_args()
    if args.record:
        profile_steps(random_pair(args.rows)["drawn each step"], 8,
                      os.path.join(args.record, "cpu_loop_random_inputs.json.gz"))
        profile_steps(prepare_pair(args.images)["prepared each step"], 8,
                      os.path.join(args.record, "cpu_loop_prepare.json.gz"))
        profile_steps(lists_loop(), 4, os.path.join(args.record, "cpu_loop_from_lists.json.gz"))
        print("recorded cpu_loop_random_inputs, cpu_loop_prepare, cpu_loop_from_lists")
        return
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    loops, tensors = ema_pair(args.blocks)
    med, line = medians(alternated(loops, args.rounds, args.calls))
    print(f"EMA over {tensors} tensors: {line}")
    print(f"  the Python loop takes {med['python loop'] / med['_foreach_lerp_']:.1f}x the foreach call")
    med, line = medians(alternated(batch_pair(args.rows), args.rounds, max(1, args.calls // 10)))
    print(f"a {args.rows} x 64 batch: {line}")
    print(f"  torch.tensor of the lists takes {med['torch.tensor(lists)'] / med['index tensors']:.0f}x indexing "
          f"converted tensors, {med['torch.tensor(lists)'] / med['torch.from_numpy']:.0f}x torch.from_numpy")
    med, line = medians(alternated(random_pair(args.rows), args.rounds, max(1, args.calls // 10)))
    print(f"an MLP step on {args.rows} random rows: {line}")
    print(f"  the pool saves {1 - med['pool drawn once'] / med['drawn each step']:.3f} of the step")
    med, line = medians(alternated(prepare_pair(args.images), args.rounds, max(1, args.calls // 10)))
    print(f"an MLP step on {args.images} uint8 images: {line}")
    print(f"  preparing once saves {1 - med['prepared once'] / med['prepared each step']:.3f} of the step")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
