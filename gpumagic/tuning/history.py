"""The run history: every profiled run, kept in an SQLite database that outlives the kernel.

Where: ``$GPUMAGIC_HOME/history.sqlite3``, or the per-user data folder that ``platformdirs``
names (``~/.local/share/gpumagic`` on Linux, ``~/Library/Application Support/gpumagic`` on
macOS, ``%LOCALAPPDATA%\\gpumagic`` on Windows). ``GPUMAGIC_HOME=""`` turns storage off: runs
are then kept in memory for this process only.

What a run holds: the report (its JSON), the capture options, the time, the kernel's working
folder, the notebook's name when the frontend exposes it, the bundle's path when ``--save`` wrote
one, and a few figures copied out of the report for the table (device, median step, GPU busy,
top finding). Nothing else from the environment.

Names: every run has an id ``r<number>`` (never reused); a label may be given to many runs:
``LABEL`` is its latest run, ``LABEL@N`` its N-th most recent (``LABEL@1`` = ``LABEL``).

Concurrency and safety (SQLite's own guarantees, https://www.sqlite.org/wal.html and
https://www.sqlite.org/lockingv3.html): each operation opens its own connection and writes in one
``BEGIN IMMEDIATE`` transaction, so two kernels (or ranks) writing at once are serialised by
SQLite's lock and lose nothing (``busy_timeout`` waits for the other writer). The journal is WAL
where the file system supports it; SQLite documents that WAL "does not work over a network
filesystem", so on NFS/SMB-style mounts (and wherever SQLite refuses WAL) the classic rollback
journal is used. A file that is not an SQLite database, or that another program or a newer
gpumagic wrote, raises :class:`HistoryError` and is never written to. Schema changes are versioned
migrations (``PRAGMA user_version``). The newest :data:`DEFAULT_KEEP` runs are kept
(``GPUMAGIC_KEEP_RUNS`` or ``HistoryStore(keep=...)`` changes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpumagic.errors import GpumagicError
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Report, report_from_dict
from gpumagic.report.views import Viewable, view
from gpumagic.tuning.home import DB_NAME, HOME_ENV, history_home, kept_files  # noqa: F401  # also this module's

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

#: Environment variable overriding how many runs are kept.
KEEP_ENV = "GPUMAGIC_KEEP_RUNS"
#: Runs kept by default: the newest 1,000 (a report's JSON is 10-100 kB, so ~10-100 MB at most).
DEFAULT_KEEP = 1000
#: The most runs ``GPUMAGIC_KEEP_RUNS`` may ask for (far inside SQLite's 64-bit integers).
MAX_KEEP = 10**9
#: ``PRAGMA application_id`` of a gpumagic history ("GPUm" in ASCII), so that another program's
#: SQLite file is recognised as such and left alone.
APPLICATION_ID = 0x47505564
#: How long a writer waits for another one holding the lock, in ms.
BUSY_TIMEOUT_MS = 30_000
#: File systems on which SQLite's WAL mode is unsafe (shared memory does not work across hosts).
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "cifs", "smb", "smb2", "smbfs", "afs", "9p", "fuse.sshfs",
                                 "ceph", "glusterfs", "fuse.glusterfs", "lustre", "gpfs", "beegfs"})

#: Schema migrations, in order: ``MIGRATIONS[v]`` brings a database from version ``v`` to ``v + 1``.
#: Never edit a released entry; append a new one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        label TEXT NOT NULL DEFAULT '',
        created_ns INTEGER NOT NULL,
        source TEXT NOT NULL DEFAULT '',
        workdir TEXT NOT NULL DEFAULT '',
        notebook TEXT NOT NULL DEFAULT '',
        options TEXT NOT NULL DEFAULT '{}',
        bundle TEXT NOT NULL DEFAULT '',
        device TEXT NOT NULL DEFAULT '',
        median_step_ms REAL,
        gpu_busy_frac REAL,
        top_finding TEXT NOT NULL DEFAULT '',
        report TEXT NOT NULL
    );
    CREATE INDEX runs_by_label ON runs (label, id);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)

_REF = re.compile(r"^r(\d+)$")
_AT = re.compile(r"^(.+)@(\d+)$")
#: Columns of a table row (the report's JSON is read only when asked for).
_ROW_COLUMNS = ("id", "label", "created_ns", "source", "workdir", "notebook", "options", "bundle", "device",
                "median_step_ms", "gpu_busy_frac", "top_finding")
#: The selected columns: the row's, and the step durations read out of the stored report (SQLite's
#: built-in JSON functions, https://www.sqlite.org/json1.html), for the step spread of each run.
_SELECT = ", ".join(_ROW_COLUMNS) + ", json_extract(report, '$.metrics.steps.durations_ms')"


class HistoryError(GpumagicError):
    """The history database cannot be used (corrupt, foreign, newer schema, unwritable)."""


class UnknownRunError(GpumagicError, LookupError):
    """No run answers to that id or label."""


class RunNameError(GpumagicError, ValueError):
    """A run reference or label that cannot be used: empty, ambiguous (``r12`` is both run 12 and
    a label), or a label that cannot be stored (see :mod:`gpumagic.report.labels`)."""


#: SQLite's largest integer: an id or ``@N`` beyond it names no run (and cannot be bound).
_SQL_INT_MAX = 2**63 - 1


def check_ref(ref: object) -> str:
    """``ref`` when it can name runs; :class:`RunNameError` when it is empty or not a string (an
    empty shell variable must never select every unlabelled run)."""
    if not isinstance(ref, str) or not ref.strip():
        raise RunNameError(f"a run is named by a label, LABEL@N or an id like r12, not {ref!r}")
    return ref


@dataclass(frozen=True)
class StoredRun:
    """One row of the history, without its report (see :meth:`HistoryStore.report`)."""

    id: int
    label: str
    created_ns: int
    source: str
    workdir: str
    notebook: str
    options: dict[str, Any]
    bundle: str
    device: str
    median_step_ms: float | None
    gpu_busy_frac: float | None
    top_finding: str
    #: The spread of the run's recorded steps (``count``, ``median_ms``, ``p10_ms``, ``p90_ms``,
    #: ``mad_frac``: see :func:`gpumagic.tuning.stats.spread`), read from its report.
    step_spread: dict[str, Any] | None = None

    @property
    def ref(self) -> str:
        """The run's id as the user types it: ``r12``."""
        return f"r{self.id}"

    @property
    def when(self) -> str:
        """Local time of the run, ``YYYY-MM-DD HH:MM:SS``."""
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created_ns / 1e9))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"ref": self.ref, "when": self.when}


