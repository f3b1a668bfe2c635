"""The local pool starts the largest rank files first and still returns the ranks in path order."""

import multiprocessing
import os
import sys

import pytest

from gpumagic.jobs import executors


def test_largest_first_orders_by_file_size_and_keeps_urls_and_missing_files_last(tmp_path):
    sizes = {"a.json": 10, "b.json": 300, "c.json": 20, "d.json": 300}
    for name, n in sizes.items():
        (tmp_path / name).write_bytes(b"x" * n)
    paths = [str(tmp_path / n) for n in sizes] + ["s3://bucket/rank9.json.gz", str(tmp_path / "gone.json")]
    assert executors.largest_first(paths, list(range(len(paths)))) == [1, 3, 2, 0, 4, 5]
    assert executors.largest_first(paths, [0, 2, 5]) == [2, 0, 5]


def test_two_processes_return_the_ranks_in_path_order(clean_job, tmp_path):
    paths = [str(p) for p in clean_job] + [str(tmp_path / "rank7.json.gz")]  # a missing file: size 0, started last
    small_first = sorted(paths[:-1], key=os.path.getsize) + paths[-1:]
    seen = []
    out = executors.run_local(small_first, 2, progress=lambda done, total: seen.append((done, total)))
    assert [s.path for s in out] == small_first
    assert [s.ok for s in out] == [True, True, True, False]
    assert out == executors.run_local(small_first, 1)
    assert seen == [(i, 4) for i in range(1, 5)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_pool_worker_keeps_freed_heap_where_glibc_allows_it():
    import platform

    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:  # in a child: this test process's allocator is left as it is
        taken = pool.apply(executors._keep_freed_memory)
    assert taken is (platform.libc_ver()[0] == "glibc")
