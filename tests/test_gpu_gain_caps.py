"""Issue 31: a fix that makes GPU kernels faster (fusion, fused attention, a faster dtype) cannot
save more than those kernels' time on the steps' critical path. On a CPU-bound step the host sets
the pace, so its gain is small however much time the kernels take; on a GPU-bound step it is
their time × the fix's speed-up, as before."""

import pytest
from tracebuilder import TraceBuilder

import gpumagic

STEP = 1_000.0
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>"
SGEMM = "ampere_sgemm_128x64_nn"
SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>"


def _steps(kernels, host_bound: bool, steps: int = 8):
    """Each step launches ``kernels`` (name, µs) at once; the host then runs Python for the rest of
    the step (host-bound: the GPU finishes early and waits) or waits in a sync until the kernels,
    which fill the step, are done (GPU-bound)."""
    tb = TraceBuilder()
    total = sum(d for _, d in kernels)
    step = STEP if host_bound else total + 10
    for s in range(steps):
        t0 = s * step
        tb.step(s + 1, t0, step)
        t = t0 + 5
        for i, (name, dur) in enumerate(kernels):
            tb.kernel(name, t, dur, launch_ts=t0 + 1 + i * 0.5)
            t += dur
        if host_bound:
            tb.op("aten::item", t0 + 10, STEP - 20)  # host work to the step's end
        else:
            tb.runtime("cudaDeviceSynchronize", t0 + 10, t - t0 - 8)  # returns when the kernels are done
    return gpumagic.analyze(tb.to_dict())


@pytest.mark.parametrize("host_bound", [False, True])
def test_elementwise_gain_is_bounded_by_the_critical_path(host_bound):
    r = _steps([(ELEMENTWISE, 100.0)] * 6, host_bound)
    f = r.finding("elementwise-bound")
    assert f is not None
    kernel_share = r.metrics.kernels.total_ms / r.metrics.window.dur_ms
    if host_bound:  # 60 % of the step in kernels, none of it bounding the step: the host paces it
        assert f.est_gain < 0.05 < kernel_share * 0.5
        assert "can bound the steps" in f.gain_method and f.severity == "low"
    else:
        assert f.est_gain == pytest.approx(kernel_share * 0.5, abs=0.02)
        assert "capped" not in f.gain_method


@pytest.mark.parametrize("host_bound", [False, True])
def test_unfused_attention_gain_is_bounded_by_the_critical_path(host_bound):
    r = _steps([(SGEMM, 150.0), (SOFTMAX, 150.0), (SGEMM, 150.0), (ELEMENTWISE, 150.0)], host_bound)
    f = r.finding("unfused-attention")
    assert f is not None
    pieces = f.evidence.numbers["attention_ms"] / r.metrics.window.dur_ms
    if host_bound:
        assert f.est_gain < 0.05 < pieces * 0.5 and "can bound the steps" in f.gain_method
    else:
        assert f.est_gain == pytest.approx(pieces * 0.5, abs=0.02)


def test_no_gpu_time_fix_promises_more_than_the_kernels_that_bound_the_steps():
    """Every finding whose fix shortens GPU compute, on the host-bound shape: the host launched each
    step's work after the GPU had finished the previous step's and was not waiting on it, so only
    the last step's kernels (followed by the window's end, not by a wait for the host) can bound
    anything; a faster dtype included (its own queue-ahead test alone counts every kernel here)."""
    r = _steps([(SGEMM, 150.0), (SOFTMAX, 150.0), (SGEMM, 150.0), (ELEMENTWISE, 150.0)], host_bound=True)
    last_step = 600.0 / (r.metrics.window.dur_ms * 1000)
    found = [f for f in r.findings if f.id in ("elementwise-bound", "unfused-attention", "mixed-precision-off",
                                               "low-compute-efficiency")]
    assert {f.id for f in found} >= {"unfused-attention", "mixed-precision-off"}
    for f in found:
        assert f.est_gain <= last_step + 1e-3, f.id
    gpu_bound = _steps([(SGEMM, 150.0), (SOFTMAX, 150.0), (SGEMM, 150.0), (ELEMENTWISE, 150.0)], host_bound=False)
    assert gpu_bound.finding("mixed-precision-off").est_gain > 0.2  # GPU-bound: the kernels' own share