def keep_from_env() -> int:
    """How many runs to keep: ``GPUMAGIC_KEEP_RUNS`` (a whole number from 1 to :data:`MAX_KEEP`) or
    :data:`DEFAULT_KEEP`; a value that cannot be used gives one warning and the default."""
    from gpumagic._env import env_int

    return env_int(KEEP_ENV, DEFAULT_KEEP, minimum=1, maximum=MAX_KEEP, what="runs")


class HistoryStore:
    """The runs in one SQLite file (``path``), or in memory for this process (``path=None``)."""

    def __init__(self, path: str | os.PathLike | None, *, keep: int | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.keep = keep_from_env() if keep is None else keep
        if self.keep < 1:
            raise ValueError(f"keep must be at least 1, not {self.keep}")
        self.journal_mode = "memory" if path is None else ""
        self._memory: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._ready = False

    # -- connections ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection to a database whose schema is current (created or migrated on first use)."""
        if self.path is None:
            with self._lock:
                if self._memory is None:
                    self._memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
                    _migrate(self._memory, "memory")
                yield self._memory
            return
        con = self._open()
        try:
            if not self._ready:
                self.journal_mode = _set_journal_mode(con, self.path)
                _migrate(con, str(self.path))
                self._ready = True
            else:
                _check_schema(con, str(self.path))
            yield con
        except sqlite3.DatabaseError as exc:
            raise _unusable(self.path, exc) from None
        finally:
            con.close()

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            con = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise HistoryError(f"cannot open the run history {self.path}: {exc}") from None
        con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        return con

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    # -- writing -------------------------------------------------------------------------------

    def add(self, report: Report, *, label: str = "", source: str = "", options: dict[str, Any] | None = None,
            workdir: str = "", notebook: str = "", bundle: str | None = None) -> StoredRun:
        """Store ``report`` as a new run (the oldest runs beyond :attr:`keep` are dropped); returns its row."""
        device = _device_name(report.metrics)
        median = None if report.metrics is None else report.metrics.steps.median_ms
        busy = None if report.metrics is None else report.metrics.gpu.busy_frac
        top = report.findings[0].id if report.findings else ""
        values = (label, time.time_ns(), source, workdir, notebook, json.dumps(options or {}, default=str),
                  bundle or "", device, median, busy, top, report.to_json(indent=None))
        with self._write() as con:
            cur = con.execute("INSERT INTO runs (label, created_ns, source, workdir, notebook, options, bundle, device, "
                              "median_step_ms, gpu_busy_frac, top_finding, report) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", values)
            run_id = cur.lastrowid
            con.execute("DELETE FROM runs WHERE id <= (SELECT id FROM runs ORDER BY id DESC LIMIT 1 OFFSET ?)", (self.keep,))
            row = con.execute(f"SELECT {_SELECT} FROM runs WHERE id = ?", (run_id,)).fetchone()
        return _stored(row)

    def remove(self, runs: Sequence[StoredRun]) -> int:
        """Delete these runs; returns how many were there."""
        with self._write() as con:
            return sum(con.execute("DELETE FROM runs WHERE id = ?", (r.id,)).rowcount for r in runs)

    def clear(self) -> int:
        with self._write() as con:
            return con.execute("DELETE FROM runs").rowcount

    # -- reading -------------------------------------------------------------------------------

    def runs(self, label: str | None = None, limit: int | None = None) -> list[StoredRun]:
        """Runs, newest first; only those labelled ``label`` when given; at most ``limit``."""
        where, params = ("WHERE label = ?", [label]) if label is not None else ("", [])
        sql = f"SELECT {_SELECT} FROM runs {where} ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(min(limit, _SQL_INT_MAX))
        with self._connect() as con:
            return [_stored(row) for row in con.execute(sql, params)]

    def labels(self) -> list[str]:
        """The labels in use, in the order they were first given (of the runs still kept)."""
        with self._connect() as con:
            rows = con.execute("SELECT label FROM runs WHERE label != '' GROUP BY label ORDER BY MIN(id)")
            return [r[0] for r in rows]

    def find(self, ref: str) -> StoredRun:
        """The run ``ref`` names: ``r<id>``, ``LABEL`` (latest) or ``LABEL@N`` (N-th most recent).

        :class:`RunNameError` for an empty ``ref``, and for ``r<id>`` when both run ``<id>`` and
        other runs labelled ``r<id>`` exist (a history written before such labels were refused):
        ``r<id>@1`` then names the labelled one."""
        check_ref(ref)
        match = _REF.match(ref)
        with self._connect() as con:
            if match:
                run_id = int(match[1])
                row = None if run_id > _SQL_INT_MAX else con.execute(
                    f"SELECT {_SELECT} FROM runs WHERE id = ?", (run_id,)).fetchone()
                if row is not None:
                    if con.execute("SELECT 1 FROM runs WHERE label = ? AND id != ?", (ref, run_id)).fetchone():
                        raise RunNameError(f"{ref!r} names both run {ref} and the runs labelled {ref!r}; "
                                           f"say {ref + '@1'!r} for the latest labelled one")
                    return _stored(row)
            label, nth = ref, 1
            at = _AT.match(ref)
            if at and int(at[2]) >= 1 and not con.execute("SELECT 1 FROM runs WHERE label = ?", (ref,)).fetchone():
                label, nth = at[1], int(at[2])
            row = None if nth > _SQL_INT_MAX else con.execute(
                f"SELECT {_SELECT} FROM runs WHERE label = ? ORDER BY id DESC LIMIT 1 OFFSET ?",
                (label, nth - 1)).fetchone()
            if row is not None:
                return _stored(row)
            count = con.execute("SELECT COUNT(*) FROM runs WHERE label = ?", (label,)).fetchone()[0]
        raise UnknownRunError(self._unknown(ref, label, nth, count))

    def _unknown(self, ref: str, label: str, nth: int, count: int) -> str:
        if count:
            return f"{label!r} has {count} run(s), so {ref!r} (its run number {nth} from the latest) does not exist"
        known = self.labels()
        listed = ", ".join(repr(k) for k in known[-20:]) if known else "none yet (profile a cell with --label NAME first)"
        return f"no run is labelled {ref!r}; known labels: {listed}"

    def report(self, run: StoredRun) -> Report:
        """The report of a stored run, rebuilt from its JSON (it holds no trace)."""
        with self._connect() as con:
            row = con.execute("SELECT report FROM runs WHERE id = ?", (run.id,)).fetchone()
        if row is None:
            raise UnknownRunError(f"run {run.ref} is no longer in the history")
        return report_from_dict(json.loads(row[0]))

    def export_rows(self) -> Iterator[dict[str, Any]]:
        """Every run with its report as a dict, oldest first."""
        with self._connect() as con:
            rows = con.execute(f"SELECT {_SELECT}, report FROM runs ORDER BY id").fetchall()
        for row in rows:
            yield _stored(row[:-1]).to_dict() | {"report": json.loads(row[-1])}


# -- schema ------------------------------------------------------------------------------------


def _set_journal_mode(con: sqlite3.Connection, path: Path) -> str:
    """WAL on a local file system when SQLite accepts it; the rollback journal otherwise."""
    _check_schema(con, str(path))  # reads the header first: a foreign file is never touched
    if not on_network_filesystem(path):
        with contextlib.suppress(sqlite3.OperationalError):  # e.g. no shared-memory support: keep the default
            mode = con.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode == "wal":
                return "wal"
    return con.execute("PRAGMA journal_mode = DELETE").fetchone()[0]


def _check_schema(con: sqlite3.Connection, where: str) -> int:
    """The database's schema version; HistoryError when it is not ours or newer than this code."""
    try:  # one statement, so one read transaction: another process creating the schema between three
        # separate reads would show its application id missing beside its tables ("not ours")
        app_id, version, tables = con.execute(
            "SELECT (SELECT application_id FROM pragma_application_id()), "
            "(SELECT user_version FROM pragma_user_version()), (SELECT COUNT(*) FROM sqlite_master)").fetchone()
    except sqlite3.DatabaseError as exc:
        raise _unusable(where, exc) from None
    if app_id != APPLICATION_ID and (app_id != 0 or tables or version):
        raise HistoryError(f"{where} is not a gpumagic run history (another program's SQLite database); "
                           f"it was left untouched: point {HOME_ENV} elsewhere")
    if version > SCHEMA_VERSION:
        raise HistoryError(f"the run history {where} was written by a newer gpumagic (schema {version}, this one "
                           f"reads up to {SCHEMA_VERSION}); it was left untouched: upgrade gpumagic or point {HOME_ENV} elsewhere")
    return version


def _migrate(con: sqlite3.Connection, where: str) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION`, one versioned step at a time, each in a transaction."""
    if _check_schema(con, where) == SCHEMA_VERSION:
        return
    con.execute("BEGIN IMMEDIATE")  # another process may be migrating: read the version again under the lock
    try:
        version = _check_schema(con, where)
        for step in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[step].split(";"):
                if statement.strip():
                    con.execute(statement)
        con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _unusable(where: str | Path, exc: sqlite3.DatabaseError) -> HistoryError:
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return HistoryError(f"the run history {where} stayed locked by another process for {BUSY_TIMEOUT_MS // 1000} s")
    if isinstance(exc, sqlite3.OperationalError) and ("readonly" in str(exc) or "unable to open" in str(exc)):
        return HistoryError(f"cannot write the run history {where}: {exc}")
    return HistoryError(f"the run history {where} is unreadable ({exc}); it was left untouched: move it away "
                        f"or point {HOME_ENV} elsewhere")


def on_network_filesystem(path: Path) -> bool:
    """Whether ``path`` lies on a network file system, per ``/proc/mounts`` (False where unknown)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    target = str(path.resolve().parent)
    best, best_type = "", ""
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, best_type = point, parts[2]
    return best_type in NETWORK_FILESYSTEMS


# -- rows and reports ------------------------------------------------------------------------


def _stored(row: Sequence[Any]) -> StoredRun:
    from gpumagic.tuning.stats import spread

    values = dict(zip(_ROW_COLUMNS, row))
    values["options"] = json.loads(values["options"] or "{}")
    steps = row[len(_ROW_COLUMNS)] if len(row) > len(_ROW_COLUMNS) else None
    try:
        durations = json.loads(steps) if isinstance(steps, str) else None
    except ValueError:  # a report written by another version: no spread rather than no row
        durations = None
    if isinstance(durations, list) and all(isinstance(d, (int, float)) for d in durations):
        values["step_spread"] = spread(durations)
    return StoredRun(**values)


def _device_name(metrics: Metrics | None) -> str:
    if metrics is None:
        return "CPU only"
    devices = metrics.trace.devices
    primary = metrics.gpu.primary_device
    names = [d.name for d in devices if primary is None or d.id == primary]
    return (names or [d.name for d in devices] or ["CPU only"])[0] or "GPU"


# -- the history as a displayable table -------------------------------------------------------


@dataclass
class History(Viewable):
    """The runs of the history, oldest first: a table with a chart of median step time and GPU busy.

    In a notebook it displays itself; ``to_text()``, ``to_html()`` and ``figure()`` (a matplotlib
    Figure) give the same views elsewhere. ``runs`` are :class:`StoredRun` rows.
    """

    runs: list[StoredRun]
    where: str = ""

    _view_kind: ClassVar[str] = "history"

    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "runs": [r.to_dict() for r in self.runs]}

    def figure(self, theme: str = "light") -> Figure | None:
        """Median step time (and GPU busy) over the runs, for ``theme`` (``'light'`` or
        ``'dark'``); None when no run has steps."""
        return view("history", "figure")(self, theme)

    def __len__(self) -> int:
        return len(self.runs)

    def __repr__(self) -> str:
        return f"<gpumagic History: {len(self.runs)} run(s) in {self.where or 'memory'}>"
