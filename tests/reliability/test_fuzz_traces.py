"""A fuzzer over real fixtures: whatever a trace file holds, loading and analysing it gives a
report or one :class:`TraceError` line, never another exception and never a warning; and
decoding in pieces gives the same trace as decoding at once.

In-process through the same entry point as ``gpumagic analyze`` (``from_bytes`` then
``analyze``); a sample of the same mutations runs as real subprocesses under ``prlimit`` in
test_subprocess_sample. Profiles: see conftest.py (``GPUMAGIC_FUZZ=fuzz-long`` for a long run).
"""

import os
import warnings
from contextlib import contextmanager

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_mutations import FIXTURES, damage, fixture, mutate_fields, structural, to_bytes

from gpumagic.analysis import analyze
from gpumagic.errors import TraceError
from gpumagic.trace import pieces
from gpumagic.trace.kineto import from_bytes

PROFILE = settings.get_profile(os.environ.get("GPUMAGIC_FUZZ", "fuzz-ci"))


def build(rng) -> bytes:
    d = fixture(rng.choice(FIXTURES))
    mutate_fields(d, rng, rng.randrange(1, 12))
    raw = structural(d, rng) if rng.random() < 0.2 else to_bytes(d)
    return damage(raw, rng) if rng.random() < 0.4 else raw


def load_and_analyse(raw: bytes, workers: int = 1):
    """The report, or None after a one-line TraceError; anything else (a warning included) fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            trace = from_bytes(raw, "fuzzed.json", workers=workers)
        except TraceError as exc:
            assert "\n" not in str(exc) and str(exc).startswith("fuzzed.json: "), str(exc)
            return None
        return trace, analyze(trace)


@settings(PROFILE)
@given(rng=st.randoms(use_true_random=False))
def test_any_mutation_gives_a_report_or_one_line(rng):
    result = load_and_analyse(build(rng))
    if result is not None:
        trace, report = result
        assert report.metrics["trace"]["events"] >= 0
        assert (trace.events.dur_ns >= 0).all()


@contextmanager
def small_pieces(size: int):
    names = ("MIN_PIECE_BYTES", "PIECE_BYTES", "ONE_PROCESS_MIN_BYTES")
    saved = [getattr(pieces, n) for n in names]
    for n, v in zip(names, (1, max(1, size), 0)):
        setattr(pieces, n, v)
    try:
        yield
    finally:
        for n, v in zip(names, saved):
            setattr(pieces, n, v)


@settings(PROFILE, max_examples=max(10, PROFILE.max_examples // 4))
@given(rng=st.randoms(use_true_random=False), share=st.integers(2, 9))
def test_pieces_give_the_same_trace_as_one_decode(rng, share):
    """One answer whatever -j: cut into pieces (in this process), the same events or the same error."""
    d = fixture(rng.choice(FIXTURES))
    mutate_fields(d, rng, rng.randrange(0, 6))
    raw = structural(d, rng) if rng.random() < 0.5 else to_bytes(d)
    whole = load_and_analyse(raw)
    with small_pieces(len(raw) // share):
        cut = load_and_analyse(raw)
    assert (whole is None) == (cut is None)
    if whole is not None:
        a, b = whole[0], cut[0]
        for f in ("kind", "name", "lane", "ts_ns", "dur_ns", "corr", "device", "stream", "nbytes"):
            assert np.array_equal(getattr(a.events, f), getattr(b.events, f)), f
        assert a.names == b.names and a.lanes == b.lanes and a.origin_ns == b.origin_ns
        assert whole[1].metrics == cut[1].metrics
