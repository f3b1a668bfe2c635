"""The memory curve: allocator records first, NVML samples as the fallback, peaks kept."""

import numpy as np
from tracebuilder import TraceBuilder

import gpumagic
from gpumagic.render.charts import GIB, envelope, memory_figure, memory_series
from gpumagic.trace.kineto import load
from gpumagic.trace.model import Samples


def _report(with_memory: bool):
    tb = TraceBuilder(total_mem=8 * GIB)
    for i in range(3):
        t = i * 1000.0
        tb.step(i + 1, t, 1000.0)
        tb.kernel("k_gemm", t + 100, 700, launch_ts=t + 50)
        if with_memory:
            tb.memory(t + 10, allocated=(i + 1) * GIB, reserved=4 * GIB)
    return gpumagic.analyze(load(tb.to_dict()))


def test_allocator_records_give_the_curve_and_the_capacity_line():
    report = _report(with_memory=True)
    source, t_ns, nbytes = memory_series(report)
    assert source.startswith("allocator")
    assert nbytes.tolist() == [GIB, 2 * GIB, 3 * GIB]
    assert t_ns.tolist() == [10_000, 1_010_000, 2_010_000]  # 10 µs into each step
    ax = memory_figure(report).axes[0]
    curve, capacity = ax.get_lines()
    assert np.allclose(curve.get_ydata(), [1, 2, 3])
    assert np.allclose(capacity.get_ydata(), 8)


def test_nvml_samples_are_the_fallback():
    report = _report(with_memory=False)
    assert memory_series(report) is None and memory_figure(report) is None
    t = np.array([0, 1_000_000], dtype=np.int64)
    report.trace.samples = Samples(gpu={"t_ns": t, "device": np.zeros(2), "mem_used_bytes": np.array([GIB, 2 * GIB])})
    source, _, nbytes = memory_series(report)
    assert source.startswith("NVML") and nbytes.tolist() == [GIB, 2 * GIB]


def test_envelope_keeps_every_bucket_peak():
    t = np.arange(10_000, dtype=np.int64)
    y = np.zeros(10_000, dtype=np.int64)
    y[4321] = 99
    te, ye = envelope(t, y, max_points=100)
    assert te.size <= 100 and ye.max() == 99
