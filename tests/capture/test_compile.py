"""torch.compile diagnostics (issue 30): a function compiled with the eager backend, a deliberate
graph break (``print``) and a recompilation (a new size), profiled on CPU; then the rules on
built traces whose bundle carries the same facts."""

from __future__ import annotations

import inspect
import logging

import pytest
import torch
from tracebuilder import TraceBuilder

import gpumagic
from gpumagic.capture.dynamo import GRAPH_BREAK_LOGGERS


def _breaks_once(x):
    y = x.sin()
    print("a deliberate graph break")
    return y.cos() + 1


BREAK_LINE = inspect.getsourcelines(_breaks_once)[1] + 2
DEF_LINE = inspect.getsourcelines(_breaks_once)[1]


def _loggers():
    return [(logging.getLogger(n).level, logging.getLogger(n).propagate, len(logging.getLogger(n).handlers))
            for n in GRAPH_BREAK_LOGGERS]


def test_graph_breaks_and_recompiles_of_a_cell_with_their_lines(capfd):
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(_breaks_once, backend="eager")
    before = _loggers()
    with gpumagic.profile(nvml=False, display=False, max_seconds=60) as run:
        compiled(torch.randn(4))
        compiled(torch.randn(5))  # dimension 0 changes: a guard fails, dynamo recompiles
    assert _loggers() == before
    assert "Graph break" not in capfd.readouterr().err  # captured for the report, not printed
    c = run.report.metrics.compile
    assert c.graph_breaks >= 1 and c.recompiles >= 1
    where = [(r.file, r.line) for r in c.break_reasons]
    assert ("tests/capture/test_compile.py", BREAK_LINE) in where, where
    top = c.break_reasons[0]
    assert "print" in top.reason and sum(r.count for r in c.break_reasons if r.line == BREAK_LINE) >= 1
    assert any("size mismatch at index 0" in r.reason and r.line == DEF_LINE for r in c.recompile_reasons)
    segs = run.report.metrics.window.segments
    assert c.compile_ms == pytest.approx(sum(s.dur_ms for s in segs if s.kind == "compile"), abs=1e-3)
    assert c.compile_ms > 0 and c.cell_compile_ms > 0
    assert {"graph-breaks", "recompiles"} <= set(run.report.finding_ids)
    recompile = next(f for f in run.report.findings if f.id == "recompiles")
    assert any("mark_dynamic(x, 0)" in fx.code for fx in recompile.fixes)


def test_a_cell_that_compiles_nothing_has_no_compile_section():
    with gpumagic.profile(nvml=False, display=False, max_seconds=1) as run:
        torch.ones(3).add_(1)
    assert run.report.metrics.compile is None
    assert "compile" not in run.report.to_dict()["metrics"]


# -- the rules, on built traces ------------------------------------------------------------------


def compiled_trace(breaks: int = 3, recompiles: int = 2, compile_us: float = 30_000):
    """Three 40 ms steps; the first spends ``compile_us`` in dynamo's frame compilation."""
    tb = TraceBuilder()
    for i in range(3):
        t = i * 40_000
        tb.step(i + 1, t, 40_000)
        tb.kernel("k", t + 100, 5_000, launch_ts=t + 50)
    tb.op("entire_frame_compile", 6_000, compile_us, cat="user_annotation")
    d = tb.to_dict()
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {"dynamo": {
        "graph_breaks": breaks,
        "break_counts": {"Failed to trace builtin operator\n  Explanation: ...": breaks},
        "break_logs": [{"reason": "Failed to trace builtin operator: Dynamo does not know how to trace `print`",
                        "file": "train.py", "line": 12}] * breaks,
        "recompiles": [{"reason": "tensor 'x' size mismatch at index 0. expected 4, actual 5", "file": "train.py",
                        "line": 10}] * recompiles,
        "compile_ms": compile_us / 1000.0 + 5.0}}}
    return d


