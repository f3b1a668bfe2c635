"""``dense-embedding-grad``: an embedding table far larger than what a batch uses, built with
dense gradients (the default), so that each step zero-fills, accumulates and updates the whole
table."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.analysis.rules.embeddings import MIN_FILL_FRAC, MIN_FRAC

RECORDED = os.path.join(DATA, "cpu_dense_embedding.json.gz")


def test_a_recorded_bag_of_words_model_with_a_dense_table():
    """benchmarks/sparse_embedding.py --record (tests/data/MANIFEST.md): a 200,000 × 32
    EmbeddingBag and Adam; unprofiled, 29.9 ms a step dense, 1.7 ms sparse with SparseAdam."""
    r = analyze(RECORDED)
    f = r.finding("dense-embedding-grad")
    n = f.evidence.numbers
    assert n["zero_fill_frac"] >= MIN_FILL_FRAC and n["dense_backwards"] == 3 and n["optimizer_steps"] == 3
    assert f.est_gain == n["cost_frac"] > 0.5 and f.gain_method.startswith("upper bound")
    assert "SparseAdam" in f.fixes[0].code and "sparse=True" in f.fixes[0].code and "with its moments" in f.why
    # unfused-optimizer claims the same optimizer steps: fixing both cannot save more than their time together
    assert r.finding("unfused-optimizer") is not None
    assert r.combined_gain == pytest.approx(f.est_gain, abs=0.01)


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz"))) - {RECORDED}))
def test_silent_on_every_other_recorded_trace(path):
    assert analyze(path).finding("dense-embedding-grad") is None


def _steps(fill_us: float, add_us: float, optimizer: str = "Adam", optimizer_us: float = 400.0, other_us: float = 300.0,
           gpu: bool = False) -> dict:
    """Three steps: a forward, a dense embedding backward holding a zero fill of ``fill_us`` and
    an add of ``add_us``, then an ``optimizer`` step of ``optimizer_us`` (``other_us`` of other work)."""
    tb = TraceBuilder(cc=(8, 0) if gpu else None)
    bwd = fill_us + add_us + 4
    step = other_us + bwd + optimizer_us + 20
    for i in range(3):
        t = i * step
        tb.step(i + 1, t, step)
        tb.op("aten::embedding_bag", t + 1, other_us - 2)
        at = t + other_us
        tb.op("autograd::engine::evaluate_function: EmbeddingBagBackward0", at, bwd + 2)
        tb.op("aten::_embedding_bag_dense_backward", at + 1, bwd)
        tb.op("aten::zeros", at + 2, fill_us)
        tb.op("aten::index_add_", at + 2 + fill_us, add_us)
        tb.add(cat="user_annotation", name=f"Optimizer.step#{optimizer}.step", ts=at + bwd + 10, dur=optimizer_us)
        if gpu:
            tb.kernel("k", t + 10, 5, launch_ts=t + 5)
    return tb.to_dict()


def test_thresholds():
    f = analyze(_steps(600, 400)).finding("dense-embedding-grad")
    assert f is not None and f.evidence.numbers["zero_fill_frac"] == pytest.approx(600 / 1004, abs=0.01)
    assert analyze(_steps(400, 600)).finding("dense-embedding-grad") is None  # a table the batches mostly cover
    # the backward and the optimizer under a tenth of the window: not worth naming
    small = analyze(_steps(30, 20, optimizer_us=20, other_us=2_000)).finding("dense-embedding-grad")
    assert small is None and MIN_FRAC > (30 + 20 + 4 + 20) / (2_000 + 54 + 40)
    assert analyze(_steps(600, 400, gpu=True)).finding("dense-embedding-grad") is None


@pytest.mark.parametrize("optimizer", ["SGD", "Adagrad"])
def test_optimizers_that_take_sparse_gradients_keep_their_kind(optimizer):
    f = analyze(_steps(600, 400, optimizer=optimizer)).finding("dense-embedding-grad")
    assert "SparseAdam" not in f.fixes[0].code and "weight_decay" in f.fixes[0].code
    assert f"{optimizer} takes them as it is" in f.fixes[0].description and "with its moments" not in f.why


def test_one_fill_a_busy_machine_stalled_does_not_decide():
    """Three backwards whose fills take 2 µs of 100 (a table the batch covers), one of them stalled
    7.5 ms by other processes: summed, the fills would be most of the time; the median of the
    calls' shares is 2 %."""
    d = _steps(2, 94)
    fills = [e for e in d["traceEvents"] if e.get("name") == "aten::zeros"]
    stalled = fills[1]
    for e in d["traceEvents"]:  # the stalled call and everything after it in its step grow by 7.5 ms
        if e.get("name") in ("aten::_embedding_bag_dense_backward",
                             "autograd::engine::evaluate_function: EmbeddingBagBackward0") \
                and e["ts"] <= stalled["ts"] <= e["ts"] + e["dur"]:
            e["dur"] += 7_500
    stalled["dur"] += 7_500
    for e in d["traceEvents"]:
        if e.get("name") == "aten::index_add_" and e["ts"] > stalled["ts"] and e["ts"] < stalled["ts"] + 200:
            e["ts"] += 7_500
    assert analyze(d).finding("dense-embedding-grad") is None
