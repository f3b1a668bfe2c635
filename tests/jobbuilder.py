"""Build multi-rank job folders from the real single-rank traces in tests/data, reproducibly.

There is no public multi-rank trace set small enough for the repository, so a job is made from one
recorded rank: its trace is copied once per rank with ``distributedInfo.rank`` changed. A straggler
is injected the way a real one looks in the traces of a synchronous data-parallel job:

- on the straggler, ``delay_us`` of extra host work (a ``cpu_op`` named :data:`HOST_WORK` on the
  thread that runs the steps) before each collective kernel: the collective and everything after
  it start ``delay_us`` later, its kernel keeps its duration (the others are already waiting);
- on every other rank, each collective kernel lasts ``delay_us`` longer (it waits inside the
  collective for the straggler) and everything after it is ``delay_us`` later.

Both rewrites are one monotone time map per rank (``t + delay × number of boundaries ≤ t``; the
boundaries are the straggler's collective starts, or the other ranks' collective ends), so nesting,
flows and step markers stay valid, and every rank's steps end at the same moments, as they do in a
real job. With ``n`` collectives per step the job loses ``n × delay_us`` per step. ``jitter_us``
adds, on every rank, a random wait of up to that many µs inside each collective (seeded by the
rank): the rank-to-rank noise of a real job, against which a straggler must stand out.

Usage: ``python tests/jobbuilder.py OUT_DIR --ranks 32 [--straggler 5 --delay-us 2000] [--jitter-us 300]``.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import re
from pathlib import Path

import msgspec
import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
#: rank 0 of a 16-GPU job on A100s: 16 NCCL send/recv kernels per step, 5 steps.
A100 = os.path.join(DATA, "a100_training_rank0.json.gz")
#: rank 1 of a 2-GPU job on V100s: 404 NCCL all-reduce kernels per step, 5 steps.
V100 = os.path.join(DATA, "v100_large_216k_events.json.gz")
#: a single-GPU ResNet-50 (no collectives): a rank doing other work than the others.
RESNET = os.path.join(DATA, "resnet50_v100_workers0.json.gz")
HOST_WORK = "straggler::extra_host_work"
_NCCL = re.compile(r"nccl|rccl", re.IGNORECASE)
_STEP = re.compile(r"^ProfilerStep#\d+$")


def read(path: str) -> bytes:
    """The source trace's JSON bytes (each rank decodes its own copy: faster than a deep copy)."""
    with gzip.open(path, "rb") as fh:
        return fh.read()


