"""Where the run history lives (:mod:`gpumagic.tuning.history`), without opening it: every
output a command writes checks it against :func:`kept_files`, and this module imports nothing
heavy (no sqlite3, no report model), so that ``gpumagic analyze`` does not pay for the store."""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable naming the folder that holds the history ("" turns storage off).
HOME_ENV = "GPUMAGIC_HOME"
DB_NAME = "history.sqlite3"


def history_home() -> Path | None:
    """The folder holding the history, or None when storage is off (``GPUMAGIC_HOME=""``)."""
    value = os.environ.get(HOME_ENV)
    if value is not None:
        return Path(value).expanduser() if value.strip() else None
    import platformdirs

    return Path(platformdirs.user_data_dir("gpumagic", appauthor=False))


def kept_files() -> list[str]:
    """What no output may replace, whatever it read: the history database, when storage is on
    (:mod:`gpumagic._atomic` protects its ``-wal``/``-shm``/``-journal`` side files with it)."""
    home = history_home()
    return [] if home is None else [str(home / DB_NAME)]
