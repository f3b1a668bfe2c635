import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.abspath(HERE))
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
    # Hypothesis keeps its example database and constants in ./.hypothesis: in the checkout. A
    # temporary folder instead (the fuzz tests are seeded by their profiles, not by a database).
    try:
        from hypothesis import configuration

        configuration.set_hypothesis_home_dir(os.path.join(home, "hypothesis"))
    except ImportError:
        pass
    # pytest-xdist's workers start with SIGINT ignored, and children inherit that: the Ctrl-C
    # tests (a real SIGINT to this process or to a child) need Python's default handler.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Text reports take the terminal's width: the same 100 columns for every test, whatever
    # terminal runs pytest (tests of the width set COLUMNS themselves).
    os.environ["COLUMNS"] = "100"
    # A rule that raises costs only its finding in a user's report (a note says so); in the tests
    # it must fail the test (gpumagic.analysis._judge).
    os.environ["GPUMAGIC_STRICT_RULES"] = "1"


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


# ---- the tests write nothing into the checkout ------------------------------------------------

def git_status(root: str = ROOT) -> set[str] | None:
    """``git status --porcelain`` lines of the checkout (untracked and ignored files included), or
    None when ``root`` is not a git checkout or git is missing."""
    try:
        out = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=all", "--ignored"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    # Python's own caches and an installed package's metadata are not outputs of the tests.
    return {line for line in out.stdout.splitlines()
            if not any(part in line for part in ("__pycache__", ".egg-info", ".pyc", ".ruff_cache", ".mypy_cache"))}


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the main process only (pytest-xdist workers share it)
        session.config._git_status_before = git_status()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_git_status_before", None)
    if before is None:  # not a git checkout, or a pytest-xdist worker: nothing to compare
        return
    after = git_status()
    new = sorted((after or set()) - before)
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("")
            reporter.write_line("FAILED: the tests changed the checkout (git status --porcelain):", red=True)
            for line in new:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