def test_the_rules_read_the_cells_counts_and_name_the_line():
    report = gpumagic.analyze(compiled_trace())
    c = report.metrics.compile
    assert (c.graph_breaks, c.recompiles, c.compile_ms, c.cell_compile_ms) == (3, 2, 30.0, 35.0)
    assert [(r.file, r.line, r.count) for r in c.break_reasons] == [("train.py", 12, 3)]  # the counter's twin merged
    assert [(r.reason, r.count) for r in c.recompile_reasons] == [("tensor 'x' size mismatch at index 0. expected 4, "
                                                                   "actual 5", 2)]
    gb = next(f for f in report.findings if f.id == "graph-breaks")
    assert "train.py:12" in gb.evidence.summary and gb.est_gain == 0.0
    assert "graph-breaks" in report.to_text() and "gain not estimated" in report.to_html()  # not "under 1 %"
    assert any("fullgraph=True" in fx.code for fx in gb.fixes) and any("explain" in fx.code for fx in gb.fixes)
    assert any("train.py:12" in fx.code for fx in gb.fixes)  # moving the call out names the line
    rc = next(f for f in report.findings if f.id == "recompiles")
    window_ms = report.metrics.window.dur_ms
    assert rc.est_gain == pytest.approx(30.0 / window_ms, abs=1e-3)  # at most the compile time in the window
    assert any("mark_dynamic(x, 0)" in fx.code for fx in rc.fixes) and any("dynamic=True" in fx.code for fx in rc.fixes)


def _recompiling(sizes, dynamic):
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(_doubled_sum, backend="eager", dynamic=dynamic)
    with gpumagic.profile(nvml=False, display=False, max_seconds=60) as run:
        for n in sizes:
            compiled(torch.randn(n))
    return run.report


def _doubled_sum(x):
    return (x * 2).sum()


def test_recompilations_are_counted_once_each_and_a_first_change_is_a_one_time_cost():
    """Dynamo logs a guard failure for every cached entry a call fails (1 + 2 + … + 5 = 15 for six
    sizes under dynamic=False), read once as "recompiled 15 time(s)"; and the one recompilation
    with which the default (dynamic=None) makes a changed size dynamic read "high, up to 93 %",
    though it never recurs."""
    sizes = (4, 5, 6, 7, 9, 11)
    default = _recompiling(sizes, None)
    c = default.metrics.compile
    assert (c.recompiles, c.recompiles_first_change) == (1, 1)
    f = default.finding("recompiles")
    assert f.severity == "low" and f.est_gain == 0.0 and f.gain_method.startswith("not a speed gain")
    assert f.title.startswith("torch.compile recompiled once, when a size (or integer) first changed")
    assert any("mark_dynamic(x, 0)" in fx.code for fx in f.fixes)
    fixed = _recompiling(sizes, False)  # an entry per size: five recompilations
    c = fixed.metrics.compile
    assert (c.recompiles, c.recompiles_first_change) == (5, 1)
    assert sorted(r.reason for r in c.recompile_reasons) == sorted(  # the first entry's failed guard, once each
        f"tensor 'x' size mismatch at index 0. expected {sizes[0]}, actual {b}" for b in sizes[1:])
    f = fixed.finding("recompiles")
    assert f.title == "torch.compile recompiled 5 time(s)" and f.est_gain > 0 and "4 of them came after" in f.evidence.summary
    back = _recompiling((4, 5, 4, 5, 4), False)  # later calls fail the newer entry and find the older: no compile
    assert back.metrics.compile.recompiles == 1


def test_recompilations_are_read_from_the_entries_dynamo_names():
    """A run of failures down to entry 0 is one recompilation; a run that stops earlier found an
    older entry; a bundle from before the entries were kept counts every failure."""
    def failure(entry, reason="tensor 'x' size mismatch at index 0. expected 4, actual 5"):
        return {"reason": reason, "file": "train.py", "line": 10, **({} if entry is None else {"entry": entry})}

    trace = compiled_trace(breaks=0, recompiles=0)
    dynamo = trace["gpumagic"]["capture"]["dynamo"]
    dynamo["recompiles"] = [failure(0), failure(1, "n == 3"), failure(0, "n == 0"), failure(2), failure(1)]
    c = gpumagic.analyze(trace).metrics.compile
    assert (c.recompiles, c.recompiles_first_change) == (2, 2)  # the size, then an integer: each its first change
    assert gpumagic.analyze(trace).finding("recompiles").est_gain == 0.0
    dynamo["recompiles"] = [failure(None), failure(None)]
    c = gpumagic.analyze(trace).metrics.compile
    assert (c.recompiles, c.recompiles_first_change) == (2, 1)


