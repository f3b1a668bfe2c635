"""Does ``growing-concatenation`` hold? An inference loop gathers a small MLP's 768-wide outputs
for ``--batches`` batches of 32 rows on the CPU, once growing a tensor with
``embs = torch.cat([embs, out])`` at every batch, once the way the finding's fix does (a list,
one ``torch.cat`` at the end). Both give the same tensor (checked first).

The growing loop is profiled by ``gpumagic.profile()`` and the finding's gain read (an
estimate); then both loops are timed unprofiled, alternated round by round, and the saving
(1 − the list's time ÷ the growing loop's) printed beside it. Numbers depend on the machine and
on what else runs on it: this prints, it asserts nothing. ``--record DIR`` instead records the
bundle tests/data keeps (``cpu_concat_growth.json.gz``: 160 batches) and exits.

    python benchmarks/concat_growth.py [--rounds 5] [--batches 400] [--record DIR]
"""

from __future__ import annotations

import argparse
import os

import torch
from steptime import alternated, medians


def _loops(batches: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 768)).eval()
    inputs = [torch.randn(32, 128) for _ in range(16)]

    def growing():
        embs = torch.empty(0, 768)
        with torch.inference_mode():
            for i in range(batches):
                embs = torch.cat([embs, model(inputs[i % 16])])
        return embs

    def listed():
        outputs = []
        with torch.inference_mode():
            for i in range(batches):
                outputs.append(model(inputs[i % 16]))
        return torch.cat(outputs)

    return {"growing torch.cat": growing, "list, one torch.cat": listed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    import gpumagic
    if args.record:
        loop = _loops(160)["growing torch.cat"]
        loop()
        with gpumagic.profile(save=os.path.join(args.record, "cpu_concat_growth.json.gz"), display=False):
            loop()
        print("recorded cpu_concat_growth.json.gz")
        return
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    loops = _loops(args.batches)
    a, b = (loop() for loop in loops.values())
    if not torch.equal(a, b):
        raise SystemExit("the two loops gathered different tensors")
    with gpumagic.profile(max_seconds=600, display=False) as run:
        loops["growing torch.cat"]()
    f = run.report.finding("growing-concatenation")
    med, line = medians(alternated(loops, args.rounds, 1))
    said = f"estimate {f.est_gain:.3f}" if f else "the rule is silent"
    print(line)
    print(f"saved: {1 - med['list, one torch.cat'] / med['growing torch.cat']:.3f}; {said}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