def collective_kernels(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel" and _NCCL.search(e.get("name", ""))]


def shift(doc: dict, boundaries: list[int], delays_us: int | list[int]) -> None:
    """Apply ``t -> t + (sum of the delays of the boundaries ≤ t)`` to every timed event's start and
    end, in place; ``delays_us`` is one delay for all boundaries or one per boundary."""
    b = np.asarray(boundaries)
    order = np.argsort(b, kind="stable")
    b = b[order]
    delays = np.broadcast_to(np.asarray(delays_us), b.shape)[order]
    total = np.concatenate([[0], np.cumsum(delays)])
    timed = [e for e in doc["traceEvents"] if e.get("ph") != "M" and "ts" in e]
    dtype = np.int64 if all(isinstance(e["ts"], int) for e in timed) else np.float64  # µs, integer in most traces
    ts = np.array([e["ts"] for e in timed], dtype=dtype)
    end = ts + np.array([e.get("dur", 0) for e in timed], dtype=dtype)
    new_ts = ts + total[np.searchsorted(b, ts, side="right")]
    new_dur = end + total[np.searchsorted(b, end, side="right")] - new_ts
    for e, t, d in zip(timed, new_ts.tolist(), new_dur.tolist()):
        e["ts"] = t
        if "dur" in e:
            e["dur"] = d


def _main_thread(doc: dict) -> tuple[object, object]:
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and _STEP.match(e.get("name", "")):
            return e["pid"], e["tid"]
    raise ValueError("the trace has no ProfilerStep# markers")


def make_rank(base: bytes, rank: int, world_size: int, *, straggler: int | None = None, delay_us: int = 0,
              jitter_us: int = 0) -> dict:
    """A copy of ``base`` as rank ``rank`` of the job (see the module docstring). ``jitter_us``: each
    collective of this rank also waits a random 0 … ``jitter_us`` (seeded by the rank), the
    rank-to-rank noise of a real job."""
    doc = msgspec.json.decode(base)
    doc["distributedInfo"] = {**(doc.get("distributedInfo") or {"backend": "nccl"}), "rank": rank, "world_size": world_size}
    kernels = collective_kernels(doc)
    if jitter_us:
        rng = random.Random(rank)
        shift(doc, [k["ts"] + k["dur"] for k in kernels], [rng.randrange(jitter_us + 1) for _ in kernels])
    if straggler is None or not delay_us:
        return doc
    if rank == straggler:
        starts = [k["ts"] for k in kernels]
        shift(doc, starts, delay_us)
        pid, tid = _main_thread(doc)
        # after the shift, the gap [start_i + (i-1)·delay, start_i + i·delay) before each collective is free
        inserted = [{"ph": "X", "cat": "cpu_op", "name": HOST_WORK, "pid": pid, "tid": tid,
                     "ts": s + i * delay_us, "dur": delay_us, "args": {}} for i, s in enumerate(sorted(starts))]
        doc["traceEvents"].extend(inserted)
    else:
        shift(doc, [k["ts"] + k["dur"] for k in kernels], delay_us)
    return doc


def write(doc: dict, path: Path) -> Path:
    path.write_bytes(gzip.compress(msgspec.json.encode(doc), compresslevel=1))
    return path


def build_job(out_dir: str | os.PathLike, *, ranks: int = 4, source: str = A100, sources: dict[int, str] | None = None,
              straggler: int | None = None, delay_us: int = 0, jitter_us: int = 0, name: str = "rank{rank}.json.gz",
              first: int = 0, world_size: int | None = None) -> list[Path]:
    """Write ranks ``first`` … ``first + ranks - 1`` of a job of ``world_size`` (default ``ranks``) into
    ``out_dir`` (created); ``sources`` overrides the source trace of some ranks (ranks on other
    devices, or doing other work). Returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    loaded: dict[str, bytes] = {}
    paths = []
    for r in range(first, first + ranks):
        src = (sources or {}).get(r, source)
        if src not in loaded:
            loaded[src] = read(src)
        doc = make_rank(loaded[src], r, world_size or ranks, straggler=straggler, delay_us=delay_us, jitter_us=jitter_us)
        paths.append(write(doc, out / name.format(rank=r)))
    return paths


# -- what the job tests share (kept here, not in tests/jobs/conftest.py: a module named
# conftest is ambiguous when several test folders have one)

#: Extra host work injected before each collective on the straggler (µs).
DELAY_US = 2000
STRAGGLER = 2
#: Random extra wait (0 … this many µs) in every collective of every rank: the noise of a real job.
JITTER_US = 300


def rewrite(path, out, change):
    """Copy a rank file with ``change(doc)`` applied to its decoded JSON."""
    with gzip.open(path, "rb") as fh:
        doc = msgspec.json.decode(fh.read())
    change(doc)
    out.write_bytes(gzip.compress(msgspec.json.encode(doc), compresslevel=1))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--source", default=A100, help="the real single-rank trace to copy (default: the A100 rank)")
    p.add_argument("--straggler", type=int, default=None)
    p.add_argument("--delay-us", type=int, default=2000, help="extra host work before each collective on the straggler")
    p.add_argument("--jitter-us", type=int, default=0, help="random extra wait in each collective, per rank")
    a = p.parse_args(argv)
    for path in build_job(a.out_dir, ranks=a.ranks, source=a.source, straggler=a.straggler, delay_us=a.delay_us,
                          jitter_us=a.jitter_us):
        print(path)


if __name__ == "__main__":
    main()

