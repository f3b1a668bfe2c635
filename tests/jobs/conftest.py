"""Job folders built from the real single-rank traces (tests/jobbuilder.py), once per test session."""

import gzip
import os
import shutil

import pytest
from jobbuilder import DELAY_US, JITTER_US, STRAGGLER, V100, build_job


def child_pids() -> list[int]:
    """This process's live (not zombie) children, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                out.append(int(entry))
    return out


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """A job's worker processes (and any server of theirs) are gone when it returns. Children that
    were there before the test (an xdist worker also runs other modules, e.g. multiprocessing's
    resource tracker) are not the job's."""
    before = set(child_pids())
    yield
    assert set(child_pids()) <= before, "the job left a process behind"


@pytest.fixture(scope="session")
def straggler_job(tmp_path_factory):
    """4 A100 ranks with jitter; rank 2 does 2 ms of extra host work before each of its collectives."""
    return build_job(tmp_path_factory.mktemp("straggler"), ranks=4, straggler=STRAGGLER, delay_us=DELAY_US, jitter_us=JITTER_US)


@pytest.fixture(scope="session")
def clean_job(tmp_path_factory):
    """3 A100 ranks whose collectives differ only by random jitter: no straggler."""
    return build_job(tmp_path_factory.mktemp("clean"), ranks=3, jitter_us=JITTER_US)


@pytest.fixture(scope="session")
def mixed_job(tmp_path_factory):
    """Ranks 0-1 copied from the A100 rank, 2-3 from the V100 rank: two kinds of work on two kinds of GPU."""
    return build_job(tmp_path_factory.mktemp("mixed"), ranks=4, sources={2: V100, 3: V100})


@pytest.fixture
def broken_job(tmp_path, straggler_job):
    """The straggler job plus a corrupt rank 4 and a rank 5 whose file is missing."""
    paths = [shutil.copy(p, tmp_path / p.name) for p in straggler_job]
    (tmp_path / "rank4.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": ')[:-8])
    return [str(p) for p in paths] + [str(tmp_path / "rank4.json.gz"), str(tmp_path / "rank5.json.gz")]
