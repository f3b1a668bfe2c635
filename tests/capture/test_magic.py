"""``%%gpuprofile`` and ``%gpuprofile`` through a real IPython ``InteractiveShell`` on CPU torch."""

from __future__ import annotations

import gc
import gzip
import json
import threading

import pytest
from IPython.utils.capture import capture_output

from gpumagic.report.model import Report
from gpumagic.shells.magic import GpuProfileMagics, split_last_expression, split_options

TRAIN = """
import torch
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range({n}):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def run(shell, source):
    with capture_output() as out:
        result = shell.run_cell(source)
    return result, out


@pytest.fixture
def displayed(monkeypatch):
    """Objects passed to IPython's display() (still displayed, so rendering runs too)."""
    import IPython.display

    seen = []
    original = IPython.display.display

    def spy(*objs, **kwargs):
        if not kwargs.get("raw"):  # a report displays itself as raw bundles: count the report once
            seen.extend(objs)
        return original(*objs, **kwargs)

    monkeypatch.setattr(IPython.display, "display", spy)
    return seen


def test_the_last_value_is_returned_and_variables_stay_defined(shell, displayed):
    result, out = run(shell, "%%gpuprofile\nimport torch\nx = torch.ones(3) + 1\nx.sum().item()\n")
    assert result.success and result.result == 6.0
    assert shell.user_ns["x"].tolist() == [2.0, 2.0, 2.0]
    assert [type(o) for o in displayed] == [Report]
    assert len(out.outputs) == 1  # the report's output; the value goes to Out, not display


def test_a_trailing_semicolon_silences_the_value(shell):
    result, _ = run(shell, "%%gpuprofile --quiet\n1 + 1;\n")
    assert result.success and result.result is None


def test_prints_appear(shell):
    _, out = run(shell, "%%gpuprofile --quiet\nprint('hello from the cell')\n")
    assert out.stdout == "hello from the cell\n"


def test_output_variable_label_and_quiet(shell, displayed):
    result, out = run(shell, "%%gpuprofile -o rep --label baseline --quiet" + TRAIN.format(n=8))
    assert result.success and displayed == [] and out.outputs == []
    rep = shell.user_ns["rep"]
    assert isinstance(rep, Report) and rep.label == "baseline"
    assert rep.metrics["steps"]["names"] == [f"ProfilerStep#{i}" for i in range(1, 6)]


def test_a_labelled_run_is_remembered_only_when_it_completes(shell):
    from gpumagic.tuning import runs

    runs.forget()
    try:
        run(shell, "%%gpuprofile -o rep --quiet --label first\nsum(range(5))\n")
        assert runs.get("first") is shell.user_ns["rep"]
        run(shell, "%%gpuprofile --quiet --label failed\nraise ValueError\n")
        assert runs.labels() == ["first"]
    finally:
        runs.forget()


def test_top_ops_reaches_the_analysis(shell, monkeypatch):
    import gpumagic.capture.session as session

    seen = []
    real = session._analyse
    monkeypatch.setattr(session, "_analyse", lambda data, label, top_ops=20: seen.append(top_ops) or real(data, label, top_ops))
    run(shell, "%%gpuprofile -o rep --quiet --top-ops 3" + TRAIN.format(n=4))
    assert seen == [3] and shell.user_ns["rep"].metrics.operators is not None


def test_window_options_reach_the_capture(shell):
    run(shell, "%%gpuprofile -o rep --quiet --skip 2 --steps 3" + TRAIN.format(n=9))
    assert shell.user_ns["rep"].metrics["steps"]["names"] == ["ProfilerStep#2", "ProfilerStep#3",
                                                               "ProfilerStep#4"]
    run(shell, "%%gpuprofile -o rep --quiet --all" + TRAIN.format(n=4))
    assert shell.user_ns["rep"].metrics["steps"]["count"] == 4


def test_save_writes_a_bundle(shell, tmp_path):
    path = tmp_path / "cell.json.gz"
    result, _ = run(shell, f"%%gpuprofile --quiet --save {path} --label saved --interval-ms 20 --no-nvml\n"
                           "sum(range(10))\n")
    assert result.success
    assert json.loads(gzip.decompress(path.read_bytes()))["gpumagic"]["label"] == "saved"


def test_line_magic_profiles_one_statement_keeping_its_text(shell):
    result, out = run(shell, '%gpuprofile --quiet --label "two words" print("a  b", end="!")')
    assert result.success and out.stdout == "a  b!"
    result, _ = run(shell, "%gpuprofile -o rep --quiet 6 * 7")
    assert result.result == 42 and shell.user_ns["rep"].label == ""


def test_an_error_is_reraised_with_the_cells_traceback(shell, displayed):
    result, _ = run(shell, "%%gpuprofile -o rep\ndef f():\n    raise ValueError('bad value')\ny = 5\nf()\n")
    err = result.error_in_exec
    assert isinstance(err, ValueError) and str(err) == "bad value"
    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_name, tb.tb_lineno))
        tb = tb.tb_next
    assert frames[-2:] == [("<module>", 4), ("f", 2)]  # the cell's own lines, as without the magic
    assert shell.user_ns["y"] == 5
    assert displayed == [shell.user_ns["rep"]]  # the partial report
    assert "this profile is partial" in " ".join(shell.user_ns["rep"].notes)


def test_keyboard_interrupt_propagates(shell):
    result, _ = run(shell, "%%gpuprofile --quiet" + TRAIN.format(n=3) + "raise KeyboardInterrupt\n")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)


