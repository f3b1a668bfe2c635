"""A torch profiler started by the profiled code takes the profiler over: gpumagic must notice,
never stop or export (torch crashes with SIGSEGV in ``export_chrome_trace``), let the code run as
without the magic, and show a report that says why nothing was recorded.

The crash is a segfault, so each shell-level case runs in a fresh interpreter; the kernel-level
case runs in a real ipykernel and checks that the kernel survives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from capture_state import clean_state_fixture, execute, kernel_fixture, kernel_leftovers, stop_foreign_profiler  # noqa: F401

from gpumagic.capture import CaptureOptions, CaptureSession
from gpumagic.capture.session import TAKEN_OVER_NOTE

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Ways profiled code takes the profiler: a finished `with` block, the legacy autograd profiler,
#: a profiler started and still running when the cell ends, and one stopped before an optimizer step.
CELLS = {
    "with-block": """
        with torch.profiler.profile() as inner:
            torch.ones(8).add_(1)
    """,
    "autograd-profiler": """
        with torch.autograd.profiler.profile() as inner:
            torch.ones(8).add_(1)
    """,
    "left-running": """
        inner = torch.profiler.profile(); inner.start()
        torch.ones(8).add_(1)
    """,
    "then-steps": """
        with torch.profiler.profile() as inner:
            torch.ones(8).add_(1)
        m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(8):
            m(torch.randn(2, 4)).sum().backward(); opt.step()
    """,
}

SHELL_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from ipyshell import ipython_shell
with ipython_shell("gpumagic") as ip:
    result = ip.run_cell("%%gpuprofile -o rep --label nested\\nimport torch\\n" + {cell!r} + "\\n'cell value'\\n")
    rep = ip.user_ns.get("rep")
    inner_events = len(ip.user_ns["inner"].key_averages()) if "{name}" != "left-running" else None
    if "{name}" == "left-running":
        ip.user_ns["inner"].stop()
    from gpumagic.tuning import runs
    print(json.dumps({{"success": result.success, "value": result.result, "notes": rep.notes if rep else None,
                      "text": rep.to_text() if rep else "", "inner_events": inner_events,
                      "remembered": "nested" in runs.labels() if hasattr(runs, "labels") else None}}))
"""


@pytest.mark.parametrize("name", sorted(CELLS))
def test_a_profiler_in_the_cell_takes_over_without_crashing_the_shell(name):
    cell = textwrap.dedent(CELLS[name])
    script = SHELL_SCRIPT.format(tests=TESTS, cell=cell, name=name)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]  # -11 (SIGSEGV) before the fix
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["success"] and out["value"] == "cell value"  # the cell ran as without the magic
    assert out["notes"][0] == TAKEN_OVER_NOTE
    assert "took over the profiler; nothing was recorded" in out["text"]
    if out["inner_events"] is not None:
        assert out["inner_events"] > 0  # the cell's own profiler got its events
    assert out["remembered"] in (False, None)  # an empty report is not kept for --compare


def test_a_session_notes_the_takeover_and_leaves_the_foreign_profiler_running(clean_state):
    import torch

    session = CaptureSession(CaptureOptions(nvml=False))
    session.start()
    inner = torch.profiler.profile()
    inner.start()
    run = session.finish()
    try:
        assert run.taken_over and run.bundle is None
        assert run.report.notes[0] == TAKEN_OVER_NOTE and run.report.findings == []
        assert torch.autograd._profiler_enabled()  # still theirs, not stopped under them
        torch.ones(8).add_(1)
    finally:
        inner.stop()
        stop_foreign_profiler()
    assert len(inner.events()) > 0  # their profile is whole


def test_profiler_functions_are_restored_after_the_session(clean_state):
    import torch.autograd.profiler as ap

    before = (ap._prepare_profiler, ap._enable_profiler)
    session = CaptureSession(CaptureOptions(nvml=False))
    session.start()
    assert ap._enable_profiler is not before[1]  # watched while recording
    session.finish()
    assert (ap._prepare_profiler, ap._enable_profiler) == before


@pytest.mark.slow
def test_the_kernel_survives_a_nested_profiler_and_profiles_again(kernel):
    km, kc = kernel
    status, outputs = execute(kc, "%%gpuprofile -o rep\nimport torch\nwith torch.profiler.profile():\n"
                                  "    torch.ones(8).add_(1)\nprint('body ran')\n")
    assert status == "ok", outputs
    assert km.is_alive()
    assert outputs[0] == ("stream", {"name": "stdout", "text": "body ran\n"})
    shown = [c["data"]["text/plain"] for k, c in outputs if k == "display_data"]
    assert shown and "took over the profiler" in shown[0]
    assert kernel_leftovers(kc) == []
    status, _ = execute(kc, "%%gpuprofile --quiet -o again\nimport torch\ntorch.ones(8).add_(1)\n")
    assert status == "ok"
    status, outputs = execute(kc, "again.notes[0] != rep.notes[0]")
    assert outputs[0][1]["data"]["text/plain"] == "True"  # a normal capture after the takeover
