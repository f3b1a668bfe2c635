"""Shared by the reliability tests that profile: what a capture may leave behind, and a kernel.

Imported by test modules (pytest puts this folder on ``sys.path``): importing
``clean_state_fixture`` / ``kernel_fixture`` makes the fixtures ``clean_state`` / ``kernel`` available.
"""

from __future__ import annotations

import threading

import pytest

from gpumagic.capture import session as session_module
from gpumagic.capture.recorder import profiler_active
from gpumagic.capture.sampler import THREAD_PREFIX

KERNEL_TIMEOUT_S = 120


def leftovers() -> list[str]:
    """What a capture left behind (a recording profiler, a gpumagic thread, a registered session,
    our optimizer hook); empty when everything was torn down."""
    from torch.optim.optimizer import _global_optimizer_post_hooks

    from gpumagic.capture.steps import OptimizerStepHook

    problems = []
    if profiler_active():
        problems.append("a torch profiler is still recording")
    threads = [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]
    if threads:
        problems.append(f"gpumagic threads still alive: {threads}")
    if session_module.active_session() is not None:
        problems.append("a capture session is still registered as active")
    if any(isinstance(getattr(h, "__self__", None), OptimizerStepHook) for h in _global_optimizer_post_hooks.values()):
        problems.append("gpumagic's optimizer step hook is still installed")
    problems += stage_timer_leftovers()
    return problems


def stage_timer_leftovers() -> list[str]:
    """The data-loader stage timers still installed in this process (gpumagic.capture.stages)."""
    from torch.utils.data import DataLoader
    from torch.utils.data._utils import fetch, pin_memory

    from gpumagic.capture import stages

    problems = []
    if stages._sink is not None:
        problems.append("the loader-stage timers still record")
    for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
        if hasattr(cls.__dict__.get("fetch"), "_gpumagic_original"):
            problems.append(f"{cls.__name__}.fetch is still wrapped")
    if hasattr(DataLoader.__dict__["_get_iterator"], "__wrapped__") or isinstance(pin_memory.pin_memory, stages.Timed):
        problems.append("DataLoader._get_iterator or pin_memory is still wrapped")
    return problems


def stop_foreign_profiler() -> None:
    """Stop a torch profiler that a test's own code left running (not gpumagic's)."""
    import torch

    if profiler_active():
        torch.autograd._disable_profiler()
        torch.autograd.profiler._set_is_profiler_enabled(False)


@pytest.fixture(name="clean_state")
def clean_state_fixture():
    """Fails the test if a capture left anything behind."""
    assert leftovers() == [], "state leaked in from an earlier test"
    yield
    problems = leftovers()
    stop_foreign_profiler()
    session_module._active = None
    assert problems == []


# ------------------------------------------------------------------------- a real kernel
@pytest.fixture(scope="module", name="kernel")
def kernel_fixture():
    """A real ipykernel (through jupyter_client) with gpumagic loaded: ``(manager, client)``."""
    pytest.importorskip("ipykernel")
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        assert execute(kc, "%load_ext gpumagic")[0] == "ok"
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def execute(kc, code: str, on_stream=None):
    """(reply status, [(iopub message type, content)]) of one cell; ``on_stream(text)`` is called
    for each piece of output the cell prints, as it arrives."""
    msg_id = kc.execute(code)
    outputs = []
    while True:
        msg = kc.get_iopub_msg(timeout=KERNEL_TIMEOUT_S)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "stream" and on_stream is not None:
            on_stream(msg["content"]["text"])
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            break
        if kind in ("stream", "display_data", "execute_result", "error"):
            outputs.append((kind, msg["content"]))
    while True:  # the reply to this request (an earlier reply may still be queued)
        reply = kc.get_shell_msg(timeout=KERNEL_TIMEOUT_S)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]["status"], outputs


def value_of(kc, expression: str) -> str:
    """``repr``-like text of ``expression`` evaluated in the kernel."""
    status, outputs = execute(kc, expression)
    assert status == "ok", outputs
    results = [c["data"]["text/plain"] for k, c in outputs if k == "execute_result"]
    assert results, outputs
    return results[0]


def kernel_leftovers(kc) -> list[str]:
    """:func:`leftovers` as seen inside the kernel."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    execute(kc, f"import sys; sys.path.insert(0, {here!r}); import capture_state as _gm_state")
    return eval(value_of(kc, "_gm_state.leftovers()"))  # a list of str, printed by the kernel
