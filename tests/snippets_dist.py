"""A two-rank gloo job on CPU that runs the straggler probe of the ``gpu-idle-gaps`` fix
(``rules.utilization.STRAGGLER_PROBE_CODE``) with one rank slowed down, and, beside it, the
method taught before (one step timed across its collectives). tests/test_snippets.py starts it
with ``torch.multiprocessing.spawn``; this module stays light so that each rank starts fast."""

from __future__ import annotations

import json
import os
import time
import types

#: The straggler and its extra time per batch: far above a tiny model's step on a busy CPU.
STRAGGLER = 1
DELAY_S = 0.1
CASES = ("compute", "loader")


def _torch_on_cpu():
    """``torch`` with ``torch.cuda.synchronize()`` a no-op: CPU kernels run synchronously."""
    import torch

    proxy = types.ModuleType("torch")
    proxy.__dict__.update(torch.__dict__)
    proxy.cuda = types.SimpleNamespace(synchronize=lambda: None)
    return proxy


class _Slow:
    """Wraps a module (slow compute) or a list of batches (slow loader) with a sleep per use."""

    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s = inner, delay_s

    def __iter__(self):
        for batch in self.inner:
            time.sleep(self.delay_s)
            yield batch


def _model(delay_s: float):
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

        def forward(self, x):
            time.sleep(delay_s)  # a slower GPU
            return self.body(x)

    torch.manual_seed(0)
    return Net()


def _old_method(ddp, loss_fn, opt, batches, slow_loader: bool, delay_s: float) -> float:
    """Before issue 23 the fix timed ``train_step`` (the all-reduce included) after the batch was
    loaded, and synchronised: every rank then measures the slowest rank's time, or less."""
    total = 0.0
    for i, (x, y) in enumerate(batches):
        if slow_loader:
            time.sleep(delay_s)  # the loader, before t0
        t0 = time.perf_counter()
        loss_fn(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
        if i > 0:
            total += time.perf_counter() - t0
    return total


def run_rank(rank: int, world: int, init_file: str, code: str, out_dir: str) -> None:
    """One rank: the probe ``code`` and the old method, for each case in :data:`CASES`; rank 0
    writes what every rank measured to ``out_dir/CASE.json``."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(rank)
        batches = [(torch.randn(4, 8), torch.randint(0, 4, (4,))) for _ in range(6)]
        for case in CASES:
            delay = DELAY_S if rank == STRAGGLER else 0.0
            model = DistributedDataParallel(_model(delay if case == "compute" else 0.0))
            loader = _Slow(batches, delay if case == "loader" else 0.0)
            ns = {"torch": _torch_on_cpu(), "loader": loader, "model": model, "loss_fn": torch.nn.CrossEntropyLoss()}
            exec(compile(code.replace('"cuda"', '"cpu"'), "<gpu-idle-gaps straggler probe>", "exec"), ns)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            old = _old_method(model, ns["loss_fn"], opt, batches, case == "loader", delay)
            old_all = [None] * world
            dist.all_gather_object(old_all, old)
            if rank == 0:
                with open(f"{out_dir}/{case}.json", "w", encoding="utf-8") as fh:
                    json.dump({"probe": ns["per_rank"], "old": old_all}, fh)
        # no rank tears its connections down while the other is still in a collective (a gloo
        # rank that did aborted once, "terminate called without an active exception", on a busy
        # machine after both cases had finished)
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    # Both ranks are past the barrier and rank 0's results are on disk. Tearing gloo down still
    # aborted a rank now and then at exit (the same message, 2 runs in 10 on this 2-core machine,
    # with the barrier): the rank leaves without running the process's C++ destructors.
    os._exit(0)