def test_a_syntax_error_is_reported_before_profiling(shell):
    result, _ = run(shell, "%%gpuprofile --quiet\nx = (\n")
    assert isinstance(result.error_in_exec or result.error_before_exec, SyntaxError)


def test_nesting_is_refused_with_a_usage_error(shell):
    from IPython.core.error import UsageError

    result, _ = run(shell, "%%gpuprofile --quiet\n%gpuprofile 1 + 1\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "already running" in str(result.error_in_exec)


@pytest.mark.parametrize("source, fragment", [
    ("%%gpuprofile --skip -1\n1\n", "skip must be an integer >= 0"),
    ("%%gpuprofile --steps x\n1\n", "invalid int value"),
    ("%%gpuprofile stray words\n1\n", "takes options only"),
    ("%gpuprofile --quiet", "needs code"),
    ("%%gpuprofile --bogus\n1\n", "unrecognized arguments"),
    ("%%gpuprofile -o 2x\n1\n", "-o needs a variable name"),
    ("%%gpuprofile --top-ops -1\n1\n", "top_ops must be an integer >= 0"),
])
def test_bad_options_are_usage_errors(shell, source, fragment):
    from IPython.core.error import UsageError

    result, _ = run(shell, source)
    assert isinstance(result.error_in_exec, UsageError)
    assert fragment in str(result.error_in_exec)


def test_help_documents_every_option():
    doc = GpuProfileMagics.gpuprofile.__doc__
    for option in ("--output", "--label", "--quiet", "--save", "--skip", "--steps", "--all", "--max-seconds",
                   "--interval-ms", "--no-nvml", "--shapes", "--flops", "--stack", "--memory", "--top-ops",
                   "--batch-size"):
        assert option in doc


@pytest.mark.parametrize("line, options, statement", [
    ("x + 1", "", "x + 1"),
    ("--quiet f(a, -1)", "--quiet", "f(a, -1)"),
    ('--label "my run" -o rep print("a  b")', '--label "my run" -o rep', 'print("a  b")'),
    ("--skip 2 --steps=3 train()", "--skip 2 --steps=3", "train()"),
    ("--quiet -- -x", "--quiet", "-x"),
    ("  --all   ", "--all", ""),
])
def test_split_options(line, options, statement):
    valued = {"-o", "--output", "--label", "--save", "--skip", "--steps", "--max-seconds", "--interval-ms"}
    assert split_options(line, valued) == (options, statement)


def test_split_last_expression():
    import ast

    body, last = split_last_expression(ast.parse("a = 1\na + 1"))
    assert len(body.body) == 1 and isinstance(last, ast.Expression)
    body, last = split_last_expression(ast.parse("a = 1"))
    assert last is None and len(body.body) == 1


@pytest.mark.slow
def test_a_hundred_profiled_cells_grow_neither_threads_nor_memory(shell):
    from gpumagic.capture.cpu import ProcReader

    def rss_bytes():
        import os
        with open(f"/proc/{os.getpid()}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    if not ProcReader().available():
        pytest.skip("needs Linux /proc to measure memory")
    cell = "%%gpuprofile --quiet\nz = torch.ones(4) + 1\n"
    run(shell, "import torch")
    for _ in range(20):  # warm up allocator pools and caches
        run(shell, cell)
    gc.collect()
    threads, rss = threading.active_count(), rss_bytes()
    for _ in range(100):
        result, _ = run(shell, cell)
        assert result.success
    gc.collect()
    assert threading.active_count() == threads
    growth = rss_bytes() - rss
    assert growth < 16 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 100 cells"


def test_torch_missing_is_a_usage_error_with_an_install_hint(shell, monkeypatch):
    import sys

    from IPython.core.error import UsageError

    monkeypatch.setitem(sys.modules, "torch", None)
    result, _ = run(shell, "%%gpuprofile\n1 + 1\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "install it first" in str(result.error_in_exec)


def test_unload_removes_the_magic_and_load_brings_it_back(shell):
    from IPython.core.error import UsageError

    shell.run_line_magic("unload_ext", "gpumagic")
    try:
        assert shell.find_magic("gpuprofile", "line") is None
        assert shell.find_magic("gpuprofile", "cell") is None
        result, _ = run(shell, "%gpuprofile 1")
        assert isinstance(result.error_in_exec, UsageError)
    finally:
        shell.run_line_magic("load_ext", "gpumagic")
    assert shell.find_cell_magic("gpuprofile") is not None


def test_flops_option_gives_compute_metrics_from_the_profilers_counts(shell):
    result, _ = run(shell, "%%gpuprofile --flops --quiet -o rep" + TRAIN.format(n=8))
    assert result.success
    c = shell.user_ns["rep"].metrics["compute"]
    # per step: forward addmm 2·8·16·1, weight gradient mm 2·8·16·1 (the input needs no gradient)
    assert c["flops_source"] == "profiler" and c["flops_per_step"] == 2 * (2 * 8 * 16 * 1)


def test_compare_shows_the_comparison_first_and_the_report_collapsed_under_it(shell):
    run(shell, "%%gpuprofile --label slow-before --quiet" + TRAIN.format(n=8))
    result, out = run(shell, "%%gpuprofile -o after --compare slow-before" + TRAIN.format(n=8))
    assert result.success
    [output] = out.outputs  # one output: the comparison, with the report inside it
    html = output.data["text/html"]
    after = shell.user_ns["after"]
    assert html.index("slow-before \u2192") < html.index("gm-verdict") < html.index('<details class="gm-full">')
    assert "gpumagic report" in html[html.index('<details class="gm-full">'):]
    assert output.data["text/plain"].startswith("gpumagic comparison: slow-before")
    assert after.to_text() in output.data["text/plain"]