def test_a_new_dtype_or_mode_compiles_once_and_is_reused():
    """A no_grad evaluation between training calls, and a second dtype, each recompile once: dynamo
    keeps the entries and switches between them (six alternations, one recompilation each), so the
    finding is a one-time cost with no gain, and it does not suggest dynamic=True, which changes
    nothing for a dtype or a mode."""
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(_doubled_sum, backend="eager")
    x = torch.randn(8)
    compiled(x)
    with gpumagic.profile(nvml=False, display=False, max_seconds=60) as run:
        for _ in range(6):
            compiled(x)
            with torch.no_grad():
                compiled(x)
            compiled(x.double())
    c = run.report.metrics.compile
    assert (c.recompiles, c.recompiles_first_change, c.recompiles_few_values) == (2, 0, 2)
    # each quoted by its failure on the first entry: what changed since (before, the newest entry's
    # failure quoted the dtype recompilation as "grad_mode" too)
    assert sorted(r.reason for r in c.recompile_reasons) == [
        "GLOBAL_STATE changed: grad_mode", "tensor 'x' dtype mismatch. expected Float, actual Double"]
    f = run.report.finding("recompiles")
    assert f.severity == "low" and f.est_gain == 0.0
    assert f.title.startswith("torch.compile recompiled 2 times, for a dtype or mode it had not compiled for")
    codes = "\n".join(fx.code for fx in f.fixes)
    assert "dynamic=True" not in codes and "x.to(torch.float32)" in codes and "set_logs(recompiles=True)" in codes


def test_few_valued_guards_that_fail_again_still_read_as_recurring():
    """The same failures twice in one function mean an entry was not reused: not a one-time cost."""
    trace = compiled_trace(breaks=0, recompiles=0)
    dynamo = trace["gpumagic"]["capture"]["dynamo"]
    dtype = "tensor 'x' dtype mismatch. expected Float, actual Double"
    mode = "GLOBAL_STATE changed: grad_mode"
    dynamo["recompiles"] = [{"reason": dtype, "file": "train.py", "line": 10, "entry": 0},
                            {"reason": mode, "file": "train.py", "line": 10, "entry": 0}]
    c = gpumagic.analyze(trace).metrics.compile
    assert (c.recompiles, c.recompiles_few_values) == (2, 2)
    assert gpumagic.analyze(trace).finding("recompiles").est_gain == 0.0
    dynamo["recompiles"].append({"reason": dtype, "file": "train.py", "line": 10, "entry": 0})
    c = gpumagic.analyze(trace).metrics.compile
    assert (c.recompiles, c.recompiles_few_values) == (3, 2)
    f = gpumagic.analyze(trace).finding("recompiles")
    assert f.title == "torch.compile recompiled 3 time(s)"
    assert any("x.to(torch.float32)" in fx.code for fx in f.fixes)   # a dtype guard failed: one dtype in
    dynamo["recompiles"] = [{"reason": "___check_obj_id(L['cfg'], 1403)", "file": "train.py", "line": 10, "entry": 0}]
    assert gpumagic.analyze(trace).metrics.compile.recompiles_few_values == 0   # an object's identity: unbounded


def test_a_guard_failure_is_kept_without_its_id_and_source_comment():
    from gpumagic.capture.dynamo import _entry, _guard_text

    logged = "[0/2]: n == 0                                         #   # train.py:3 in f\nUser stack trace:\n  ..."
    assert (_guard_text(logged), _entry(logged)) == ("n == 0", 2)
    assert (_guard_text("tensor 'x' dtype mismatch"), _entry("tensor 'x' dtype mismatch")) == ("tensor 'x' dtype mismatch", None)


