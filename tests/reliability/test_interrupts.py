"""Ctrl-C at any moment of a capture's teardown and report build: the profiler, samplers and hook
are gone afterwards, the next capture works, and the profiled code's own exception is the one
raised.

Deterministic: ``gpumagic.capture.interrupts.checkpoint_hook`` raises ``KeyboardInterrupt`` at one
named checkpoint of ``finish()`` at a time (how an interrupt landing there looks to the code).
Real signals: SIGINT sent to this process during the teardown, and to a real ipykernel by
``KernelManager.interrupt_kernel()`` while it builds the report.
"""

from __future__ import annotations

import os
import signal

import pytest

torch = pytest.importorskip("torch")

from capture_state import clean_state_fixture, execute, kernel_fixture, kernel_leftovers, leftovers  # noqa: E402,F401
from ipyshell import ipython_shell  # noqa: E402

from gpumagic.capture import CaptureOptions, CaptureSession, interrupts  # noqa: E402
from gpumagic.capture.session import CHECKPOINTS, finish_after  # noqa: E402

#: Checkpoints a CPU capture passes (no NVML sampler here, so no NVML shutdown).
REACHED = [c for c in CHECKPOINTS if c != "shutdown-nvml"]


@pytest.fixture
def interrupt_at(monkeypatch):
    """``interrupt_at(name)``: the first time ``finish()`` reaches checkpoint ``name``, raise
    KeyboardInterrupt there. Returns the list of checkpoints passed, in order."""
    passed: list[str] = []

    def arm(name: str) -> list[str]:
        def hook(reached: str) -> None:
            passed.append(reached)
            if reached == name and passed.count(name) == 1:
                raise KeyboardInterrupt(f"injected at {name}")

        monkeypatch.setattr(interrupts, "checkpoint_hook", hook)
        return passed

    return arm


def _work() -> None:
    for _ in range(20):
        torch.ones(64).mul_(2)


def _new_session(**options) -> CaptureSession:
    session = CaptureSession(CaptureOptions(nvml=False, interval_ms=10, **options))
    session.start()
    _work()
    return session


def test_every_named_checkpoint_is_reached_in_order(interrupt_at, tmp_path, clean_state):
    passed = interrupt_at("no such checkpoint")
    _new_session(save=str(tmp_path / "run.json.gz")).finish()
    assert [c for c in CHECKPOINTS if c in passed] == REACHED
    assert [c for c in passed if c in REACHED] == [c for c in REACHED for _ in range(passed.count(c))]


@pytest.mark.parametrize("name", REACHED)
def test_an_interrupt_at_any_checkpoint_still_tears_everything_down(name, interrupt_at, tmp_path, clean_state):
    interrupt_at(name)
    session = _new_session(save=str(tmp_path / "run.json.gz"))
    with pytest.raises(KeyboardInterrupt, match=f"injected at {name}"):
        session.finish()
    assert session.state == "finished"
    assert leftovers() == []
    interrupts.checkpoint_hook = None
    run = _new_session().finish()  # the next capture is not refused
    assert run.report is not None


@pytest.mark.parametrize("name", REACHED)
def test_the_codes_own_exception_wins_over_an_interrupt_in_finish(name, interrupt_at, clean_state):
    interrupt_at(name)
    session = _new_session()
    error = ValueError("from the profiled code")
    run = finish_after(session, error)  # does not raise: the caller re-raises `error`
    assert run.finished and leftovers() == []


def test_a_real_sigint_during_the_teardown_waits_until_it_is_complete(monkeypatch, clean_state):
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    passed = []

    def hook(name: str) -> None:
        passed.append(name)
        if name == "stop-profiler":
            os.kill(os.getpid(), signal.SIGINT)  # delivered to the main thread, i.e. here

    monkeypatch.setattr(interrupts, "checkpoint_hook", hook)
    session = _new_session()
    with pytest.raises(KeyboardInterrupt):
        session.finish()
    assert "release" in passed and "export" not in passed  # raised once the teardown ended
    assert leftovers() == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_interrupts_held_leaves_a_block_without_signals_unchanged():
    with interrupts.interrupts_held():
        value = 1 + 1
    assert value == 2 and signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("cell_raises", [False, True])
