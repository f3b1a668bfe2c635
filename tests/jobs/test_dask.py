"""The Dask path: the same job from a ``distributed.LocalCluster``'s workers, files or fsspec URLs."""

import pytest

from gpumagic.jobs import analyze_job

distributed = pytest.importorskip("distributed")
fsspec = pytest.importorskip("fsspec")


@pytest.fixture(scope="module")
def client():
    """A small in-process cluster (threads, no extra processes: kind to a 2-core CI runner)."""
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as c:
        yield c


def test_dask_gives_the_same_job_as_the_local_pool(client, straggler_job):
    seen = []
    on_cluster = analyze_job(straggler_job, client=client, progress=lambda done, total: seen.append(done))
    local = analyze_job(straggler_job, jobs=1)
    assert on_cluster.stragglers == local.stragglers == [2]
    assert on_cluster.to_dict() == local.to_dict()
    assert sorted(seen) == [1, 2, 3, 4]


def test_workers_read_fsspec_urls_and_report_a_missing_one(client, clean_job):
    """memory:// is an fsspec file system the in-process workers share with this test."""
    urls = []
    for p in clean_job:
        url = f"memory://job/{p.name}"
        with fsspec.open(url, "wb") as fh:
            fh.write(p.read_bytes())
        urls.append(url)
    job = analyze_job([*urls, "memory://job/rank3.json.gz"], client=client)
    assert [r.rank for r in job.analysed] == [0, 1, 2]
    assert [(r.rank, r.path) for r in job.errors] == [(3, "memory://job/rank3.json.gz")]
    assert "cannot read" in job.errors[0].error
    assert job.to_dict()["job"]["ranks"][0]["path"] == "memory://job/rank0.json.gz"


def test_a_rank_that_fails_on_a_worker_is_reported_and_the_rest_go_on(client, clean_job, monkeypatch):
    from gpumagic.jobs import executors

    real = executors.summarize

    def flaky(path):
        if path.endswith("rank2.json.gz"):
            raise RuntimeError("worker lost its disk")
        return real(path)

    monkeypatch.setattr(executors, "summarize", flaky)
    job = analyze_job(clean_job, client=client)
    assert [r.rank for r in job.analysed] == [0, 1]
    assert job.errors[0].rank == 2 and job.errors[0].error.endswith("its analysis failed (RuntimeError: worker lost its disk)")
