"""``gpumagic analyze``: formats, exit codes, one-line errors, never a traceback."""

import glob
import gzip
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracebuilder import DATA

from gpumagic import TraceError, analyze
from gpumagic.shells.cli import main

H100 = os.path.join(DATA, "h100_bert_small_inference.json.gz")


def test_json_format_to_file(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["analyze", H100, "--format", "json", "-o", str(out)]) == 0
    d = json.loads(out.read_text())
    assert set(d) >= {"metrics", "findings", "notes"}
    assert {"launch-bound", "low-gpu-utilization"} <= {f["id"] for f in d["findings"]}
    f = d["findings"][0]
    assert set(f) >= {"id", "severity", "title", "why", "evidence", "est_gain", "gain_method", "fixes", "doc_url"}
    assert "wrote json report" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["analyze", H100, "--format", "json"], ["schema", "report"]])
def test_a_dash_output_is_standard_output_not_a_file(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "-o", "-"]) == 0
    assert json.loads(capsys.readouterr().out) and not os.path.exists(tmp_path / "-")


def test_text_format_on_the_bundled_example(capsys):
    assert main(["analyze", "example"]) == 0
    out = capsys.readouterr().out
    assert "dataloader-bound" in out and "GPU busy" in out


@pytest.mark.parametrize("content", [b"", b"\x1f\x8b\x08\x00garbage", b"{", b"<html></html>"])
def test_bad_files_exit_2_with_one_line(tmp_path, capsys, content):
    p = tmp_path / "x.json"
    p.write_bytes(content)
    assert main(["analyze", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpumagic: error: ") and err.count("\n") == 1


def test_missing_file_in_a_real_process():
    r = subprocess.run([sys.executable, "-m", "gpumagic", "analyze", "/no/such/trace.json"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2
    assert r.stderr == "gpumagic: error: /no/such/trace.json: no such file\n"


def _buffered_env() -> dict[str, str]:
    """This process's environment without PYTHONUNBUFFERED, so that a child buffers its stdout
    as it does on a user's machine."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def test_a_real_process_writes_everything_before_its_quick_exit(tmp_path):
    """The console entry ends with ``os._exit``: the report must be complete on stdout and in -o."""
    cmd = [sys.executable, "-m", "gpumagic", "analyze", os.path.join(DATA, "a100_training_rank0.json.gz"), "--format", "json"]
    piped = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_buffered_env())
    assert piped.returncode == 0
    out = tmp_path / "r.json"
    to_file = subprocess.run([*cmd, "-o", str(out), "-j", "1"], capture_output=True, text=True, check=False)
    assert to_file.returncode == 0 and "wrote json report" in to_file.stderr
    assert json.loads(piped.stdout) == json.loads(out.read_text())  # and -j 1 gives the same report
    usage = subprocess.run([*cmd, "-j", "-3"], capture_output=True, text=True, check=False)
    assert usage.returncode == 2 and "expected a whole number >= 0" in usage.stderr
    helped = subprocess.run([sys.executable, "-m", "gpumagic", "analyze", "--help"], capture_output=True, text=True,
                            check=False, env=_buffered_env())
    assert helped.returncode == 0 and "--jobs" in helped.stdout


def test_a_reader_that_stops_early_ends_the_process_quietly():
    """``gpumagic analyze t --format html | head -c 10``: no traceback, the status of SIGPIPE."""
    cmd = [sys.executable, "-m", "gpumagic", "analyze", os.path.join(DATA, "a100_training_rank0.json.gz"), "--format", "html"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_buffered_env())
    assert proc.stdout.read(10) == b"<!DOCTYPE "
    proc.stdout.close()  # the reader goes away with ~100 KB still to come
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141
    assert err == ""


def test_jobs_decode_a_large_trace_in_pieces_with_the_same_report(tmp_path, monkeypatch):
    from gpumagic.trace import pieces

    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 1 << 20)
    calls = []
    real = pieces.decode_in_pieces
    monkeypatch.setattr(pieces, "decode_in_pieces",
                        lambda raw, n, *rest, **kw: calls.append((n, real(raw, n, *rest, **kw))) or calls[-1][1])
    path = os.path.join(DATA, "resnet50_v100_workers4.json.gz")
    reports = []
    for jobs in ("3", "1"):
        out = tmp_path / f"r{jobs}.json"
        assert main(["analyze", path, "--format", "json", "-o", str(out), "-j", jobs]) == 0
        reports.append(json.loads(out.read_text()))
    assert [n for n, _ in calls] == [3] and calls[0][1] is not None  # cut in 3, not a fallback
    assert reports[0] == reports[1]


def test_a_gzip_too_small_for_an_early_child_is_inflated_in_one_call(tmp_path, monkeypatch):
    """With several processes the command reads a trace into a bytearray (cut into pieces in place,
    its inflation followed by an early child) only when an early child could start on it: a gzip
    that says it inflates to less than ``pieces.EARLY_MIN_BYTES`` is inflated in one call into
    bytes, whose pieces are copies; the report is the same either way, and with ``-j 1``."""
    from gpumagic.shells.cli.analyze import _in_place
    from gpumagic.trace import files, pieces

    path = os.path.join(DATA, "resnet50_v100_workers4.json.gz")  # 31 MB of JSON
    plain = tmp_path / "t.json"
    plain.write_bytes(bytes(files.read_bytes(path)))
    assert not _in_place(files.gzip_size(path), 2) and not _in_place(files.gzip_size(path), 1)
    assert _in_place(files.gzip_size(str(plain)), 2) and not _in_place(files.gzip_size(str(plain)), 1)
    assert _in_place(files.gzip_size("-"), 2)  # standard input: read into a bytearray whatever it holds
    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 1 << 20)
    texts = []
    real_read = files.read_bytes
    monkeypatch.setattr(files, "read_bytes", lambda *a, **kw: texts.append(real_read(*a, **kw)) or texts[-1])
    reports = {}
    for case, early_min in (("bytes", pieces.EARLY_MIN_BYTES), ("in place", 1 << 20)):
        monkeypatch.setattr(pieces, "EARLY_MIN_BYTES", early_min)
        for jobs in ("2", "1"):
            out = tmp_path / f"{case}-{jobs}.json"
            assert main(["analyze", path, "--format", "json", "-o", str(out), "-j", jobs]) == 0
            reports[case, jobs] = json.loads(out.read_text())
    assert [type(t) for t in texts] == [bytes, bytes, bytearray, bytes]
    assert all(r == reports["bytes", "1"] for r in reports.values())


def test_a_large_trace_has_the_allocator_keep_freed_memory(tmp_path, monkeypatch):
    """From KEEP_FREED_MIN_BYTES of JSON (the gzip trailer's size, else the file's) the command asks
    glibc to keep what it frees; below, and for what it cannot size, it changes nothing."""
    from gpumagic import _allocator
    from gpumagic.shells.cli import analyze as cli

    asked = []
    monkeypatch.setattr(_allocator, "mallopt", lambda settings: asked.append(settings) or True)
    gz = os.path.join(DATA, "a100_training_rank0.json.gz")
    assert not cli._keep_freed_memory(gz, 26 << 20) and not asked
    assert cli._keep_freed_memory(gz, cli.KEEP_FREED_MIN_BYTES)
    assert asked.pop() == {_allocator.M_MMAP_THRESHOLD: _allocator.LARGE_MMAP_THRESHOLD,
                           _allocator.M_TRIM_THRESHOLD: cli.TRIM_MIN_BYTES}
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:  # sparse: no disk used
        fh.truncate(cli.KEEP_FREED_MIN_BYTES)
    assert cli._keep_freed_memory(str(big), None) and asked.pop()
    assert not cli._keep_freed_memory(str(tmp_path / "small.json"), None)  # missing: nothing asked
    assert not cli._keep_freed_memory("-", None) and not asked


def test_mallopt_says_whether_glibc_took_every_setting(monkeypatch):
    """In a fresh process (the test runner's allocator is left alone): the settings the command and
    the pool workers use are taken; a setting glibc refuses (``M_MXFAST``, 1, past its maximum)
    makes the answer False; elsewhere than Linux nothing is asked."""
    from gpumagic import _allocator

    probe = ("from gpumagic import _allocator as a; "
             "print(a.mallopt({a.M_MMAP_THRESHOLD: a.LARGE_MMAP_THRESHOLD, a.M_TRIM_THRESHOLD: 1 << 28}), "
             "a.mallopt({a.M_TOP_PAD: 1 << 20, 1: 1 << 20}), a.mallopt({a.M_TOP_PAD: 1 << 20}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    if sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION"):
        assert out.stdout.split() == ["True", "False", "True"]
    monkeypatch.setattr(sys, "platform", "darwin")
    assert _allocator.mallopt({_allocator.M_TOP_PAD: 1 << 20}) is False


def test_ctrl_c_while_decoding_in_pieces_stops_the_children_and_exits_130(tmp_path):
    """SIGINT to the whole process group (as a terminal sends it) while pieces are decoded."""
    import signal
    import time

    big = tmp_path / "big.json"
    with gzip.open(os.path.join(DATA, "v100_large_216k_events.json.gz"), "rb") as fh:
        big.write_bytes(fh.read())
    proc = subprocess.Popen([sys.executable, "-m", "gpumagic", "analyze", str(big), "-j", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until a decoding child exists
        kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        if kids:
            break
        time.sleep(0.01)
    assert kids, "no decoding child was started"
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 130
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in kids) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in kids)  # the children are gone


def test_unwritable_output(tmp_path, capsys):
    assert main(["analyze", H100, "-o", str(tmp_path / "no" / "dir" / "r.txt")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_saved_trace_analysis_imports_no_heavy_package():
    """Analysing and rendering a saved trace (every bundled one, and a job of three) loads neither
    the capture-side packages nor ``numpy.ma``, which plain ``np.unique``/``np.median`` import on
    first use (tens of milliseconds of every ``gpumagic analyze`` process: ``gpumagic._arrays``)."""
    files = sorted(glob.glob(os.path.join(DATA, "*.json.gz")))
    code = ("import sys, gpumagic\n"
            "from gpumagic.jobs import analyze_job\n"
            "for f in sys.argv[1:]:\n"
            "    r = gpumagic.analyze(f); r.to_text(); r.to_json(); r.to_html()\n"
            "analyze_job(sys.argv[1:4], jobs=1).to_text()\n"
            "print([m for m in ('torch','IPython','ipywidgets','matplotlib','numpy.ma') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code, *files], capture_output=True, text=True, check=True)
    assert len(files) >= 20 and r.stdout.strip() == "[]"


def test_json_to_standard_output_needs_neither_the_history_folder_nor_temporary_files():
    """Standard output replaces no file: the command neither looks up the run history's folder
    (platformdirs, which ``-o`` needs to protect the history) nor loads ``tempfile`` (which writing
    a regular file through ``-o`` needs), so a small trace's start-up does not pay for them."""
    code = ("import sys; before = set(sys.modules); from gpumagic.shells.cli import main; "
            f"status = main(['analyze', {H100!r}, '--format', 'json']); "
            "print(status, sorted({'platformdirs', 'tempfile'} & (set(sys.modules) - before)), file=sys.stderr)")
    env = {k: v for k, v in os.environ.items() if k != "GPUMAGIC_HOME"}  # the default folder: platformdirs'
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert r.stderr.strip() == "0 []"
    assert json.loads(r.stdout)["findings"]
    # nor does -o /dev/null, a character device written in place (which no kept file can be)
    sink = code.replace("'--format', 'json'", "'--format', 'json', '-o', '/dev/null'")
    r = subprocess.run([sys.executable, "-c", sink], capture_output=True, text=True, check=True, env=env)
    assert r.stderr.strip().splitlines()[-1] == "0 []"


with open(H100, "rb") as _fh:
    import gzip as _gzip

    _RAW = _gzip.decompress(_fh.read())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, len(_RAW) - 1), flip=st.integers(0, len(_RAW) - 1), byte=st.integers(0, 255))
def test_corrupted_or_truncated_input_gives_trace_error_or_a_report(tmp_path, cut, flip, byte):
    """Any damage to a real trace either still reads (and then analyses) or raises TraceError."""
    data = bytearray(_RAW[:cut] if cut % 2 else _RAW)
    if data:
        data[flip % len(data)] = byte
    p = tmp_path / "damaged.json"
    p.write_bytes(bytes(data))
    try:
        r = analyze(str(p))
    except TraceError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(r.findings, list)


@pytest.mark.parametrize(("enabled", "defrag", "stalls"), [
    ("always [madvise] never", "always defer defer+madvise [madvise] never", True),
    ("always [madvise] never", "always defer [defer+madvise] madvise never", True),
    ("always [madvise] never", "[always] defer defer+madvise madvise never", True),
    ("always [madvise] never", "always [defer] defer+madvise madvise never", False),
    ("[always] madvise never", "always defer defer+madvise [madvise] never", True),
    ("[always] madvise never", "[always] defer defer+madvise madvise never", False),
    ("always madvise [never]", "always defer defer+madvise [madvise] never", False),
    ("garbled", "", False),
])
def test_numpy_huge_pages_stall_reads_the_kernel_settings(tmp_path, enabled, defrag, stalls):
    from gpumagic.shells.cli import numpy_huge_pages_stall

    (tmp_path / "enabled").write_text(enabled + "\n")
    (tmp_path / "defrag").write_text(defrag + "\n")
    assert numpy_huge_pages_stall(str(tmp_path)) is stalls
    assert numpy_huge_pages_stall(str(tmp_path / "absent")) is False


def test_the_command_leaves_a_chosen_numpy_huge_page_setting_alone():
    """The console script sets NUMPY_MADVISE_HUGEPAGE (before numpy is imported) only where the
    user has not, and only where the kernel's settings call for it."""
    from gpumagic.shells.cli import numpy_huge_pages_stall

    script = ("import os\nimport gpumagic.shells.cli as c\n"
              "c.main = lambda: print(os.environ.get('NUMPY_MADVISE_HUGEPAGE')) or 0\nc.run()\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == ("0" if numpy_huge_pages_stall() else "None")
    env["NUMPY_MADVISE_HUGEPAGE"] = "1"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1"
