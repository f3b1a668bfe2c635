"""``growing-concatenation``: a tensor grown by ``torch.cat`` one piece at a time, on a recorded
inference loop, on built traces that vary one condition at a time (host and GPU, through the
window and anew in every step), and silent on every other recorded trace."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze

ID = "growing-concatenation"
RECORDED = os.path.join(DATA, "cpu_concat_growth.json.gz")


def test_a_recorded_loop_that_grows_its_result_with_torch_cat():
    """benchmarks/concat_growth.py --record (tests/data/MANIFEST.md): the list and one torch.cat
    saved 0.89 of 400 batches' time, for an estimate of 0.73."""
    f = analyze(RECORDED).finding(ID)
    n = f.evidence.numbers
    assert n["calls"] == 160 and n["series"] == 1 and n["growth"] >= 2.0 and n["measured_on"] == "host"
    assert 0.3 < f.est_gain < n["concat_frac"] and f.gain_method.startswith("estimate")
    assert "outputs.append(model(x))" in f.fixes[0].code and "torch.cat(outputs)" in f.fixes[0].code
    assert f.evidence.windows and all(w.label == "a growing concatenation" for w in f.evidence.windows)


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz"))) - {RECORDED}))
def test_silent_on_every_other_recorded_trace(path):
    """The model-internal concatenations of the real traces (a DenseNet-like cat, attention's key
    and value caches while decoding) do not grow so."""
    assert analyze(path).finding(ID) is None


def _inference(durations_us, other_us: float = 100.0, gpu_us=None) -> dict:
    """An inference window: each iteration a model op of ``other_us`` then a concatenation of the
    given host duration; with ``gpu_us``, the concatenation launches a copy kernel of that length."""
    tb = TraceBuilder(cc=(8, 0) if gpu_us is not None else None)
    t = 0.0
    for i, d in enumerate(durations_us):
        tb.op("aten::addmm", t, other_us)
        tb.op("aten::cat", t + other_us + 5, d)
        if gpu_us is not None:
            tb.kernel("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float>", t + other_us + 8,
                      gpu_us[i], launch_ts=t + other_us + 6)
        t += other_us + max(d, 0 if gpu_us is None else gpu_us[i]) + 20
    return tb.to_dict()


def test_thresholds_on_the_host():
    grow = [20.0 * (i + 1) for i in range(40)]  # linear: 20 µs to 800 µs
    f = analyze(_inference(grow)).finding(ID)
    assert f is not None and f.evidence.numbers["growth"] > 5
    # the estimate: every call but one of the longest
    window = analyze(_inference(grow)).metrics.window.dur_ms * 1e3
    assert f.est_gain == pytest.approx((sum(grow) - max(grow)) / window, abs=0.01)
    assert analyze(_inference([400.0] * 40)).finding(ID) is None  # the same size every call: a model's own
    assert analyze(_inference([300.0 + 5 * i for i in range(40)])).finding(ID) is None  # grows under 2x
    assert analyze(_inference(grow[:7])).finding(ID) is None  # too few calls
    assert analyze(_inference([2.0 * (i + 1) for i in range(40)], other_us=2_000)).finding(ID) is None  # < 10 %


def test_a_sawtooth_that_grows_and_starts_again_is_not_one_series_without_steps():
    """Without steps, concatenations that grow and fall back (many short sequences) are not a
    tensor grown through the window."""
    saw = [20.0 * (i % 10 + 1) for i in range(60)]
    assert analyze(_inference(saw)).finding(ID) is None


def test_a_sequence_grown_anew_in_every_step():
    """A training loop whose forward builds its output one time step at a time with torch.cat: the
    concatenations grow within each step and start again in the next."""
    tb = TraceBuilder(cc=None)
    t = 0.0
    for k in range(4):
        start = t
        for i in range(16):
            tb.op("aten::addmm", t, 50)
            tb.op("aten::cat", t + 55, 40.0 * (i + 1))
            t += 55 + 40.0 * (i + 1) + 10
        tb.op("autograd::engine::evaluate_function: AddmmBackward0", t, 200)
        tb.add(cat="user_annotation", name="Optimizer.step#SGD.step", ts=t + 210, dur=50)
        t += 300
        tb.step(k + 1, start, t - start)
    f = analyze(tb.to_dict()).finding(ID)
    assert f is not None and f.evidence.numbers["series"] == 4 and f.evidence.numbers["calls"] == 64


def test_on_a_gpu_the_copies_kernels_are_read():
    """On a GPU the host's call stays a launch; the kernel's copy is what grows."""
    grow = [30.0 * (i + 1) for i in range(40)]
    f = analyze(_inference([15.0] * 40, gpu_us=grow)).finding(ID)
    assert f is not None and f.evidence.numbers["measured_on"] == "GPU kernels"
    assert analyze(_inference([15.0] * 40, gpu_us=[300.0] * 40)).finding(ID) is None


def test_the_fix_gathers_the_same_tensor():
    """The fix's list and one torch.cat give what the growing loop gives."""
    import torch

    from gpumagic.analysis.rules.concat import LIST_CODE

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 6).eval()
    batches = [torch.randn(4, 8) for _ in range(5)]
    grown = torch.empty(0, 6)
    with torch.inference_mode():
        for x in batches:
            grown = torch.cat([grown, model(x)])
    ns = {"torch": torch, "model": model, "batches": batches}
    exec(compile(LIST_CODE, "<fix>", "exec"), ns)
    assert torch.equal(ns["result"], grown)


def _evaluation_loop(batches: int = 40, grow: bool = True) -> dict:
    """Hugging Face's evaluation loop, built: per batch a DataLoader wait, five small concatenations
    of the model's own (12 µs), then the logits and the labels concatenated to the ones before
    (``nested_concat``: the logits' copy grows 400 µs a batch, the labels' 6 µs)."""
    tb = TraceBuilder(cc=None)
    t = 0.0
    for i in range(batches):
        tb.dataloader(t, 30)
        t += 40
        for _ in range(5):
            tb.op("aten::addmm", t, 60)
            tb.op("aten::cat", t + 65, 12)
            t += 85
        for d in ((400.0 * (i + 1), 6.0 * (i + 1)) if grow else (400.0, 6.0)):
            tb.op("aten::cat", t, d)
            t += d + 10
    return tb.to_dict()


def test_an_evaluation_loop_that_concatenates_its_logits_each_batch():
    """The model's own small concatenations and the labels' keep the whole series flat at a glance;
    each batch's longest call, the logits', grows."""
    f = analyze(_evaluation_loop()).finding(ID)
    assert f is not None and f.evidence.numbers["calls"] == 40 and f.evidence.numbers["growth"] > 5
    assert any("preprocess_logits_for_metrics" in fx.code for fx in f.fixes if fx.flavor == "huggingface")
    assert analyze(_evaluation_loop(grow=False)).finding(ID) is None
