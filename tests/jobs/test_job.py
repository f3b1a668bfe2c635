"""The job view on jobs built from real rank traces: stragglers named or not, uneven ranks, broken files."""

import json
import os
import statistics

import pytest
from jobbuilder import DELAY_US, HOST_WORK, RESNET, STRAGGLER, build_job, collective_kernels, make_rank, read, rewrite

import gpumagic
from gpumagic.errors import GpumagicError
from gpumagic.jobs import analyze_job, rank_files

#: Collectives per step in the A100 rank's steps: 20 in the first step, 15 in the others (see
#: test_builder_injects_the_delay_where_a_straggler_does); its median step holds 16 after the
#: step the profiler cut short.
A100_COLLECTIVES_PER_STEP = 16


@pytest.fixture(scope="module")
def straggler(straggler_job):
    return analyze_job(straggler_job, jobs=1)


def test_straggler_rank_names_the_injected_rank_and_roughly_its_delay(straggler):
    assert straggler.stragglers == [STRAGGLER]
    f = straggler.finding("straggler-rank")
    assert f is not None and f.ranks == (STRAGGLER,) and f.scope == "job"
    injected_ms = A100_COLLECTIVES_PER_STEP * DELAY_US / 1000
    lost = f.finding.evidence.numbers["lost_ms_per_step"]
    assert injected_ms * 0.75 <= lost <= injected_ms * 1.25
    assert f.finding.est_gain == pytest.approx(lost / straggler.step_median_ms, abs=1e-3)
    # the straggler is the one with short collectives, the others spend the wait inside theirs
    by_rank = {r.rank: r for r in straggler.ranks}
    assert all(by_rank[r].comm_ms > by_rank[STRAGGLER].comm_ms + 4 * injected_ms for r in (0, 1, 3))
    assert straggler.finding_ids[0] == "straggler-rank"


def test_json_job_rows(straggler):
    d = json.loads(straggler.to_json())["job"]
    assert d["world_size"] == 4 and d["stragglers"] == [STRAGGLER]
    assert [r["rank"] for r in d["ranks"]] == [0, 1, 2, 3]
    row = d["ranks"][0]
    assert set(row) >= {"rank", "path", "device", "step_median_ms", "step_p90_ms", "gpu_busy_frac", "comm_ms",
                        "comm_exposed_ms", "top_finding"}
    assert row["device"] == "NVIDIA A100-SXM4-80GB" and row["top_finding"] == row["findings"][0]
    assert d["step_median_ms"] == pytest.approx(statistics.median(r["step_median_ms"] for r in d["ranks"]))


def test_no_straggler_stays_silent_and_findings_are_listed_once(clean_job):
    job = analyze_job(clean_job, jobs=1)
    assert job.stragglers == [] and "straggler-rank" not in job.finding_ids
    ids = job.finding_ids
    assert len(ids) == len(set(ids))  # one entry per finding, not one per rank
    single = gpumagic.analyze(clean_job[0])
    assert set(ids) == set(single.finding_ids)
    for f in job.findings:
        assert f.scope == "common" and f.ranks == (0, 1, 2)
    d = job.to_dict()["job"]
    assert all(f["rank_count"] == 3 and f["of_ranks"] == 3 for f in d["findings"])


def test_ranks_on_different_devices_are_compared_only_with_their_peers(mixed_job):
    job = analyze_job(mixed_job, jobs=1)
    devices = {r.rank: r.device for r in job.ranks}
    assert devices == {0: "NVIDIA A100-SXM4-80GB", 1: "NVIDIA A100-SXM4-80GB",
                       2: "Tesla V100-SXM2-32GB", 3: "Tesla V100-SXM2-32GB"}
    assert sorted(g.ranks for g in job.groups) == [(0, 1), (2, 3)]
    assert job.stragglers == []
    assert any("2 different kinds of work" in n for n in job.notes)
    # a finding on 2 of 4 ranks is "at least half": listed once with its ranks
    mp = job.finding("mixed-precision-off")
    assert mp is not None and mp.ranks == (2, 3)


def test_a_rank_only_kernel_does_not_set_a_rank_apart(tmp_path, straggler_job):
    """Rank 0 also runs a kernel of its own (say, for logging): still a peer of the others."""
    def extra_kernel(doc):
        k = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "nccl" not in e["name"].lower())
        k["name"] = "void log_metrics_kernel<float>(float const*, float*)"

    paths = [rewrite(straggler_job[0], tmp_path / "rank0.json.gz", extra_kernel), *straggler_job[1:]]
    job = analyze_job(paths, jobs=1)
    assert [g.ranks for g in job.groups] == [(0, 1, 2, 3)] and job.stragglers == [STRAGGLER]


def test_a_rank_alone_in_its_work_cannot_be_judged(tmp_path, clean_job):
    """Two A100 ranks, and a rank 2 that trains a single-GPU ResNet: rank 2 has no peer."""
    (lone,) = build_job(tmp_path, ranks=1, first=2, world_size=3, source=RESNET)
    job = analyze_job([*clean_job[:2], lone], jobs=1)
    assert job.stragglers == []
    assert any(n.startswith("rank 2: no other rank does the same work") for n in job.notes)


def test_a_job_where_no_two_ranks_match_says_it_cannot_tell(clean_job, mixed_job):
    job = analyze_job([clean_job[0], mixed_job[2]], jobs=1)
    assert job.stragglers == []
    assert any("job's shape makes it impossible" in n for n in job.notes)


