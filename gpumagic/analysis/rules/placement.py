"""``model-on-cpu``: the machine has a GPU, but the model's operators ran on the CPU."""

from __future__ import annotations

import numpy as np

from gpumagic.analysis.context import Context
from gpumagic.analysis.names import GRAPH_LAUNCH_CALLS
from gpumagic.analysis.rules.base import finding, pytorch, rule
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: "No kernels, or a handful": at most this many GPU kernels and kernel launches in the window ...
HANDFUL = 10
#: ... while at least this many ATen operators ran (the model did run, on the CPU).
MIN_CPU_OPS = 50
DOC = "https://pytorch.org/docs/stable/notes/cuda.html"
TO_CUDA_CODE = """
device = torch.device("cuda")
model = model.to(device)                      # parameters and buffers move to the GPU
for x, y in DataLoader(dataset, batch_size=batch_size, pin_memory=True):
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)   # every input, each step
    out = model(x)                            # now runs as CUDA kernels"""


@rule("model-on-cpu")
def model_on_cpu(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the CUDA/HIP runtime was recorded (so the profiler watched a GPU), yet at most
    a handful of kernels ran and were launched, while ≥ 50 ATen operators ran on the CPU: the
    model and its data never moved to the GPU. A trace without any GPU runtime event is not this
    finding: it was recorded without GPU activity (a note says so); nor is a window that replays a
    captured graph (``cudaGraphLaunch``/``hipGraphLaunch``: one launch for all of the model's
    kernels, which a trace cut short may not hold; a serving engine's host operators beside it
    prepare its inputs). Gain: not estimated (the
    speed-up depends on the model). False positives: a deliberate CPU baseline recorded with
    CUDA activity on."""
    ev, msk = ctx.trace.events, ctx.masks
    runtime = int(np.count_nonzero(msk["runtime"]))
    if runtime == 0:
        return None
    kernels = int(np.count_nonzero(ctx.events_in_window(msk["kernel"])))
    launches = int(np.count_nonzero(ctx.events_in_window(msk["runtime"] & ctx.host_name_ids(
        lambda n: "Launch" in n)[ev.name])))
    aten = int(np.count_nonzero(ctx.events_in_window(msk["cpu_op"] & ctx.host_name_ids(
        lambda n: n.startswith("aten::"))[ev.name])))
    if kernels > HANDFUL or launches > HANDFUL or aten < MIN_CPU_OPS:
        return None
    if ctx.events_in_window(msk["runtime"] & ctx.host_name_ids(GRAPH_LAUNCH_CALLS.__contains__)[ev.name]).any():
        return None  # a captured graph replayed: one launch, the model's kernels (past the trace's end, here)
    return finding(
        severity="high", title="The model ran on the CPU: it never moved to the GPU",
        why="""The profiler recorded the CUDA runtime, so this process could use a GPU, yet its operators ran as
        CPU code and (almost) no GPU kernel ran. A model and its inputs stay on the CPU until moved with
        .to("cuda"); every parameter, buffer and input tensor of one operation must be on the same device.""",
        summary=f"{aten} ATen operators ran in the window but only {kernels} GPU kernel{'s' if kernels != 1 else ''} "
                f"({launches} launch{'es' if launches != 1 else ''}), while {runtime} CUDA/HIP runtime calls were "
                "recorded.",
        numbers={"aten_ops": aten, "gpu_kernels": kernels, "kernel_launches": launches, "runtime_calls": runtime},
        est_gain=0.0, gain_method="not estimated: the speed-up of running on the GPU depends on the model",
        fixes=(pytorch("Move the model and every batch to the GPU", TO_CUDA_CODE),),
        doc_url=DOC,
    )
