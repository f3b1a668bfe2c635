"""``%%gpuprofile`` in a real Jupyter kernel (ipykernel through jupyter_client), as a notebook runs it."""

from __future__ import annotations

import ast

import pytest

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.slow

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def kernel():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def execute(kc, code: str):
    """(reply status, [(iopub message type, content)]) of one cell."""
    msg_id = kc.execute(code)
    outputs = []
    while True:
        msg = kc.get_iopub_msg(timeout=TIMEOUT_S)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            break
        if kind in ("stream", "display_data", "execute_result", "error"):
            outputs.append((kind, msg["content"]))
    return shell_reply(kc, msg_id, TIMEOUT_S)["content"]["status"], outputs


def shell_reply(kc, msg_id: str, timeout_s: float) -> dict:
    """The shell channel's reply to ``msg_id``, skipping older replies (start_new_kernel may leave
    several kernel_info replies there when the kernel was slow to start)."""
    while True:
        reply = kc.get_shell_msg(timeout=timeout_s)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def test_a_notebook_cell_prints_live_displays_the_report_and_returns_its_value(kernel):
    assert execute(kernel, "%load_ext gpumagic")[0] == "ok"
    status, outputs = execute(kernel, """%%gpuprofile -o rep
import torch
print("live")
m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(8):
    m(torch.randn(4, 8)).sum().backward(); opt.step()
6 * 7
""")
    assert status == "ok"
    kinds = [k for k, _ in outputs]
    assert kinds == ["stream", "display_data", "display_data", "execute_result"]
    assert outputs[0][1]["text"] == "live\n"
    assert set(outputs[1][1]["data"]) == {"text/html", "text/plain"}  # the static report, an output of its own
    assert "application/vnd.jupyter.widget-view+json" in outputs[2][1]["data"]  # then the live view
    assert outputs[3][1]["data"]["text/plain"] == "42"
    status, outputs = execute(kernel, "rep.metrics['steps']['count']")
    assert outputs[0][1]["data"]["text/plain"] == "5"


def test_an_error_fails_the_cell_so_run_all_stops(kernel):
    execute(kernel, "%load_ext gpumagic")
    status, outputs = execute(kernel, "%%gpuprofile --quiet\nraise ValueError('from the cell')\n")
    assert status == "error"
    assert [(k, c.get("ename"), c.get("evalue")) for k, c in outputs] == [("error", "ValueError", "from the cell")]


def test_the_time_cap_stops_recording_inside_the_kernel(kernel):
    execute(kernel, "%load_ext gpumagic")
    status, _ = execute(kernel, """%%gpuprofile --quiet -o capped --max-seconds 0.3
import time, torch
t0 = time.time()
while time.time() - t0 < 1.0:
    torch.ones(8).add_(1)
""")
    assert status == "ok"
    _, outputs = execute(kernel, "capped.metrics['window']['dur_ms'], "
                                 "[t.name for t in __import__('threading').enumerate() if t.name.startswith('gpumagic-')]")
    dur_ms, threads = ast.literal_eval(outputs[0][1]["data"]["text/plain"])
    assert 250 <= dur_ms < 600 and threads == []  # ~0.3 s of a 1 s cell