def test_missing_and_corrupt_rank_files_are_named_and_the_job_goes_on(broken_job):
    job = analyze_job(broken_job, jobs=1)
    errors = {r.rank: r.error for r in job.errors}
    assert set(errors) == {4, 5}
    assert "no such file" in errors[5] and "rank4.json.gz" in errors[4]
    assert job.stragglers == [STRAGGLER] and len(job.analysed) == 4
    text = job.to_text()
    assert "rank 4: " in text and "rank 5: " in text
    d = job.to_dict()["job"]
    assert {e["rank"] for e in d["errors"]} == {4, 5} and d["analysed"] == 4


def test_ranks_are_aligned_by_steps_not_by_their_clocks(tmp_path, straggler_job):
    """Rank 3's host clock is an hour off: nothing changes."""
    def skew(doc):
        for e in doc["traceEvents"]:
            if "ts" in e and e.get("ph") != "M":
                e["ts"] += 3_600_000_000

    paths = [str(p) for p in straggler_job[:3]] + [str(rewrite(straggler_job[3], tmp_path / "rank3.json.gz", skew))]
    job = analyze_job(paths, jobs=1)
    assert job.stragglers == [STRAGGLER]
    lost = job.finding("straggler-rank").finding.evidence.numbers["lost_ms_per_step"]
    assert lost == analyze_job(straggler_job, jobs=1).finding("straggler-rank").finding.evidence.numbers["lost_ms_per_step"]


def test_rank_comes_from_distributed_info_else_the_file_name(tmp_path, straggler_job):
    def drop(doc):
        del doc["distributedInfo"]

    named = rewrite(straggler_job[1], tmp_path / "worker.rank7.pt.trace.json.gz", drop)
    anonymous = rewrite(straggler_job[1], tmp_path / "trace.json.gz", drop)
    job = analyze_job([anonymous, named, straggler_job[1]], jobs=1)
    assert [(r.rank, r.rank_source) for r in job.ranks] == [(1, "distributedInfo"), (7, "file name"), (None, "")]
    assert any("its rank is unknown" in n for n in job.notes)


def test_process_pool_gives_the_same_job(straggler_job, straggler):
    assert analyze_job(straggler_job, jobs=2).to_dict() == straggler.to_dict()


def test_progress_is_reported_per_rank(clean_job):
    seen = []
    analyze_job(clean_job, jobs=1, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_rank_files_expands_folders_and_globs(tmp_path, clean_job):
    folder = os.path.dirname(clean_job[0])
    assert rank_files(folder) == sorted(map(str, clean_job))
    assert rank_files(os.path.join(folder, "rank[12]*")) == [str(p) for p in clean_job[1:]]
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(GpumagicError, match=r"holds no \.json or \.json\.gz trace file"):
        rank_files(tmp_path)
    with pytest.raises(GpumagicError, match="no file matches"):
        rank_files(str(tmp_path / "rank*.json"))


def test_builder_injects_the_delay_where_a_straggler_does():
    """The straggler's trace gains host work before each collective and keeps its collective
    durations; the others' collectives last DELAY_US longer (a few that overlap another collective
    on a second stream differ more); every rank's step ends together."""
    base = read(os.path.join(os.path.dirname(__file__), "..", "data", "a100_training_rank0.json.gz"))
    late = make_rank(base, STRAGGLER, 4, straggler=STRAGGLER, delay_us=DELAY_US)
    other = make_rank(base, 0, 4, straggler=STRAGGLER, delay_us=DELAY_US)
    assert late["distributedInfo"]["rank"] == STRAGGLER and other["distributedInfo"]["rank"] == 0
    k_late, k_other = collective_kernels(late), collective_kernels(other)
    assert len(k_late) == len(k_other) == 80
    longer = [b["dur"] - a["dur"] for a, b in zip(k_late, k_other)]
    assert sum(x == DELAY_US for x in longer) >= 0.9 * len(longer)
    assert sum(e["name"] == HOST_WORK for e in late["traceEvents"]) == 80

    def steps(doc):
        return sorted((e["ts"], e["dur"]) for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))

    assert steps(late) == steps(other)


def test_an_unexpected_error_in_one_rank_is_that_rank_s_error(clean_job, monkeypatch):
    from gpumagic.jobs import executors

    real = executors.summarize

    def flaky(path):
        if path.endswith("rank1.json.gz"):
            raise IndexError("index 7 is out of bounds")
        return real(path)

    monkeypatch.setattr(executors, "summarize", flaky)
    job = analyze_job(clean_job, jobs=1)
    assert [r.rank for r in job.analysed] == [0, 2]
    assert [r.error for r in job.errors] == [f"{clean_job[1]}: its analysis failed (IndexError: index 7 is out of bounds)"]


def test_copies_of_one_recording_cannot_tell_stragglers_apart(tmp_path, clean_job):
    """Four files with one rank's content under different names: not "Stragglers: none" (nothing
    was compared), and not "no two ranks do the same work" either."""
    import shutil

    from jobbuilder import A100

    paths = [shutil.copy(A100, tmp_path / f"node{i}.json.gz") for i in range(4)]
    job = analyze_job(paths, jobs=1)
    assert job.same_recording and job.stragglers == [] and "straggler-rank" not in job.finding_ids
    assert job.to_dict()["job"]["same_recording"] is True
    text = job.to_text()
    assert "Stragglers: none" not in text and "Stragglers: cannot tell" in text.splitlines()[1]
    assert any("all 4 files hold the same recording" in n for n in job.notes)
    assert not any("no two ranks do the same work" in n for n in job.notes)
    assert "cannot tell" in job.to_html()
    # real ranks (the builder's copies with their own rank and jitter) are not "the same recording"
    clean = analyze_job(clean_job, jobs=1)
    assert not clean.same_recording and clean.to_dict()["job"]["same_recording"] is False
