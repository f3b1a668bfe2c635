"""Mutations of real trace fixtures, field by field, for the fuzzer and the subprocess sample.

Each mutation takes the decoded trace (a dict, changed in place) or its bytes and returns bytes
to load: values of other types and ranges in event fields, args, the header and the gpumagic
section; deep nesting; extra top-level arrays; then text-level damage (truncation, encodings,
stray bytes, gzip).
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import random

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
#: Small real fixtures: NVIDIA (torch 2.6) and AMD ROCm (string-valued numbers in args).
FIXTURES = ("h100_bert_small_inference.json.gz", "mi300_bert_small_infer.json.gz")

EVENT_FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "s", "bp")
ARG_FIELDS = ("correlation", "stream", "device", "bytes", "Bytes", "Total Allocated", "Total Reserved",
              "Device Id", "Device Type", "name", "labels", "External id")
HEADER_FIELDS = ("deviceProperties", "baseTimeNanoseconds", "displayTimeUnit", "schemaVersion",
                 "distributedInfo", "traceEvents", "gpumagic")
BUNDLE_FIELDS = ("notes", "label", "clock", "samples", "capture", "machine")

_cache: dict[str, dict] = {}


def fixture(name: str) -> dict:
    """A fresh copy of a fixture, decoded."""
    if name not in _cache:
        with gzip.open(os.path.join(DATA, name), "rb") as fh:
            _cache[name] = json.load(fh)
    return json.loads(json.dumps(_cache[name]))


def odd_value(rng: random.Random, depth: int = 0):
    """A value of some type and range a trace should not hold (or might, at the edges)."""
    kind = rng.randrange(14)
    if kind == 0:
        return rng.choice([2**31, 2**32 - 1, 2**32, 2**40, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**100, -(2**63) - 1])
    if kind == 1:
        return rng.choice([-1, 0, 1, -(2**31), 127, 128, 255, 256, 32768])
    if kind == 2:
        return rng.choice([1e308, -1e308, 1.7976931348623157e308, 5e-324, -0.0, 1e15, 4.1e15, -1e300, 0.5])
    if kind == 3:
        return rng.choice(["", "0", "12", "-7", "0x1f", "1e3", "stream 7", "nan", "inf", "\x00", "\x1b]0;title\x07",
                           "\ud800", "é" * 50, "a" * 5000])
    if kind == 4:
        return rng.choice([None, True, False])
    if kind == 5 and depth < 3:
        return [odd_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 6 and depth < 3:
        return {rng.choice(ARG_FIELDS + EVENT_FIELDS): odd_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if kind == 7:
        return rng.uniform(-1e6, 1e16)
    if kind == 8:
        return rng.randrange(-(2**70), 2**70)
    return rng.choice([0, 1, 1.5, "x", None, [], {}])


def mutate_fields(d: dict, rng: random.Random, count: int) -> None:
    """Change, delete or add ``count`` fields of events, their args, the header or the bundle."""
    events = d.get("traceEvents") if isinstance(d.get("traceEvents"), list) else []
    for _ in range(count):
        where = rng.randrange(10)
        if where < 5 and events:
            e = rng.choice(events)
            if isinstance(e, dict):
                _change(e, rng.choice(EVENT_FIELDS), rng)
        elif where < 8 and events:
            e = rng.choice(events)
            if isinstance(e, dict):
                if not isinstance(e.get("args"), dict):
                    e["args"] = {}
                _change(e["args"], rng.choice(ARG_FIELDS), rng)
        elif where == 8:
            bundle = d.setdefault("gpumagic", {})
            if isinstance(bundle, dict):
                _change(bundle, rng.choice(BUNDLE_FIELDS), rng)
                if rng.random() < 0.5:
                    bundle["samples"] = {"gpu": {"t_epoch_ns": [rng.choice([0, 1, 2**62, 2**64, 1e300])] * 2,
                                                 "gpu_util": odd_value(rng)},
                                         "cpu": odd_value(rng)}
        else:
            _change(d, rng.choice(HEADER_FIELDS[:-2]), rng)


def _change(obj: dict, key: str, rng: random.Random) -> None:
    r = rng.random()
    if r < 0.2:
        obj.pop(key, None)
    else:
        obj[key] = odd_value(rng)


def structural(d: dict, rng: random.Random) -> bytes:
    """Whole-file shapes: a second top-level array of event-like objects, deep nesting."""
    choice = rng.randrange(4)
    events = d.get("traceEvents") if isinstance(d.get("traceEvents"), list) else []
    if choice == 0:
        d["otherEvents"] = events[: rng.randrange(1, 50)]
    elif choice == 1:
        d = {"aaa": events[: rng.randrange(1, 50)], **d}
    elif choice == 2:
        depth = rng.choice([100, 1000, 100_000])
        text = json.dumps(d)
        return text[:-1].encode() + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
    else:
        return json.dumps(events).encode()  # a bare list of events
    return json.dumps(d).encode()


def to_bytes(d: dict) -> bytes:
    return json.dumps(d, allow_nan=True).encode("utf-8", "surrogatepass")


def damage(raw: bytes, rng: random.Random) -> bytes:
    """Text-level damage: truncation, other encodings, stray bytes, gzip (maybe truncated)."""
    kind = rng.randrange(7)
    if kind == 0:
        return raw[: rng.randrange(len(raw) + 1)]
    if kind == 1:
        return codecs.BOM_UTF8 + raw
    if kind == 2:
        return raw.decode("utf-8", "surrogatepass").encode(rng.choice(["utf-16", "utf-32", "latin-1"]), "replace")
    if kind == 3:
        at = rng.randrange(len(raw) + 1)
        return raw[:at] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8))) + raw[at:]
    if kind == 4:
        z = gzip.compress(raw, compresslevel=1, mtime=0)
        return z[: rng.randrange(len(z) + 1)] if rng.random() < 0.5 else z
    if kind == 5:
        return raw.replace(b", ", b",", rng.randrange(100)).replace(b"}", b"},", 1)  # Kineto's trailing-comma slip
    return raw


def mutated(seed: int) -> bytes:
    """One mutated trace, chosen entirely by ``seed``."""
    rng = random.Random(seed)
    d = fixture(rng.choice(FIXTURES))
    mutate_fields(d, rng, rng.randrange(1, 12))
    raw = structural(d, rng) if rng.random() < 0.2 else to_bytes(d)
    return damage(raw, rng) if rng.random() < 0.4 else raw
