"""``cpu-float64``: a CPU-only run whose matrix work computes in float64 (double precision), where
float32 halves the bytes and doubles the numbers each vector instruction takes."""

from __future__ import annotations

from gpumagic.analysis.context import Context
from gpumagic.analysis.cpuprecision import compute_in_calls_of, float64, low_precision
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for, windows
from gpumagic.analysis.rules.precision import FLOAT32_CODE
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding

#: Evidence: at least half of the matrix-operator calls with a recorded floating-point input type
#: took float64 first (``--shapes``), at least this many of them ...
MIN_TYPED_CALLS = 2
#: ... or, without recorded types, at least half of the optimizers' parameter elements are float64
#: (a model with float64 weights computes its forward and backward in float64).
MIN_SHARE = 0.5
#: The matrix operators (forward and backward, counted once) must take this share of the window:
#: the GPU rule's line for matmul kernels (``precision.MATMUL_KERNEL_FRAC``), on the host ...
MIN_MATRIX_FRAC = 0.10
#: ... in calls of at least this long, where the numbers' work outweighs a call's fixed cost.
#: ``benchmarks/cpu_float64.py --calls`` on this project's 2-core AVX2 machine (2026-12-06): an
#: ``nn.Linear`` on a batch of 64 ran 1.04-1.07x slower in float64 in calls of 8-11 us, 1.6x at
#: 19 us, 1.8-2.1x from 42 us on (unprofiled). The profiler lengthens each call by up to about
#: 20 us (the tiny MLP's ``aten::linear``: 8 us unprofiled, 27 us profiled), so a call of 50 us
#: profiled ran about 30 us or more unprofiled, where float64 cost 1.6x and more.
LONG_CALL_NS = 50_000
DOC = "https://pytorch.org/docs/stable/tensor_attributes.html#torch-dtype"
#: Measured by benchmarks/cpu_float64.py on this project's 2-core AMD EPYC (AVX2): the training
#: step in float64 over the same step in float32 (see docs/performance.md for the run).
MEASURED = ("2.20× slower in float64 for an MLP of 1024-wide layers, 2.37× for a small convolution network, "
            "1.85× for a transformer encoder, no slower (0.98×) for a tiny MLP whose step is per-operator overhead")
INFERENCE_CODE = """
model = model.float()          # parameters and buffers to float32 (in place)
with torch.inference_mode():
    out = model(x.float())     # every float64 input (NumPy's default: torch.from_numpy(array) is float64 too)
"""


@rule("cpu-float64")
def cpu_float64(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: a CPU-only trace whose matrix operators (``cpuprecision.COMPUTE_OPS``: linear,
    matmul, convolutions and their backward, attention) take ≥ 10 % of the window and compute in
    float64: ≥ half of those calls with a recorded floating-point first input type have
    ``double`` (or ``c10::complex<double>``) first (``--shapes``, ≥ 2 calls); without recorded
    types, ≥ half of the elements of the parameters the optimizers held are float64 (a gpumagic
    capture reads them at each optimizer's first step). A NumPy array is float64, and so is a
    tensor made from one; a model given such inputs and made to match with ``.double()``
    computes everything in float64. On a CPU a vector instruction takes twice as many float32
    numbers as float64 and the memory traffic halves: measured 1.85× (a transformer encoder) to
    2.37× (a small CNN) faster in float32 on an AVX2 CPU
    (``benchmarks/cpu_float64.py``). Gain, an upper bound: the share of the window in host
    operators, counted once — as if float32 made them free (the measured saving exceeds the
    matrix operators' share alone: every operator on float64 tensors moves twice the bytes).
    Silent with a GPU (``mixed-precision-off`` reads float64 GEMM kernels there), on an inference
    window without recorded types (no optimizer to read the parameters from). False positives:
    float64 kept on purpose for numerical reasons (ill-conditioned solvers, tests against a
    float64 reference). Silent where the matrix operators' calls are short (< 10 % of the window
    in calls of 50 µs or more): there a call's fixed cost outweighs its numbers and float32 saves
    nothing (a tiny MLP: 0.98x)."""
    if ctx.device >= 0:
        return None
    f64 = float64(ctx)
    typed = f64.typed_frac
    if typed is not None and f64.typed_calls >= MIN_TYPED_CALLS:
        if typed < MIN_SHARE:
            return None
    elif f64.params_frac is None or f64.params_frac < MIN_SHARE:
        return None
    lp = low_precision(ctx)
    matrix = ctx.frac(lp.compute_ns)
    long_calls = ctx.frac(compute_in_calls_of(ctx, LONG_CALL_NS))
    if long_calls < MIN_MATRIX_FRAC:
        return None
    gain = max(ctx.frac(lp.ops_ns), matrix)
    evidence = []
    if typed is not None and f64.typed_calls >= MIN_TYPED_CALLS:
        evidence.append(f"{f64.typed_calls} of {f64.typed_of} matrix-operator calls with a recorded floating-point "
                        f"input took float64 ({pct(typed)})")
    if f64.params_frac is not None:
        evidence.append(f"{pct(f64.params_frac)} of the optimizer's parameter elements are float64")
    training = ctx.workload == "training"
    return finding(
        severity=severity_for(gain),
        title="The model computes in float64 (double precision) on the CPU",
        why=f"""The matmuls and convolutions ran in float64. A NumPy array is float64 by default, and so is a
        tensor made from one (torch.from_numpy, torch.tensor); a model given such inputs fails with "expected
        ... Float but found Double", and .double() on the model silences the error by making everything float64.
        On a CPU a vector instruction holds twice as many float32 numbers as float64 ones and every tensor moves
        half the bytes: {MEASURED} (benchmarks/cpu_float64.py on an AVX2 CPU). Unless the model needs double
        precision, cast the model and its inputs to float32 once. Autocast does not help: it leaves float64
        tensors alone.""",
        summary=(f"{'; '.join(evidence)}. The host's matrix operators take {pct(matrix)} of the window "
                 f"({pct(long_calls)} in calls of {LONG_CALL_NS // 1000} µs or more), all its operators {pct(gain)}."),
        numbers={"float64_calls": f64.typed_calls, "typed_calls": f64.typed_of,
                 "float64_params_frac": None if f64.params_frac is None else round(f64.params_frac, 4),
                 "matrix_ops_frac": round(matrix, 4), "long_matrix_calls_frac": round(long_calls, 4),
                 "host_ops_frac": round(gain, 4), "threshold_matrix_ops_frac": MIN_MATRIX_FRAC,
                 "threshold_call_us": LONG_CALL_NS // 1000},
        windows=windows(lp.compute[0], lp.compute[1], "cpu", label="matrix operators"),
        est_gain=gain,
        gain_method=("upper bound: the share of the window in host operators, counted once, as if float32 made them "
                     "free (every operator on float64 tensors moves twice the bytes, not only the matrix ones, which "
                     f"take matrix_ops_frac); measured {MEASURED}"),
        fixes=(pytorch("Compute in float32: cast the model once and every floating-point input (a NumPy array is "
                       "float64: .float() it, or build it as np.float32)", FLOAT32_CODE if training else INFERENCE_CODE),),
        doc_url=DOC,
    )


__all__ = ["cpu_float64"]
