"""Time per ``nn.Module`` instance (``metrics.modules``), from the ranges ``--modules`` records.

Each module call is a range ``gpumagic::module PATH (Type)`` (:mod:`gpumagic.capture.modules`).
Over the ranges that start in the window, per ``PATH``:

- ``calls``: how many ranges;
- ``forward_ms``: their host time (a module's own time and its children's: the tree is inclusive);
- ``forward_gpu_ms``: the GPU time of the kernels, copies and memsets launched inside them;
- ``backward_ms`` / ``backward_gpu_ms``: the host time of the backward nodes, and the GPU time of
  the work they launched, that the forward operators inside the ranges created. Which backward
  node a forward operator made is the trace's own link (``fwdbwd`` flow arrows, on sequence
  numbers: :mod:`gpumagic.trace.links`), not a bracket of backward hooks, which fire before a
  layer's weight gradients are computed when its input needs no gradient (the issue this
  implements cites it; PyTorch's docs on ``register_full_backward_hook`` say the hook fires when
  the gradients with respect to the module's *inputs* are computed). A node's host time is that
  of the ``autograd::engine::evaluate_function:`` span around it. Gradient accumulation into
  ``.grad`` (``AccumulateGrad``) has no forward operator and is not attributed; nor is backward
  work whose forward ran outside the window.

``backward_ms`` is null when the trace has no links (``Trace.links`` unset: a trace built in
memory); the GPU columns are null when the trace has no GPU activity.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.report.metrics import ModuleRow, as_record
from gpumagic.trace.links import EVALUATE_PREFIX, MODULE_PREFIX
from gpumagic.trace.model import Kind

_RANGE_RE = re.compile("^" + re.escape(MODULE_PREFIX) + r"(?P<path>.+) \((?P<type>[^()]*)\)$")


def module_rows(ctx: Context) -> list[ModuleRow] | None:
    """One row per module path, largest (forward + backward host time) first; None without ranges."""
    tr, ev = ctx.trace, ctx.trace.events
    parsed: dict[int, re.Match[str]] = {}
    for i, n in enumerate(tr.names):
        if n.startswith(MODULE_PREFIX) and (match := _RANGE_RE.match(n)) is not None:
            parsed[i] = match
    if not parsed:
        return None
    ids = np.fromiter(parsed, np.int64, len(parsed))
    rows = np.flatnonzero(np.isin(ev.name, ids) & (ev.kind == Kind.ANNOTATION) & (ev.ts_ns >= ctx.lo) & (ev.ts_ns < ctx.hi))
    if rows.size == 0:
        return None
    gpu = ctx.masks["gpu"]
    has_gpu = bool(gpu.any())
    fwd_gpu = _launched_inside(ctx, rows) if has_gpu else None
    links = tr.links
    bwd_host = bwd_gpu = None
    if links is not None:
        bwd_host, bwd_gpu = _backward(ctx, rows, links, has_gpu)
    acc: dict[str, dict[str, Any]] = {}
    for k, r in enumerate(rows.tolist()):
        m = parsed[int(ev.name[r])]
        row = acc.setdefault(m.group("path"), {"path": m.group("path"), "type": m.group("type"), "calls": 0,
                                               "forward_ns": 0, "backward_ns": 0, "fwd_gpu_ns": 0, "bwd_gpu_ns": 0})
        row["calls"] += 1
        row["forward_ns"] += int(ev.dur_ns[r])
        if fwd_gpu is not None:
            row["fwd_gpu_ns"] += int(fwd_gpu[k])
        if bwd_host is not None:
            row["backward_ns"] += int(bwd_host[k])
        if bwd_gpu is not None:
            row["bwd_gpu_ns"] += int(bwd_gpu[k])
    out = []
    for row in acc.values():
        out.append({
            "path": row["path"], "type": row["type"], "calls": row["calls"],
            "forward_ms": _ms(row["forward_ns"]),
            "backward_ms": _ms(row["backward_ns"]) if bwd_host is not None else None,
            "forward_gpu_ms": _ms(row["fwd_gpu_ns"]) if has_gpu else None,
            "backward_gpu_ms": _ms(row["bwd_gpu_ns"]) if has_gpu and bwd_host is not None else None,
        })
    out.sort(key=lambda d: (-(d["forward_ms"] + (d["backward_ms"] or 0.0)), d["path"]))
    return [as_record(d, ModuleRow) for d in out]


def _ms(ns: float) -> float:
    return round(ns / 1e6, 4)


def _launched_inside(ctx: Context, rows: np.ndarray, spans: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Per span (the ranges ``rows``, or ``spans`` = starts, ends, lanes): GPU time launched inside it."""
    ev = ctx.trace.events
    g = np.flatnonzero(ctx.masks["gpu"] & (ctx.launch_row >= 0))
    launch = ctx.launch_row[g]
    if spans is None:
        spans = (ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows], ev.lane[rows].astype(np.int64))
    return iv.weight_in_ranges(ev.ts_ns[launch], ev.lane[launch].astype(np.int64), ev.dur_ns[g], *spans)


def _backward(ctx: Context, rows: np.ndarray, links: Any, has_gpu: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Per range: host and GPU time of the backward nodes its forward operators made."""
    ev = ctx.trace.events
    starts, ends = ev.ts_ns[rows], ev.ts_ns[rows] + ev.dur_ns[rows]
    lanes = ev.lane[rows].astype(np.int64)
    if len(links) == 0:
        return np.zeros(rows.size, np.int64), (np.zeros(rows.size, np.int64) if has_gpu else None)
    b_start, b_end = _evaluate_spans(ctx, links.bwd)
    host = b_end - b_start
    f_ts, f_lane = ev.ts_ns[links.fwd], ev.lane[links.fwd].astype(np.int64)
    bwd_host = iv.weight_in_ranges(f_ts, f_lane, host, starts, ends, lanes)
    if not has_gpu:
        return bwd_host, None
    per_node = _launched_inside(ctx, np.zeros(0, np.int64), (b_start, b_end, ev.lane[links.bwd].astype(np.int64)))
    return bwd_host, iv.weight_in_ranges(f_ts, f_lane, per_node, starts, ends, lanes)


def _evaluate_spans(ctx: Context, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each backward node's ``evaluate_function`` span (same lane, around it), else the node's own."""
    tr, ev = ctx.trace, ctx.trace.events
    s, e = ev.ts_ns[nodes].copy(), (ev.ts_ns[nodes] + ev.dur_ns[nodes]).copy()
    ids = np.fromiter((i for i, n in enumerate(tr.names) if n.startswith(EVALUATE_PREFIX)), np.int64)
    if ids.size == 0:
        return s, e
    evals = np.flatnonzero(np.isin(ev.name, ids))
    node_lane = ev.lane[nodes]
    for ln in distinct(node_lane).tolist():
        on = evals[ev.lane[evals] == ln]
        if on.size == 0:
            continue
        which = np.flatnonzero(node_lane == ln)
        k = np.searchsorted(ev.ts_ns[on], s[which], "right") - 1  # the last span starting at or before the node
        ok = k >= 0
        cand = on[np.maximum(k, 0)]
        ok &= ev.ts_ns[cand] + ev.dur_ns[cand] >= e[which]
        s[which[ok]], e[which[ok]] = ev.ts_ns[cand[ok]], ev.ts_ns[cand[ok]] + ev.dur_ns[cand[ok]]
    return s, e
