"""Does ``frozen-forward`` hold? A linear head trained on a frozen convolutional backbone (two
3x3 convolutions with batch norm, 32 and 64 channels, pooled; every parameter's
``requires_grad`` off, eval mode) over ``--samples`` 3x32x32 images on the CPU, once as written
(the backbone runs in every step), once the way the finding's fix does (the backbone's outputs
computed once, the head trained on them). With the same shuffle both train the same head
(checked first: the features and the trained weights agree).

The loop as written is profiled by ``gpumagic.profile()`` and the finding's gain read (an
estimate); then an epoch of each is timed unprofiled, alternated round by round, and the saving
(1 − the cached epoch's time ÷ the epoch as written) printed beside it, with the one-time cost
of computing the features (one pass of the backbone, paid once for every epoch after). Numbers
depend on the machine and on what else runs on it: this prints, it asserts nothing.
``--record DIR`` instead records the bundle tests/data keeps (``cpu_frozen_backbone.json.gz``)
and exits.

    python benchmarks/frozen_features.py [--rounds 5] [--samples 1024] [--record DIR]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from steptime import alternated, medians
from torch import nn


def _setup(samples: int):
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                             nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten())
    for p in backbone.parameters():
        p.requires_grad_(False)
    backbone.eval()
    dataset = torch.utils.data.TensorDataset(torch.randn(samples, 3, 32, 32), torch.randint(0, 10, (samples,)))
    return backbone, dataset


def _loops(samples: int, batch_size: int = 32):
    backbone, dataset = _setup(samples)
    loss_fn = nn.CrossEntropyLoss()
    start = nn.Linear(64, 10).state_dict()

    def head_and_optimizer():
        head = nn.Linear(64, 10)
        head.load_state_dict(start)
        return head, torch.optim.SGD(head.parameters(), lr=0.1)

    def as_written():
        head, optimizer = head_and_optimizer()
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                             generator=torch.Generator().manual_seed(1))
        for xb, yb in loader:
            loss = loss_fn(head(backbone(xb)), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return head

    def features():  # the fix's one-time pass
        out, targets = [], []
        with torch.no_grad():
            for xb, yb in torch.utils.data.DataLoader(dataset, batch_size=batch_size):
                out.append(backbone(xb))
                targets.append(yb)
        return torch.utils.data.TensorDataset(torch.cat(out), torch.cat(targets))

    cached = features()

    def on_cached():
        head, optimizer = head_and_optimizer()
        loader = torch.utils.data.DataLoader(cached, batch_size=batch_size, shuffle=True,
                                             generator=torch.Generator().manual_seed(1))
        for fb, yb in loader:
            loss = loss_fn(head(fb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return head

    return {"backbone every step": as_written, "cached features": on_cached}, features, backbone, dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    args = parser.parse_args()
    import gpumagic
    if args.record:
        loops, *_ = _loops(256)
        loops["backbone every step"]()
        with gpumagic.profile(save=os.path.join(args.record, "cpu_frozen_backbone.json.gz"), display=False):
            loops["backbone every step"]()
        print("recorded cpu_frozen_backbone.json.gz")
        return
    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    loops, features, backbone, dataset = _loops(args.samples)
    with torch.no_grad():
        direct = backbone(dataset.tensors[0][:64])
    if not torch.allclose(features().tensors[0][:64], direct, atol=1e-5):
        raise SystemExit("the cached features differ from the backbone's outputs")
    a, b = (loop() for loop in loops.values())
    if not all(torch.allclose(p, q, atol=1e-4) for p, q in zip(a.parameters(), b.parameters(), strict=True)):
        raise SystemExit("the two loops trained different heads")
    first, second = loops
    with gpumagic.profile(max_seconds=600, display=False) as run:
        loops[first]()
    f = run.report.finding("frozen-forward")
    med, line = medians(alternated(loops, args.rounds, 1))
    t0 = time.perf_counter()
    features()
    once = (time.perf_counter() - t0) * 1e3
    said = f"estimate {f.est_gain:.3f}" if f else "the rule is silent"
    print(line.replace(" a step", " an epoch"))
    print(f"saved: {1 - med[second] / med[first]:.3f} of an epoch; {said}; computing the features once: {once:.1f} ms")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
