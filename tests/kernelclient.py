"""A real Jupyter kernel (ipykernel through jupyter_client) for tests that need one, as a notebook runs it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

TIMEOUT_S = 120


@contextlib.contextmanager
def running_kernel(graceful: bool = False) -> Iterator:
    """A started kernel's client; shut down after (``graceful``: through a shutdown request, so
    the kernel's ``atexit`` handlers run, and waiting for the process to end)."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=not graceful)


def execute(kc, code: str, timeout_s: float = TIMEOUT_S):
    """(reply status, [(iopub message type, content)]) of one cell."""
    msg_id = kc.execute(code)
    outputs = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout_s)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            break
        if kind in ("stream", "display_data", "execute_result", "error"):
            outputs.append((kind, msg["content"]))
    while True:  # skip older replies (start_new_kernel may leave several kernel_info replies behind)
        reply = kc.get_shell_msg(timeout=timeout_s)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]["status"], outputs


def value(kc, expression: str):
    """The ``text/plain`` of ``expression`` evaluated in the kernel (a failure raises with the traceback)."""
    status, outputs = execute(kc, expression)
    if status != "ok":
        raise AssertionError(f"{expression!r} failed in the kernel: {outputs}")
    return next(c["data"]["text/plain"] for k, c in outputs if k == "execute_result")
