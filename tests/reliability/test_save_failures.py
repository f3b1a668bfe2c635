"""``--save`` never loses the profile, and a target that cannot work is refused before the cell runs.

After the cell ran, a failing save (folder removed, permission taken away, disk full) leaves the
report shown and stored by ``-o``, with the error as one warning line on stderr and a note in the
report; nothing is left in the folder. Before the cell runs, an empty path, a missing folder, a
directory, ``/proc`` and unterminated quotes are a ``UsageError`` and the cell does not run.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from capture_state import clean_state_fixture  # noqa: F401
from ipyshell import ipython_shell

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def shell():
    with ipython_shell("gpumagic") as ip:
        yield ip


@pytest.mark.parametrize("options", [
    '--save ""', "--save ''", "--save /proc/run.json.gz", "--save /no/such/folder/run.json",
    "--save {tmp}", "--save {tmp}/sub/run.json", '--label "unterminated', "--save 'run.json",
])
def test_a_target_that_cannot_work_is_refused_before_the_cell_runs(options, shell, tmp_path, clean_state):
    result = shell.run_cell(f"%%gpuprofile {options.format(tmp=tmp_path)}\nran = True\n")
    assert type(result.error_in_exec).__name__ == "UsageError", result.error_in_exec
    assert "ran" not in shell.user_ns
    assert list(tmp_path.iterdir()) == []


def test_the_error_names_the_problem(shell, tmp_path, clean_state):
    result = shell.run_cell('%%gpuprofile --save ""\nran = True\n')
    assert "save needs a file name" in str(result.error_in_exec)
    result = shell.run_cell("%%gpuprofile --save /no/such/folder/run.json\nran = True\n")
    assert "/no/such/folder does not exist" in str(result.error_in_exec)


def test_a_quoted_path_with_spaces_is_one_path(shell, tmp_path, clean_state):
    target = tmp_path / "my run.json.gz"
    result = shell.run_cell(f'%%gpuprofile --quiet --no-nvml --save "{target}"\nimport torch\ntorch.ones(4).add_(1)\n')
    assert result.success and target.is_file()


SCRIPT = """
import json, os, sys
sys.path.insert(0, {tests!r})
from ipyshell import ipython_shell
with ipython_shell("gpumagic") as ip:
    ip.user_ns["folder"] = {folder!r}
    result = ip.run_cell({cell!r})
    rep = ip.user_ns.get("rep")
    print(json.dumps({{"success": result.success, "error": repr(result.error_in_exec),
                      "notes": rep.notes if rep is not None else None, "value": ip.user_ns.get("value")}}))
"""


def _run_cell_in_subprocess(folder, action: str, name: str = "run.json.gz"):
    target = os.path.join(folder, name)
    cell = (f"%%gpuprofile -o rep --no-nvml --save {target}\nimport os, shutil, torch\n"
            f"torch.ones(64).add_(1)\n{textwrap.dedent(action)}\nvalue = 42\n")
    script = SCRIPT.format(tests=TESTS, folder=str(folder), cell=cell)
    env = dict(os.environ, HOME=str(folder.parent), IPYTHONDIR=str(folder.parent / ".ipython"),
               MPLCONFIGDIR=str(folder.parent / ".mpl"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=env, cwd=folder.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _assert_kept_and_warned(out: dict, stderr: str, why: str) -> None:
    assert out["success"] and out["value"] == 42, out  # the cell itself succeeded
    assert out["notes"] is not None  # the report exists and was stored by -o
    assert any(n.startswith("The bundle was not saved:") and why in n for n in out["notes"]), out["notes"]
    warnings = [line for line in stderr.splitlines() if line.startswith("gpumagic: warning: the bundle was not saved")]
    assert len(warnings) == 1 and why in warnings[0], stderr[-2000:]
    assert "Traceback" not in stderr


def test_the_folder_removed_while_the_cell_ran(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    out, stderr = _run_cell_in_subprocess(folder, "shutil.rmtree(folder)")
    _assert_kept_and_warned(out, stderr, "does not exist")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits (the read-only case below runs as root)")
def test_permission_taken_away_while_the_cell_ran(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    try:
        out, stderr = _run_cell_in_subprocess(folder, "os.chmod(folder, 0o500)")
    finally:
        os.chmod(folder, 0o700)
    _assert_kept_and_warned(out, stderr, "not writable")
    assert os.listdir(folder) == []


def test_the_file_system_made_read_only_while_the_cell_ran(small_disk):
    remount = "import subprocess; subprocess.run(['mount', '-o', 'remount,ro', folder], check=True)"
    out, stderr = _run_cell_in_subprocess(small_disk, remount)
    _assert_kept_and_warned(out, stderr, "cannot write")
    assert os.listdir(small_disk) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (needs root and mount rights; skipped elsewhere), unmounted afterwards."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip("a small tmpfs cannot be mounted here (needs root); the ENOSPC test below covers the path")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_after_the_cell_ran(small_disk):
    fill = "open(os.path.join(folder, 'filler'), 'wb').write(os.urandom(60 * 1024))"
    out, stderr = _run_cell_in_subprocess(small_disk, fill, name="run.json")  # uncompressed: > the 4 KiB left
    _assert_kept_and_warned(out, stderr, "No space left on device")
    assert sorted(os.listdir(small_disk)) == ["filler"]  # no half-written bundle, no temporary file


def test_a_write_failing_with_enospc_keeps_the_report(shell, tmp_path, monkeypatch, capsys, clean_state):
    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    target = tmp_path / "run.json"
    shell.run_cell("import os")
    monkeypatch.setattr(os, "fsync", no_space)  # what a full disk makes the final flush do
    result = shell.run_cell(f"%%gpuprofile --quiet --no-nvml -o rep --save {target}\nimport torch\n"
                            "torch.ones(4).add_(1)\n")
    assert result.success
    assert any("No space left on device" in n for n in shell.user_ns["rep"].notes)
    assert "gpumagic: warning: the bundle was not saved" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
