"""FLOPs of the matmul-family and convolution operators in a window, and ``metrics["compute"]``.

Where the numbers come from, best first:

- ``"profiler"``: ``torch.profiler(with_flops=True)`` writes ``args["flops"]`` on the operators
  it has a formula for (matmuls and ``conv2d`` forward; PyTorch ``torch/csrc/profiler/util.cpp``,
  ``computeFlops``). Work it has no formula for (convolution backward, attention) is added from
  shapes.
- ``"shapes"``: from ``record_shapes=True``'s input sizes, with the usual counts (a multiply-add is
  2 FLOPs): ``mm``/``addmm`` ``2·M·K·N``, ``bmm``/``baddbmm`` ``2·B·M·K·N``, ``linear`` ``2·rows·in·out``,
  a convolution ``2 · numel(output) · Cin/groups · kernel area`` (= ``2 · numel(output) ·
  prod(weight.shape[1:])``), its backward the same per gradient it computes (input and weight:
  2× the forward), attention ``2·B·H·L·S·(D + Dv)`` forward and 2.5× that backward (five matmuls
  instead of two; FlashAttention-2 paper, Dao 2023, §4 counts the same).

Each piece of work counts once: an operator of the family counts only when no enclosing operator
on its thread is of the family (``aten::linear`` counts, the ``aten::addmm`` inside it does not).
A convolution's output size comes from its recorded stride/padding (``Concrete Inputs``, torch ≥
2.1); old traces record neither, so it comes from the backward operator of the same input and
weight shapes (whose ``grad_output`` has the output's size), or else from the input of the next
operator on the thread that takes a tensor of the output's batch and channels.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis import devices
from gpumagic.analysis import names as nm
from gpumagic.report.metrics import ComputeMetrics

MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                        "aten::_addmm_activation", "aten::addbmm", "aten::_scaled_mm"})
CONV_RE = re.compile(r"^aten::(conv[123]d|convolution|_convolution|cudnn_convolution(_relu|_add_relu)?|"
                     r"miopen_convolution|miopen_depthwise_convolution|mkldnn_convolution|_slow_conv2d_forward|"
                     r"slow_conv2d_forward|thnn_conv2d|_nnpack_spatial_convolution|slow_conv3d)$")
CONV_T_RE = re.compile(r"^aten::(conv_transpose[123]d|cudnn_convolution_transpose|miopen_convolution_transpose|"
                       r"slow_conv_transpose[23]d)$")
#: Backward with (grad_output, input, weight): today's ``convolution_backward`` and the slow paths.
CONV_BWD_GRAD_FIRST = frozenset({"aten::convolution_backward", "aten::slow_conv2d_backward",
                                 "aten::thnn_conv2d_backward", "aten::_slow_conv2d_backward"})
#: Backward with (input, grad_output, weight): the cuDNN/MIOpen/oneDNN backward of torch < 1.11.
CONV_BWD_INPUT_FIRST = frozenset({"aten::cudnn_convolution_backward", "aten::miopen_convolution_backward",
                                  "aten::mkldnn_convolution_backward"})
CONV_BWD_PARTS = re.compile(r"_convolution_backward_(input|weight)$")
ATTN_FWD = frozenset({"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
                      "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
                      "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math"})
ATTN_FWD_BLHD = frozenset({"aten::_flash_attention_forward", "aten::_efficient_attention_forward"})
ATTN_BWD = frozenset({"aten::_scaled_dot_product_flash_attention_backward",
                      "aten::_scaled_dot_product_efficient_attention_backward",
                      "aten::_scaled_dot_product_cudnn_attention_backward",
                      "aten::_scaled_dot_product_flash_attention_for_cpu_backward"})
ATTN_BWD_BLHD = frozenset({"aten::_flash_attention_backward", "aten::_efficient_attention_backward"})
ATTN_BWD_FACTOR = 2.5
#: Where each attention operator takes ``is_causal`` (aten/src/ATen/native/native_functions.yaml):
#: a causal mask skips half of the score matrix.
CAUSAL_ARG = {"aten::scaled_dot_product_attention": 5, "aten::_scaled_dot_product_flash_attention": 4,
              "aten::_scaled_dot_product_efficient_attention": 6, "aten::_scaled_dot_product_cudnn_attention": 6,
              "aten::_flash_attention_forward": 8, "aten::_scaled_dot_product_flash_attention_backward": 11,
              "aten::_scaled_dot_product_efficient_attention_backward": 11}
#: ``Input type`` strings → the dtypes ``metrics.compute.dtype`` names.
DTYPES = {"float": "fp32", "c10::Half": "fp16", "Half": "fp16", "c10::BFloat16": "bf16", "BFloat16": "bf16",
          "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
          "c10::Float8_e5m2fnuz": "fp8", "double": "fp64"}
#: How far ahead on a thread to look for the operator that consumes a convolution's output.
NEXT_OP_LOOKAHEAD = 40


def in_family(name: str) -> bool:
    return (name in MATMUL_OPS or name in ATTN_FWD or name in ATTN_FWD_BLHD or name in ATTN_BWD
            or name in ATTN_BWD_BLHD or name in CONV_BWD_GRAD_FIRST or name in CONV_BWD_INPUT_FIRST
            or bool(CONV_RE.match(name) or CONV_T_RE.match(name)))


def _numel(shape) -> int:
    return int(fprod(shape)) if shape else 0


def fprod(values) -> float:
    """``float(np.prod(values, dtype=np.float64))`` for a short list of sizes, the same number
    (numpy multiplies a reduction's float64 values one after another, as this loop does) at a
    tenth of the cost: it runs for every operator instance whose FLOPs or bytes are counted."""
    p = 1.0
    for x in values:
        p *= float(x)
    return p


def _tensor(dims, i) -> list[int] | None:
    if i < len(dims) and isinstance(dims[i], list) and dims[i] and all(isinstance(x, int) for x in dims[i]):
        return dims[i]
    return None


def _concrete(concrete, i):
    """A recorded scalar/list input: ``"[2, 2]"`` → [2, 2]; ``"1"`` → 1; else None."""
    if not concrete or i >= len(concrete) or not isinstance(concrete[i], str) or not concrete[i]:
        return None
    text = concrete[i].strip()
    if text in ("True", "False"):
        return text == "True"
    nums = re.findall(r"-?\d+", text)
    if text.startswith("["):
        return [int(x) for x in nums]
    if text in ("same", "'same'", "valid", "'valid'"):
        return text.strip("'")
    return int(nums[0]) if len(nums) == 1 and re.fullmatch(r"-?\d+\.?", text) else None


def matmul_flops(name: str, dims: list) -> float | None:
    if name in ("aten::mm", "aten::_scaled_mm"):
        a, b = _tensor(dims, 0), _tensor(dims, 1)
        return 2.0 * a[0] * a[1] * b[1] if a and b and len(a) == 2 and len(b) == 2 else None
    if name in ("aten::addmm", "aten::_addmm_activation"):
        a, b = _tensor(dims, 1), _tensor(dims, 2)
        return 2.0 * a[0] * a[1] * b[1] if a and b and len(a) == 2 and len(b) == 2 else None
    if name in ("aten::bmm", "aten::baddbmm", "aten::addbmm"):
        a, b = (_tensor(dims, 0), _tensor(dims, 1)) if name == "aten::bmm" else (_tensor(dims, 1), _tensor(dims, 2))
        return 2.0 * a[0] * a[1] * a[2] * b[2] if a and b and len(a) == 3 and len(b) == 3 else None
    if name == "aten::linear":
        x, w = _tensor(dims, 0), _tensor(dims, 1)
        if not x or not w:
            return None
        out = w[0] if len(w) == 2 else 1
        return 2.0 * _numel(x) * out
    if name == "aten::matmul":  # broadcast batch dims; a 1-D operand is a vector
        a, b = _tensor(dims, 0), _tensor(dims, 1)
        if not a or not b:
            return None
        batch = max(_numel(a[:-2]) if len(a) > 2 else 1, _numel(b[:-2]) if len(b) > 2 else 1)
        m = a[-2] if len(a) >= 2 else 1
        n = b[-1] if len(b) >= 2 else 1
        return 2.0 * batch * m * a[-1] * n
    return None


def attention_flops(name: str, dims: list, concrete) -> float | None:
    """``2·B·H·L·S·(D + Dv)``, halved for a causal mask (when ``is_causal`` was recorded), ×2.5 for
    a backward."""
    off = 1 if name in ATTN_BWD or name in ATTN_BWD_BLHD else 0
    q, k, v = _tensor(dims, off), _tensor(dims, off + 1), _tensor(dims, off + 2)
    if not q or not k or not v or len(q) != 4 or len(k) != 4 or len(v) != 4:
        return None
    if name in ATTN_FWD_BLHD or name in ATTN_BWD_BLHD:  # (batch, seq, heads, dim)
        b, lq, h, d = q
        s, dv = k[1], v[3]
    else:  # (batch, heads, seq, dim)
        b, h, lq, d = q
        s, dv = k[2], v[3]
    flops = 2.0 * b * h * lq * s * (d + dv)
    if name in CAUSAL_ARG and _concrete(concrete, CAUSAL_ARG[name]) is True:
        flops /= 2
    return flops * (ATTN_BWD_FACTOR if off else 1.0)


def conv_out_spatial(name: str, x: list[int], w: list[int], concrete) -> list[int] | None:
    """The output's spatial sizes from recorded stride/padding/dilation, when recorded."""
    if name.startswith("aten::cudnn_convolution") or name.startswith("aten::miopen_") or name == "aten::mkldnn_convolution":
        pad_i, stride_i, dil_i = 2, 3, 4
    else:  # conv2d, convolution, _convolution, slow paths: (input, weight, bias, stride, padding, dilation, ...)
        stride_i, pad_i, dil_i = 3, 4, 5
    stride, pad, dil = _concrete(concrete, stride_i), _concrete(concrete, pad_i), _concrete(concrete, dil_i)
    nsp = len(x) - 2
    if stride is None or pad is None:
        return None
    if pad == "same":
        return list(x[2:])
    pad = 0 if pad == "valid" else pad

    def per_dim(v, default):
        if v is None:
            return [default] * nsp
        return v * nsp if isinstance(v, list) and len(v) == 1 else (v if isinstance(v, list) else [v] * nsp)

    s, p, d = per_dim(stride, 1), per_dim(pad, 0), per_dim(dil, 1)
    if len(s) != nsp or len(p) != nsp or len(d) != nsp:
        return None
    return [(x[2 + i] + 2 * p[i] - d[i] * (w[2 + i] - 1) - 1) // s[i] + 1 for i in range(nsp)]


def _dtype(types: list) -> str | None:
    for t in types[:3] if types else ():
        if t in DTYPES:
            return DTYPES[t]
    return None


class _Ops:
    """The operator table with each operator's parent (the enclosing operator on its thread).

    Built once per table (:meth:`of`): the whole window's FLOPs, the steady part's and the
    operators' table share it."""

    def __init__(self, table):
        self.t = table
        self.end = table.ts_ns + table.dur_ns
        order = np.lexsort((-table.dur_ns, table.ts_ns, table.lane))
        parent = _nested_parents(table.lane[order], table.ts_ns[order], self.end[order], table.dur_ns[order])
        if parent is None:  # operators that overlap without nesting: the stack walk decides
            self.parent = _stack_parents(table.lane, table.ts_ns, self.end, order)
        else:
            self.parent = np.full(len(table), -1, dtype=np.int64)
            self.parent[order] = np.where(parent >= 0, order[np.maximum(parent, 0)], -1)
        # each operator's children in the walk's order (thread, start, longest first), as runs of
        # one list: an owner's run is found through a dict made at C speed (slicing a list per
        # owner up front cost 27 ms on the 35 MB ResNet-50 trace, for the few owners walked)
        kids = order[self.parent[order] >= 0]
        kids = kids[np.argsort(self.parent[kids], kind="stable")]
        owners, first = np.unique(self.parent[kids], return_index=True)
        self._bounds: list[int] = [*first.tolist(), kids.size]
        self._kids: list[int] = kids.tolist()
        self._run: dict[int, int] = dict(zip(owners.tolist(), range(owners.size)))
        self.up: list[int] = self.parent.tolist()  # the parents as Python ints, for the walks below
        self._bwd_out: dict[tuple, list[int]] | None = None

    def children(self, i: int) -> list[int]:
        """Operator ``i``'s children, in the walk's order."""
        k = self._run.get(i)
        return [] if k is None else self._kids[self._bounds[k]:self._bounds[k + 1]]

    def steps_up(self, j: int, i: int) -> int:
        """How many parent links lead from ``j`` up to its ancestor ``i``."""
        up, n = self.up, 0
        while j != i:
            j, n = up[j], n + 1
        return n

    @property
    def backward_outputs(self) -> dict[tuple, list[int]]:
        """:func:`_backward_outputs` of the table, computed once."""
        if self._bwd_out is None:
            self._bwd_out = _backward_outputs(self.t)
        return self._bwd_out

    @classmethod
    def of(cls, table) -> _Ops:
        """The tree of ``table``, built on first use and kept with it."""
        tree = table.__dict__.get("_ops_tree")
        if tree is None:
            tree = table.__dict__["_ops_tree"] = cls(table)
        return tree

    def descendants(self, i: int):
        todo = self.children(i)
        while todo:
            j = todo.pop()
            yield j
            todo.extend(self.children(j))

    def has_family_ancestor(self, i: int, family) -> bool:
        up = self.up
        p = up[i]
        while p >= 0:
            if family[p]:
                return True
            p = up[p]
        return False


def _stack_parents(lane: np.ndarray, start: np.ndarray, end: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each operator's parent by a walk over ``order`` (thread, start, longest first) with a
    stack of the operators still open: the top one, when it ends no earlier than the operator.
    Exact for any input, overlapping spans included; :func:`_nested_parents` is its fast twin."""
    parent = [-1] * len(lane)
    stack: list[int] = []
    current = None
    # Python lists, not numpy scalars, in the loop: 5-10x faster per operator, same values
    lanes, starts, ends = lane.tolist(), start.tolist(), end.tolist()
    for i in order.tolist():
        if lanes[i] != current:
            stack, current = [], lanes[i]
        while stack and ends[stack[-1]] <= starts[i]:
            stack.pop()
        if stack and ends[i] <= ends[stack[-1]]:
            parent[i] = stack[-1]
        stack.append(i)
    return np.array(parent, dtype=np.int64)


def _nested_parents(lane: np.ndarray, start: np.ndarray, end: np.ndarray, dur: np.ndarray) -> np.ndarray | None:
    """:func:`_stack_parents` vectorised, for operators given in walk order: the position of each
    one's parent (-1 for none), or None when some spans overlap without nesting (then the walk
    must decide). When every operator nests in the latest-started one still open at its start,
    the open operators always form a chain, the stack walk's stack is that chain, and the parent
    is the last earlier operator whose depth (the number of operators open at its start) is one
    less; each of those conditions is checked here."""
    n = lane.size
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return parent
    cut = np.flatnonzero(lane[1:] != lane[:-1]) + 1
    for a, b in zip([0, *cut.tolist()], [*cut.tolist(), n]):
        s, e, zero = start[a:b], end[a:b], dur[a:b] == 0
        m = b - a
        # earlier operators ended by each start: all that ended minus the later (or the same)
        # empty operators at the same start, which sort last among their start
        ended = np.searchsorted(np.sort(e), s, side="right")
        same_end = np.searchsorted(s, s, side="right")
        zeros = np.concatenate(([0], np.cumsum(zero)))
        ended -= zeros[same_end] - zeros[np.arange(m)]
        depth = np.arange(m) - ended
        if depth.min() < 0:
            return None
        p = np.full(m, -1, dtype=np.int64)
        for d in distinct(depth[depth > 0]).tolist():
            at = np.flatnonzero(depth == d - 1)
            sel = np.flatnonzero(depth == d)
            k = np.searchsorted(at, sel, side="left") - 1
            if (k < 0).any():
                return None
            p[sel] = at[k]
        has = p >= 0
        q = p[has]
        if not ((e[q] > s[has]).all() and (e[has] <= e[q]).all()):
            return None
        parent[a:b] = np.where(has, p + a, -1)
    return parent


def count(table, lo: int, hi: int) -> dict[str, Any]:
    """FLOPs of the family operators that start in ``[lo, hi)``: total, per dtype, the source."""
    out: dict[str, Any] = {"flops": 0.0, "by_dtype": defaultdict(float), "profiler": 0, "shapes": 0, "unresolved": 0, "units": []}
    if table is None or not len(table):
        return out
    ops = _Ops.of(table)
    names = table.name
    of_name = {n: in_family(n) for n in set(names)}  # once per distinct name
    family = np.fromiter(map(of_name.__getitem__, names), bool, len(names))
    has_flops = table.flops > 0
    bwd_out = ops.backward_outputs
    # plain lists for the per-operator walks (a numpy element read costs ten times more)
    family_l, has_l = family.tolist(), has_flops.tolist() if has_flops.any() else None
    for i in np.flatnonzero(family & (table.ts_ns >= lo) & (table.ts_ns < hi)).tolist():
        if ops.has_family_ancestor(i, family_l):
            continue
        flops, source = _unit_flops(ops, i, has_l, bwd_out)
        if flops is None:
            out["unresolved"] += 1
            continue
        out["flops"] += flops
        out[source] += 1
        out["units"].append(i)
        out["by_dtype"][_unit_dtype(ops, i, family_l) or "unknown"] += flops
    return out


def _unit_flops(ops: _Ops, i: int, has_flops, bwd_out) -> tuple[float | None, str]:
    """The profiler's count where it has one (the outermost counted operators inside the unit),
    else the count from shapes. ``has_flops``: per operator, whether the profiler counted it;
    None when it counted none."""
    t = ops.t
    if has_flops is not None:
        if has_flops[i]:
            return float(t.flops[i]), "profiler"
        inner = [j for j in ops.descendants(i) if has_flops[j] and not _has_counted_ancestor(ops, j, i, has_flops)]
        if inner:
            return float(t.flops[inner].sum()), "profiler"
    return shape_flops(ops, i, bwd_out), "shapes"


def _has_counted_ancestor(ops: _Ops, j: int, stop: int, has_flops) -> bool:
    up = ops.up
    p = up[j]
    while p >= 0 and p != stop:
        if has_flops[p]:
            return True
        p = up[p]
    return False


def _unit_dtype(ops: _Ops, i: int, family) -> str | None:
    """The dtype the work ran in: the innermost family operator's inputs (autocast casts inside
    ``aten::linear``, so the ``addmm`` within it shows the reduced precision)."""
    types = ops.t.types
    best, depth_best = _dtype(types[i]), 0
    for j in ops.descendants(i):
        if family[j] and _dtype(types[j]):
            depth = ops.steps_up(j, i)
            if depth > depth_best:
                best, depth_best = _dtype(types[j]), depth
    return best


def shape_flops(ops: _Ops, i: int, bwd_out) -> float | None:
    t = ops.t
    name, dims, concrete = t.name[i], t.dims[i], t.concrete[i]
    if name in MATMUL_OPS:
        return matmul_flops(name, dims)
    if name in ATTN_FWD or name in ATTN_FWD_BLHD or name in ATTN_BWD or name in ATTN_BWD_BLHD:
        return attention_flops(name, dims, concrete)
    if name in CONV_BWD_GRAD_FIRST or name in CONV_BWD_INPUT_FIRST:
        return _conv_backward(ops, i)
    x, w = _tensor(dims, 0), _tensor(dims, 1)
    if not x or not w or len(x) != len(w) or len(x) < 3:
        return None
    if CONV_T_RE.match(name) or (name in ("aten::convolution", "aten::_convolution") and _concrete(concrete, 6) is True):
        return 2.0 * _numel(x) * _numel(w[1:])
    spatial = conv_out_spatial(name, x, w, concrete) or bwd_out.get((tuple(x), tuple(w))) or _next_input(ops, i, x, w)
    if not spatial:
        return None
    return 2.0 * x[0] * w[0] * _numel(spatial) * _numel(w[1:])


def _conv_backward(ops: _Ops, i: int) -> float | None:
    t = ops.t
    name, dims = t.name[i], t.dims[i]
    g_i, x_i = (0, 1) if name in CONV_BWD_GRAD_FIRST else (1, 0)
    g, x, w = _tensor(dims, g_i), _tensor(dims, x_i), _tensor(dims, 2)
    if not g or not w:
        return None
    transposed = _concrete(t.concrete[i], 7) is True if name == "aten::convolution_backward" else False
    forward = 2.0 * _numel(x if transposed and x else g) * _numel(w[1:])
    parts = {m.group(1) for j in ops.descendants(i) if (m := CONV_BWD_PARTS.search(t.name[j]))}
    if parts:
        return forward * len(parts)
    text = t.concrete[i][-1] if t.concrete[i] else ""  # output_mask, e.g. "[True, True, False]"
    if isinstance(text, str) and text.startswith("["):
        flags = re.findall(r"True|False", text)
        if len(flags) >= 2:
            return forward * ((flags[0] == "True") + (flags[1] == "True"))
    return forward * 2


def _backward_outputs(table) -> dict[tuple, list[int]]:
    """(input shape, weight shape) → the output's spatial sizes, from convolution backward
    operators (their ``grad_output`` has the forward output's size)."""
    out: dict[tuple, list[int]] = {}
    for i, name in enumerate(table.name):
        if name in CONV_BWD_GRAD_FIRST or name in CONV_BWD_INPUT_FIRST:
            g_i, x_i = (0, 1) if name in CONV_BWD_GRAD_FIRST else (1, 0)
            g, x, w = _tensor(table.dims[i], g_i), _tensor(table.dims[i], x_i), _tensor(table.dims[i], 2)
            if g and x and w and len(g) == len(x) >= 3:
                out.setdefault((tuple(x), tuple(w)), g[2:])
    return out


def _next_input(ops: _Ops, i: int, x: list[int], w: list[int]) -> list[int] | None:
    """The spatial sizes of the first later operator on the thread (after the convolution and
    its enclosing convolution operators end) whose first input has the output's batch and
    channels."""
    t = ops.t
    end = ops.end[i]
    lane = t.lane[i]
    cand = np.flatnonzero((t.lane == lane) & (t.ts_ns >= end))[:NEXT_OP_LOOKAHEAD]
    for j in cand.tolist():
        y = _tensor(t.dims[j], 0)
        if y and len(y) == len(x) and y[0] == x[0] and y[1] == w[0]:
            return y[2:]
    return None


#: FP32 matmuls count as TF32 when kernels whose names say TF32 carry most of the matmul
#: kernel time (cuBLAS/cutlass put ``tf32`` in the name, e.g. ``cutlass_80_tensorop_s1688tf32gemm``
#: and ``sm80_xmma_gemm_f32f32_tf32f32``; on Ampere ``s1688gemm`` tensor-op kernels on FP32 data
#: are TF32 too: FP32 has no tensor-core path of its own). AMD's Tensile/hipBLASLt GEMMs say
#: xfloat32, its twin, with ``_MX`` (``names.says_xf32``).
TF32_KERNEL_RE = re.compile(r"tf32|tensorop_s1688|tensorop_s16816", re.IGNORECASE)


def metrics(ctx) -> ComputeMetrics:
    """``metrics.compute`` (docs/metrics.md): FLOPs over the window, achieved TFLOP/s, the
    device's peak for the dtype the matmuls ran in, and MFU = achieved / peak."""
    c = count(ctx.trace.ops, ctx.lo, ctx.hi)
    name = _device_name(ctx)
    peak = devices.peak_for(name)
    out: dict[str, Any] = {"flops": None, "flops_per_step": None, "achieved_tflops": None, "peak_tflops": None,
                           "mfu": None, "flops_source": None, "dtype": None, "device_name": name or None,
                           "device_sku": peak.sku if peak else None, "peak_source": None,
                           "ops_counted": c["profiler"] + c["shapes"], "ops_unresolved": c["unresolved"],
                           "matmul_kernel_tflops": None, "flops_coverage": None, "mfu_lower_bound": None}
    out["flops_coverage"] = coverage(ctx, c)
    if out["ops_counted"]:
        _efficiency(ctx, c, name, out)
    return ComputeMetrics(**out)


def _efficiency(ctx, c: dict[str, Any], name: str, out: dict[str, Any]) -> None:
    """Fill ``out`` (the compute fields) from the counted FLOPs ``c``."""
    dtype = max(c["by_dtype"].items(), key=lambda kv: kv[1])[0]
    dtype = None if dtype in ("unknown", "fp64") else dtype
    if dtype == "fp32" and _tf32_kernels(ctx):
        dtype = "tf32"
    flops = c["flops"]
    seconds = ctx.window_ns / 1e9
    out.update(flops=flops, achieved_tflops=round(flops / seconds / 1e12, 6), dtype=dtype,
               flops_source="profiler" if c["profiler"] else "shapes")
    if ctx.step_bounds:
        out["flops_per_step"] = flops / len(ctx.step_bounds)
    mm_ns = _matmul_kernel_ns(ctx)
    if mm_ns:
        out["matmul_kernel_tflops"] = round(flops / (mm_ns / 1e9) / 1e12, 4)
    tflops, source = devices.peak_tflops(name, dtype)
    cov = out["flops_coverage"]
    if tflops and cov is not None and cov < COVERAGE_LOWER_BOUND:
        out.update(peak_tflops=tflops, peak_source=source)  # withheld: the FLOPs miss most matmul work
    elif tflops:
        out.update(peak_tflops=tflops, peak_source=source, mfu=round(out["achieved_tflops"] / tflops, 4),
                   mfu_lower_bound=bool(cov is not None and cov < COVERAGE_FULL))
        if out["matmul_kernel_tflops"] is not None and out["matmul_kernel_tflops"] > tflops:
            out["matmul_kernel_tflops"] = None  # above peak: some matmul kernels were not recognised by name


#: MFU is stated when the counted FLOPs cover at least 90 % of the matmul-family kernel time
#: (the kernels launched inside counted operators); from 50 % it is a lower bound
#: (``mfu_lower_bound``); below, it is withheld (``mfu`` null): kernels replayed by graphs, with
#: no launching operator, or non-matmul kernels matching a matmul name did work nobody counted.
COVERAGE_FULL = 0.9
COVERAGE_LOWER_BOUND = 0.5


def coverage(ctx, c: dict) -> float | None:
    """Share of the primary GPU's matmul-family kernel time (matmul, convolution, attention
    names) launched from inside an operator whose FLOPs were counted; ``None`` without such
    kernels. A kernel replayed by a graph launch or without a launching call is not covered."""
    if ctx.device < 0:
        return None
    ev = ctx.trace.events
    k = np.flatnonzero(_matmul_mask(ctx))
    total = float(ev.dur_ns[k].sum())
    if not total:
        return None
    table, units = ctx.trace.ops, c.get("units") or []
    if table is None or not units:
        return 0.0
    u = np.array(units, dtype=np.int64)
    by = ctx.launch_row[k]
    ok = by >= 0
    covered = np.zeros(k.size, dtype=bool)
    lt, ll = ev.ts_ns[np.maximum(by, 0)], ev.lane[np.maximum(by, 0)]
    for lane in distinct(table.lane[u]).tolist():
        mine = u[table.lane[u] == lane]
        s, e = _union(table.ts_ns[mine], table.ts_ns[mine] + table.dur_ns[mine])
        j = np.searchsorted(s, lt, side="right") - 1
        covered |= ok & (ll == lane) & (j >= 0) & (lt < e[np.maximum(j, 0)])
    return round(float(ev.dur_ns[k[covered]].sum()) / total, 4)


def _union(s: np.ndarray, e: np.ndarray):
    from gpumagic.analysis import intervals as iv
    return iv.union(s, e)


def _device_name(ctx) -> str:
    """The primary GPU's name; when its id is not in ``deviceProperties`` (ROCm traces number
    kernels' devices differently) but every listed device has the same name, that name."""
    if ctx.device < 0:
        return ""
    info = ctx.trace.device_info(ctx.device)
    if info is not None:
        return info.name
    names = {d.name for d in ctx.trace.devices}
    return names.pop() if len(names) == 1 else ""


def _matmul_mask(ctx) -> np.ndarray:
    return ctx.events_in_window(ctx.masks["kernel"] & ctx.masks["name_matmul"]) & ctx.on_device


def _matmul_kernel_ns(ctx) -> int:
    return int(ctx.trace.events.dur_ns[_matmul_mask(ctx)].sum()) if ctx.device >= 0 else 0


def _tf32_kernels(ctx) -> bool:
    if ctx.device < 0:
        return False
    ev = ctx.trace.events
    sel = _matmul_mask(ctx)
    total = ev.dur_ns[sel].sum()
    if not total:
        return False
    ids = np.flatnonzero(ctx.trace.name_ids(lambda n: bool(TF32_KERNEL_RE.search(n)) or nm.says_xf32(n)))
    return bool(ev.dur_ns[sel & np.isin(ev.name, ids)].sum() * 2 > total)
