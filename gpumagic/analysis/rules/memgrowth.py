"""``memory-growth``: allocated memory climbs step after step: something keeps tensors from each step."""

from __future__ import annotations

from gpumagic.analysis.context import Context
from gpumagic.analysis.memgrowth import growth
from gpumagic.analysis.rules.base import finding, pytorch, rule
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: Steps with allocator records needed to call a rise steady: three rises in a row, at least.
MIN_STEPS = 4
#: The floor must rise in at least this share of the step-to-step transitions, and fall in none:
#: a loop whose floor moves with its data (a smaller last batch, prefetched inputs) rises and falls.
MIN_RISE_FRAC = 0.75
#: A rise that fills the device within this many steps is one a training run meets (medium);
#: slower rises are reported as low.
SOON_STEPS = 100_000
#: Where the capacity is unknown, a rise of this much a step is medium: 100,000 steps of it is
#: 100 GiB, more than any single GPU holds today (the H200's 141 GB, the MI300X's 192 GB aside).
UNKNOWN_CAPACITY_RISE = 1 << 20
DOC = "https://pytorch.org/docs/stable/notes/faq.html#my-model-reports-cuda-runtime-error-2-out-of-memory"
KEEP_NUMBERS_CODE = """
running_loss = 0.0
running_loss += loss.item()                 # a Python float: `running_loss += loss` keeps every step's graph
predictions = []
predictions.append(logits.detach().cpu())   # collected outputs: without their graph, and off the device
"""
SNAPSHOT_CODE = """
torch.cuda.memory._record_memory_history(max_entries=100_000)
# ... run a few steps ...
torch.cuda.memory._dump_snapshot("memory_snapshot.pickle")   # open it at https://pytorch.org/memory_viz
torch.cuda.memory._record_memory_history(enabled=None)
"""
LIVE_TENSORS_CODE = """
import gc
live = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]   # before and after a few steps
# (type(o), not isinstance: a weak proxy among the objects would raise ReferenceError)
print(len(live), "tensors,", sum(t.nelement() * t.element_size() for t in live) / 2**20, "MiB")
"""


def _mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB" if abs(n) >= 2**20 else f"{n / 2**10:,.1f} KiB" if abs(n) >= 2**10 else f"{n:,.0f} B"


@rule("memory-growth")
def memory_growth(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the allocator's lowest total in each step (its *floor*: what stays allocated
    between steps), from the ``[memory]`` records (``--memory``) of the primary GPU, or of the
    CPU in a trace without one (:mod:`gpumagic.analysis.memgrowth`). Threshold: ≥ 4 steps with
    records, the floor rising in ≥ 75 % of the step-to-step transitions and falling in none. A
    steady loop frees what a step allocated before the next, so its floor stays put; a floor
    that climbs is memory the program keeps each step — a tensor appended to a list, a running
    total that is a tensor carrying its graph (PyTorch's FAQ: ``total_loss += loss``; where no
    backward pass frees them, the activations that graph saved), outputs collected on the device
    — and it ends in an out-of-memory error. Gain: none in speed. Severity: medium when the rise
    fills the device within 100,000 steps (or is ≥ 1 MiB a step where the capacity is unknown),
    else low. False positives: a cache that grows on purpose and is bounded (it stops rising
    later than the window shows)."""
    g = growth(ctx)
    steps = len(g.floors)
    if steps < MIN_STEPS or g.falls or g.rises < MIN_RISE_FRAC * (steps - 1) or g.per_step <= 0:
        return None
    fill = g.steps_to_fill
    soon = fill <= SOON_STEPS if fill is not None else g.per_step >= UNKNOWN_CAPACITY_RISE
    where = "the GPU's memory" if g.device == "gpu" else "host memory"
    at_rate = (f"; at this rate the remaining {_mib(g.capacity - g.peak)} of {where} fills in about {fill:,.0f} steps"
               if fill is not None and g.capacity else "")
    fixes = [pytorch("Keep Python numbers, or tensors without their graph and off the device, across steps",
                     KEEP_NUMBERS_CODE)]
    if g.device == "gpu":
        fixes.append(pytorch("Find what stays allocated: record the allocator's history and view the snapshot",
                             SNAPSHOT_CODE, diagnostic=True))
    else:
        fixes.append(pytorch("Find what stays alive: count the live tensors before and after a few steps",
                             LIVE_TENSORS_CODE, diagnostic=True))
    return finding(
        severity="medium" if soon else "low",
        title=f"Memory climbs {_mib(g.per_step)} every step: something keeps tensors from each step",
        why="""A loop in its steady state frees what a step allocated before the next step starts, so the memory
        left allocated between steps (parameters, gradients, optimizer state) stays the same. Here it rises step
        after step: the program keeps something from every step, and the run ends in an out-of-memory error. The
        usual causes: a tensor appended to a list each step, outputs or predictions collected on the device, a
        running total that is a tensor (`total_loss += loss`: it keeps each step's graph, and in a loop with no
        backward pass, such as an evaluation without torch.no_grad(), every activation that graph saved), a cache
        without a bound. Keep numbers with .item(), tensors with .detach() (and .cpu() for collected outputs).""",
        summary=(f"The allocator's lowest total in each of {steps} steps ({g.device.upper()} records) rose in {g.rises} "
                 f"of {steps - 1} transitions, from {_mib(g.floors[0])} to {_mib(g.floors[-1])}: "
                 f"+{_mib(g.per_step)} a step{at_rate}."),
        numbers={"growth_per_step_bytes": round(g.per_step), "steps": steps, "rises": g.rises,
                 "first_floor_bytes": g.floors[0], "last_floor_bytes": g.floors[-1],
                 **({"steps_to_fill": round(fill)} if fill is not None else {}), "device": g.device},
        est_gain=0.0,
        gain_method="not a speed finding: memory that runs out",
        fixes=tuple(fixes),
        doc_url=DOC,
    )


__all__ = ["memory_growth"]
