"""The magics under hostile options (issue 24, classes 1, 4, 5 and 11), in a real IPython shell on CPU torch.

- ``-o NAME`` never replaces what the namespace needs (dunders, IPython's own names, builtins
  the user did not bind);
- once the cell has run, nothing loses its report: a history that cannot be written, a bad
  ``GPUMAGIC_KEEP_RUNS``, the working folder removed: the report is shown (and stored by ``-o``)
  with one warning line; a label that cannot be stored is a UsageError before the cell runs;
- option values beyond what the platform accepts are UsageErrors, not thread tracebacks;
- a cell whose exception's ``__str__`` raises re-raises that very exception.
"""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")

from ipyshell import ipython_shell  # noqa: E402
from IPython.core.error import UsageError  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

from gpumagic import _env  # noqa: E402
from gpumagic.errors import exception_text  # noqa: E402
from gpumagic.report.model import Report  # noqa: E402
from gpumagic.shells.cli._output import error_line  # noqa: E402
from gpumagic.tuning import history, runs  # noqa: E402

CELL = "%%gpuprofile --no-nvml --quiet {opts}\nimport torch\nran = True\ntorch.ones(4).sum()\n"
BAD_STR = "class BadStr(Exception):\n    def __str__(self):\n        raise RuntimeError('formatting fails')\n"


@pytest.fixture
def shell():
    with ipython_shell("gpumagic") as ip:
        yield ip


def run(shell, source):
    with capture_output() as out:
        result = shell.run_cell(source)
    return result, out


@pytest.mark.parametrize("name", ["__builtins__", "__name__", "__doc__", "__spec__", "print", "len", "In", "Out",
                                  "get_ipython", "exit", "_", "__", "_i", "_ii", "_3", "_i7", "_oh", "_dh", "class"])
def test_o_refuses_names_the_namespace_needs(shell, name):
    before = shell.user_ns.get(name, KeyError)
    result, _ = run(shell, CELL.format(opts=f"-o {name}"))
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    assert "ran" not in shell.user_ns  # refused before the cell ran
    assert shell.user_ns.get(name, KeyError) is before
    result, _ = run(shell, "x = len([1, 2])\n")  # the kernel still works
    assert result.success and shell.user_ns["x"] == 2
    result, _ = run(shell, f"%gputune -o {name} [1, 2]\n")
    assert isinstance(result.error_in_exec, UsageError)


def test_o_takes_ordinary_names_and_builtins_the_user_bound(shell):
    run(shell, "list = 'mine'\n")
    for name in ("rep", "list", "_private", "x_1"):
        result, _ = run(shell, CELL.format(opts=f"-o {name}"))
        assert result.success, result.error_in_exec
        assert isinstance(shell.user_ns[name], Report)


@pytest.mark.parametrize("opts, fragment", [
    ("--interval-ms 100000000000000", "interval_ms must be an integer"),
    ("--interval-ms 1e14", "invalid int value"),
    ("--max-seconds 1e300", "max_seconds must be a positive number"),
    ("--max-seconds 1e400", "max_seconds must be a positive number"),
    ("--steps 99999999999999999999999", "steps must be an integer"),
    ("--compare a@99999999999999999999999", "--compare"),
    ("--compare r99999999999999999999999", "--compare"),
    ("--compare ''", "a run is named by a label"),
    ("--label r12", "looks like a run id"),
    ("--label $'\\ud800'", ""),
])
def test_out_of_range_options_are_usage_errors_before_the_cell_runs(shell, opts, fragment):
    runs.record(torch_free_report(), label="a")
    if "ud800" in opts:  # a lone surrogate cannot be typed through the shell's words: pass it as a variable
        shell.user_ns["bad"] = "\ud800"
        opts = "--label {bad}"
    result, _ = run(shell, CELL.format(opts=opts))
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    assert fragment in str(result.error_in_exec)
    assert "ran" not in shell.user_ns


