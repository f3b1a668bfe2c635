"""Time per nn.Module (issue 30): ranges from global forward hooks while recording (``--modules``),
backward time through the trace's own forward→backward links (``fwdbwd`` flows), ``metrics.modules``,
and the Modules view. A hand-built trace checks the attribution exactly; a small nn.Sequential
trained on CPU checks the capture end to end (structure only: no timing is assumed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from capture.test_magic import TRAIN, run
from tracebuilder import TraceBuilder

import gpumagic
from gpumagic.capture.modules import ModuleRanges
from gpumagic.render.modules import modules_text, tree_rows
from gpumagic.trace.links import MODULE_PREFIX


def _global_hooks() -> int:
    from torch.nn.modules import module as nn_module

    return len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)


ENGINE = 200  # the autograd engine's device thread, where CUDA backward nodes run


def _built_trace(tmp_path, with_flows: bool = True, bwd_tid: int = 100):
    """One step: net (Sequential) holds net.0 (Linear: addmm + a kernel) and net.1 (ReLU); in the
    backward (on ``bwd_tid``), ReluBackward0 then AddmmBackward0 (which launches a kernel), each
    linked to its forward operator by a fwdbwd flow."""
    tb = TraceBuilder()
    tb.step(1, 0, 1000)
    ann = "user_annotation"
    tb.op(f"{MODULE_PREFIX}net (Sequential)", 10, 390, cat=ann)
    tb.op(f"{MODULE_PREFIX}net.0 (Linear)", 20, 180, cat=ann)
    tb.op("aten::addmm", 50, 100)
    tb.kernel("gemm_fwd", 70, 30, launch_ts=60)
    tb.op(f"{MODULE_PREFIX}net.1 (ReLU)", 210, 180, cat=ann)
    tb.op("aten::relu", 250, 50)
    tb.op("autograd::engine::evaluate_function: ReluBackward0", 500, 60, tid=bwd_tid)
    tb.op("ReluBackward0", 502, 50, tid=bwd_tid)
    tb.op("autograd::engine::evaluate_function: AddmmBackward0", 600, 120, tid=bwd_tid)
    tb.op("AddmmBackward0", 601, 100, tid=bwd_tid)
    tb.add(cat="cuda_runtime", name="cudaLaunchKernel", ts=610, dur=3, tid=bwd_tid, args={"correlation": 7})
    tb.add(cat="kernel", name="gemm_bwd", ts=620, dur=40, pid=0, tid=7, args={"device": 0, "stream": 7, "correlation": 7})
    tb.op("Optimizer.step#SGD.step", 800, 100)
    if with_flows:
        for fid, (f, b) in enumerate(((50, 601), (250, 502)), start=1):
            tb.add(ph="s", id=fid, cat="fwdbwd", name="fwdbwd", ts=f)
            tb.add(ph="f", id=fid, cat="fwdbwd", name="fwdbwd", ts=b, bp="e", tid=bwd_tid)
    return tb.write(tmp_path / "t.json")


@pytest.mark.parametrize("bwd_tid", [100, ENGINE], ids=["same-thread", "engine-thread"])
def test_backward_time_follows_the_fwdbwd_links_into_each_module_and_its_parents(tmp_path, bwd_tid):
    rows = {r.path: r for r in gpumagic.analyze(_built_trace(tmp_path, bwd_tid=bwd_tid)).metrics.modules}
    assert list(rows) == ["net", "net.0", "net.1"]  # largest first
    assert (rows["net.0"].forward_ms, rows["net.0"].backward_ms) == (0.18, 0.12)  # the evaluate_function span
    assert (rows["net.0"].forward_gpu_ms, rows["net.0"].backward_gpu_ms) == (0.03, 0.04)
    assert (rows["net.1"].forward_ms, rows["net.1"].backward_ms, rows["net.1"].backward_gpu_ms) == (0.18, 0.06, 0.0)
    assert (rows["net"].forward_ms, rows["net"].backward_ms, rows["net"].forward_gpu_ms) == (0.39, 0.18, 0.03)
    assert {r.type for r in rows.values()} == {"Sequential", "Linear", "ReLU"} and {r.calls for r in rows.values()} == {1}


def test_links_from_a_parsed_dict_and_none_without_flows(tmp_path):
    report = gpumagic.analyze(_built_trace(tmp_path, with_flows=False))
    assert [r.backward_ms for r in report.metrics.modules] == [0.0, 0.0, 0.0]  # links read, none found
    parsed = json.loads(Path(_built_trace(tmp_path)).read_text())
    from_file = gpumagic.analyze(_built_trace(tmp_path)).metrics.modules
    assert gpumagic.analyze(parsed).metrics.modules == from_file  # the dict's decoded flows give the same links
    trace = gpumagic.load_trace(parsed)
    trace.links = None  # a trace built in memory without them: backward time unknown, not zero
    assert [r.backward_ms for r in gpumagic.analyze(trace).metrics.modules] == [None, None, None]
    assert "modules" not in gpumagic.analyze("example").to_dict()["metrics"]  # no ranges: no section


def test_the_tree_puts_children_under_their_parent_heaviest_first(tmp_path):
    report = gpumagic.analyze(_built_trace(tmp_path))
    assert [(r.path, depth) for r, depth, _ in tree_rows(list(report.metrics.modules))] == [
        ("net", 0), ("net.0", 1), ("net.1", 1)]
    text = modules_text(report, 80)
    assert "├─ 0 (Linear)" in text and "└─ 1 (ReLU)" in text
    html = report.to_html()
    assert '<section class="gm-section gm-modules"><h3>Modules</h3>' in html and "net.0" in html


def test_a_small_sequential_trained_on_cpu(clean_modules):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpumagic.profile(modules=True, nvml=False, display=False, skip=1, steps=3) as run_:
        assert _global_hooks() == 2
        for _ in range(6):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    assert _global_hooks() == 0
    rows = {r.path: r for r in run_.report.metrics.modules}
    assert set(rows) == {"Sequential", "Sequential.0", "Sequential.1", "Sequential.2"}
    assert {r.calls for r in rows.values()} == {3}  # one call per recorded step
    assert rows["Sequential.0"].type == "Linear" and rows["Sequential.1"].type == "ReLU"
    children = [rows[f"Sequential.{i}"] for i in range(3)]
    assert rows["Sequential"].forward_ms >= sum(c.forward_ms for c in children)  # ranges nest
    # Sequential runs no operator of its own: its backward is its children's, exactly
    assert rows["Sequential"].backward_ms == pytest.approx(sum(c.backward_ms for c in children), abs=1e-3)
    # the first Linear's input needs no gradient, so a backward hook would fire before its weight
    # gradient; the link from its addmm still finds AddmmBackward0
    assert rows["Sequential.0"].backward_ms > 0 and rows["Sequential.2"].backward_ms > 0
    assert all(r.forward_gpu_ms is None for r in rows.values())  # CPU only


def test_without_flow_arrows_the_sequence_numbers_give_the_same_links(clean_modules, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpumagic.profile(modules=True, nvml=False, display=False, skip=1, steps=2) as run_:
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    doc = json.loads(run_.bundle)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "fwdbwd"]
    (tmp_path / "noflows.json").write_text(json.dumps(doc))
    with_flows = gpumagic.analyze(run_.trace)
    without = gpumagic.analyze(str(tmp_path / "noflows.json"))
    assert len(run_.trace.links) > 0 and len(without.trace.links) == len(run_.trace.links)
    assert without.trace.links.fwd.tolist() == run_.trace.links.fwd.tolist()
    assert [r.backward_ms for r in without.metrics.modules] == [r.backward_ms for r in with_flows.metrics.modules]


def test_off_by_default_and_named_from_the_namespace(clean_modules):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with gpumagic.profile(nvml=False, display=False, max_seconds=1) as run_:
        assert _global_hooks() == 0
        model(torch.randn(2, 4))
    assert run_.report.metrics.modules is None
    ranges = ModuleRanges({"model": model}, {"_hidden": model}).install()
    try:
        assert ranges._path(model, []) == "model" and ranges._path(model[0], []) == "model.0"
    finally:
        ranges.remove()
    assert _global_hooks() == 0


def test_a_forward_that_raises_closes_its_ranges(clean_modules):
    class Boom(torch.nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Boom())
    with pytest.raises(ValueError, match="boom"), gpumagic.profile(modules=True, nvml=False, display=False,
                                                                  max_seconds=2) as run_:
        model(torch.randn(2, 4))
    assert _global_hooks() == 0
    rows = {r.path: r.calls for r in run_.report.metrics.modules}
    assert rows == {"Sequential": 1, "Sequential.0": 1, "Sequential.1": 1}


def test_the_magic_takes_modules_and_names_the_model_by_its_variable(shell, clean_modules):
    result, _ = run(shell, "%%gpuprofile --modules --quiet -o rep --skip 1 --steps 2 --no-nvml\n" + TRAIN.format(n=4))
    assert result.success
    rows = shell.user_ns["rep"].metrics.modules
    assert [r.path for r in rows] == ["model"] and rows[0].type == "Linear" and rows[0].calls == 2
    assert _global_hooks() == 0


@pytest.fixture
def clean_modules():
    before = _global_hooks()
    yield
    assert _global_hooks() == before


def test_the_live_widget_gets_a_modules_tab_only_with_module_times(tmp_path):
    pytest.importorskip("ipywidgets")
    from gpumagic.render.widget import TAB_TITLES, ReportWidget

    with_modules = ReportWidget(gpumagic.analyze(_built_trace(tmp_path)))
    plain = ReportWidget(gpumagic.analyze("example"))
    try:
        assert list(with_modules.tabs.titles) == [*TAB_TITLES[:4], "Modules", *TAB_TITLES[4:]]
        assert "net.0" in with_modules.tabs.children[4].value
        assert list(plain.tabs.titles) == list(TAB_TITLES)
    finally:
        with_modules.close()
        plain.close()


def test_a_compiled_module_is_one_row_and_its_recompile_for_our_hooks_is_left_out(clean_modules, recwarn):
    import torch._dynamo

    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    compiled = torch.compile(model, backend="eager")
    compiled(torch.randn(4, 8))  # compiled before the capture: the hooks then fail a guard
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    filters = list(__import__("warnings").filters)
    with gpumagic.profile(modules=True, nvml=False, display=False, skip=1, steps=2) as run_:
        for _ in range(4):
            opt.zero_grad()
            compiled(torch.randn(4, 8)).sum().backward()
            opt.step()
    assert list(__import__("warnings").filters) == filters  # our filter is gone again
    assert not [w for w in recwarn if "global hooks" in str(w.message)]
    assert [(r.type, r.calls) for r in run_.report.metrics.modules] == [("OptimizedModule", 2)]
    c = run_.report.metrics.compile
    assert c is None or (c.recompiles == 0 and c.graph_breaks == 0)  # the hooks' guard failure is not the code's
