import os
import shutil
import sys
import tempfile

import pytest

HERE = os.path.dirname(__file__)
DATA = os.path.join(HERE, "data")
sys.path.insert(0, HERE)


@pytest.fixture(scope="session")
def data_dir() -> str:
    return DATA


def pytest_configure(config):
    """A temporary run history for the whole session, set before any fixture runs: module- and
    session-scoped fixtures (a kernel started once per module) start before the per-test
    ``gpumagic_home`` below and must not see the real home folder either."""
    home = tempfile.mkdtemp(prefix="gpumagic-home-session-")
    config._gpumagic_home = (home, os.environ.get("GPUMAGIC_HOME"))
    os.environ["GPUMAGIC_HOME"] = home
    # Text reports take the terminal's width: the same 100 columns for every test, whatever
    # terminal runs pytest (tests of the width set COLUMNS themselves).
    os.environ["COLUMNS"] = "100"


def pytest_unconfigure(config):
    home, before = getattr(config, "_gpumagic_home", (None, None))
    if home is None:
        return
    shutil.rmtree(home, ignore_errors=True)
    if before is None:
        os.environ.pop("GPUMAGIC_HOME", None)
    else:
        os.environ["GPUMAGIC_HOME"] = before


@pytest.fixture(autouse=True)
def gpumagic_home(tmp_path_factory):
    """Every test gets its own empty run history: nothing is ever written to the real home folder.

    Processes the tests start (kernels, the CLI) inherit the variable. (Not through the
    ``monkeypatch`` fixture: that would make a test's own monkeypatch undo later than the
    leftover checks of tests/capture/conftest.py expect.)"""
    home = tmp_path_factory.mktemp("gpumagic-home")
    before = os.environ.get("GPUMAGIC_HOME")
    os.environ["GPUMAGIC_HOME"] = str(home)
    yield home
    if before is None:
        os.environ.pop("GPUMAGIC_HOME", None)
    else:
        os.environ["GPUMAGIC_HOME"] = before
