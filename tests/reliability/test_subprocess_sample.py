"""A sample of the fuzzer's mutations run as real ``gpumagic analyze`` processes under
``prlimit`` (60 s of CPU, 2 GB of address space): each exits 0, or 2 with exactly one line on
stderr: no traceback, no hang, no crash."""

import os
import random
import shutil
import subprocess
import sys

import pytest
from trace_mutations import mutated

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEEDS = range(1000, 1012)

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")


def analyze_limited(path: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = ["prlimit", "--cpu=60", f"--as={2 << 30}", sys.executable, "-m", "gpumagic", "analyze", path,
           "--format", "json", "-o", os.devnull, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, env={**os.environ, "PYTHONPATH": ROOT})


@pytest.mark.parametrize("seed", SEEDS)
def test_mutated_trace_exits_0_or_2_with_one_line(tmp_path, seed):
    path = tmp_path / f"mutated-{seed}.json"
    path.write_bytes(mutated(seed))
    jobs = random.Random(seed).choice(["1", "2"])
    p = analyze_limited(str(path), "-j", jobs)
    assert p.returncode in (0, 2), p.stderr
    if p.returncode == 2:
        assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith("gpumagic: error: "), p.stderr
