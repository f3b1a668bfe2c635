"""The run history (gpumagic.tuning.history): names, keeping, storage off, concurrency, bad databases."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from recorded import analysed
from tracebuilder import DATA

from gpumagic.tuning import history, runs
from gpumagic.tuning.history import HistoryError, HistoryStore, UnknownRunError

W0 = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
W4 = os.path.join(DATA, "resnet50_v100_workers4.json.gz")


@pytest.fixture(scope="module")
def reports():
    return analysed(W0), analysed(W4)


def test_runs_are_kept_by_label_number_and_id(tmp_path, reports):
    store = HistoryStore(tmp_path / "h.sqlite3")
    a = store.add(reports[0], label="before", options={"steps": 5}, workdir="/w", notebook="nb.ipynb")
    b = store.add(reports[1], label="before")
    c = store.add(reports[1])
    assert (a.ref, b.ref, c.ref) == ("r1", "r2", "r3")
    assert store.find("before").id == 2 and store.find("before@1").id == 2 and store.find("before@2").id == 1
    assert store.find("r3").label == "" and store.labels() == ["before"]
    assert (a.device, a.median_step_ms, a.gpu_busy_frac, a.top_finding) == ("Tesla V100-DGXS-32GB", 176.761, 0.5664,
                                                                             "dataloader-bound")
    assert (a.options, a.workdir, a.notebook) == ({"steps": 5}, "/w", "nb.ipynb")
    with pytest.raises(UnknownRunError, match=r"'before' has 2 run\(s\), so 'before@3'"):
        store.find("before@3")
    with pytest.raises(UnknownRunError, match="no run is labelled 'after'; known labels: 'before'"):
        store.find("after")


def test_a_stored_report_comes_back_equal(tmp_path, reports):
    store = HistoryStore(tmp_path / "h.sqlite3")
    row = store.add(reports[0], label="x")
    back = store.report(row)
    assert back.to_dict() == reports[0].to_dict() and back.trace is None
    assert back.findings[0].evidence.windows == reports[0].findings[0].evidence.windows


def test_a_label_with_an_at_sign_is_still_found_whole(tmp_path, reports):
    store = HistoryStore(tmp_path / "h.sqlite3")
    store.add(reports[0], label="lr@3")
    assert store.find("lr@3").label == "lr@3"


def test_only_the_newest_runs_are_kept_and_ids_are_never_reused(tmp_path, reports):
    store = HistoryStore(tmp_path / "h.sqlite3", keep=3)
    for i in range(5):
        store.add(reports[i % 2], label=f"run{i}")
    assert [r.ref for r in store.runs()] == ["r5", "r4", "r3"]
    store.clear()
    assert store.add(reports[0]).ref == "r6"


def test_keep_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(history.KEEP_ENV, "7")
    assert HistoryStore(tmp_path / "h.sqlite3").keep == 7
    monkeypatch.setenv(history.KEEP_ENV, "lots")
    with pytest.warns(RuntimeWarning, match="GPUMAGIC_KEEP_RUNS='lots' is not a whole number of runs"):
        assert HistoryStore(tmp_path / "h.sqlite3").keep == history.DEFAULT_KEEP


def test_the_default_home_is_the_per_user_data_folder(monkeypatch):
    import platformdirs

    monkeypatch.delenv(history.HOME_ENV, raising=False)
    assert history.history_home() == __import__("pathlib").Path(platformdirs.user_data_dir("gpumagic", appauthor=False))
    monkeypatch.setenv(history.HOME_ENV, "~/elsewhere")
    assert str(history.history_home()) == os.path.expanduser("~/elsewhere")


def test_an_empty_gpumagic_home_turns_storage_off(monkeypatch, tmp_path, reports):
    monkeypatch.setenv(history.HOME_ENV, "")
    monkeypatch.chdir(tmp_path)
    row = runs.record(reports[0], label="mem")
    assert runs.store().path is None and runs.get(row.ref) is reports[0]
    assert runs.labels() == ["mem"]
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere we can see
    runs.forget()


def test_the_suite_writes_to_a_temporary_home(gpumagic_home, reports):
    runs.record(reports[0])
    assert runs.store().path == gpumagic_home / history.DB_NAME
    assert (gpumagic_home / history.DB_NAME).is_file()
    assert os.environ[history.HOME_ENV] == str(gpumagic_home)


def test_wal_on_a_local_disk_and_the_rollback_journal_on_a_network_one(tmp_path, monkeypatch, reports):
    local = HistoryStore(tmp_path / "local.sqlite3")
    local.add(reports[0])
    assert local.journal_mode == "wal"
    monkeypatch.setattr(history, "on_network_filesystem", lambda path: True)
    remote = HistoryStore(tmp_path / "remote.sqlite3")
    remote.add(reports[0])
    assert remote.journal_mode == "delete"
    assert sqlite3.connect(tmp_path / "remote.sqlite3").execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_network_filesystems_are_read_from_proc_mounts(tmp_path, monkeypatch):
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\nserver:/home {tmp_path} nfs4 rw 0 0\n")
    real = history.Path

    class FakePath(type(real())):
        def read_text(self, *a, **k):
            return mounts.read_text() if str(self) == "/proc/mounts" else super().read_text(*a, **k)

    monkeypatch.setattr(history, "Path", FakePath)
    assert history.on_network_filesystem(real(tmp_path) / "sub" / "h.sqlite3")
    assert not history.on_network_filesystem(real("/var/h.sqlite3"))


WRITER = textwrap.dedent("""
    import sys
    import gpumagic
    from gpumagic.tuning.history import HistoryStore
    store = HistoryStore(sys.argv[1])
    report = gpumagic.analyze(sys.argv[2])
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    for i in range(int(sys.argv[3])):
        store.add(report, label=sys.argv[4], options={"i": i})
