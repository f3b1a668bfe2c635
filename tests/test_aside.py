"""The critical path computed in a forked child while the analysis computes the rest
(gpumagic.analysis.aside): the same report as in one process, and no child left behind."""

from __future__ import annotations

import os

import pytest
from processes import children
from tracebuilder import DATA

from gpumagic import _forked
from gpumagic.analysis import analyze, aside
from gpumagic.analysis import metrics as metrics_mod
from gpumagic.analysis.context import build_context
from gpumagic.trace import load

# a cold start (the steady-state rules judge a sub-window: a second child for its context), a
# graph capture, a plain training window
TRACES = ["volta_resnet50_coldstart_nw4.json.gz", "mi300_vllm_decode_fullgraph_capture.json.gz",
          "resnet50_v100_workers0.json.gz"]


@pytest.fixture
def forks(monkeypatch):
    """Every trace counts as large (MIN_EVENTS 0); records each child started and checks that none
    is left running or unreaped afterwards."""
    before = children()
    started: list[_forked.Child] = []
    real = _forked.start

    def counted(work):
        child = real(work)
        started.append(child)
        return child

    monkeypatch.setattr(aside, "MIN_EVENTS", 0)
    monkeypatch.setattr(_forked, "start", counted)
    yield started
    assert children() <= before


@pytest.mark.parametrize("name", TRACES)
def test_a_child_computing_the_critical_path_gives_the_same_report(name, forks):
    trace = load(os.path.join(DATA, name))
    one = analyze(trace).to_dict()
    two = analyze(trace, workers=2).to_dict()
    assert forks, "no child was started"
    assert two == one
    assert two["metrics"]["critical_path"] == one["metrics"]["critical_path"]


def test_the_child_computes_the_costly_metrics_and_not_the_breakdown(forks, monkeypatch):
    """The parent never computes what the child does (the report is still whole), and the child,
    forked before the step-time breakdown, never computes it: it reads one category's union."""
    trace = load(os.path.join(DATA, "resnet50_v100_workers0.json.gz"))
    one = analyze(trace).to_dict()
    parent = os.getpid()

    def not_here(ctx):
        assert os.getpid() != parent, "computed in the parent although the child did"
        return None

    for key in ("_critical_path", "_operators"):  # the parent's fallbacks (aside.take)
        monkeypatch.setattr(metrics_mod, key, not_here)
    assert set(metrics_mod.ASIDE) == {"critical_path", "operators"}
    assert analyze(trace, workers=2).to_dict() == one
    ctx = build_context(trace)
    assert "breakdown" not in ctx.cache
    probe = {**metrics_mod.ASIDE, "probe": lambda c: ("breakdown" in c.cache, c.cat_union.computed)}
    assert aside.start(ctx, probe, workers=2)
    assert aside.take(ctx, "probe", not_here) == (False, ["dataloader"])


def test_the_cold_start_forks_a_second_child_for_its_steady_part(forks):
    report = analyze(load(os.path.join(DATA, "volta_resnet50_coldstart_nw4.json.gz")), workers=2)
    assert any("judged its steady part only" in n for n in report.notes)  # a sub-window was judged
    assert len(forks) == 2


def test_a_child_that_dies_costs_time_not_the_answer(forks, monkeypatch):
    trace = load(os.path.join(DATA, "resnet50_v100_workers0.json.gz"))
    one = analyze(trace).to_dict()
    parent = os.getpid()
    real = metrics_mod.ASIDE["critical_path"]

    def dying(ctx):
        if os.getpid() != parent:
            os._exit(9)  # as if killed (out of memory) before it wrote its result
        return real(ctx)

    monkeypatch.setitem(metrics_mod.ASIDE, "critical_path", dying)
    assert analyze(trace, workers=2).to_dict() == one
    assert forks


def test_no_process_to_spare_computes_everything_here(monkeypatch):
    monkeypatch.setattr(aside, "MIN_EVENTS", 0)

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(_forked, "fork_quietly", no_fork)
    before = set(os.listdir("/proc/self/fd"))
    trace = load(os.path.join(DATA, "resnet50_v100_workers0.json.gz"))
    assert analyze(trace, workers=2).to_dict() == analyze(trace).to_dict()
    assert set(os.listdir("/proc/self/fd")) == before  # no result file left open


def test_an_error_in_the_analysis_stops_the_child(forks, monkeypatch):
    def broken(ctx):
        raise RuntimeError("a bug in a metric")

    monkeypatch.setattr(metrics_mod, "_kernels", broken)
    with pytest.raises(RuntimeError, match="a bug in a metric"):
        analyze(load(os.path.join(DATA, "resnet50_v100_workers0.json.gz")), workers=2)
    assert forks  # started, then stopped and reaped (the fixture checks)


def test_small_traces_one_worker_and_values_not_asked_for_fork_nothing(forks):
    trace = load(os.path.join(DATA, "event_sync_multistream.json.gz"))
    analyze(trace)  # workers=1, the default (a notebook kernel's)
    assert not forks
    ctx = build_context(trace)
    assert aside.start(ctx, {"x": lambda c: 41 + 1}, workers=2)
    assert not aside.start(ctx, {"y": lambda c: 0}, workers=2)  # one child per context at a time
    assert aside.take(ctx, "other", lambda c: "here") == "here"  # the child does not compute it: no wait
    assert len(forks) == 1 and aside._CHILD in ctx.cache
    assert aside.take(ctx, "x", lambda c: pytest.fail("computed here although the child did")) == 42
    assert aside._CHILD not in ctx.cache


def test_a_trace_below_the_threshold_is_analysed_in_one_process(monkeypatch):
    started = []
    monkeypatch.setattr(_forked, "start", lambda work: started.append(work))
    trace = load(os.path.join(DATA, "event_sync_multistream.json.gz"))
    assert len(trace.events) < aside.MIN_EVENTS
    analyze(trace, workers=8)
    assert not started


def test_workers_also_decode_a_file_in_pieces(monkeypatch, forks):
    """``analyze(path, workers=2)`` loads the file as the command line does: in pieces, side by side."""
    from gpumagic.trace import pieces

    monkeypatch.setattr(pieces, "MIN_PIECE_BYTES", 1)
    monkeypatch.setattr(pieces, "PIECE_BYTES", 1 << 20)
    calls = []
    real = pieces.decode_in_pieces

    def counted(raw, workers, *args, **kwargs):
        out = real(raw, workers, *args, **kwargs)
        calls.append((workers, out is not None))
        return out

    monkeypatch.setattr(pieces, "decode_in_pieces", counted)
    path = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
    assert analyze(path, workers=2).to_dict() == analyze(load(path)).to_dict()
    assert calls == [(2, True)]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_workers_must_be_a_whole_number_of_at_least_one(bad):
    with pytest.raises(ValueError, match="workers must be a whole number >= 1"):
        analyze(os.path.join(DATA, "event_sync_multistream.json.gz"), workers=bad)
