"""The job's views (text, self-contained HTML with a per-rank chart, notebook bundle) and the
straggler rule on hand-made rank summaries."""

import random
import re

import pytest

from gpumagic._atomic import WriteError
from gpumagic.jobs.model import build
from gpumagic.jobs.stragglers import MIN_WAIT_NS, find_stragglers
from gpumagic.jobs.summary import RankSummary, StepCollectives, failed

KERNELS = {"w": frozenset({1, 2, 3}), "a": frozenset({1, 2, 3}), "b": frozenset({4, 5, 6})}


def rank(r, durs, befores, work="w", step_ms=100.0):
    """A rank summary with one StepCollectives per step from ``durs``/``befores`` (ns lists per step)."""
    steps = tuple(StepCollectives(key=f"step {k}", dur_ms=step_ms, names=(0,) * len(d), dur_ns=tuple(d), before_ns=tuple(b))
                  for k, (d, b) in enumerate(zip(durs, befores)))
    return RankSummary(path=f"/job/rank{r}.json", rank=r, rank_source="distributedInfo", device="Test GPU",
                       step_median_ms=step_ms, step_p90_ms=step_ms, gpu_busy_frac=0.5, comm_ms=10.0, comm_exposed_ms=5.0,
                       steps=steps, collective_names=("ncclKernel_AllReduce",), work=work, kernels=KERNELS[work])


def test_jitter_between_two_ranks_is_not_a_straggler():
    rng = random.Random(7)
    ranks = [rank(r, [[1_000_000 + rng.randrange(0, 60_000) for _ in range(40)] for _ in range(5)],
                  [[500_000] * 40 for _ in range(5)]) for r in (0, 1)]
    found, notes = find_stragglers(ranks)
    assert found == [] and notes == []


def test_consistent_late_arrival_is_a_straggler_with_its_loss():
    wait = 300_000  # ns the others wait in each of 10 collectives per step
    fast = [[1_000_000 + wait] * 10 for _ in range(4)]
    ranks = [rank(0, fast, [[200_000] * 10] * 4), rank(1, fast, [[200_000] * 10] * 4),
             rank(2, [[1_000_000] * 10 for _ in range(4)], [[200_000 + wait] * 10] * 4)]
    (s,), _ = find_stragglers(ranks)
    assert (s.rank, s.lost_ms_per_step, s.compute_excess_ms, s.late_share, s.peers) == (2, 3.0, 3.0, 1.0, (0, 1))


def test_waits_below_the_noise_floor_are_ignored():
    ranks = [rank(0, [[1_000_000 + MIN_WAIT_NS - 1] * 10] * 3, [[0] * 10] * 3),
             rank(1, [[1_000_000] * 10] * 3, [[MIN_WAIT_NS] * 10] * 3)]
    assert find_stragglers(ranks) == ([], [])


def test_ranks_without_a_common_step_are_not_compared():
    a = rank(0, [[1_000_000] * 10], [[0] * 10])
    b = rank(1, [[1_000_000] * 9], [[0] * 9])
    found, notes = find_stragglers([a, b])
    assert found == [] and notes == ["ranks 0, 1: no step with the same collectives on every rank, so they could not be aligned"]


def test_pipeline_stages_are_not_stragglers():
    """Stage 1 (other kernels) runs shorter collectives than stage 0 by design: no comparison across stages."""
    stage0 = [rank(r, [[2_000_000] * 8] * 3, [[100_000] * 8] * 3, work="a") for r in (0, 1)]
    stage1 = [rank(r, [[500_000] * 8] * 3, [[1_600_000] * 8] * 3, work="b") for r in (2, 3)]
    job = build(stage0 + stage1)
    assert job.stragglers == [] and [g.ranks for g in job.groups] == [(0, 1), (2, 3)]


@pytest.fixture(scope="module")
def job(straggler_job):
    from gpumagic.jobs import analyze_job

    return analyze_job([*map(str, straggler_job), "/job/missing/rank4.json.gz"], jobs=1, label="nightly")


def test_text(job):
    text = job.to_text(width=100)
    assert text.startswith("gpumagic job: nightly: 4 of 5 ranks analysed (world size 4), median step ")
    lines = text.splitlines()
    lost = job.finding("straggler-rank").finding.evidence.numbers["lost_ms_per_step"]
    assert lines[1] == f"Stragglers: rank 2 \u2014 the job loses {lost:.1f} ms per step (13 % of the median step)"
    assert any(re.match(r"\s+2\*\s+NVIDIA A100", ln) for ln in lines)
    assert "rank 4: /job/missing/rank4.json.gz: no such file" in text
    code = {ln.strip() for f in job.findings for fix in f.finding.fixes for ln in fix.code.splitlines()}
    assert all(len(ln) <= 100 for ln in lines if ln.strip() not in code and "no such file" not in ln)