""")


@pytest.mark.parametrize("network", [False, True], ids=["wal", "rollback-journal"])
def test_two_processes_writing_at_once_lose_nothing(tmp_path, network):
    path = tmp_path / "h.sqlite3"
    env = dict(os.environ)
    # network: the writers take the file system for a network one and use the rollback journal
    code = WRITER if not network else WRITER.replace(
        "from gpumagic.tuning.history import HistoryStore",
        "from gpumagic.tuning import history\nhistory.on_network_filesystem = lambda p: True\n"
        "from gpumagic.tuning.history import HistoryStore")
    n = 40
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), W0, str(n), name], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for name in ("a", "b")]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        p.stdin.close()
        assert p.wait(timeout=120) == 0
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == ("delete" if network else "wal")
    rows = HistoryStore(path).runs()
    assert len(rows) == 2 * n and len({r.id for r in rows}) == 2 * n
    for name in ("a", "b"):
        assert sorted(r.options["i"] for r in rows if r.label == name) == list(range(n))


def test_a_corrupt_database_is_a_clear_error_and_is_left_untouched(tmp_path, reports):
    path = tmp_path / "h.sqlite3"
    garbage = b"this is not a database\n" * 400
    path.write_bytes(garbage)
    store = HistoryStore(path)
    with pytest.raises(HistoryError, match=r"is unreadable \(file is not a database\); it was left untouched"):
        store.add(reports[0])
    with pytest.raises(HistoryError):
        store.runs()
    assert path.read_bytes() == garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.sqlite3"]  # no journal, no WAL file


def test_a_database_with_a_truncated_page_is_refused_too(tmp_path, reports):
    path = tmp_path / "h.sqlite3"
    HistoryStore(path).add(reports[0], label="x")
    data = path.read_bytes()
    # keep the header, scribble over the rest (what a crash of a careless copier leaves)
    broken = data[:100] + b"\xff" * (len(data) - 100)
    path.write_bytes(broken)
    for f in tmp_path.glob("h.sqlite3-*"):
        f.unlink()
    with pytest.raises(HistoryError, match="unreadable"):
        HistoryStore(path).find("x")
    assert path.read_bytes() == broken


def test_a_newer_schema_is_refused_and_left_untouched(tmp_path, reports):
    path = tmp_path / "h.sqlite3"
    HistoryStore(path).add(reports[0], label="x")
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {history.SCHEMA_VERSION + 1}")
    con.close()
    before = path.read_bytes()
    with pytest.raises(HistoryError, match=rf"written by a newer gpumagic \(schema {history.SCHEMA_VERSION + 1}, this one "
                                           rf"reads up to {history.SCHEMA_VERSION}\); it was left untouched"):
        HistoryStore(path).add(reports[0])
    assert path.read_bytes() == before


def test_another_programs_database_is_refused(tmp_path, reports):
    path = tmp_path / "other.sqlite3"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (text TEXT)")
    con.commit()
    con.close()
    with pytest.raises(HistoryError, match="is not a gpumagic run history"):
        HistoryStore(path).runs()
    assert sqlite3.connect(path).execute("SELECT name FROM sqlite_master").fetchall() == [("notes",)]


def test_migrations_run_in_order_from_an_older_schema(tmp_path, monkeypatch, reports):
    path = tmp_path / "h.sqlite3"
    HistoryStore(path).add(reports[0], label="old")  # schema 1
    v2 = "ALTER TABLE runs ADD COLUMN note TEXT NOT NULL DEFAULT ''"
    monkeypatch.setattr(history, "MIGRATIONS", (*history.MIGRATIONS, v2))
    monkeypatch.setattr(history, "SCHEMA_VERSION", history.SCHEMA_VERSION + 1)
    store = HistoryStore(path)
    assert store.find("old").label == "old"  # the old run survives the migration
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 2
    assert "note" in [c[1] for c in con.execute("PRAGMA table_info(runs)")]


def test_export_rows_carry_the_report(tmp_path, reports):
    store = HistoryStore(tmp_path / "h.sqlite3")
    store.add(reports[0], label="a")
    (row,) = list(store.export_rows())
    assert row["ref"] == "r1" and row["label"] == "a" and row["report"]["findings"][0]["id"] == "dataloader-bound"
    json.dumps(row)


def test_a_schema_created_by_another_process_while_we_read_it_is_never_taken_for_a_foreign_file(tmp_path):
    """The check reads the application id, the schema version and the tables in one statement (one
    read transaction). Three separate reads, with another process creating the schema between the
    first and the others, saw no application id beside a schema version, and called the run
    history "another program's SQLite database" (a two-kernel race, seen in CI)."""
    import sqlite3

    from gpumagic.tuning import history

    path = tmp_path / "h.sqlite3"
    sqlite3.connect(path).close()  # an empty database: what the first of two writers finds

    class OtherProcessInBetween:
        """A connection whose first statement, once read, is followed by another connection
        creating the schema (the other writer's migration landing right then)."""

        def __init__(self, con):
            self.con, self.calls = con, 0

        def execute(self, sql, *args):
            cursor, owner = self.con.execute(sql, *args), self
            owner.calls += 1

            class Read:
                def fetchone(self):
                    row = cursor.fetchone()
                    if owner.calls == 1:
                        other = sqlite3.connect(path, isolation_level=None)
                        history._migrate(other, str(path))
                        other.close()
                    return row

            return Read()

    con = sqlite3.connect(path, isolation_level=None)
    try:
        assert history._check_schema(OtherProcessInBetween(con), str(path)) in (0, history.SCHEMA_VERSION)
        assert history._check_schema(con, str(path)) == history.SCHEMA_VERSION  # and ours from now on
    finally:
        con.close()