def test_no_break_and_no_recompile_no_finding():
    report = gpumagic.analyze(compiled_trace(breaks=0, recompiles=0))
    assert report.metrics.compile.graph_breaks == 0
    assert not {"graph-breaks", "recompiles"} & set(report.finding_ids)
    plain = compiled_trace()
    del plain["gpumagic"]
    assert gpumagic.analyze(plain).metrics.compile is None  # not recorded by gpumagic: nothing to say


def test_in_a_notebook_cell_the_break_names_the_cells_line(shell):
    from capture.test_magic import run

    cell = ("%%gpuprofile --quiet -o rep --no-nvml --max-seconds 60\n"
            "import torch\n"
            "def step(x):\n"
            "    y = x * 2\n"
            "    print('logging inside the compiled code')\n"
            "    return y + 1\n"
            "fn = torch.compile(step, backend='eager')\n"
            "fn(torch.ones(3)); fn(torch.ones(3))\n")
    result, _ = run(shell, cell)
    assert result.success
    c = shell.user_ns["rep"].metrics.compile
    assert c.graph_breaks >= 1 and c.recompiles == 0
    assert [r.line for r in c.break_reasons if r.file] == [4]  # the cell's 4th line: the print


def test_the_notes_list_what_torch_compile_did():
    """The report's Notes (text and HTML) carry metrics.compile: compile time in the window and
    over the cell, the counts, and each reason with its line."""
    report = gpumagic.analyze(compiled_trace())
    text = report.to_text(width=100)
    notes = text[text.index("NOTES"):]
    assert "torch.compile: compiling 30.0 ms in the window (dynamo's frames 35.0 ms over the cell); 3 graph breaks; 2 recompiles" \
        in notes.replace("\n    ", " ")
    assert "graph break ×3: Failed to trace builtin operator" in notes and "(train.py:12)" in notes
    assert "recompile ×2: tensor 'x' size mismatch at index 0. expected 4, actual 5 (train.py:10)" in notes
    html = report.to_html()
    block = html[html.index('class="gm-compile"'):]
    assert "3 graph breaks; 2 recompiles" in block and "train.py:12" in block and "size mismatch" in block
    plain = compiled_trace()
    del plain["gpumagic"]
    assert "torch.compile:" not in gpumagic.analyze(plain).to_text() and "gm-compile" not in gpumagic.analyze(plain).to_html()


def _slow_backend(gm, example_inputs):
    """A torch.compile backend that takes 0.6 s to compile (the graph runs as traced)."""
    import time

    time.sleep(0.6)
    return gm.forward


