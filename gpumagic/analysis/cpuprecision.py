"""16-bit floating point on the CPU: what the CPU computes natively, and which operators ran in it.

``support`` reads the CPU features a gpumagic capture records (``machine.cpu_flags``, from
``/proc/cpuinfo``): on x86, AVX512_BF16 or AMX-BF16 compute bfloat16 natively; with
AVX512BW/VL/DQ alone oneDNN computes bfloat16 by converting to FP32 (PyTorch's
``mkldnn_bf16_device_check``, ``aten/src/ATen/native/mkldnn/Utils.h``); without them PyTorch
falls back to its generic kernels (``aten::_slow_conv2d_forward`` for a convolution). float16 is
native with AVX512_FP16 or AMX-FP16 (``mkldnn_fp16_device_check``). On Arm, FEAT_BF16
(``bf16``) computes bfloat16; float16 on Arm is left unknown.

``low_precision`` finds the matrix operators that ran in 16 bits on the host, two ways:

- autocast's casts: ``torch.autocast("cpu")`` casts the inputs of the operators it runs in lower
  precision (``aten/src/ATen/autocast_mode.cpp``, the CPU ``lower_precision_fp`` list: linear,
  matmul, mm, addmm, bmm, baddbmm, addbmm, the convolutions, prelu...) inside the operator's own
  call and then calls the operator again on the cast inputs (its ``WrapFunction_`` calls the
  ``at::`` function with autocast's key excluded), so the profiler records an ``aten::linear``
  holding ``aten::to`` calls directly, beside an inner ``aten::linear``. Both must be there: a
  user's ``.to()`` runs between operators, not inside one, and other layers that nest an
  operator in itself do not cast its inputs (``torch.func.vmap``'s batching rules nest
  ``aten::addmm`` in ``aten::addmm`` and cast a Python scalar to a tensor deep inside, in an
  ``aten::mul``). Attention is left out of this evidence: its math path casts in FP32 too;
- recorded dtypes (``--shapes``): an operator of the family whose first inputs are
  ``c10::BFloat16`` or ``c10::Half`` (a model cast with ``.to(torch.bfloat16)`` included).

``float64`` finds the same operators computing in double precision: their recorded first input
types (``double``, ``c10::complex<double>``, with ``--shapes``), and the elements of the
parameters the optimizers held (``capture.optimizer_parameter_elements``, read by a gpumagic
capture at each optimizer's first step): a model whose parameters are float64 computes its
forward and backward in float64 (an ``nn.Linear`` of float64 weights refuses float32 inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpumagic._arrays import distinct
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.operators import parent_op
from gpumagic.trace.model import EventTable, meta_block

#: The operators CPU autocast runs in lower precision whose calls show its casts (the CPU
#: ``lower_precision_fp`` list of ``aten/src/ATen/autocast_mode.cpp``, attention left out).
CAST_EVIDENCE_OPS = frozenset({
    "aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm",
    "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::conv_transpose1d", "aten::conv_transpose2d",
    "aten::conv_transpose3d", "aten::_convolution", "aten::conv_tbc", "aten::prelu", "aten::linalg_vecdot",
})
#: The matrix work of a step, forward and backward: its time bounds what a faster precision saves.
COMPUTE_OPS = CAST_EVIDENCE_OPS | frozenset({
    "aten::convolution", "aten::convolution_backward", "aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward",
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "aten::_native_multi_head_attention",
})
CASTS = frozenset({"aten::to", "aten::_to_copy"})
#: PyTorch's generic convolutions, which run where oneDNN cannot take the dtype.
SLOW_CONV = frozenset({"aten::_slow_conv2d_forward", "aten::thnn_conv2d", "aten::slow_conv3d_forward",
                       "aten::slow_conv_transpose2d"})
#: ``Input type`` strings of double-precision tensors (real and complex), as the profiler records them.
DOUBLE_TYPES = frozenset({"double", "c10::complex<double>"})
#: ``Input type`` strings of the other floating-point tensors: a call with one of these first is
#: a matrix operator that did not run in double precision.
FLOAT_TYPES = frozenset({"float", "c10::BFloat16", "BFloat16", "c10::Half", "Half", "c10::complex<float>"})
#: ``Input type`` strings of the 16-bit floats.
LOW_TYPES = {"c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16", "Half": "fp16"}
#: The optimizers' parameter dtypes as the capture names them (``capture.optimizer_parameter_elements``),
#: for the 16-bit ones.
PARAM_LOW = {"bfloat16": "bf16", "float16": "fp16"}
#: A model cast to 16 bits (``model.half()``, ``.bfloat16()``): at least this share of the optimizers'
#: parameter elements in one 16-bit type.
MIN_PARAM_SHARE = 0.5
X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})
ARM = frozenset({"aarch64", "arm64", "armv8l"})


def support(machine: dict[str, Any]) -> dict[str, str | None]:
    """``{"bf16": s, "fp16": s}``, each ``"native"``, ``"emulated"`` (bfloat16 through FP32 on
    AVX-512), ``"none"`` (generic kernels) or None (unknown: no features recorded, or an
    architecture not read here)."""
    flags, arch = machine.get("cpu_flags"), str(machine.get("arch") or "").lower()
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        return {"bf16": None, "fp16": None}
    have = set(flags)
    if arch in X86 or (not arch and have & {"avx2", "avx512f"}):
        bf16 = ("native" if have & {"avx512_bf16", "amx_bf16"} else
                "emulated" if {"avx512bw", "avx512vl", "avx512dq"} <= have else "none")
        fp16 = "native" if have & {"avx512_fp16", "amx_fp16"} else "none"
        return {"bf16": bf16, "fp16": fp16}
    if arch in ARM:
        return {"bf16": "native" if "bf16" in have else "none", "fp16": None}
    return {"bf16": None, "fp16": None}


@dataclass(frozen=True)
class LowPrecision:
    """The host's matrix operators seen running in 16 bits in the window."""

    #: calls holding autocast's casts, and calls with 16-bit inputs recorded (``--shapes``)
    autocast_calls: int
    typed_calls: dict[str, int]
    #: the matrix operators' time on the host (union, ns) and its intervals
    compute_ns: int
    compute: iv.Intervals
    #: every host operator's time (union, ns): under autocast all of them run on 16-bit tensors
    #: or cast between the types, not only the matrix ones
    ops_ns: int = 0
    #: calls of PyTorch's generic convolution, which runs where oneDNN cannot take the dtype
    slow_conv_calls: int = 0
    #: the 16-bit types holding at least :data:`MIN_PARAM_SHARE` of the optimizers' parameter elements
    #: (a model cast to 16 bits, seen without ``--shapes``), and that share
    param_types: tuple[str, ...] = ()
    param_share: float = 0.0

    @property
    def calls(self) -> int:
        return self.autocast_calls + sum(self.typed_calls.values())

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The 16-bit types they ran in: from the recorded dtypes, else the parameters' 16-bit type,
        else autocast's bf16 or fp16."""
        typed = tuple(sorted(d for d, n in self.typed_calls.items() if n))
        return typed or self.param_types or (("bf16", "fp16") if self.autocast_calls else ())


