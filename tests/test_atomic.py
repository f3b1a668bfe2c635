"""gpumagic._atomic: whole or nothing, never over the input."""

import os
import resource
import signal

import pytest

from gpumagic._atomic import FILE_MODE, WriteError, write_atomic


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_writes_text_and_bytes_with_the_usual_mode(tmp_path):
    write_atomic(tmp_path / "a.txt", "héllo")
    write_atomic(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == FILE_MODE
    assert leftovers(tmp_path) == []


def test_refuses_the_input_also_through_a_link(tmp_path):
    src = tmp_path / "trace.json"
    src.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(src)
    for target in (src, link, tmp_path / "." / "trace.json"):
        with pytest.raises(WriteError, match="refusing to write over the input"):
            write_atomic(target, "x", protect=[src])
    assert src.read_text() == "{}"


@pytest.mark.parametrize("case", ["missing folder", "directory", "empty", "not writable", "not regular"])
def test_refused_targets_are_one_sentence(tmp_path, case):
    os.mkfifo(tmp_path / "fifo")  # a FIFO would block the writer; a character device such as /dev/null is a sink
    target = {"missing folder": tmp_path / "nope" / "x.html", "directory": tmp_path, "empty": "",
              "not writable": "/proc/x.html", "not regular": tmp_path / "fifo"}[case]
    with pytest.raises(WriteError) as err:
        write_atomic(target, "x")
    assert "\n" not in str(err.value)


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing(tmp_path):
    """RLIMIT_FSIZE makes the write fail half way (EFBIG), as a full disk would."""
    target = tmp_path / "out.html"
    target.write_text("old")
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, old[1]))
    try:
        with pytest.raises(WriteError, match="cannot write"):
            write_atomic(target, "x" * 10_000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, handler)
    assert target.read_text() == "old"
    assert leftovers(tmp_path) == []


def test_an_interrupt_mid_write_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "out.html"

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "x")
    assert not target.exists() and leftovers(tmp_path) == []