@pytest.mark.parametrize("line", ["--interval-ms ²", "--interval-ms 1e14", "--interval-ms 99999999999999999999",
                                  "--interval-ms=٣٠٠"])
def test_gpumonitor_refuses_intervals_it_cannot_use(shell, line):
    result, _ = run(shell, f"%gpumonitor {line}\n")
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    from gpumagic.shells import monitor

    assert monitor.current() is None or not monitor.current().running


def torch_free_report() -> Report:
    from tracebuilder import DATA

    import gpumagic

    return gpumagic.analyze(os.path.join(DATA, "h100_bert_small_inference.json.gz"))


@pytest.mark.parametrize("keep", ["²", "99999999999999999999", "-3"])
def test_a_bad_keep_runs_value_costs_one_warning_and_the_run_is_kept(shell, monkeypatch, keep):
    monkeypatch.setattr(_env, "_warned", set())
    monkeypatch.setenv(history.KEEP_ENV, keep)
    runs._stores.clear()  # a store reads the variable when it is made
    with pytest.warns(_env.EnvWarning, match=history.KEEP_ENV):
        result, _ = run(shell, CELL.format(opts="-o rep --label k"))
    assert result.success, result.error_in_exec
    assert isinstance(shell.user_ns["rep"], Report)
    assert [r.label for r in runs.store().runs()] == ["k"]
    runs._stores.clear()


def test_a_history_that_cannot_be_written_costs_one_warning_line(shell, gpumagic_home):
    (gpumagic_home / history.DB_NAME).write_bytes(b"not a database" * 100)
    runs._stores.clear()
    result, out = run(shell, CELL.format(opts="-o rep --label h"))
    assert result.success, result.error_in_exec
    assert isinstance(shell.user_ns["rep"], Report)
    err = [ln for ln in out.stderr.splitlines() if ln.startswith("gpumagic")]
    assert len(err) == 1 and err[0].startswith("gpumagic: warning: this run was not stored in the run history"), err
    runs._stores.clear()


def test_the_working_folder_removed_under_the_cell_keeps_the_report(shell, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    here = os.getcwd()
    os.chdir(gone)
    try:
        result, _ = run(shell, "%%gpuprofile --no-nvml --quiet -o rep --label w\nimport os, torch\n"
                               f"os.rmdir({str(gone)!r})\ntorch.ones(4).sum()\n")
    finally:
        os.chdir(here)
    assert result.success, result.error_in_exec
    assert isinstance(shell.user_ns["rep"], Report)
    assert runs.find("w").workdir == ""  # recorded anyway, without the folder it no longer has


def test_the_cell_exception_is_re_raised_even_when_its_str_raises(shell):
    run(shell, BAD_STR)
    for opts in ("--no-nvml", "--no-nvml --label bad -o rep"):
        result, _ = run(shell, f"%%gpuprofile {opts}\nimport torch\ntorch.ones(2)\nerr = BadStr()\nraise err\n")
        assert result.error_in_exec is shell.user_ns["err"]
    result, _ = run(shell, "%gpuprofile --no-nvml raise BadStr()\n")
    assert type(result.error_in_exec).__name__ == "BadStr"
    result, _ = run(shell, "%gputune (_ for _ in ()).throw(BadStr())\n")  # gpumagic's message quotes it safely
    assert isinstance(result.error_in_exec, UsageError) and "BadStr" in str(result.error_in_exec)


def test_nothing_of_gpumagic_formats_an_exception_unsafely():
    class BadStr(Exception):
        def __str__(self):
            raise RuntimeError("formatting fails")

    assert "BadStr" in exception_text(BadStr()) and "BadStr" in error_line(BadStr())
    import gpumagic

    err = BadStr()
    with pytest.raises(BadStr) as caught, gpumagic.profile(nvml=False, display=False):
        torch.ones(2)
        raise err
    assert caught.value is err
    assert sys.exc_info() == (None, None, None)