def low_precision(ctx: Context) -> LowPrecision:
    """The window's 16-bit matrix operators on the host (computed once per context)."""
    return ctx.memo("cpu_low_precision", _find)


def _find(ctx: Context) -> LowPrecision:
    ev, m = ctx.trace.events, ctx.masks
    ops = ctx.events_in_window(m["cpu_op"] & m["host"])
    family = _compute_family(ctx, ops)
    compute = ctx.intervals(family)
    types, share = _param_types(ctx)
    return LowPrecision(autocast_calls=autocast_calls(ctx, ops), typed_calls=_typed(ctx),
                        compute_ns=iv.total(compute), compute=compute, ops_ns=iv.total(ctx.intervals(ops)),
                        slow_conv_calls=int((ops & ctx.trace.name_ids(lambda n: n in SLOW_CONV)[ev.name]).sum()),
                        param_types=types, param_share=share)


def _parameter_elements(ctx: Context) -> dict[str, int] | None:
    """The optimizers' parameter elements by dtype as the capture recorded them
    (``capture.optimizer_parameter_elements``, ``{"float32": n, ...}``); None when not recorded or
    not valid."""
    held = meta_block(ctx.trace.meta, "capture").get("optimizer_parameter_elements")
    if not isinstance(held, dict) or not all(type(v) is int and v >= 0 for v in held.values()):
        return None
    return held


def _param_types(ctx: Context) -> tuple[tuple[str, ...], float]:
    """The 16-bit type holding most of the optimizers' parameter elements, when it holds at least
    :data:`MIN_PARAM_SHARE` of them, and its share; nothing without the capture's record."""
    held = _parameter_elements(ctx)
    if held is None:
        return (), 0.0
    total = sum(held.values())
    low = {PARAM_LOW[k]: v / total for k, v in held.items() if k in PARAM_LOW and total}
    best = max(low, key=low.__getitem__, default=None)
    return ((best,), round(low[best], 4)) if best is not None and low[best] >= MIN_PARAM_SHARE else ((), 0.0)


@dataclass(frozen=True)
class Float64:
    """What says the host's matrix operators computed in double precision."""

    #: the share of the optimizers' parameter elements that are float64 (None: not recorded,
    #: a plain trace or a window without an optimizer step)
    params_frac: float | None
    #: matrix-operator calls whose recorded first input is double precision, and those whose
    #: first input is any floating-point type (both 0 without ``--shapes``)
    typed_calls: int
    typed_of: int

    @property
    def typed_frac(self) -> float | None:
        return self.typed_calls / self.typed_of if self.typed_of else None


