"""``layout-conversions``: cuDNN transposes activations between NCHW and NHWC around each
convolution (tensor cores in fp16/bf16 work in NHWC); channels_last removes the transposes."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze

TO_NHWC = ("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true, "
           "(cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, __nv_bfloat16 const*, "
           "__nv_bfloat16*)")
TO_NCHW = "void cudnn::ops::nhwcToNchwKernel<float, float, float, true, false, (cudnnKernelDataType_t)0>(int, int)"


def _convnet(convs=4, conv_us=400, transpose_us=60, steps=4):
    """GPU-bound steps of ``convs`` convolutions, each with a transpose in and one out."""
    tb = TraceBuilder()
    step_us = convs * (conv_us + 2 * transpose_us + 30) + 200
    for i in range(steps):
        t = i * step_us
        tb.step(i + 1, t, step_us)
        at = t + 100
        for _ in range(convs):
            for name, dur in ((TO_NHWC, transpose_us), ("sm80_xmma_fprop_implicit_gemm_bf16_nhwc", conv_us),
                              (TO_NCHW, transpose_us)):
                tb.kernel(name, at, dur, launch_ts=max(t + 1, at - 90))
                at += dur + 10
    return tb.to_dict()


def test_transposes_around_every_convolution():
    f = analyze(_convnet()).finding("layout-conversions")
    n = f.evidence.numbers
    assert n["conversion_kernels"] == 4 * 4 * 2
    assert n["conversion_frac"] == pytest.approx(120 / 520, abs=0.01)
    assert 0 < f.est_gain <= n["conversion_frac"] and f.gain_method.startswith("estimate")
    assert "memory_format=torch.channels_last" in f.fixes[0].code


def test_a_first_convolution_alone_is_silent():
    assert analyze(_convnet(transpose_us=5)).finding("layout-conversions") is None  # under 5 % of kernel time


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "*.json.gz"))))
def test_silent_on_every_recorded_trace(path):
    """The FP32 ResNet-50 traces convert at their first convolution only (0.1–0.2 % of kernel time)."""
    assert analyze(path).finding("layout-conversions") is None
