"""``activation-recompute``: activation checkpointing runs each block's forward again inside the
backward pass; the finding weighs that time against whether the memory would fit without it."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.analysis.rules.recompute import MIN_FRAC

RECORDED = os.path.join(DATA, "cpu_checkpointed_blocks.json.gz")
ENGINE = 200  # the autograd engine's device thread, where a GPU backward runs
GiB = 2**30


def test_recorded_checkpointed_blocks():
    """benchmarks/recompute.py --record: four residual MLP blocks, each under
    torch.utils.checkpoint(use_reentrant=False), trained on the CPU (tests/data/MANIFEST.md)."""
    r = analyze(RECORDED)
    f = r.finding("activation-recompute")
    n = f.evidence.numbers
    assert f.severity == "medium" and f.gain_method.startswith("estimate")
    # each of the four blocks recomputes two linears and a GELU a step
    assert "aten::linear ×8" in f.evidence.summary and "aten::gelu ×4" in f.evidence.summary
    ph = r.metrics.phases
    assert 0 < ph.recompute_median_ms < ph.median_ms.backward  # a part of the backward
    assert n["recompute_frac"] == pytest.approx(ph.recompute_median_ms / r.metrics.steps.median_ms, abs=0.05)
    assert n["recompute_kept_bytes"] is None and "no allocator records" in f.evidence.summary
    codes = "\n".join(fx.code for fx in f.fixes)
    assert "x = block(x)" in codes and "gradient_checkpointing_disable()" in codes
    assert "checkpointing=False" in codes
    for fx in f.fixes:
        if fx.flavor == "pytorch":
            compile(fx.code, "<fix>", "exec")  # pastes as Python


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz"))) - {RECORDED}))
def test_silent_on_every_other_recorded_trace(path):
    r = analyze(path)
    assert r.finding("activation-recompute") is None
    assert r.metrics.phases is None or r.metrics.phases.recompute_median_ms is None


def _gpu_steps(peak: int | None, kept: int = 2 * GiB, reentrant: bool = False, recompute: bool = True):
    """Three 10 ms GPU training steps. Forward on the main thread (two linears, 2 ms of kernels);
    backward on the engine thread: a node that first runs the block's forward again (an
    ``aten::linear`` launching a 1.5 ms kernel, memory rising by ``kept`` across it) and then its
    own ``aten::mm`` (3 ms of kernels). With ``reentrant`` the node is
    ``CheckpointFunctionBackward`` and the block's own backward nodes are nested in it after the
    recomputation. ``peak``: the allocator's peak (bytes; no records when None), of 80 GiB."""
    tb = TraceBuilder()
    base = 1 * GiB
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.op("aten::linear", t + 100, 300)
        tb.kernel("sm80_gemm_fwd", t + 200, 2_000, launch_ts=t + 150)
        node = "CheckpointFunctionBackward" if reentrant else "AddmmBackward0"
        tb.op(f"autograd::engine::evaluate_function: {node}", t + 2_500, 5_000, tid=ENGINE)
        if recompute:
            tb.op("aten::linear", t + 2_600, 400, tid=ENGINE)
            tb.kernel("sm80_gemm_recompute", t + 2_700, 1_500, launch_ts=t + 2_650)
        if reentrant:
            tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 3_200, 1_000, tid=ENGINE)
        tb.op("aten::mm", t + 4_300, 300, tid=ENGINE)
        tb.kernel("sm80_gemm_bwd", t + 4_400, 3_000, launch_ts=t + 4_350)
        if peak is not None:
            tb.memory(t + 2_590, base, base)
            tb.memory(t + 3_000, base + kept, base + kept)  # the recomputed activations
            tb.memory(t + 5_000, peak, peak)
            tb.memory(t + 8_000, base, peak)
    return tb.to_dict()


def test_gpu_fits_without_checkpointing():
    """10 GiB peak + 2 GiB rebuilt of an 80 GiB device: the kernel time the recomputation launched
    (1.5 of 10 ms) is the gain, and the evidence says it fits."""
    f = analyze(_gpu_steps(peak=10 * GiB)).finding("activation-recompute")
    n = f.evidence.numbers
    assert n["recompute_frac"] == pytest.approx(0.15, abs=0.01) and f.est_gain == pytest.approx(0.15, abs=0.01)
    assert n["recompute_kept_bytes"] == 2 * GiB
    assert n["projected_peak_frac"] == pytest.approx(12 / 80, abs=1e-3)
    assert "would fit" in f.title and not any(fx.diagnostic for fx in f.fixes)


def test_gpu_silent_when_the_activations_would_not_fit():
    """70 GiB peak + 6 GiB rebuilt > 90 % of 80 GiB: the checkpoints are what makes the step fit."""
    assert analyze(_gpu_steps(peak=70 * GiB, kept=6 * GiB)).finding("activation-recompute") is None
    assert analyze(_gpu_steps(peak=60 * GiB, kept=6 * GiB)).finding("activation-recompute") is not None


def test_gpu_without_memory_records_asks_for_them():
    f = analyze(_gpu_steps(peak=None)).finding("activation-recompute")
    assert f.severity in ("medium", "low") and "would fit" not in f.title
    assert f.fixes[0].diagnostic and "max_memory_allocated" in f.fixes[0].code
    assert "--memory" in f.fixes[0].description


def test_reentrant_checkpoint_counts_its_recomputation_not_the_nested_backward():
    """CheckpointFunctionBackward: from the node's start to the end of the recomputed linear
    (0.5 ms of host time), not the nested backward after it."""
    r = analyze(_gpu_steps(peak=10 * GiB, reentrant=True))
    assert r.metrics.phases.recompute_median_ms == pytest.approx(0.5, abs=1e-3)
    assert r.finding("activation-recompute").evidence.numbers["recompute_frac"] == pytest.approx(0.15, abs=0.01)


def test_a_backward_of_its_own_operators_only_is_silent():
    """Forward operators outside the engine's nodes (the forward pass) and the nodes' own aten::mm
    are no recomputation."""
    r = analyze(_gpu_steps(peak=10 * GiB, recompute=False))
    assert r.finding("activation-recompute") is None and r.metrics.phases.recompute_median_ms is None


def test_below_the_threshold_is_silent():
    """A recomputation of 0.3 ms of kernels in a 10 ms step (3 %) is below the 5 % line."""
    d = _gpu_steps(peak=10 * GiB)
    for e in d["traceEvents"]:
        if e.get("name") == "sm80_gemm_recompute":
            e["dur"] = 300
    assert MIN_FRAC > 0.03 and analyze(d).finding("activation-recompute") is None


def test_the_views_show_the_recomputation_under_the_backward():
    from gpumagic.render.breakdown import phases_html
    from gpumagic.render.text import render_text

    r = analyze(RECORDED)
    redo = r.metrics.phases.recompute_median_ms
    text = render_text(r)
    back = text.index("backward", text.index("STEP PHASES"))
    assert "of which the forward again" in text[back:back + 200]
    html = phases_html(r)
    assert html.index("of which the forward again") > html.index("backward")
    assert f"{redo:.1f} ms" in html