def test_the_time_cap_waits_for_a_compilation_in_the_first_step():
    """A first compiled step can take minutes: the 0.2 s cap comes inside the compilation and
    waits for it, so that the steps after it are recorded, not the compilation alone."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    compiled = torch.compile(model, backend=_slow_backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpumagic.profile(nvml=False, display=False, max_seconds=0.2, steps=3) as run:
        for _ in range(6):
            compiled(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    r = run.report
    assert any("came while torch.compile was compiling" in n for n in r.notes), r.notes
    assert not any("stopped at the" in n for n in r.notes)
    assert r.metrics.steps.count == 3  # the three steps after the skipped, compiling one


def test_compiling_now_is_false_outside_a_compilation():
    from gpumagic.capture.session import compiling_now

    assert compiling_now() is False
    seen = []

    def backend(gm, example_inputs):
        seen.append(compiling_now())
        return gm.forward

    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + 1, backend=backend)
    fn(torch.ones(2))
    fn(torch.ones(2))  # cached: no compilation
    assert seen == [True]


def test_without_steps_the_cap_counts_again_from_the_end_of_the_compilation():
    import time

    import torch._dynamo

    torch._dynamo.reset()
    fn = torch.compile(lambda x: x * 2, backend=_slow_backend)
    with gpumagic.profile(nvml=False, display=False, max_seconds=0.2) as run:
        fn(torch.ones(4))  # compiles for 0.6 s: the cap comes inside
        end = time.perf_counter() + 2.0
        while time.perf_counter() < end:  # inference, no optimizer step: the fresh cap stops it
            fn(torch.ones(4))
    notes = " ".join(run.report.notes)
    assert "came while torch.compile was compiling" in notes
    assert "The compilation over, the code had another 0.2 s" in notes
    assert "Recording stopped at the 0.2 s cap" in notes
    # stopped by the fresh cap (a poll and a cap after the compilation: 0.7 s), not at the loop's end
    m = run.report.metrics
    assert m.window.dur_ms - m.compile.compile_ms < 1900



def test_a_transformers_forward_names_its_tensors_by_keyword():
    """transformers' forward wrappers take ``**kwargs``: dynamo names the tensors
    ``kwargs['input_ids']`` and ``kwargs['cache'].layers[0].keys``. Recorded from ``generate()``
    with the forward compiled (the fix of cpu-op-overhead's generation advice): the prompt, then
    one token (input_ids' length), then a cache one position longer — each size's first change,
    compiled dynamic from then on. The names were not read, and the two read as recurring, "up to
    100 %" of a window that compiled."""
    gen = ".venv/lib/python3.11/site-packages/transformers/utils/generic.py"
    ids = "tensor 'kwargs['input_ids']' size mismatch at index 1. expected 4, actual 1"
    keys = "tensor 'kwargs['cache'].layers[0].keys' size mismatch at index 2. expected 4, actual 5"
    trace = compiled_trace(breaks=0, recompiles=0)
    dynamo = trace["gpumagic"]["capture"]["dynamo"]
    dynamo["recompiles"] = [{"reason": ids, "file": gen, "line": 1075, "entry": 0},
                            {"reason": keys, "file": gen, "line": 1075, "entry": 1},
                            {"reason": ids, "file": gen, "line": 1075, "entry": 0}]
    report = gpumagic.analyze(trace)
    assert (report.metrics.compile.recompiles, report.metrics.compile.recompiles_first_change) == (2, 2)
    f = report.finding("recompiles")
    assert f.est_gain == 0.0 and f.severity == "low"
    assert any("torch._dynamo.mark_dynamic(input_ids, 1)" in fx.code for fx in f.fixes)
    # recurring, on a path into an object only: no mark_dynamic on a name the caller does not have
    dynamo["recompiles"] = [{"reason": keys, "file": gen, "line": 1075, "entry": 0},
                            {"reason": keys.replace("actual 5", "actual 6"), "file": gen, "line": 1075, "entry": 1},
                            {"reason": keys, "file": gen, "line": 1075, "entry": 0}]
    f = gpumagic.analyze(trace).finding("recompiles")
    assert f.est_gain > 0 and not any("mark_dynamic" in fx.code for fx in f.fixes)
    assert any("dynamic=True" in fx.code for fx in f.fixes)


def test_a_guard_source_is_read_as_the_argument_a_caller_passes():
    from gpumagic.analysis.compile import plain_name

    assert plain_name("x") == "x" and plain_name("L['x']") == "x" and plain_name("kwargs['input_ids']") == "input_ids"
    assert plain_name("kwargs['cache'].layers[0].keys") is None and plain_name("L['self'].weight") is None


def test_a_recompilation_entered_through_dynamos_wrapper_is_named_so():
    """``torch.compile(model)`` enters the module through dynamo's own ``wrap_inline`` frame: the
    recompiled code's file is torch's, not the user's, and the place says so."""
    from gpumagic.report.metrics import CompileReason

    wrapper = CompileReason(reason="tensor 'x' size mismatch", file="/env/lib/torch/_dynamo/external_utils.py",
                            line=67, count=1)
    assert wrapper.place.startswith("a compiled module's call, entered through dynamo's wrapper")
    assert wrapper.place.endswith("external_utils.py:67")
    own = CompileReason(reason="r", file="train.py", line=10, count=1)
    assert own.place == "train.py:10" and CompileReason(reason="r", file=None, line=None, count=1).place == ""
