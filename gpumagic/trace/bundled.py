"""Reading what a gpumagic bundle adds to a Kineto trace (the top-level ``"gpumagic"`` key written
by :mod:`gpumagic.capture.bundle`): label, notes, capture facts and samples aligned to the trace.

The section comes from a file, so every field is checked before use: a field of the wrong type
or shape is left out with a note, and the rest of the trace loads as usual.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpumagic.trace.columns import fit64
from gpumagic.trace.model import Samples, Trace

CLOCK_ANCHOR = "gpumagic::clock_anchor"
#: Epoch times beyond this (ns, about the year 2116) are not read; with it, adding the clock
#: offset cannot overflow int64.
EPOCH_LIMIT_NS = 1 << 62
#: Top-level fields copied into ``Trace.meta`` as they are (plain JSON values).
META_FIELDS = ("label", "capture", "machine", "versions", "every_step")


def attach_bundle(trace: Trace, bundle: Any) -> None:
    """Read ``bundle`` (the decoded ``"gpumagic"`` value) into ``trace``."""
    if not isinstance(bundle, dict):
        trace.notes.append("The trace's gpumagic section is not an object; it was ignored.")
        return
    notes = bundle.get("notes", [])
    if isinstance(notes, list):
        trace.notes.extend(n for n in notes if isinstance(n, str) and n)
    else:
        trace.notes.append("The gpumagic section's notes are not a list; they were ignored.")
    for key in META_FIELDS:
        if key in bundle:
            trace.meta[key] = bundle[key]
    if "machine" in trace.meta:
        trace.meta["machine"] = _machine(trace, trace.meta["machine"])
    if "label" in trace.meta and not isinstance(trace.meta["label"], str):
        trace.meta["label"] = str(trace.meta["label"])[:200]
    if "loader_stages" in bundle:
        _loader_stages(trace, bundle["loader_stages"])
    if "error" in bundle:
        _error(trace, bundle["error"])
    if "memory_categories" in bundle:
        _memory_categories(trace, bundle["memory_categories"])
    samples = bundle.get("samples") or {}
    if not isinstance(samples, dict):
        trace.notes.append("The gpumagic section's samples are not an object; they were ignored.")
        return
    if not samples:
        return
    clock = bundle.get("clock") or {}
    offset = _sample_offset(trace, clock if isinstance(clock, dict) else {})
    trace.samples = Samples(gpu=_columns(trace, "gpu", samples.get("gpu"), offset),
                            cpu=_columns(trace, "cpu", samples.get("cpu"), offset))


#: The machine block's numeric facts the analysis reads (core counts): each a finite number in
#: (0, MAX_CORES], else left out with a note.
CORE_FIELDS = ("cpu_count", "usable_cores", "cpu_quota_cores")
MAX_CORES = 1 << 20


def _machine(trace: Trace, block: Any) -> dict[str, Any]:
    """The bundle's ``machine`` block with the fields the analysis reads checked: core counts are
    positive finite numbers, ``cpu_affinity`` a list of core numbers; anything else is dropped."""
    if not isinstance(block, dict):
        trace.notes.append("The gpumagic section's machine facts are not an object; they were ignored.")
        return {}
    out = dict(block)
    dropped = [k for k in CORE_FIELDS if k in out and out[k] is not None and not _core_count(out[k])]
    affinity = out.get("cpu_affinity")
    if affinity is not None and not (isinstance(affinity, list) and len(affinity) <= MAX_CORES
                                     and all(type(c) is int and 0 <= c < MAX_CORES for c in affinity)):
        dropped.append("cpu_affinity")
    if "usable_cores_source" in out and not isinstance(out["usable_cores_source"], str):
        dropped.append("usable_cores_source")
    for key in dropped:
        del out[key]
    if dropped:
        trace.notes.append(f"The gpumagic section's machine facts {', '.join(dropped)} are not valid; they were ignored.")
    return out


def _error(trace: Trace, block: Any) -> None:
    """``meta["error"]``: ``{"type": str, "types": [str], "message": str}`` (capture.bundle.error_block)."""
    ok = (isinstance(block, dict) and isinstance(block.get("type"), str) and isinstance(block.get("message"), str)
          and isinstance(block.get("types", []), list) and all(isinstance(t, str) for t in block.get("types", [])))
    if not ok:
        trace.notes.append("The gpumagic section's error is not valid; it was ignored.")
        return
    trace.meta["error"] = {"type": block["type"][:200], "types": [t[:200] for t in block.get("types", [])][:64],
                           "message": block["message"][:MAX_ERROR_CHARS]}


#: The longest error message read from a bundle.
MAX_ERROR_CHARS = 20_000
#: Fields of one of the largest allocations at the peak: ``bytes`` (int), the rest text or null.
_TOP_TEXT = ("category", "frame", "module", "op")


def _memory_categories(trace: Trace, block: Any) -> None:
    """``meta["memory_categories"]`` (written by capture.memcats), its times made trace-relative:
    ``categories`` (names), ``t_ns`` (1-D int64), ``bytes`` (2-D int64, one row per time, one
    column per category), ``peak_t_ns``, ``peak_bytes`` (one per category), ``category_peaks`` (each category's own
    maximum, or None), ``top`` (dicts)."""
    def bad() -> None:
        trace.notes.append("The gpumagic section's memory categories are not valid; they were ignored.")

    if not isinstance(block, dict):
        return bad()
    names = block.get("categories")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        return bad()
    times: np.ndarray | None
    rows: np.ndarray | None
    if block.get("t_ns") == [] and block.get("bytes") == []:
        times, rows = np.zeros(0, np.int64), np.zeros((0, len(names)), np.int64)
    else:
        times, rows = _numbers(block.get("t_ns")), _numbers(block.get("bytes"))
    if times is None or rows is None or times.dtype.kind != "i" or rows.dtype.kind != "i":
        return bad()
    if times.ndim != 1 or rows.ndim != 2 or rows.shape != (len(times), len(names)) or not np.all(np.abs(times) < EPOCH_LIMIT_NS):
        return bad()
    raw_peak, peak = block.get("peak_t_ns"), _numbers(block.get("peak_bytes"))
    peak_t = fit64(raw_peak)
    has_peak = raw_peak is not None
    if has_peak and (peak_t is None or abs(peak_t) >= EPOCH_LIMIT_NS or peak is None
                     or peak.dtype.kind != "i" or peak.shape != (len(names),)):
        return bad()
    own = _numbers(block.get("category_peaks")) if block.get("category_peaks") is not None else None
    if own is not None and (own.dtype.kind != "i" or own.shape != (len(names),)):
        return bad()
    top = block.get("top") or []
    if not isinstance(top, list) or not all(_top_ok(a) for a in top):
        return bad()
    origin = trace.origin_ns
    trace.meta["memory_categories"] = {
        "device": str(block.get("device") or "")[:40],
        "categories": [n[:40] for n in names],
        "t_ns": times.astype(np.int64) - origin,
        "bytes": rows.astype(np.int64),
        "peak_t_ns": peak_t - origin if peak_t is not None else None,
        "peak_bytes": [int(b) for b in peak] if has_peak and peak is not None else None,
        "category_peaks": None if own is None else [int(b) for b in own],
        "top": [{"bytes": int(a["bytes"]), "t_ns": None if a.get("t_ns") is None else a["t_ns"] - origin,
                 **{k: (a.get(k) or None) and str(a[k])[:300] for k in _TOP_TEXT}} for a in top[:100]],
    }


def _top_ok(a: Any) -> bool:
    return (isinstance(a, dict) and type(a.get("bytes")) is int and 0 <= a["bytes"] < EPOCH_LIMIT_NS
            and (a.get("t_ns") is None or (type(a["t_ns"]) is int and abs(a["t_ns"]) < EPOCH_LIMIT_NS))
            and all(a.get(k) is None or isinstance(a[k], str) for k in _TOP_TEXT))


def _core_count(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and 0 < value <= MAX_CORES


def _sample_offset(trace: Trace, clock: dict[str, Any]) -> int:
    """ns to add to an epoch time to get trace-relative time."""
    anchor_epoch = fit64(clock.get("anchor_epoch_ns"))
    if anchor_epoch is not None and abs(anchor_epoch) < EPOCH_LIMIT_NS:
        ids = [i for i, n in enumerate(trace.names) if n == CLOCK_ANCHOR]
        hit = np.isin(trace.events.name, ids) if ids else np.zeros(0, dtype=bool)
        if hit.any():
            return int(trace.events.ts_ns[np.flatnonzero(hit)[0]]) - anchor_epoch
    trace.notes.append("Samples were aligned assuming the profiler clock is the system clock (no clock anchor).")
    return -trace.origin_ns


def _columns(trace: Trace, which: str, block: Any, offset: int) -> dict[str, np.ndarray]:
    """One block of samples as arrays of equal length; what does not fit is left out with a note."""
    if not block:
        return {}
    times = _numbers(block.get("t_epoch_ns")) if isinstance(block, dict) else None
    if times is None or times.ndim != 1 or not np.all(np.abs(times) < EPOCH_LIMIT_NS):
        trace.notes.append(f"The gpumagic section's {which} samples have no valid times (t_epoch_ns); they were ignored.")
        return {}
    out = {"t_ns": times.astype(np.int64) + offset}
    skipped = []
    for key, values in block.items():
        if key == "t_epoch_ns":
            continue
        arr = _numbers(values)
        if arr is None or arr.ndim == 0 or len(arr) != len(times) or key == "t_ns":
            skipped.append(str(key)[:40])
        else:
            out[key] = arr
    if skipped:
        trace.notes.append(f"The gpumagic section's {which} samples had fields of the wrong type or length, "
                           f"left out: {', '.join(sorted(skipped))}.")
    return out


def _numbers(values: Any) -> np.ndarray | None:
    """``values`` as a numeric array (ints stay ints), or None if it is not a list of finite
    numbers (or of equal-length lists of them)."""
    if not isinstance(values, list):
        return None
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError, OverflowError, RecursionError):
        return None
    if arr.dtype.kind not in "iuf" or (arr.dtype.kind == "f" and not np.all(np.isfinite(arr))):
        return None
    return arr


#: Longest stage name kept (a qualified name; longer ones are cut).
MAX_STAGE_NAME = 200
#: Most stages read from a bundle (a pipeline has a handful; the rest would be noise).
MAX_STAGES = 200


def _loader_stages(trace: Trace, block: Any) -> None:
    """The data-loader stage timings (``capture.stages``) into ``trace.meta["loader_stages"]``:
    ``{"batches": int, "fetched": int, "workers": int, "stages": [{"name", "where", "self_ns",
    "calls", "batches"}]}``, each checked; the block is ignored with a note when it does not have
    that shape. ``fetched`` and a row's ``batches`` (absent from bundles written before the timers
    could sample) default to ``batches``."""
    ok = isinstance(block, dict) and _count(block.get("batches")) and _count(block.get("workers"), zero=True)
    rows = block.get("stages") if ok else None
    if not isinstance(rows, list) or not all(
            isinstance(r, dict) and isinstance(r.get("name"), str) and r.get("name")
            and r.get("where") in ("main", "worker") and _count(r.get("self_ns"), zero=True)
            and _count(r.get("calls"), zero=True) and _count(r.get("batches", block["batches"]))
            for r in rows) or not _count(block.get("fetched", block.get("batches"))):
        trace.notes.append("The gpumagic section's loader_stages are not valid; they were ignored.")
        return
    trace.meta["loader_stages"] = {
        "batches": block["batches"], "fetched": max(block.get("fetched", 0), block["batches"]),
        "workers": block["workers"],
        "stages": [{"name": r["name"][:MAX_STAGE_NAME], "where": r["where"], "self_ns": r["self_ns"],
                    "calls": r["calls"], "batches": r.get("batches", block["batches"])} for r in rows[:MAX_STAGES]]}


def _count(value: Any, zero: bool = False) -> bool:
    """A non-negative int (positive unless ``zero``) that fits int64."""
    return type(value) is int and (0 if zero else 1) <= value < 1 << 63