def float64(ctx: Context) -> Float64:
    """The window's evidence of float64 matrix work on the host (computed once per context)."""
    return ctx.memo("cpu_float64", _find_float64)


def _find_float64(ctx: Context) -> Float64:
    held = _parameter_elements(ctx)
    frac = None
    if held is not None:
        total = sum(held.values())
        frac = held.get("float64", 0) / total if total else None
    doubles = floats = 0
    t = ctx.trace.ops
    if t is not None:
        for i in (i for i, name in enumerate(t.name) if name in COMPUTE_OPS):
            if not ctx.lo <= t.ts_ns[i] < ctx.hi:
                continue
            first = next((typ for typ in (t.types[i] or []) if isinstance(typ, str)
                          and (typ in DOUBLE_TYPES or typ in FLOAT_TYPES)), None)
            if first is not None:
                floats += 1
                doubles += first in DOUBLE_TYPES
    return Float64(params_frac=frac, typed_calls=doubles, typed_of=floats)


def compute_in_calls_of(ctx: Context, min_ns: int) -> int:
    """The host matrix operators' time (union, ns) in the window's calls of at least ``min_ns``."""
    ev, m = ctx.trace.events, ctx.masks
    family = _compute_family(ctx, ctx.events_in_window(m["cpu_op"] & m["host"]))
    return iv.total(ctx.intervals(family & (ev.dur_ns >= min_ns)))


def _compute_family(ctx: Context, ops: np.ndarray) -> np.ndarray:
    """The matrix operators (:data:`COMPUTE_OPS`) among ``ops`` (a mask)."""
    family: np.ndarray = ops & ctx.trace.name_ids(lambda n: n in COMPUTE_OPS)[ctx.trace.events.name]
    return family


def autocast_calls(ctx: Context, ops: np.ndarray) -> int:
    """How many matrix operator calls among ``ops`` (a mask) show autocast's work: a cast held
    directly by the call, and the same operator called again directly inside it."""
    ev = ctx.trace.events
    evidence = np.flatnonzero(ops & ctx.trace.name_ids(lambda n: n in CAST_EVIDENCE_OPS)[ev.name])
    casts = np.flatnonzero(ops & ctx.trace.name_ids(lambda n: n in CASTS)[ev.name])
    if not evidence.size or not casts.size:
        return 0
    casting = parent_op(ctx, casts)
    casting = casting[casting >= 0]
    holder = parent_op(ctx, evidence)
    again = holder >= 0
    again[again] &= ev.name[holder[again]] == ev.name[evidence[again]]
    holds_cast = np.zeros(len(ev.name), dtype=bool)
    holds_cast[casting] = True
    inner = holder[again]  # the calls holding their own operator again
    return int(distinct(inner[holds_cast[inner]]).size)


def holders(ev: EventTable, calls: np.ndarray, casts: np.ndarray) -> int:
    """How many of ``calls`` hold at least one of ``casts`` (same thread, the cast starting
    inside the call). Calls on a thread nest: in (thread, start) order, a cast is inside some
    call iff the largest end among the calls started before it lies after its start, and the
    outermost such call is the one holding that end."""
    if not calls.size or not casts.size:
        return 0
    big = np.int64(1) << 62 >> 16  # room for the times of one thread under each thread's offset
    lane_c = ev.lane[calls].astype(np.int64) + 1
    start = lane_c * big + ev.ts_ns[calls]
    end = start + ev.dur_ns[calls]
    order = np.lexsort((-ev.dur_ns[calls], start))
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    holder = np.maximum.accumulate(np.where(end == reach, np.arange(end.size), 0))
    q = (ev.lane[casts].astype(np.int64) + 1) * big + ev.ts_ns[casts]
    k = np.searchsorted(start, q, side="right") - 1
    ok = k >= 0
    k = np.maximum(k, 0)
    ok &= reach[k] > q
    return int(distinct(holder[k[ok]]).size)


def _typed(ctx: Context) -> dict[str, int]:
    """Family operators in the window whose recorded first inputs are 16-bit floats, by type."""
    t = ctx.trace.ops
    out = {"bf16": 0, "fp16": 0}
    if t is None:
        return out
    for i in (i for i, name in enumerate(t.name) if name in COMPUTE_OPS):
        if ctx.lo <= t.ts_ns[i] < ctx.hi:
            for typ in (t.types[i] or [])[:2]:
                low = LOW_TYPES.get(typ) if isinstance(typ, str) else None
                if low:
                    out[low] += 1
                    break
    return out


def host_threads(ctx: Context) -> int | None:
    """``torch.get_num_threads()`` as the capture recorded it (``capture.intra_op_threads``); None
    for a plain trace or an older bundle."""
    value = meta_block(ctx.trace.meta, "capture").get("intra_op_threads")
    return value if type(value) is int and value > 0 else None


def machine_support(ctx: Context) -> dict[str, str | None]:
    """:func:`support` of the trace's recorded machine."""
    return support(meta_block(ctx.trace.meta, "machine"))
