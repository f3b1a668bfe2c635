"""DataLoader workers that end with their epoch count as this process tree's CPU, not other
processes': the sampler reads the parent's time of exited children (``reaped``)."""

from __future__ import annotations

import pytest

from gpumagic.capture.cpu import CpuTimes, ProcReader, cpu_row


def test_a_new_worker_counts_whole_and_an_exited_one_through_its_parent():
    """Worker 7 lives through the interval (10 → 30 ticks), worker 8 starts in it (15 ticks),
    worker 9 ends in it: seen at 40 ticks, it exited at 100, which the parent's children time
    gained whole; 60 of them fall in this interval."""
    before = CpuTimes(cores=[(0, 0)], main_ticks=0, worker_ticks={7: 10, 9: 40}, children_ticks=5)
    after = CpuTimes(cores=[(200, 200)], main_ticks=50, worker_ticks={7: 30, 8: 15}, children_ticks=105)
    row = cpu_row(before, after, dt_s=1.0, hz=100, t_epoch_ns=1)
    assert row["workers"] == pytest.approx(35.0) and row["reaped"] == pytest.approx(60.0)
    assert row["worker_count"] == 2


def test_without_the_childrens_time_there_is_no_reaped_column():
    row = cpu_row(CpuTimes([(0, 0)], 0), CpuTimes([(1, 1)], 0), 1.0, 100, 1)
    assert "reaped" not in row


def test_the_reader_takes_cutime_and_cstime(tmp_path):
    (tmp_path / "stat").write_text("cpu  1 2 3 4 5 6 7 8\ncpu0 1 2 3 4 5 6 7 8\n")
    me = tmp_path / "42"
    (me / "task" / "42").mkdir(parents=True)
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime ...
    line = "42 (python main) S 1 42 42 0 -1 0 10 0 0 0 70 30 400 25 20 0 9 0 100 0 0\n"
    (me / "stat").write_text(line)
    (me / "task" / "42" / "stat").write_text(line)
    t = ProcReader(root=tmp_path, pid=42).read()
    assert t.main_ticks == 100 and t.children_ticks == 425


def test_a_capture_counts_the_workers_of_ended_epochs_as_its_own():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    import gpumagic

    class Busy(Dataset):
        """Each sample burns CPU in the worker: well over a clock tick per worker and epoch."""

        def __len__(self):
            return 4

        def __getitem__(self, i):
            x = torch.randn(128, 128)
            for _ in range(60):
                x = torch.tanh(x @ x / 128)
            return x[0]

    model = torch.nn.Linear(128, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Busy(), batch_size=2, num_workers=1)
    with gpumagic.profile(steps=5) as run:
        for _ in range(4):
            for x in loader:
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
    cpu = run.trace.samples.cpu
    assert "reaped" in cpu and float(cpu["reaped"].sum()) > 0
