"""The run history outlives the kernel: a run labelled in one kernel is compared in the next."""

from __future__ import annotations

import ast

import pytest
from kernelclient import execute, running_kernel, value

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")
pytest.importorskip("torch")

pytestmark = pytest.mark.slow

TRAIN = """
import time, torch
torch.manual_seed(0)
m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(8):
    time.sleep({sleep})
    m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
"""


def test_compare_with_a_run_from_the_kernel_before_the_restart(gpumagic_home):
    with running_kernel() as kc:
        assert execute(kc, "%load_ext gpumagic")[0] == "ok"
        status, _ = execute(kc, "%%gpuprofile --quiet --no-nvml --label before" + TRAIN.format(sleep=0.03))
        assert status == "ok"
        first_pid = value(kc, "__import__('os').getpid()")
    # a new kernel process: nothing in memory survives, only the history on disk
    with running_kernel() as kc:
        assert value(kc, "__import__('os').getpid()") != first_pid
        assert execute(kc, "%load_ext gpumagic")[0] == "ok"
        status, outputs = execute(kc, "%%gpuprofile -o rep --no-nvml --label after --compare before"
                                      + TRAIN.format(sleep=0.0))
        assert status == "ok", outputs
        shown = [c["data"]["text/plain"] for k, c in outputs if k == "display_data"]
        # one output: the comparison first, the full report under it
        assert len(shown) == 1 and shown[0].startswith("gpumagic comparison: before → after\n")
        assert "faster" in shown[0].splitlines()[1]  # 30 ms of sleep per step is gone
        facts = ast.literal_eval(value(kc, "import gpumagic; from gpumagic.tuning import runs; "
                                           "c = gpumagic.compare('before', 'after'); "
                                           "(runs.get('before').trace is None, runs.get('after') is rep, "
                                           "c.step_time_ratio < 0.5, runs.labels(), runs.find('before').ref)"))
        assert facts == (True, True, True, ["before", "after"], "r1")
    assert (gpumagic_home / "history.sqlite3").is_file()