def test_html_is_self_contained_with_a_per_rank_chart(job):
    page = job.to_html()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count('<div class="gm-rank-chart"') == 1 and page.count('title="rank ') >= 4
    assert "<script" not in page and not re.search(r"""(src|href)=["']?https?:""", page.replace('href="https://pytorch.org', ""))
    assert 'class="gm-straggler"' in page and "no such file" in page


def test_notebook_bundle(job):
    bundle = job._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"] == job.to_text()
    assert bundle["text/html"].startswith('<div class="gpumagic-report gpumagic-static">')
    assert set(job._repr_mimebundle_(include={"text/plain"})) == {"text/plain"}


def test_save_html_writes_whole_and_never_over_a_rank_file(job, tmp_path, straggler_job):
    out = job.save_html(tmp_path / "job.html")
    assert out.read_text(encoding="utf-8") == job.to_html()
    with pytest.raises(WriteError):
        job.save_html(straggler_job[0])


def test_a_large_job_labels_only_stragglers_and_failures():
    ranks = [rank(r, [[1_000_000] * 4] * 3, [[0] * 4] * 3) for r in range(100)] + [failed("/job/rank100.json", "broken")]
    from gpumagic.render.job import rank_chart_svg

    svg = rank_chart_svg(build(ranks))
    assert svg.count('class="gm-rank-label">rank ') == 1 and 'class="gm-rank-label">rank 100<' in svg


@pytest.mark.parametrize(("straggler_busy", "host_side"), [(200_000, True), (500_000, False)])
def test_straggler_wording_host_side_or_gpu_side(straggler_busy, host_side):
    """Issue 31: a straggler whose extra time before the collective is GPU idle time is host-side."""
    from gpumagic.jobs.findings import straggler_finding

    wait = 300_000
    fast = [[1_000_000 + wait] * 10 for _ in range(4)]

    def with_busy(r, durs, befores, busy):
        base = rank(r, durs, befores)
        steps = tuple(StepCollectives(key=s.key, dur_ms=s.dur_ms, names=s.names, dur_ns=s.dur_ns, before_ns=s.before_ns,
                                      busy_before_ns=(busy,) * len(s.before_ns)) for s in base.steps)
        return RankSummary(**{**base.__dict__, "steps": steps})

    ranks = [with_busy(0, fast, [[200_000] * 10] * 4, 200_000), with_busy(1, fast, [[200_000] * 10] * 4, 200_000),
             with_busy(2, [[1_000_000] * 10 for _ in range(4)], [[200_000 + wait] * 10] * 4, straggler_busy)]
    (s,), _ = find_stragglers(ranks)
    assert s.host_side is host_side
    f = straggler_finding([s], 100.0).finding
    assert ("host-side" in f.evidence.summary) is host_side
    assert ("more GPU-side work" in f.evidence.summary) is not host_side


def test_html_follows_the_dark_scheme_and_stacks_the_rank_table_when_narrow(job):
    page = job.to_html()
    assert "@media (prefers-color-scheme:dark)" in page  # the saved page follows the reader's scheme
    assert ".gm-rank-chart{max-width:900px;font-size:12px;color:var(--gm-fg)}" in page  # chart text in the theme
    # each cell says its column, for the stacked (one card per rank) layout under 640 px
    assert page.count('data-label="step med"') == len(job.ranks) and "@container (max-width:640px)" in page


def test_the_job_text_shows_a_finding_s_first_change_before_a_diagnostic():
    """A shared finding's one fix line in the job's text is its first change; a diagnostic snippet
    (``Fix.diagnostic``, such as memory-pressure's "Confirm it") is shown only when there is no
    change, and then labelled as one."""
    from gpumagic.jobs.findings import JobFinding
    from gpumagic.render.job import _finding_text
    from gpumagic.report.model import Evidence, Finding, Fix

    probe = Fix("pytorch", "Confirm it with the allocator's counters", "print(torch.cuda.memory_stats())", diagnostic=True)
    change = Fix("pytorch", "Store less per batch", "batch_size //= 2")
    f = Finding(id="memory-pressure", severity="medium", title="Memory near the limit", why="why",
                evidence=Evidence(summary="peak 95 %", numbers={}, windows=()), est_gain=0.0,
                gain_method="none", fixes=(probe, change), doc_url="")
    text = "\n".join(_finding_text(JobFinding(finding=f, ranks=(0, 1), scope="common", evidence_rank=0), 2, 100))
    assert "Fix: Store less per batch" in text and "Confirm it" not in text
    only = "\n".join(_finding_text(JobFinding(finding=dataclasses_replace(f, fixes=(probe,)), ranks=(0, 1),
                                              scope="common", evidence_rank=0), 2, 100))
    assert "Diagnostic: Confirm it with the allocator's counters" in only


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)
