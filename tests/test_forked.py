"""gpumagic._forked: work done in a forked child, its result handed back through a file in memory."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from gpumagic import _forked

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is not available")


def test_a_result_comes_back_with_its_arrays_aligned_and_writeable():
    child = _forked.start(lambda: {"ts": np.arange(1001, dtype=np.float64), "names": ["a", "b"], "n": 3})
    got = _forked.wait(child)
    assert got["names"] == ["a", "b"] and got["n"] == 3
    assert np.array_equal(got["ts"], np.arange(1001, dtype=np.float64))
    assert got["ts"].flags.aligned and got["ts"].flags.writeable
    got["ts"][0] = -1.0  # a private copy of the page: the file is not written
    assert child.ended


@pytest.mark.parametrize("work", [lambda: 1 / 0, lambda: None, lambda: os._exit(9)])
def test_a_child_that_raises_returns_nothing_or_dies_gives_none(work):
    assert _forked.wait(_forked.start(work)) is None


def test_stop_and_wait_act_once(monkeypatch):
    r, w = os.pipe()

    def blocked():  # until the parent writes (never)
        os.read(r, 1)
        return 1

    child = _forked.start(blocked)
    kills = []
    real_kill = os.kill
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append(pid) or real_kill(pid, sig))
    _forked.stop(child)
    _forked.stop(child)  # the id may name another process by now: no second kill, no second close
    assert kills == [child.pid] and child.ended
    assert _forked.wait(child) is None
    done = _forked.start(lambda: 2)
    assert _forked.wait(done) == 2
    _forked.stop(done)
    assert kills == [child.pid]
    os.close(r)
    os.close(w)


def test_an_interrupted_wait_stops_and_reaps_the_child(monkeypatch):
    r, w = os.pipe()
    child = _forked.start(lambda: os.read(r, 1))  # blocked until the parent writes (never)
    real_waitpid, calls = os.waitpid, []

    def interrupted_once(pid, options):
        if not calls:
            calls.append(pid)
            raise KeyboardInterrupt  # Ctrl-C while waiting
        return real_waitpid(pid, options)

    monkeypatch.setattr(os, "waitpid", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        _forked.wait(child)
    monkeypatch.undo()
    assert child.ended
    with pytest.raises(ChildProcessError):  # killed and reaped: no child of that id is left
        os.waitpid(child.pid, os.WNOHANG)
    os.close(r)
    os.close(w)


def test_the_child_leaves_without_the_parents_clean_up(tmp_path):
    """os._exit: no atexit handler of the parent's runs in the child."""
    import atexit

    sys.stdout.flush()
    marker = tmp_path / "ran"
    handler = lambda: marker.write_text("atexit ran")  # noqa: E731
    atexit.register(handler)
    try:
        assert _forked.wait(_forked.start(lambda: os.getpid())) not in (None, os.getpid())
    finally:
        atexit.unregister(handler)
    assert not marker.exists()


def test_ctrl_c_is_held_while_the_child_is_forked(monkeypatch):
    """SIGINT is blocked while os.fork runs (and its after-fork hooks in the child, where a
    KeyboardInterrupt printed a traceback: tests/test_cli.py's Ctrl-C test failed so once), and
    the mask is back as it was in the parent and, once the child runs its work, in the child."""
    import signal

    masks: list[set] = []
    real = _forked.fork_quietly

    def fork():
        masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, set()))
        return real()

    monkeypatch.setattr(_forked, "fork_quietly", fork)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    child = _forked.start(lambda: signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set()))
    assert signal.SIGINT in masks[0] and signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    assert _forked.wait(child) is (signal.SIGINT in before)  # the child's work ran with the parent's mask