@pytest.mark.parametrize("name", ["stop-profiler", "stop-sampler", "release", "analyse"])
def test_the_magic_after_an_interrupt_in_finish(name, cell_raises, interrupt_at, clean_state):
    interrupt_at(name)
    body = "raise ValueError('from the cell')" if cell_raises else "x = 1"
    with ipython_shell("gpumagic") as ip:
        result = ip.run_cell(f"%%gpuprofile --quiet --no-nvml\nimport torch\ntorch.ones(8).add_(1)\n{body}\n")
        expected = ValueError if cell_raises else KeyboardInterrupt
        assert type(result.error_in_exec) is expected
        assert leftovers() == []
        interrupts.checkpoint_hook = None
        again = ip.run_cell("%%gpuprofile --quiet --no-nvml -o rep\nimport torch\ntorch.ones(8).add_(1)\n")
        assert again.success and ip.user_ns["rep"] is not None


# ------------------------------------------------------------------------- a real kernel
ARM_IN_KERNEL = """
import os, signal, sys, time
from gpumagic.capture import interrupts
def _gm_hook(name, _seen=[]):
    _seen.append(name)
    if name == {at!r} and _seen.count(name) == 1:
        {action}
interrupts.checkpoint_hook = _gm_hook
"""


def _disarm(kc) -> None:
    assert execute(kc, "from gpumagic.capture import interrupts; interrupts.checkpoint_hook = None")[0] == "ok"


@pytest.mark.slow
@pytest.mark.parametrize("at", ["stop-profiler", "stop-sampler"])
def test_a_kernel_signalling_itself_during_the_teardown(kernel, at):
    _km, kc = kernel
    assert execute(kc, ARM_IN_KERNEL.format(at=at, action="os.kill(os.getpid(), signal.SIGINT)"))[0] == "ok"
    status, outputs = execute(kc, "%%gpuprofile --quiet\nimport torch\ntorch.ones(8).add_(1)\n")
    _disarm(kc)
    assert status == "error" and outputs[-1][1]["ename"] == "KeyboardInterrupt"
    assert kernel_leftovers(kc) == []
    assert execute(kc, "%%gpuprofile --quiet\nimport torch\ntorch.ones(8).add_(1)\n")[0] == "ok"


@pytest.mark.slow
@pytest.mark.parametrize("cell_raises", [False, True])
def test_interrupting_a_kernel_while_it_builds_the_report(kernel, cell_raises):
    km, kc = kernel
    action = "print('building', flush=True); time.sleep(60)"
    assert execute(kc, ARM_IN_KERNEL.format(at="analyse", action=action))[0] == "ok"
    body = "raise ValueError('from the cell')" if cell_raises else "y = 2"

    def on_stream(text: str) -> None:
        if "building" in text:
            km.interrupt_kernel()  # SIGINT from outside, as the notebook's stop button sends it

    status, outputs = execute(kc, f"%%gpuprofile --quiet\nimport torch\ntorch.ones(8).add_(1)\n{body}\n",
                              on_stream=on_stream)
    _disarm(kc)
    errors = [c["ename"] for k, c in outputs if k == "error"]
    assert status == "error" and errors == ["ValueError" if cell_raises else "KeyboardInterrupt"]
    assert kernel_leftovers(kc) == []
    assert execute(kc, "%%gpuprofile --quiet\nimport torch\ntorch.ones(8).add_(1)\n")[0] == "ok"


@pytest.mark.slow
def test_interrupting_the_profiled_cell_itself(kernel):
    km, kc = kernel
    code = ("%%gpuprofile --quiet --all\nimport time, torch\nprint('running', flush=True)\n"
            "t0 = time.time()\nwhile time.time() - t0 < 60:\n    torch.ones(8).add_(1)\n")
    status, outputs = execute(kc, code, on_stream=lambda text: km.interrupt_kernel() if "running" in text else None)
    assert status == "error" and [c["ename"] for k, c in outputs if k == "error"] == ["KeyboardInterrupt"]
    assert kernel_leftovers(kc) == []
