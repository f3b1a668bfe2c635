"""``job.collectives``: each collective across ranks, on a job built from the shared A100 rank with a
known late rank (tests/jobbuilder.py: rank 2 does 2 ms more host work before each collective)."""

import json

import pytest
from jobbuilder import DELAY_US, JITTER_US, STRAGGLER

from gpumagic.jobs import analyze_job


@pytest.fixture(scope="module")
def job(straggler_job):
    return analyze_job(straggler_job, jobs=1)


def test_the_late_rank_arrives_last_and_the_others_wait_for_it(job):
    table = job.collectives
    assert table, "no collectives tabulated"
    top = table[0]  # most total wait first
    assert top["last_rank"] == STRAGGLER and top["last_share"] >= 0.9
    by = {r["rank"]: r for r in top["ranks"]}
    assert sorted(by) == [0, 1, 2, 3] and top["count"] >= 10
    delay_ms, jitter_ms = DELAY_US / 1000, JITTER_US / 1000
    # it arrives about the injected delay after the first rank and hardly waits; the others wait that long
    assert delay_ms - jitter_ms <= by[STRAGGLER]["skew_ms"] <= delay_ms + jitter_ms
    assert by[STRAGGLER]["wait_ms"] <= jitter_ms
    for r in (0, 1, 3):
        assert delay_ms - jitter_ms <= by[r]["wait_ms"] <= delay_ms + jitter_ms
        assert by[r]["skew_ms"] <= jitter_ms
        assert by[r]["dur_ms"] == pytest.approx(by[STRAGGLER]["dur_ms"] + by[r]["wait_ms"], abs=jitter_ms)
    assert top["size_bytes"] is None and by[0]["bus_gbps"] is None  # the trace records no message sizes


def test_straggler_finding_cites_the_table(job):
    f = job.finding("straggler-rank")
    assert f is not None
    assert f"rank {STRAGGLER} arrives last" in f.finding.evidence.summary
    assert "ncclKernel" in f.finding.evidence.summary


def test_json_and_text_carry_the_table(job):
    d = json.loads(job.to_json())["job"]
    assert d["collectives"] == json.loads(json.dumps(job.collectives))
    text = job.to_text()
    assert "COLLECTIVES ACROSS RANKS" in text and f"last: rank {STRAGGLER}" in text
    assert "Collectives across ranks" in job.to_html()
