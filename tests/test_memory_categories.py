"""What filled memory (``--memory``: torch's memory profile by category) and the out-of-memory finding."""

from __future__ import annotations

import gzip
import json
import os

import pytest
from tracebuilder import DATA

import gpumagic
from gpumagic.analysis.oom import FIT_MARGIN, largest_batch, parse_message
from gpumagic.trace import load
from gpumagic.trace.kineto import from_bytes

torch = pytest.importorskip("torch")

#: The message of torch 2.x's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp).
CUDA_MESSAGE = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which "
                "3.06 MiB is free. Including non-PyTorch memory, this process has 79.14 GiB memory in use. Of the "
                "allocated memory 78.54 GiB is allocated by PyTorch, and 11.41 MiB is reserved by PyTorch but "
                "unallocated. If reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
#: The format before torch 2.1.
OLD_MESSAGE = ("CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB already "
               "allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch)")


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    return model, torch.optim.Adam(model.parameters()), torch.randn(64, 256), torch.randint(0, 10, (64,))


def _step(model, opt, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_a_cpu_capture_with_memory_names_what_filled_it(tmp_path):
    model, opt, x, y = _model()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with gpumagic.profile(memory=True, skip=1, steps=2, nvml=False, save=str(tmp_path / "run.json.gz")) as run:
        for _ in range(4):
            _step(model, opt, x, y)
    mem = run.report.metrics.memory
    if mem.by_category is None:  # this torch records no categories on CPU: say why, never a silent gap
        assert mem.categories_missing
        pytest.skip(f"torch gave no memory categories: {mem.categories_missing}")
    cats = mem.by_category
    assert mem.by_category_device == "cpu" and mem.categories_missing is None
    # Adam's state (exp_avg, exp_avg_sq and a step count per parameter) is held at every peak
    state_bytes = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    assert state_bytes > 2 * param_bytes and cats["optimizer_state"] == state_bytes
    assert cats["parameter"] >= param_bytes and cats["input"] >= x.numel() * 4
    assert all(mem.at_peak[k] <= v for k, v in cats.items())
    assert 0 <= mem.by_category_peak_ms <= run.report.metrics.window.dur_ms
    top = mem.top_allocations
    assert top and [a.bytes for a in top] == sorted((a.bytes for a in top), reverse=True)
    assert top[0].bytes == 256 * 512 * 4  # the first layer's weight-sized tensors are the largest
    made_here = [a for a in top if a.frame]
    assert made_here and all("test_memory_categories.py(" in a.frame for a in made_here)
    # the saved bundle gives the same answer offline, and the HTML shows the stacked chart
    again = gpumagic.analyze(str(tmp_path / "run.json.gz"))
    assert again.metrics.memory.by_category == cats
    html = again.to_html()
    assert "What filled memory" in html and "gm-memory-categories" in html
    assert "BY CATEGORY at the peak" in again.to_text()


def test_without_memory_the_report_says_how_to_get_categories():
    report = gpumagic.analyze(os.path.join(DATA, "resnet50_v100_workers0.json.gz"))
    mem = report.metrics.memory
    assert mem.by_category is None and mem.top_allocations is None
    assert "--memory" in mem.categories_missing
    assert "Memory by category" in report.to_html()


def _bundle_with(trace_path: str, section: dict) -> bytes:
    with gzip.open(trace_path) as f:
        doc = json.load(f)
    doc["gpumagic"] = {"format": 1, "label": "", "notes": [], **section}
    return json.dumps(doc).encode()


def _recorded_block(origin_ns: int, lo: int, names=("parameter", "gradient", "activation", "unknown")):
    """A memory profile as the capture writes it (profiler clock = trace origin + trace time)."""
    t = [origin_ns + lo + k * 1_000_000 for k in range(4)]
    rows = [[100, 0, 0, 0], [100, 0, 700, 5], [100, 100, 300, 5], [100, 100, 0, 0]]
    return {"device": "cuda:0", "categories": list(names), "t_ns": t, "bytes": rows,
            "peak_t_ns": t[1], "peak_bytes": rows[1],
            "top": [{"bytes": 700, "category": "activation", "frame": "train.py(12): step", "module": "Linear_0",
                     "op": "aten::addmm", "t_ns": t[1]}]}


def test_a_recorded_memory_profile_is_read_checked_and_windowed():
    path = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
    plain = load(path)
    report = gpumagic.analyze(path)
    lo = report.metrics.window.start_ns
    raw = _bundle_with(path, {"memory_categories": _recorded_block(plain.origin_ns, lo + 1000)})
    mem = gpumagic.analyze(from_bytes(raw, "b")).metrics.memory
    assert {k: v for k, v in mem.at_peak.items() if k != "allocator_cache"} == {
        "parameter": 100, "gradient": 0, "activation": 700, "unknown": 5}  # adds up to the peak
    assert {k: v for k, v in mem.by_category.items() if k != "allocator_cache"} == {
        "parameter": 100, "gradient": 100, "activation": 700, "unknown": 5}  # each one's own peak
    assert mem.by_category_peak_ms == pytest.approx(1.001, abs=1e-6)
    assert mem.top_allocations[0].frame == "train.py(12): step" and mem.top_allocations[0].at_ms == pytest.approx(1.001)
    bad = _recorded_block(plain.origin_ns, lo)
    bad["bytes"] = [[1, 2]]  # rows that do not match the times and categories
    trace = from_bytes(_bundle_with(path, {"memory_categories": bad}), "b")
    assert "memory_categories" not in trace.meta
    assert any("memory categories are not valid" in n for n in trace.notes)


@pytest.mark.parametrize("message, asked, capacity, unallocated", [
    (CUDA_MESSAGE, 20 * 2**20, round(79.15 * 2**30), round(11.41 * 2**20)),
    (OLD_MESSAGE, 36 * 2**20, round(7.93 * 2**30), round(188.0 * 2**20) - round(130.35 * 2**20)),
    ("MPS backend out of memory (MPS allocated: 1.20 GB, other allocations: 3.40 MB, max allowed: 18.13 GB). "
     "Tried to allocate 256.00 MB on private pool.", 256 * 2**20, round(18.13 * 2**30), None),
    ("out of memory", None, None, None),
])
def test_the_message_gives_the_sizes(message, asked, capacity, unallocated):
    got = parse_message(message)
    assert (got["asked_bytes"], got["capacity_bytes"], got["unallocated_reserved_bytes"]) == (asked, capacity, unallocated)


def test_largest_batch_keeps_the_margin():
    # 2 GiB fixed, 6 GiB more at batch 32 on a 16 GiB device: (0.9 * 16 - 2) / (6 / 32) = 66.13
    b = largest_batch(32, 8 * 2**30, 2 * 2**30, 16 * 2**30)
    assert b == 66
    per_sample = 6 * 2**30 / 32
    assert 2 * 2**30 + b * per_sample <= (1 - FIT_MARGIN) * 16 * 2**30 < 2 * 2**30 + (b + 1) * per_sample
    assert largest_batch(32, 2 * 2**30, 2 * 2**30, 16 * 2**30) is None  # nothing grows with the batch


def test_an_out_of_memory_error_gives_the_finding_and_is_reraised_unchanged(tmp_path):
    model, opt, x, y = _model()
    err = torch.OutOfMemoryError(CUDA_MESSAGE)
    saved = tmp_path / "oom.json.gz"
    with pytest.raises(torch.OutOfMemoryError) as caught, gpumagic.profile(memory=True, batch_size=64, nvml=False, save=str(saved)) as run:
        for i in range(3):
            _step(model, opt, x, y)
            if i == 1:
                raise err
    assert caught.value is err
    for report in (run.report, gpumagic.analyze(str(saved))):  # live, and from the saved bundle
        f = report.findings[0]
        assert f.id == "out-of-memory" and f.severity == "high"
        n = f.evidence.numbers
        assert n["asked_bytes"] == 20 * 2**20 and n["unallocated_reserved_bytes"] == round(11.41 * 2**20)
        assert n["batch_size"] == 64 and isinstance(n["largest_batch_estimate"], int)
        assert "estimate" in f.evidence.summary
        freed = [_freed(fx.description) for fx in f.fixes]
        known = [b for b in freed if b is not None]
        assert known == sorted(known, reverse=True) and freed[:len(known)] == known  # most first, unknown last


def _freed(description: str) -> float | None:
    import re

    hit = re.search(r"frees up to ([0-9.]+) (bytes|KiB|MiB|GiB)", description)
    return None if hit is None else float(hit.group(1)) * {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[hit.group(2)]


def test_without_memory_records_the_finding_still_comes_from_the_exception_alone():
    path = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
    raw = _bundle_with(path, {"error": {"type": "OutOfMemoryError", "types": ["OutOfMemoryError", "RuntimeError"],
                                        "message": OLD_MESSAGE}})
    f = gpumagic.analyze(from_bytes(raw, "b")).findings[0]
    assert f.id == "out-of-memory" and f.evidence.numbers["asked_bytes"] == 36 * 2**20
    assert f.evidence.numbers["largest_batch_estimate"] is None
    assert "--memory" in f.evidence.numbers["null_because"] and "--batch-size" in f.evidence.numbers["null_because"]
    # 188 − 130.35 MiB reserved but unallocated ≥ the 36 MiB asked: fragmentation, and the only fix with a
    # known amount when nothing says what held the memory, so first
    assert "expandable_segments" in f.fixes[0].code and "57.65 MiB" in f.fixes[0].description
    other = _bundle_with(path, {"error": {"type": "ValueError", "types": ["ValueError"], "message": "bad"}})
    assert "out-of-memory" not in gpumagic.analyze(from_bytes(other, "b")).finding_ids


def test_a_cell_raising_out_of_memory_reraises_the_same_exception(tmp_path):
    from ipyshell import ipython_shell
    from IPython.utils.capture import capture_output

    with ipython_shell("gpumagic") as shell:
        shell.user_ns["oom_error"] = torch.OutOfMemoryError(CUDA_MESSAGE)
        with capture_output():
            result = shell.run_cell("%%gpuprofile --quiet -o rep --no-nvml\nimport torch\nx = torch.ones(4) * 2\n"
                                    "raise oom_error\n")
        assert result.error_in_exec is shell.user_ns["oom_error"]
        assert shell.user_ns["rep"].findings[0].id == "out-of-memory"
