"""Per-operator efficiency (``metrics.operators``, docs/metrics.md): for each operator (name and,
where recorded, input shapes), its count, the GPU time of the kernels it launched, FLOPs and bytes,
achieved TFLOP/s and TB/s, the device's peaks and where it sits on a roofline.

- **Which operator launched a kernel**: the innermost host operator (``cpu_op``) around the
  runtime call with the kernel's correlation id, on that call's thread (as AMD TraceLens
  attributes kernels to the leaf operators that launched them). Kernels whose launch no operator
  encloses, and kernels replayed by a graph launch (``cudaGraphLaunch``: one call for many
  kernels) whose operator has no FLOP count, are *uncovered*: their time is reported, not
  attributed.
- **FLOPs**: the profiler's own count (``with_flops=True``) where present, else from the input
  shapes (``record_shapes=True``) with the formulas of :mod:`gpumagic.analysis.flops`.
- **Bytes**: the recorded input tensors' sizes times their element sizes, plus the output of a
  matrix multiply (its shape follows from the inputs'). Other outputs are not recorded, so it is
  a lower bound of the traffic, and TB/s with it.
- **Roofline** (Williams, Waterman and Patterson, "Roofline: an insightful visual performance
  model", CACM 2009): an operator whose arithmetic intensity (FLOPs per byte) is below the
  device's ridge point (peak FLOP/s ÷ peak bytes/s) is ``memory``-bound, else ``compute``-bound;
  ``frac_of_roof`` is its achieved rate over the roof at its intensity. Peaks come from
  :mod:`gpumagic.analysis.devices` (datasheets).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis import devices, flops
from gpumagic.analysis.context import Context
from gpumagic.report.metrics import Metrics, OperatorRow
from gpumagic.trace.model import EventTable

TOP_OPERATORS = 20
MS = 1e6
#: Element sizes of the ``Input type`` strings torch.profiler records (bytes).
ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "Half": 2, "BFloat16": 2,
                 "long int": 8, "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
                 "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
                 "c10::complex<float>": 8, "c10::complex<double>": 16}
_MM_OUT = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}
#: The operator table's times come from the file's µs as float64 (sub-µs digits lost on large
#: timestamps): an operator matches its event within this much.
MATCH_NS = 1_000
_BIG = np.int64(1) << np.int64(44)  # > any trace's time span in ns (about 4.9 h): lane * _BIG + ts orders by lane


def _ms(ns: float) -> float:
    return round(float(ns) / MS, 4)


def enclosing_op(ctx: Context, rows: np.ndarray) -> np.ndarray:
    """For host events ``rows`` (runtime calls), the row of the innermost ``cpu_op`` on the same
    thread whose span contains the call's start; -1 where none does. Vectorised: operators on a
    thread nest, so in (thread, start, longest first) order an operator's depth is the number of
    earlier ones still open at its start, and the innermost one around a moment is the last
    operator before it of the depth open there minus one."""
    nest = _nesting(ctx)
    return nest.innermost(*nest.at(ctx.trace.events, rows))


def parent_op(ctx: Context, rows: np.ndarray) -> np.ndarray:
    """For host operators ``rows``, the row of the operator that directly holds each (the
    innermost other ``cpu_op`` on its thread around its start, ordered before it: of two with
    the same start, the longer holds the shorter); -1 for an outermost one. An empty operator
    holds nothing but has a parent."""
    nest = _nesting(ctx)
    q, started = nest.at(ctx.trace.events, rows)
    if nest.ops.size and rows.size:
        # operators ordered before each row: its own place among them; an empty one (not among
        # them) keeps every operator starting at or before it
        own = np.minimum(np.searchsorted(nest.ops_sorted, rows), nest.ops.size - 1)
        mine = nest.ops_sorted[own] == rows
        started[mine] = nest.by_row[own[mine]]
    return nest.innermost(q, started)


class _Nesting:
    """The trace's non-empty host operators in (thread, start, longest first) order, with each
    one's depth: what :func:`enclosing_op` and :func:`parent_op` search (built once per context)."""

    def __init__(self, ctx: Context) -> None:
        ev, m = ctx.trace.events, ctx.masks
        ops = np.flatnonzero(m["cpu_op"] & m["host"] & (ev.dur_ns > 0))  # an empty span encloses nothing
        lane = ev.lane[ops].astype(np.int64) + 1
        s_key = lane * _BIG + ev.ts_ns[ops]
        e_key = lane * _BIG + ev.ts_ns[ops] + ev.dur_ns[ops]
        order = _by_thread_start_longest(ev.lane[ops], s_key, ev.dur_ns[ops])
        self.ops, self.s_key, self.e_key = ops[order], s_key[order], e_key[order]
        self.ends_sorted = np.sort(self.e_key)
        self.depth = np.arange(self.ops.size) - np.searchsorted(self.ends_sorted, self.s_key, side="right")
        # from a row to its place in the order: the rows sorted, and where each one stands
        self.by_row = np.argsort(self.ops, kind="stable")
        self.ops_sorted = self.ops[self.by_row]

    def at(self, ev: EventTable, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each of ``rows``'s (thread, start) key, and how many operators of the order start at or
        before it."""
        q = (ev.lane[rows].astype(np.int64) + 1) * _BIG + ev.ts_ns[rows]
        return q, np.searchsorted(self.s_key, q, side="right")

    def innermost(self, q: np.ndarray, started: np.ndarray) -> np.ndarray:
        """The innermost operator open at key ``q`` among the first ``started`` of the order."""
        out = np.full(q.size, -1, np.int64)
        open_at = started - np.searchsorted(self.ends_sorted, q, side="right")
        want = open_at - 1
        for d in distinct(want[want >= 0]).tolist():
            at_d = np.flatnonzero(self.depth == d)
            sel = np.flatnonzero(want == d)
            k = np.searchsorted(at_d, started[sel], side="left") - 1
            ok = k >= 0
            cand = at_d[np.maximum(k, 0)]
            ok &= self.e_key[cand] > q[sel]  # still open, on the same thread
            ok &= self.s_key[cand] // _BIG == q[sel] // _BIG
            out[sel[ok]] = self.ops[cand[ok]]
        return out


def _nesting(ctx: Context) -> _Nesting:
    return ctx.memo("operator_nesting", _Nesting)


def _by_thread_start_longest(lane: np.ndarray, s_key: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """``np.lexsort((-dur, s_key))`` for rows in time order (as the event table keeps them):
    ``s_key`` (thread, then start) is then already in order within each thread, so a stable
    sort by thread alone gives the (thread, start) order, in linear time where the thread ids
    fit 16 bits (numpy's radix sort); only the runs of equal ``s_key`` are then ordered by
    duration, longest first. At 1.1M operators, 0.01 s against about 0.1 s for the lexsort.
    Equal keys keep their order, as in the lexsort."""
    if lane.size == 0 or int(lane.min()) < 0 or int(lane.max()) >= 1 << 15:
        return np.lexsort((-dur, s_key))
    order = np.argsort(lane.astype(np.int16), kind="stable")
    key = s_key[order]
    if not (key[1:] >= key[:-1]).all():  # not in time order within a thread after all
        return np.lexsort((-dur, s_key))
    tie = np.flatnonzero(key[1:] == key[:-1])
    if tie.size:
        runs = np.zeros(order.size, dtype=bool)
        runs[tie] = True
        runs[tie + 1] = True
        at = np.flatnonzero(runs)  # positions of rows sharing their key with a neighbour
        order[at] = order[at][np.lexsort((-dur[order[at]], key[at]))]
    return order


def _shapes_index(ctx: Context):
    """``OpTable`` row for an event row, matched on thread, start and name (-1 where none)."""
    t = ctx.trace.ops
    if t is None or not len(t):
        return None
    key = (t.lane.astype(np.int64) + 1) * _BIG + t.ts_ns
    order = np.argsort(key, kind="stable")
    return t, key[order], order


def _match(ctx: Context, rows: np.ndarray, shapes) -> np.ndarray:
    """Per event row, its ``OpTable`` row (same thread and name, start within
    :data:`MATCH_NS`), -1 where none."""
    out = np.full(rows.size, -1, np.int64)
    if shapes is None or rows.size == 0:
        return out
    t, keys, order = shapes
    ids = {n: i for i, n in enumerate(ctx.trace.names)}
    t_name = np.fromiter(map(ids.get, t.name, itertools.repeat(-1)), np.int64, len(t.name))[order]
    ev = ctx.trace.events
    q = (ev.lane[rows].astype(np.int64) + 1) * _BIG + ev.ts_ns[rows]
    want = ev.name[rows].astype(np.int64)
    pos = np.searchsorted(keys, q - MATCH_NS, side="left")
    for off in range(4):  # a few operators may start within the tolerance of one another
        p = np.minimum(pos + off, keys.size - 1)
        ok = (out < 0) & (pos + off < keys.size) & (np.abs(keys[p] - q) <= MATCH_NS) & (t_name[p] == want)
        out[ok] = order[p[ok]]
    return out


def _bytes(name: str, dims: list, types: list) -> float | None:
    total, known = 0.0, False
    for i, d in enumerate(dims or ()):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            size = ELEMENT_BYTES.get(types[i] if i < len(types) else "")
            if size:
                total += flops.fprod(d) * size
                known = True
    out = _MM_OUT.get(name)
    if out is not None and known:
        a, b = flops._tensor(dims, out[0]), flops._tensor(dims, out[1])
        size = ELEMENT_BYTES.get(types[out[0]] if out[0] < len(types) else "")
        if a and b and size and len(a) == len(b) >= 2:
            total += flops.fprod(a[:-1]) * b[-1] * size
    return total if known else None


def metrics(ctx: Context, top: int = TOP_OPERATORS) -> dict[str, Any]:
    """``metrics["operators"]`` (docs/metrics.md)."""
    ev, m = ctx.trace.events, ctx.masks
    name_dev = flops._device_name(ctx)
    bw, bw_src = devices.peak_bandwidth(name_dev)
    out: dict[str, Any] = {"top": [], "count": 0, "kernel_ms": 0.0, "attributed_ms": 0.0, "uncovered_ms": 0.0,
                           "graph_uncovered_ms": 0.0, "shapes": ctx.trace.ops is not None,
                           "peak_tbps": bw, "peak_bandwidth_source": bw_src, "device_name": name_dev or None}
    if ctx.device < 0:
        return out
    k = np.flatnonzero(ctx.events_in_window(m["kernel"] | m["memcpy"] | m["memset"]) & ctx.on_device)
    out["kernel_ms"] = _ms(ev.dur_ns[k].sum())
    assert ctx.launch_row is not None  # build_context sets it
    launch = ctx.launch_row[k]
    has = launch >= 0
    op = np.full(k.size, -1, np.int64)
    op[has] = enclosing_op(ctx, launch[has])
    graph = has & m["name_graph_launch"][np.maximum(launch, 0)]
    # per operator instance (event row): GPU time, kernels, whether it replayed a graph
    inst, inv = np.unique(op[op >= 0], return_inverse=True)
    gpu_ns = np.bincount(inv, weights=ev.dur_ns[k][op >= 0], minlength=inst.size)
    in_graph = np.bincount(inv, weights=graph[op >= 0], minlength=inst.size) > 0
    out["uncovered_ms"] = _ms(ev.dur_ns[k][op < 0].sum())
    out["graph_uncovered_ms"] = _ms(ev.dur_ns[k][(op < 0) & graph].sum())
    shapes = _shapes_index(ctx)
    match = _match(ctx, inst, shapes)
    ops_tree: list = []  # the operator table with parents, built when a formula needs it

    def tree():
        if not ops_tree:
            tree_of = flops._Ops.of(shapes[0])
            ops_tree.extend((tree_of, tree_of.backward_outputs))
        return ops_tree

    groups: dict[tuple, dict[str, Any]] = {}
    # instances without recorded shapes: by name, vectorised (no FLOPs, no bytes)
    plain = match < 0
    graph_ns = float(gpu_ns[plain & in_graph].sum())  # a graph replay whose work the trace does not count
    out["graph_uncovered_ms"] = round(out["graph_uncovered_ms"] + graph_ns / MS, 4)
    out["uncovered_ms"] = round(out["uncovered_ms"] + graph_ns / MS, 4)
    sel = plain & ~in_graph
    names_n = len(ctx.trace.names)
    cnt = np.bincount(ev.name[inst[sel]], minlength=names_n)
    tot = np.bincount(ev.name[inst[sel]], weights=gpu_ns[sel], minlength=names_n)
    for n in np.flatnonzero(cnt).tolist():
        name = ctx.trace.names[n]
        groups[(name, None)] = {"name": name, "shapes": None, "count": int(cnt[n]), "gpu_ns": float(tot[n]),
                                "flops": 0.0, "flops_known": 0, "bytes": 0.0, "bytes_known": 0, "dtype": None,
                                "flops_source": None}
    shaped = np.flatnonzero(~plain)
    if shaped.size:
        _add_shaped(ctx, out, groups, shaped, inst, match, gpu_ns, in_graph, shapes[0], tree)
    out["count"] = len(groups)
    out["attributed_ms"] = _ms(sum(g["gpu_ns"] for g in groups.values()))
    # equal GPU times (operators that launched nothing: 0) in name and shape order, not in the
    # order the file happened to list them
    ranked = sorted(groups.values(), key=lambda g: (-g["gpu_ns"], g["name"], g["shapes"] or ""))[:max(int(top), 0)]
    out["top"] = [_row(g, name_dev, bw) for g in ranked]
    return out


def _add_shaped(ctx: Context, out: dict[str, Any], groups: dict[tuple, dict[str, Any]], shaped: np.ndarray,
                inst: np.ndarray, match: np.ndarray, gpu_ns: np.ndarray, in_graph: np.ndarray, t, tree) -> None:
    """Add the operator instances ``shaped`` (positions in ``inst``, in order; each matched to the
    ``OpTable`` row ``match``) to ``groups``, keyed by name and shapes.

    Instances with the same name, shapes, dtypes and arguments do the same work, so the formulas
    run once per distinct combination (a training loop repeats a few hundred of them step after
    step), and the sums per group are made at C speed, in the instances' order: the same floats as
    adding them one at a time. A graph replay whose work the trace does not count is left out of
    the groups and added to the uncovered time, one instance at a time as before (each sum is
    rounded)."""
    ev = ctx.trace.events
    names = ctx.trace.names
    rows = match[shaped]
    key = np.stack([ev.name[inst[shaped]].astype(np.int64),
                    *(_text_codes(column, rows) for column in (t.dims, t.types, t.concrete))], axis=1)
    distinct_keys, first, which = np.unique(key, axis=0, return_index=True, return_inverse=True)
    which = which.ravel()
    facts = []  # per distinct key: (name, shape text, bytes, dtype, FLOPs from shapes)
    for name_id, i in zip(distinct_keys[:, 0].tolist(), rows[first].tolist()):
        name = names[name_id]
        dims, types = t.dims[i], t.types[i] or []
        fs = None
        if flops.in_family(name) or flops.CONV_BWD_PARTS.search(name):
            table, bwd_out = tree()
            fs = flops.shape_flops(table, i, bwd_out) or _conv_part_flops(table, i)
        facts.append((name, _shape_text(dims), _bytes(name, dims, types) if dims else None, flops._dtype(types), fs))
    counted = t.flops[rows]
    profiler = counted > 0
    fs_known, fs_value = _per_instance([f[4] for f in facts], which)
    known = profiler | fs_known
    value = np.where(profiler, counted, np.where(fs_known, fs_value, 0.0))
    skipped = in_graph[shaped] & ~known
    for j in shaped[skipped].tolist():
        out["graph_uncovered_ms"] = round(out["graph_uncovered_ms"] + gpu_ns[j] / MS, 4)
        out["uncovered_ms"] = round(out["uncovered_ms"] + gpu_ns[j] / MS, 4)
    kept = np.flatnonzero(~skipped)
    if kept.size == 0:
        return
    which, known, value, profiler = which[kept], known[kept], value[kept], profiler[kept]
    # one group per (name, shape text), numbered in the order their first instance comes
    group_ids: dict[tuple, int] = {}
    group_of_key = np.array([group_ids.setdefault((f[0], f[1]), len(group_ids)) for f in facts], dtype=np.int64)
    # (dense: a group whose every instance was left out above has no number here)
    _, starts, group = np.unique(group_of_key[which], return_index=True, return_inverse=True)
    group = group.ravel()
    order = np.argsort(starts, kind="stable")
    entries = []
    for g in order.tolist():
        j = int(starts[g])  # the group's first instance gives its dtype and FLOP source
        name, shape_text, _, dtype, _ = facts[int(which[j])]
        src = "profiler" if profiler[j] else ("shapes" if known[j] else None)
        entries.append(groups.setdefault((name, shape_text), {
            "name": name, "shapes": shape_text, "count": 0, "gpu_ns": 0.0, "flops": 0.0, "flops_known": 0,
            "bytes": 0.0, "bytes_known": 0, "dtype": dtype, "flops_source": src}))
    has_bytes, nbytes = _per_instance([f[2] for f in facts], which)
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    slot = rank[group]  # each instance's entry
    sums = {}
    for field, weights in (("gpu_ns", gpu_ns[shaped][kept]), ("flops", value), ("bytes", nbytes)):
        acc = np.array([e[field] for e in entries], dtype=np.float64)
        np.add.at(acc, slot, weights)  # one instance after another, as a loop adds them
        sums[field] = acc.tolist()
    counts = {"count": np.bincount(slot, minlength=order.size), "flops_known": np.bincount(slot, weights=known, minlength=order.size),
              "bytes_known": np.bincount(slot, weights=has_bytes, minlength=order.size)}
    for k, e in enumerate(entries):
        for field in ("gpu_ns", "flops", "bytes"):
            e[field] = sums[field][k]
        for field, c in counts.items():
            e[field] += int(c[k])


def _per_instance(values: list, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A fact per distinct key (a number, or None when unknown), spread to the instances that
    ``which`` maps to their keys: (known, value with 0.0 where unknown)."""
    known = np.array([v is not None for v in values], dtype=bool)
    value = np.array([0.0 if v is None else v for v in values], dtype=np.float64)
    return known[which], value[which]


def _text_codes(column: list, rows: np.ndarray) -> np.ndarray:
    """A code per row of ``rows`` for the text of ``column[row]`` (the raw shapes lists): rows
    whose values print the same get the same code. The table shares one list between the rows
    that recorded the same text, so each distinct list is printed once."""
    values = [column[i] for i in rows.tolist()]
    ids = np.fromiter(map(id, values), dtype=np.int64, count=len(values))
    _, first, which = np.unique(ids, return_index=True, return_inverse=True)
    codes: dict[str, int] = {}
    code_of_id = np.array([codes.setdefault(str(values[i]), len(codes)) for i in first.tolist()], dtype=np.int64)
    return code_of_id[which.ravel()]


def _conv_part_flops(ops, i: int) -> float | None:
    """A convolution backward's half (``aten::cudnn_convolution_backward_input``/``_weight``,
    recorded inside ``aten::cudnn_convolution_backward``): each does the forward's FLOPs,
    2 · numel(grad_output) · (C_in/groups · kernel), as :func:`flops._conv_backward` counts per
    part. The weight's shape comes from the input (``_input``) or from the enclosing backward."""
    t = ops.t
    m = flops.CONV_BWD_PARTS.search(t.name[i])
    if not m:
        return None
    g = flops._tensor(t.dims[i], 1)
    w = flops._tensor(t.dims[i], 2) if m.group(1) == "input" else None
    p = ops.parent[i]
    if w is None and p >= 0 and (t.name[p] in flops.CONV_BWD_GRAD_FIRST or t.name[p] in flops.CONV_BWD_INPUT_FIRST):
        w = flops._tensor(t.dims[p], 2)
    if not g or not w or len(g) != len(w):
        return None
    return 2.0 * flops._numel(g) * flops._numel(w[1:])


def _shape_text(dims) -> str | None:
    """``"141x512, 512x512"``: each input's sizes, ``-`` for a non-tensor input (trailing ones
    dropped)."""
    parts = ["x".join(str(x) for x in d) if isinstance(d, list) and d else "-" for d in dims or ()]
    while parts and parts[-1] == "-":
        parts.pop()
    return ", ".join(parts) or None


def least_efficient(m: Metrics, below: float) -> OperatorRow | None:
    """Of ``metrics.operators.top``, the operator with the most GPU time whose achieved rate is
    under ``below`` of its dtype's peak (None when no operator's rate is known)."""
    ops = m.operators
    rows = [] if ops is None else [r for r in ops.top if r.frac_of_peak is not None and r.frac_of_peak < below]
    return max(rows, key=lambda r: r.gpu_ms) if rows else None


def _row(g: dict[str, Any], device_name: str, bw: float | None) -> dict[str, Any]:
    """One operator's row; FLOPs and bytes only when known for every instance (else ``None``:
    a partial sum would understate the rate)."""
    sec = g["gpu_ns"] / 1e9
    fl = g["flops"] if g["flops_known"] == g["count"] and g["flops_known"] else None
    by = g["bytes"] if g["bytes_known"] == g["count"] and g["bytes_known"] else None
    dtype = g["dtype"]
    peak, _ = devices.peak_tflops(device_name, dtype)
    row: dict[str, Any] = {
        "name": g["name"], "shapes": g["shapes"], "count": g["count"], "gpu_ms": _ms(g["gpu_ns"]),
        "flops": fl, "bytes": by, "dtype": dtype, "flops_source": g["flops_source"] if fl is not None else None,
        "tflops": round(fl / sec / 1e12, 4) if fl is not None and sec > 0 else None,
        "tbps": round(by / sec / 1e12, 4) if by is not None and sec > 0 else None,
        "intensity": round(fl / by, 3) if fl is not None and by else None,
        "peak_tflops": peak, "peak_tbps": bw, "bound": None, "frac_of_peak": None, "frac_of_roof": None,
        "above_peak": False,
    }
    if row["tflops"] is not None and peak:
        row["frac_of_peak"] = round(row["tflops"] / peak, 4)
        # above the peak: the kernels did fewer FLOPs than the formula counts (Winograd or FFT
        # convolutions) or ran in a faster dtype than the inputs' (TF32 for FP32 inputs)
        row["above_peak"] = row["frac_of_peak"] > 1.0
    if row["intensity"] is not None and peak and bw:
        ridge = peak / bw  # FLOPs per byte where the roofs meet (TFLOP/s ÷ TB/s)
        row["bound"] = "compute" if row["intensity"] >= ridge else "memory"
        roof = min(peak, row["intensity"] * bw)
        row["frac_of_roof"] = round(row["tflops"] / roof, 4) if roof > 0 else None
    return row
