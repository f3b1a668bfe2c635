"""``layout-conversions``: cuDNN converts activations between NCHW and NHWC around convolutions."""

from __future__ import annotations

import re

import numpy as np

from gpumagic.analysis.context import Context
from gpumagic.analysis.gpubound import gpu_time_gain
from gpumagic.analysis.metrics import kernel_mask
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: cuDNN's layout transposes, as its kernels are named in cuDNN 7 to 9 (``nchwToNhwcKernel``,
#: ``cudnn::ops::nchwToNhwcKernel``, ``cudnn::engines_precompiled::nhwcToNchwKernel``, their
#: ``nchw2nhwc_params_t`` arguments).
CONVERT_RE = re.compile(r"nchwToNhwc|nhwcToNchw|nchw2nhwc|nhwc2nchw")
#: A finding when the conversions take this share of the primary GPU's kernel time (the
#: TensorBoard profiler plugin's 5 % line). A model whose first convolution alone converts its
#: input (FP32 ResNet-50 on a V100: 0.1 % of kernel time, tests/data) stays well below it.
MIN_SHARE = 0.05
DOC = "https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html"
CHANNELS_LAST_CODE = """
model = model.to(memory_format=torch.channels_last)     # its 4-D weights stored NHWC
images = images.to(memory_format=torch.channels_last)   # and each 4-D input batch, before the model
"""


@rule("layout-conversions")
def layout_conversions(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: cuDNN's layout-transpose kernels (``nchwToNhwcKernel``, ``nhwcToNchwKernel``:
    :data:`CONVERT_RE`) take ≥ 5 % of the primary GPU's kernel time. PyTorch stores 4-D tensors
    NCHW by default, while cuDNN's tensor-core convolutions (fp16/bf16: autocast) work in NHWC, so
    each convolution transposes its input in and its output back: two more passes over the
    activations (PyTorch's channels-last tutorial; NVIDIA's "Convolutional Layers User's Guide",
    "Tensor Layouts In Memory: NCHW vs NHWC"). ``channels_last`` stores weights and activations
    NHWC and the transposes go. Gain: the transposes' GPU time (capped at what can bound the
    steps), an estimate — the convolutions may also pick faster kernels, and an operator
    without a channels-last kernel may convert back. False positives: a model whose other
    operators want NCHW (some custom kernels) gains less."""
    if ctx.device < 0:
        return None
    ev = ctx.trace.events
    k = kernel_mask(ctx)
    rows = np.flatnonzero(k & ctx.trace.name_ids(lambda n: bool(CONVERT_RE.search(n)))[ev.name])
    total = int(ev.dur_ns[k].sum())
    if not rows.size or not total:
        return None
    spent = int(ev.dur_ns[rows].sum())
    share = spent / total
    if share < MIN_SHARE:
        return None
    gain, method = gpu_time_gain(ctx, rows, 1.0, "estimate: the layout transposes' GPU time, which channels_last "
                                                 "removes (the convolutions may also get faster, or an operator "
                                                 "without a channels-last kernel convert back)")
    steps = len(ctx.step_bounds)
    per_step = f", {rows.size / steps:,.0f} a step" if steps else ""
    return finding(
        severity=severity_for(gain),
        title=f"cuDNN converts activations between NCHW and NHWC: {pct(share)} of GPU kernel time",
        why="""PyTorch keeps 4-D tensors in NCHW order unless told otherwise, while cuDNN's tensor-core convolutions
        (fp16 and bf16, as under autocast) work in NHWC: around each convolution it runs a transpose kernel on the
        input and another on the output, two extra passes over the activations. Storing the model and its inputs
        channels_last (NHWC) lets the convolutions read them as they are.""",
        summary=(f"{rows.size:,} layout-transpose kernels ({spent / 1e6:.2f} ms{per_step}) took {pct(share)} of the "
                 "GPU's kernel time."),
        numbers={"conversion_kernels": int(rows.size), "conversion_ms": round(spent / 1e6, 4),
                 "conversion_frac": round(share, 4), "threshold_frac": MIN_SHARE},
        windows=windows(ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows], "gpu", ctx.device, "layout transpose"),
        est_gain=gain,
        gain_method=method,
        fixes=(pytorch("Keep the model and its inputs channels_last", CHANNELS_LAST_CODE),),
        doc_url=DOC,
    )


__all__ = ["layout_conversions"]
