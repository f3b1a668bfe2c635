"""``%gputune``: a thin shell over tune_dataloader."""

from __future__ import annotations

import pytest
from datasets_for_tuner import Sleepy
from ipyshell import ipython_shell

from gpumagic.capture.dataloader import TuneResult

IPython = pytest.importorskip("IPython")


@pytest.fixture(scope="module")
def shell():
    with ipython_shell("gpumagic.shells.tune_magic") as ip:
        yield ip


def test_gputune_measures_and_stores_the_result(shell):
    shell.user_ns["ds"] = Sleepy(n=40, item_s=0)
    shell.run_line_magic("gputune", "ds --workers 0,1 --pin-memory off --batch-size 4 --seconds 0.2 -o tuned --quiet")
    result = shell.user_ns["tuned"]
    assert isinstance(result, TuneResult)
    assert [r.config.num_workers for r in result.rows] == [0, 1]
    assert result.batch_size == 4


def test_gputune_rounds_interleave_the_settings(shell, monkeypatch):
    """``--rounds N`` reaches the tuner's interleaved rounds: every setting is measured once per round."""
    from gpumagic.capture import dataloader

    order = []
    measure = dataloader._measure

    def spy(base, config, *a, **kw):
        order.append(config.num_workers)
        return measure(base, config, *a, **kw)

    monkeypatch.setattr(dataloader, "_measure", spy)
    shell.user_ns["ds"] = Sleepy(n=40, item_s=0)
    shell.run_line_magic("gputune", "ds --workers 0,1 --pin-memory off --batch-size 4 --seconds 0.3 --rounds 3 "
                                    "-o tuned --quiet")
    assert order == [0, 1, 0, 1, 0, 1]  # ABAB, not AABB
    assert shell.user_ns["tuned"].rows[0].batches > 0


@pytest.mark.parametrize("line, message", [
    ("missing_name", "cannot evaluate 'missing_name': NameError"),
    ("ds --workers a,b", "--workers takes comma-separated integers"),
    ("ds --seconds 0", "max_seconds_per_config must be a positive number"),
    ("ds --rounds 0", "rounds must be an integer >= 1"),
    ("42", "takes a Dataset or a DataLoader"),
])
def test_gputune_usage_errors(shell, line, message):
    from IPython.core.error import UsageError

    shell.user_ns["ds"] = Sleepy(n=8, item_s=0)
    with pytest.raises(UsageError, match=message):
        shell.run_line_magic("gputune", line)
