"""``host-contended``: other processes take the cores a CPU-only loop computes on; the main thread
waits for a core (schedstat run-queue wait), and intra-op threads beyond the cores left stall
every parallel operator."""

from __future__ import annotations

import copy
import gzip
import json
import os

import pytest
from tracebuilder import DATA

from gpumagic import analyze

BUNDLE = os.path.join(DATA, "cpu_contended.json.gz")


def _raw() -> dict:
    with gzip.open(BUNDLE, "rt") as fh:
        return json.load(fh)


RAW = _raw()


def test_a_recorded_loop_beside_spinning_neighbours():
    """Recorded on this project's 2-core machine beside two spinning processes (tests/data/MANIFEST.md):
    the plain loop took 192 ms a step with two threads, 31 with one, 11 alone."""
    r = analyze(BUNDLE)
    h = r.metrics.host
    assert h.shared_machine and h.main_runqueue_wait_frac >= 0.3 and h.intra_op_threads == 2
    f = r.finding("host-contended")
    assert f.est_gain == pytest.approx(h.main_runqueue_wait_frac) and f.gain_method.startswith("estimate")
    assert f.evidence.numbers["suggested_num_threads"] == 1
    first, listing = f.fixes
    assert first.code.startswith("torch.set_num_threads(1)") and not first.diagnostic
    assert listing.diagnostic and "--sort=-pcpu" in listing.code
    for fx in f.fixes:
        compile(fx.code, "<fix>", "exec")


def _with(cpu_update=None, capture_update=None) -> dict:
    d = copy.deepcopy(RAW)
    g = d["gpumagic"]
    for k, v in (cpu_update or {}).items():
        g["samples"]["cpu"][k] = v(g["samples"]["cpu"][k]) if callable(v) else v
    g["capture"].update(capture_update or {})
    return d


def test_no_wait_no_finding():
    d = _with({"main_wait": lambda xs: [0.0 for _ in xs]})
    r = analyze(d)
    assert r.metrics.host.main_runqueue_wait_frac == 0 and r.finding("host-contended") is None


def test_threads_within_the_cores_left_keep_the_count():
    """One intra-op thread already: no thread fix, the diagnostic only."""
    f = analyze(_with(capture_update={"intra_op_threads": 1})).finding("host-contended")
    assert "suggested_num_threads" not in f.evidence.numbers
    assert [x.diagnostic for x in f.fixes] == [True]


def test_silent_without_samples_and_with_a_gpu():
    d = copy.deepcopy(RAW)
    d["gpumagic"]["samples"] = {}
    assert analyze(d).finding("host-contended") is None
    h100 = analyze(os.path.join(DATA, "h100_bert_small_inference.json.gz"))
    assert h100.finding("host-contended") is None and h100.metrics.host.main_runqueue_wait_frac is None


LOADER = os.path.join(DATA, "cpu_contended_loader.json.gz")


def test_a_loader_wait_does_not_hide_a_longer_wait_for_a_core():
    """Recorded beside three spinning processes on 2 cores (tests/data/MANIFEST.md): the loop waited
    7 % of the window for its batches and 60 % for a core. It read only "add a worker" while any
    loader wait over 5 % silenced host-contended; the larger wait leads now."""
    r = analyze(LOADER)
    h = r.metrics.host
    assert 0.05 < h.dataloader_frac < h.main_runqueue_wait_frac
    assert {"host-contended", "dataloader-bound"} <= set(r.finding_ids)
    assert r.findings[0].id == "host-contended"
    with gzip.open(LOADER, "rt") as fh:
        d = json.load(fh)
    cpu = d["gpumagic"]["samples"]["cpu"]
    cpu["main_wait"] = [min(w, 2.0) for w in cpu["main_wait"]]  # the thread hardly waited: the loader's wait is larger
    quiet = analyze(d)
    assert quiet.metrics.host.main_runqueue_wait_frac < quiet.metrics.host.dataloader_frac
    assert quiet.finding("host-contended") is None and quiet.finding("dataloader-bound") is not None
