"""``allocator-churn``: the caching allocator hands device memory back to the driver and allocates
it again in most steps — ``torch.cuda.empty_cache()`` in the loop, retries at the memory limit,
or caching turned off — and the GPU idles around those calls."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze

GiB = 2**30
STEP = 10_000  # µs


def _loop(steps=6, churn_steps=None, mallocs=1, free_us=1_000, peak=None):
    """``steps`` GPU steps of 10 ms: 0.2 ms of launches, 7 ms of kernels, then in each step of
    ``churn_steps`` (default: all) a ``cudaFree`` of ``free_us`` µs (it waits for the queue,
    then returns) and ``mallocs`` ``cudaMalloc`` calls of 0.3 ms; the next step's kernels
    start after the host launches them. ``peak``: allocator records peaking there (bytes)."""
    tb = TraceBuilder()
    churn = set(range(steps)) if churn_steps is None else set(churn_steps)
    for i in range(steps):
        t = i * STEP
        tb.step(i + 1, t, STEP)
        tb.op("aten::linear", t + 50, 150)
        tb.kernel("sm80_gemm", t + 300, 7_000, launch_ts=t + 100)
        if i in churn:
            at = t + 7_400  # after the kernels: the GPU is idle from 7.3 ms
            tb.runtime("cudaFree", at, free_us)
            at += free_us
            for _ in range(mallocs):
                tb.runtime("cudaMalloc", at, 300 if mallocs < 10 else 5)
                at += 300 if mallocs < 10 else 5
        if peak is not None:
            tb.memory(t + 200, peak // 2, peak // 2)
            tb.memory(t + 3_000, peak, peak)
    return tb.to_dict()


def test_empty_cache_every_step():
    r = analyze(_loop())
    f = r.finding("allocator-churn")
    n = f.evidence.numbers
    assert n["churn_steps"] == 6 and n["mallocs_per_step"] == 1 and n["frees_per_step"] == 1
    # idle from each call's start until the next step's kernel: 7.4 → 10.3 ms, ≥ 2.6 ms of each 10 ms step
    assert 0.2 < n["idle_frac"] <= 0.3 and f.est_gain <= n["idle_frac"]
    assert f.fixes[0].code.count("torch.cuda.empty_cache()") == 2 and not f.fixes[0].diagnostic
    assert "num_alloc_retries" in f.fixes[-1].code and f.fixes[-1].diagnostic
    assert "empty_cache() is called in the loop" in f.evidence.summary
    # the calls recur: they are the loop, not a cold start, and the steady rules judge the window
    kinds = {s.kind for s in r.metrics.window.segments}
    assert "cold_start" not in kinds


def test_a_cache_that_warms_up_in_the_first_step_is_the_cold_start():
    r = analyze(_loop(churn_steps=[0]))
    assert r.finding("allocator-churn") is None
    assert "cold_start" in {s.kind for s in r.metrics.window.segments}


def test_near_the_memory_limit_the_cause_is_the_allocators_retries():
    f = analyze(_loop(peak=int(78 * GiB))).finding("allocator-churn")
    assert "near the limit the allocator empties its cache" in f.evidence.summary
    assert not any("empty_cache() inside" in fx.code for fx in f.fixes)  # not the user's call to remove


def test_hundreds_of_driver_allocations_a_step_mean_caching_is_off():
    f = analyze(_loop(mallocs=200)).finding("allocator-churn")
    assert f.evidence.numbers["mallocs_per_step"] == 200
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" in f.fixes[0].code


def test_churn_in_a_minority_of_steps_is_silent():
    assert analyze(_loop(churn_steps=[1, 3])).finding("allocator-churn") is None


def test_below_the_threshold_is_silent():
    d = _loop()
    for e in d["traceEvents"]:  # the next step's kernels start right after the calls, and the calls are short
        if e.get("name") == "cudaFree":
            e["dur"] = 10
        if e.get("name") == "cudaMalloc":
            e["dur"] = 10
        if e.get("name") == "sm80_gemm":
            e["dur"] = 9_900
    assert analyze(d).finding("allocator-churn") is None


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "*.json.gz"))))
def test_silent_on_every_recorded_trace(path):
    assert analyze(path).finding("allocator-churn") is None
