"""Fixtures for the capture tests: nothing may outlive a test, and an IPython shell to drive magics.

``no_leftovers`` (autouse) fails any test after which a torch profiler is still recording, a
``gpumagic-`` thread is alive, a capture session is still registered, or gpumagic's optimizer
hook is still installed; it cleans up first, so one failure does not cascade into the next tests.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from ipyshell import ipython_shell  # noqa: E402

from gpumagic.capture import session as session_module  # noqa: E402
from gpumagic.capture.recorder import profiler_active  # noqa: E402
from gpumagic.capture.sampler import THREAD_PREFIX  # noqa: E402
from gpumagic.capture.steps import OptimizerStepHook  # noqa: E402


def _gpumagic_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]


def _our_hooks() -> list:
    from torch.optim.optimizer import _global_optimizer_post_hooks

    return [k for k, h in _global_optimizer_post_hooks.items()
            if isinstance(getattr(h, "__self__", None), OptimizerStepHook)]


def leftovers() -> list[str]:
    """What a capture left behind; empty when everything was torn down."""
    problems = []
    if profiler_active():
        problems.append("a torch profiler is still recording")
    threads = _gpumagic_threads()
    if threads:
        problems.append(f"gpumagic threads still alive: {threads}")
    if session_module.active_session() is not None:
        problems.append("a capture session is still registered as active")
    if _our_hooks():
        problems.append("gpumagic's optimizer step hook is still installed")
    return problems


def _clean_up() -> None:
    from torch.optim.optimizer import _global_optimizer_post_hooks

    if profiler_active():
        torch.autograd._disable_profiler()
        torch.autograd.profiler._set_is_profiler_enabled(False)
    for key in _our_hooks():
        _global_optimizer_post_hooks.pop(key, None)
    session_module._active = None


@pytest.fixture(autouse=True)
def no_leftovers():
    problems = leftovers()
    if problems:
        _clean_up()
        pytest.fail(f"state leaked in from an earlier test: {problems}")
    yield
    problems = leftovers()
    if problems:
        _clean_up()
        pytest.fail(f"the test left state behind: {problems}")


@pytest.fixture(scope="module")
def shell():
    """An IPython shell with gpumagic loaded, history in memory; process state restored after."""
    with ipython_shell("gpumagic") as ip:
        yield ip


@pytest.fixture
def tiny_model():
    """A linear model with its SGD optimizer, small enough for a step to take ~0.1 ms."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


@pytest.fixture
def train(tiny_model):
    """``train(n)`` runs ``n`` plain training steps of ``tiny_model`` on random data."""
    model, optimizer = tiny_model

    def run(n: int) -> None:
        for _ in range(n):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    return run
