"""What an event's name says: step markers, data-loader waits, syncs, collectives, matmuls,
tensor/matrix cores, graph launches, compilation.

This is the one data module for names: every pattern sits in a table with the public source
that documents it, so adding a vendor or a library touches this file only. Classifiers run
once per *distinct* name (a few thousand at most), never per event.

Time is linear in the names' total length, and bounded per name: a classifier looks at the first
:data:`MAX_NAME_CHARS` characters only (:func:`long_names_note` says when a trace had longer
names), and the case-insensitive tables run as case-sensitive patterns over the lower-cased name
(:func:`_folded`), which Python's ``re`` scans about ten times faster than ``re.IGNORECASE``.
The kernel classes scan only the names that hold some text one of their alternatives requires
(:func:`_kernel_candidates`: most kernel names hold none), and the classes of host calls, operators
and frames are evaluated only on the names host events carry (``Context.host_name_ids``), so that
hundreds of thousands of distinct kernel names cost little more than their joined text.

The patterns that classifying a trace never runs are compiled on first use (:data:`_DEFERRED`):
the one-name patterns whose all-names twins do the work, and the case-insensitive originals of
the lower-cased tables. ``names.STEP_RE`` and the like read as compiled patterns all the same.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

#: Patterns compiled the first time they are read (as ``names.X_RE``, or by a one-name classifier),
#: not at import: classifying a trace's names runs their twins instead (:func:`_batch`: the
#: multi-line ``_X_M`` patterns and the lower-cased :func:`_folded` tables), so ``gpumagic analyze``
#: does not pay for compiling them. Name -> (pattern, flags); each is declared with its type.
_DEFERRED: dict[str, tuple[str, int]] = {}


def _defer(name: str, pattern: str, flags: int = 0) -> None:
    """Declare the module attribute ``name``: ``re.compile(pattern, flags)``, on first use."""
    _DEFERRED[name] = (pattern, flags)


def _text(name: str) -> str:
    """The text of the deferred pattern ``name`` (for its twins: compiles nothing)."""
    return _DEFERRED[name][0]


def _compiled(name: str) -> re.Pattern[str]:
    """The deferred pattern ``name``, compiled the first time it is asked for and kept as the module
    attribute (two threads asking at once compile it twice, to equal patterns)."""
    found: re.Pattern[str] | None = globals().get(name)
    if found is None:
        found = globals()[name] = re.compile(*_DEFERRED[name])
    return found


if not TYPE_CHECKING:  # hidden from mypy, which reads the declared attributes' types instead
    def __getattr__(name: str) -> re.Pattern[str]:
        if name in _DEFERRED:
            return _compiled(name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


STEP_RE: re.Pattern[str]
_defer("STEP_RE", r"^ProfilerStep#\d+$")
#: Characters of a name that the classifiers read. Real kernel names, C++ templates spelled out
#: included, run to a few thousand characters (cutlass/CUTLASS 3 kernel names are the longest we
#: have seen, about 2,000); beyond this a name is classified on its beginning, with a note.
MAX_NAME_CHARS = 16_384
DATALOADER_PREFIX = "enumerate(DataLoader)"

#: Host calls that block until the GPU (or a stream/event) has finished queued work, with the
#: document that says so. Non-blocking look-alikes are deliberately absent: ``cudaEventQuery``
#: and ``cudaStreamQuery`` poll, ``cudaStreamWaitEvent`` orders streams on the GPU, and CUPTI's
#: ``cuda_sync`` activity records ("Event Sync", "Stream Wait Event", "Context Sync") describe
#: a sync without being the host call.
SYNC_CALL_SOURCES = {
    # CUDA Runtime API, "Device Management" / "Stream Management" / "Event Management"
    "cudaDeviceSynchronize": "CUDA Runtime API: blocks until the device has completed all preceding tasks",
    "cudaStreamSynchronize": "CUDA Runtime API: waits for stream tasks to complete",
    "cudaEventSynchronize": "CUDA Runtime API: waits for an event to complete",
    # CUDA Runtime API, "API synchronization behavior": synchronous memcpy
    "cudaMemcpy": "CUDA Runtime API, API synchronization behavior: synchronous copy",
    "cudaMemcpy2D": "CUDA Runtime API, API synchronization behavior: synchronous copy",
    # CUDA Driver API twins
    "cuCtxSynchronize": "CUDA Driver API", "cuStreamSynchronize": "CUDA Driver API",
    "cuEventSynchronize": "CUDA Driver API", "cuMemcpyDtoH_v2": "CUDA Driver API: synchronous copy",
    "cuMemcpyHtoD_v2": "CUDA Driver API: synchronous copy",
    # HIP Runtime API (ROCm docs, "Synchronization"/"Memory management")
    "hipDeviceSynchronize": "HIP Runtime API", "hipStreamSynchronize": "HIP Runtime API",
    "hipEventSynchronize": "HIP Runtime API", "hipMemcpy": "HIP Runtime API: synchronous copy",
    "hipMemcpyDtoH": "HIP Runtime API: synchronous copy", "hipMemcpyHtoD": "HIP Runtime API: synchronous copy",
    # ROCm PyTorch: c10/hip copies a scalar to the host with hipMemcpyWithStream, which
    # synchronises the stream (HIP Runtime API: "hipMemcpyWithStream ... synchronous")
    "hipMemcpyWithStream": "HIP Runtime API: copy on a stream, then synchronise it",
}
SYNC_CALLS = frozenset(SYNC_CALL_SOURCES)
#: Operators that force a sync to read a value on the host (PyTorch docs,
#: ``torch.cuda.set_sync_debug_mode``; ``.item()`` lowers to ``_local_scalar_dense``).
SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero",
                      "aten::equal", "aten::masked_select", "aten::unique", "aten::_unique2"})
#: Host calls that grow the caching allocator (cold start) or create the context.
ALLOC_CALLS = frozenset({"cudaMalloc", "cudaMallocAsync", "cudaHostAlloc", "cudaMallocHost", "cudaFree",
                         "cuMemAlloc_v2", "cuMemCreate", "hipMalloc", "hipFree", "hipHostMalloc"})
INIT_CALLS = frozenset({"cuInit", "cuDevicePrimaryCtxRetain", "cudaGetDeviceCount", "cudaSetDevice",
                        "cudaGetDeviceProperties", "cudaGetDeviceProperties_v2", "hipInit", "hipGetDeviceCount"})
#: Launches that replay a whole captured graph (CUDA Runtime API ``cudaGraphLaunch``, Driver API
#: ``cuGraphLaunch``, HIP ``hipGraphLaunch``): one host call, many kernels.
GRAPH_LAUNCH_CALLS = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
#: Calls that make a stream wait for an event recorded on another stream: a GPU-side
#: dependency, not host work (CUDA Runtime API ``cudaStreamWaitEvent``; HIP twin).
STREAM_WAIT_CALLS = frozenset({"cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent"})

#: Compilation and autotuning. TorchDynamo's ``convert_frame`` / Inductor's ``compile_fx``,
#: ``async_compile``, ``codecache`` (torch/_dynamo, torch/_inductor sources), Triton's compiler,
#: cuDNN's algorithm search (``cudnnFind*``). Not ``TorchDynamo Cache Lookup``: that is the
#: per-call guard check of an already compiled frame (torch/_dynamo/eval_frame), nor the
#: ``Torch-Compiled Region``/``CompiledFunction`` spans that run compiled code. Without ``--stack``
#: a frame compilation is still in the trace as the ranges dynamo's ``dynamo_timed`` records around
#: it: ``entire_frame_compile`` and ``_compile.compile_inner (dynamo_timed)``
#: (torch/_dynamo/convert_frame.py, ``_compile``; torch/_dynamo/utils.py, ``dynamo_timed``).
COMPILE_RE: re.Pattern[str]
_defer("COMPILE_RE", r"(convert_frame\.py.*_compile|compile_fx|async_compile|codecache|"
                     r"torch/_inductor/.*compile|triton/compiler|autotune|cudnnFind|TorchDynamo(?! Cache Lookup)|"
                     r"^entire_frame_compile$|^_compile\.compile_inner \(dynamo_timed\)$)")
NOT_COMPILE_RE = re.compile(r"Cache Lookup|Torch-Compiled Region|CompiledFunction")

#: Collective-communication kernels, with their sources:
#: - ``nccl``: NVIDIA NCCL kernels (``ncclKernel_AllReduce_...``, ``ncclDevKernel_...``);
#: - ``rccl``: AMD RCCL (the NCCL port, same kernel names plus ``rccl``);
#: - ``multimem_all_reduce``/``multimem_`` : PyTorch symmetric memory (torch/csrc/distributed/c10d/symm_mem);
#: - ``one_shot_all_reduce``/``two_shot_all_reduce``: PyTorch symmetric memory and intra-node
#:   all-reduce kernels of SGLang/vLLM (``cross_device_reduce_1stage/2stage``);
#: - ``custom_all_reduce``/``cross_device_reduce``: vLLM csrc/custom_all_reduce.cuh, SGLang's copy;
#: - ``quickreduce``: vLLM's ROCm quick all-reduce (csrc/quickreduce);
#: - expert-parallel all-to-all: DeepEP's dispatch/combine kernels under its public
#:   ``deep_ep::`` namespace (deepseek-ai/DeepEP csrc/kernels: ``deep_ep::intranode::dispatch``,
#:   ``deep_ep::internode_ll::combine``...) and DeepSeek's internal ``dpsk::ep::`` names;
#: - NVSHMEM device kernels (``nvshmem``/``nvshmemi_`` names, the library DeepEP's internode and
#:   low-latency kernels are built on);
#: - MSCCL / MSCCL++ (``msccl``, ``mscclpp``: Microsoft's collective libraries, also in RCCL).
COLLECTIVE_RE: re.Pattern[str]
_defer(
    "COLLECTIVE_RE",
    r"(nccl|rccl|multimem_all_reduce|multimem_all_gather|one_shot_all_reduce|two_shot_all_reduce|"
    r"custom_all_reduce|cross_device_reduce|allreduce_kernel|all_reduce_kernel|quickreduce|"
    r"reduce_scatter_kernel|all_gather_kernel|deep_ep::|dpsk::ep::|nvshmem|msccl)",
    re.IGNORECASE,
)
#: Host-side signs that a program communicates (to tell when collective kernels may have been
#: missed by name): PyTorch's ``record_param_comms`` and ``c10d::`` operators, ``nccl:*``
#: annotations (torch.distributed's profiling), DeepEP's Python ``Buffer.dispatch``/``combine``.
COMM_HOST_RE: re.Pattern[str]
_defer("COMM_HOST_RE", r"(^record_param_comms$|^c10d::|^nccl:|deep_ep/buffer\.py\(\d+\): (dispatch|combine))")


def is_comm_host(name: str) -> bool:
    return bool(_compiled("COMM_HOST_RE").search(_head(name)))

#: Kernel-name fragments that mean tensor-core (NVIDIA) or matrix-core (AMD) instructions, by source:
#: - cuBLAS/cuDNN encode the MMA shape or precision (``h884``, ``s1688``, ``16816``, ``tf32``,
#:   ``bf16``...); cutlass names ``tensorop``; Hopper cuBLAS ``nvjet``/``sm90_xmma_*gmma*``
#:   (NVIDIA cuBLAS/cutlass kernel naming);
#: - flash-attention (``flash_fwd``) and fused MHA (``fmha``) kernels always use tensor cores;
#: - AMD Tensile/hipBLASLt: ``MI16x16x1`` etc. is the MFMA instruction shape in the kernel name
#:   (ROCm Tensile docs, "Kernel names": ``MI<M>x<N>x<B>`` = MatrixInstruction);
#: - AMD MFMA/xdlops: ``mfma``, ``xdlops``, MIOpen's implicit-GEMM ``gtcx`` (xdlops) kernels;
#: - Triton attention kernels (``attn_fwd``, ``unified_attention``) are ``tl.dot`` in 16-bit,
#:   which Triton lowers to MMA/MFMA (Triton fused-attention tutorial; vLLM triton_unified_attention).
TENSOR_CORE_RE: re.Pattern[str]
_defer(
    "TENSOR_CORE_RE",
    r"(h884|h1688|s1688|h16816|s16816|i8816|i16832|884gemm|1688gemm|16816gemm|tensorop|wmma|hmma|"
    r"imma|gmma|wgmma|nvjet|tf32|bf16|fp16|f16f16|_f16_|e4m3|e5m2|fp8|flash|fmha|sm90_xmma|sm100_|"
    r"_MI\d+x\d+x\d+|mfma|xdlops|_gtcx|attn_fwd|attn_bwd|unified_attention)",
    re.IGNORECASE,
)
#: Matmul, convolution and attention kernels: the work tensor/matrix cores accelerate.
#: NVIDIA: cuBLAS/cutlass/cuDNN names (gemm, conv, wgrad/dgrad/fprop, nvjet, xmma);
#: AMD: Tensile/hipBLASLt ``Cijk_`` (C[i,j] = Σ_k A·B, Tensile's kernel naming), rocBLAS/MIOpen
#: ``igemm``/xdlops, Composable Kernel ``gemm``; Triton: ``_matmul*``, ``bmm``, ``attn_fwd``.
MATMUL_RE: re.Pattern[str]
_defer(
    "MATMUL_RE",
    r"(gemm|gemv|conv|wgrad|dgrad|fprop|matmul|cutlass|nvjet|xmma|flash|fmha|attention|attn_fwd|attn_bwd|"
    r"winograd|implicit_convolve|cublas|mma|^Cijk_|xdlops|\bbmm|_bmm)",
    re.IGNORECASE,
)
#: Matmul kernels that compute in float64 (double precision; complex128 too): cuBLAS's
#: ``volta_dgemm_64x64_nn``/``dgemm``/``zgemm``/``dgemv``, its templated kernels over ``double``
#: (``gemv2T_kernel_val<int, int, double, ...>``), the FP64 tensor-core GEMMs of A100 and later
#: (``d884``/``dmma``, ``xmma_gemm_f64f64_...``), Tensile's double (``Cijk_..._DB_``, ``_ZB_``).
#: Applied to kernels already classified as matmuls.
#: Compiled at import, not deferred: the kernel metrics check every trace's matmul kernel names.
FP64_MATMUL_RE = re.compile(r"(?i:dgemm|zgemm|dgemv|zgemv|f64|d884|dmma|\bdouble\b)|_DB_|_ZB_")
#: Names that mark a training step: autograd's engine, ``*Backward*`` nodes, optimizer steps
#: (PyTorch profiler records ``Optimizer.step#AdamW.step``), and backward kernels.
TRAINING_RE = re.compile(r"(autograd::engine|Backward|_backward|Optimizer\.(step|zero_grad)|optimizer\.step|wgrad|dgrad)")

COPY_KIND_RE = re.compile(r"Memcpy (HtoD|DtoH|DtoD|PtoP|HtoH)(?: \((\w+) -> (\w+)\))?")
#: Host frames that say nothing about what the program was doing (the interpreter's and
#: IPython's outer frames).
UNINFORMATIVE_FRAME_RE = re.compile(
    r"^(<module>|<built-in method exec|<built-in function exec|exec|run_code|run_cell|run_ast_nodes|"
    r"_run_module_as_main|_run_code|ProfilerStep#|gpumagic::|\[memory\]|<frozen runpy>|"
    r".*IPython/core/interactiveshell\.py|.*ipykernel/|.*runpy\.py)"
)


def _head(name: str) -> str:
    return name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS]


def _low(name: str) -> str:
    return _head(name).lower()


def long_names_note(names: Sequence[str]) -> str | None:
    """The report's note when some names were longer than :data:`MAX_NAME_CHARS` (else None)."""
    n = sum(1 for x in names if len(x) > MAX_NAME_CHARS) if max(map(len, names), default=0) > MAX_NAME_CHARS else 0
    if not n:
        return None
    return (f"{n} event name{'s' if n != 1 else ''} longer than {MAX_NAME_CHARS:,} characters (longer than any real "
            f"kernel or operator name) {'were' if n != 1 else 'was'} classified on {'their' if n != 1 else 'its'} "
            f"first {MAX_NAME_CHARS:,} characters.")


def is_step(name: str) -> bool:
    return bool(_compiled("STEP_RE").match(_head(name)))


def is_dataloader(name: str) -> bool:
    return name.startswith(DATALOADER_PREFIX)


def is_sync_call(name: str) -> bool:
    return name in SYNC_CALLS


def is_nccl(name: str) -> bool:
    """Any collective-communication kernel (NCCL, RCCL, custom all-reduce); the historical name."""
    return bool(_COLLECTIVE.search(_low(name)))


is_collective = is_nccl


def is_tensor_core(name: str) -> bool:
    return bool(_TENSOR_CORE.search(_low(name)))


#: Matmul kernels whose names say 16-bit inputs: bfloat16 (cuBLAS ``ampere_bf16_s16816gemm_bf16_…``,
#: ``sm90_xmma_gemm_bf16bf16_bf16f32_…``, cutlass ``…tensorop_bf16_s16816gemm…``, Composable Kernel
#: ``…_bf16bf16bf16_…``) or float16 (cuBLAS ``ampere_fp16_s16816gemm_fp16_…``, Volta/Turing
#: ``h884gemm``/``h1688gemm``/``h16816gemm``, ``f16f16`` types, ``__half``/``c10::Half`` templates).
#: Many names say neither (Hopper's ``nvjet_…``, Tensile's ``Cijk_…``): they count in neither.
BF16_MATMUL_RE = re.compile(r"(?i:bf16|bfloat16)")
FP16_MATMUL_RE = re.compile(r"(?i:(?<!b)fp16|(?<!b)f16f16|_f16_|h884|h1688|h16816|__half\b|c10::Half)")

#: AMD Tensile and hipBLASLt GEMM names spell the problem type first: ``Cijk`` (the indices of C),
#: ``A`` and ``B`` with theirs, then the data type of A and B by Tensile's one-letter codes
#: (Tensile ``DataType.toChar``: S float32, D float64, C complex64, Z complex128, H float16,
#: B bfloat16, X xfloat32, I int32, I8 int8, ``4xi8``, F8/B8 and their ``N`` (fnuz) and mixed
#: forms for 8-bit floats), which Tensile writes either fused with what follows (``SB`` = single
#: with beta, ``HHS`` = half in and out, single compute) or as its own ``_``-separated part
#: (``S_B``, ``B_BS``, ``BBS_BH``), as observed in real MI300X traces and Tensile's
#: ``ProblemType.__str__``. A complex-conjugate mark ``C`` may come before a complex type.
#: Longer codes come first in the alternation so ``B8`` is not read as ``B``.
TENSILE_TYPE_RE = re.compile(
    r"^Cijk_A[A-Za-z]+_B[A-Za-z]+_(?:C_(?=[CZ]))?(4xi8|F8B8N|B8F8N|F8B8|B8F8|F8N|B8N|F8|B8|I64|I8|[SDCZHBIX])")
#: Tensile's mark of FP32 matmuls run in xfloat32 on the matrix cores (``F32XdlMathOp``: ``_MX``).
TENSILE_XF32_RE = re.compile(r"_MX(?:_|$)")
#: An MFMA matrix instruction in a Tensile name (``MI16x16x1``, ``MI32x32x2x1``; Tensile's kernel
#: naming, ``MatrixInstruction``).
TENSILE_MFMA_RE = re.compile(r"_MI\d+x\d+x\d+")
#: MIOpen's implicit-GEMM convolutions on the matrix cores name their precision
#: (``igemm_fwd_gtcx_nhwc_fp32_…``, ``igemm_bwd_data_gtcx_nhwc_fp32_…``, ``igemm_fwd_gtcx3_nhwc_bf16_…``).
MIOPEN_XDLOPS_FP32_RE = re.compile(r"_gtcx\d*_\w*?fp32(?:_|$)")


#: The device names AMD GPUs report (``"AMD Instinct MI300X VF"``, ``"AMD Radeon PRO W7900"``).
AMD_DEVICE_RE = re.compile(r"\bAMD\b|Instinct|Radeon")


def says_amd_device(device_name: str) -> bool:
    """A GPU's name (``deviceProperties``) says AMD."""
    return bool(AMD_DEVICE_RE.search(device_name))


def tensile_type(name: str) -> str | None:
    """The A/B data type a Tensile/hipBLASLt kernel name spells (:data:`TENSILE_TYPE_RE`: ``"S"``,
    ``"B"``, ``"H"``, ``"D"``...), or None for any other name."""
    found = TENSILE_TYPE_RE.match(name) if name.startswith("Cijk_") else None
    return found.group(1) if found else None


def says_bf16(name: str) -> bool:
    """The name of a kernel already known to be a matmul says it takes bfloat16 inputs."""
    return bool(BF16_MATMUL_RE.search(_head(name))) or tensile_type(name) == "B"


def says_fp16(name: str) -> bool:
    """The name of a kernel already known to be a matmul says it takes float16 inputs."""
    return bool(FP16_MATMUL_RE.search(_head(name))) or tensile_type(name) == "H"


def says_fp64(name: str) -> bool:
    """The name of a kernel already known to be a matmul says it computes in float64."""
    return bool(FP64_MATMUL_RE.search(_head(name))) or tensile_type(name) in ("D", "Z")


def says_xf32(name: str) -> bool:
    """A Tensile/hipBLASLt GEMM name says it multiplies FP32 inputs as xfloat32 on the matrix cores
    (type ``S`` with the ``_MX`` math mark, or type ``X``): AMD's twin of TF32 (MI300X: 653.7
    TFLOP/s against 163.4 in FP32, AMD's datasheet)."""
    head = _head(name)
    kind = tensile_type(head)
    return kind == "X" or (kind == "S" and bool(TENSILE_XF32_RE.search(head)))


def says_fp32_matrix(name: str) -> bool:
    """The name of a kernel already known to be a matmul says it multiplies float32 on AMD's matrix
    cores at their FP32 rate: a Tensile/hipBLASLt GEMM of type S or C with an MFMA instruction and
    no xfloat32 mark (``Cijk_Ailk_Bljk_SB_MT128x96x16_MI32x32x2x1_…``), or an MIOpen xdlops
    convolution in fp32. Such kernels count as matrix-core kernels (:func:`is_tensor_core`), yet
    they run at the FP32 matrix rate, an eighth of bf16's on an MI300X (AMD's datasheet)."""
    head = _head(name)
    if tensile_type(head) in ("S", "C"):
        return bool(TENSILE_MFMA_RE.search(head)) and not TENSILE_XF32_RE.search(head)
    return bool(MIOPEN_XDLOPS_FP32_RE.search(head))


def is_fp64_matmul(name: str) -> bool:
    """A matmul kernel (:func:`is_matmul`) whose name says it computes in float64."""
    return is_matmul(name) and says_fp64(name)


def is_matmul(name: str) -> bool:
    low = _low(name)
    return bool(_compiled("_MATMUL").search(low)) and not _COLLECTIVE.search(low)


def is_compile(name: str) -> bool:
    head = _head(name)
    return bool(_compiled("COMPILE_RE").search(head)) and not NOT_COMPILE_RE.search(head)


def is_graph_launch(name: str) -> bool:
    return name in GRAPH_LAUNCH_CALLS


def is_stream_wait(name: str) -> bool:
    return name in STREAM_WAIT_CALLS


def is_training(name: str) -> bool:
    return bool(TRAINING_RE.search(_head(name)))


def is_informative_frame(name: str) -> bool:
    return not UNINFORMATIVE_FRAME_RE.match(_head(name))


def copy_kind(name: str) -> tuple[str, str]:
    """``"Memcpy HtoD (Pageable -> Device)"`` → ``("HtoD", "pageable")``.

    The memory kind is that of the host side (source for HtoD, destination for DtoH):
    ``pageable``, ``pinned``, ``device`` (device-to-device) or ``unknown``.
    """
    m = COPY_KIND_RE.match(_head(name))
    if not m:
        return "other", "unknown"
    direction, src, dst = m.group(1), m.group(2), m.group(3)
    if direction in ("DtoD", "PtoP"):
        return direction, "device"
    host = {"HtoD": src, "DtoH": dst}.get(direction, src)
    return direction, (host or "unknown").lower()


# --- Kernel-level classes: fused attention, softmax, elementwise/reduction -----------
#: Fused attention kernels: FlashAttention (``flash_fwd_kernel``/``flash_bwd``, the names in
#: PyTorch's ``aten/src/ATen/native/transformers/cuda/flash_attn``), memory-efficient attention
#: (``fmha_cutlassF``/``fmha_cutlassB``, xFormers' kernels vendored in PyTorch's
#: ``mem_eff_attention``), cuDNN's SDPA (``cudnn_generated_fort_native_sdpa``, names seen in
#: cuDNN frontend traces), fused MHA (``fmha``), AMD Composable Kernel ``ck_fmha``/``fmha_fwd``
#: and aiter ``mha_fwd``, Triton attention (``attn_fwd``/``attn_bwd`` in the TraceLens MI300X
#: traces, vLLM's ``unified_attention``/``paged_attention``).
FUSED_ATTENTION_RE: re.Pattern[str]
_defer(
    "FUSED_ATTENTION_RE",
    r"(flash_fwd|flash_bwd|flash_attn|FlashAttn|fmha|efficient_attention|mem_eff|native_sdpa|_sdpa_|"
    r"attn_fwd|attn_bwd|unified_attention|paged_attention|mha_fwd|mha_bwd)",
    re.IGNORECASE,
)
#: Softmax kernels: PyTorch's ``cunn_SoftMaxForward``/``softmax_warp_forward`` (aten/src/ATen/
#: native/cuda/SoftMax.cu, PersistentSoftmax.cuh), MIOpen ``SoftmaxForward``, Triton ``*softmax*``.
SOFTMAX_RE: re.Pattern[str]
_defer("SOFTMAX_RE", r"softmax", re.IGNORECASE)
#: Memory-bound elementwise, reduction and normalisation kernels, the work fusion collapses.
#: PyTorch's TensorIterator kernels are ``elementwise_kernel``, ``vectorized_elementwise_kernel``,
#: ``unrolled_elementwise_kernel`` and ``reduce_kernel`` (aten/src/ATen/native/cuda/Loops.cuh,
#: Reduce.cuh); optimizers' ``multi_tensor_apply_kernel`` (ForeachFunctors.cuh); normalisation:
#: cuDNN ``bn_fw_*``/``bn_bw_*``, PyTorch ``batch_norm_*``, ``layer_norm``, ``group_norm``,
#: ``rms_norm``, ck_tile ``rmsnorm``; softmax; ``CatArrayBatchedCopy``. Triton kernels that
#: Inductor generated (``triton_poi_``/``triton_red_``/``triton_per_``) are already fused and do
#: not count.
ELEMENTWISE_RE: re.Pattern[str]
_defer(
    "ELEMENTWISE_RE",
    r"(elementwise_kernel|reduce_kernel|multi_tensor_apply|\bbn_fw|\bbn_bw|batch_norm|layer_norm|LayerNorm|"
    r"group_norm|rms_?norm|softmax|CatArrayBatchedCopy|\bindex_elementwise|fill_kernel|"
    r"(?<![a-z])(add|mul|div|where|copy)_kernel)",
    re.IGNORECASE,
)
INDUCTOR_FUSED_RE: re.Pattern[str]
_defer("INDUCTOR_FUSED_RE", r"^triton_(poi|red|per|tem)_")


def is_fused_attention(name: str) -> bool:
    return bool(_FUSED_ATTENTION.search(_low(name)))


def is_softmax(name: str) -> bool:
    low = _low(name)
    return "softmax" in low and not _FUSED_ATTENTION.search(low)


def is_elementwise(name: str) -> bool:
    low = _low(name)
    return bool(_ELEMENTWISE.search(low)) and not _compiled("INDUCTOR_FUSED_RE").match(name) and not _COLLECTIVE.search(low)


def _folded(name: str, rewrites: tuple[tuple[str, str], ...] = ()) -> tuple[str, int]:
    """The deferred pattern ``name`` (``re.IGNORECASE``) as a case-sensitive pattern for lower-cased
    names, text and flags: the same matches, about ten times faster. ``rewrites`` move a branch's
    leading assertion (``\\b``, ``^``, a look-behind) after its literal, which lets ``re`` skip ahead
    to the branches' first letters."""
    text, flags = _DEFERRED[name]
    for old, new in rewrites:
        if old not in text:
            raise AssertionError(f"{old!r} is not in the pattern {text!r}")
        text = text.replace(old, new)
    if re.search(r"\\[DWSBAZP]", text):  # lower-casing would change their meaning
        raise AssertionError(f"cannot fold {text!r}")
    return text.lower(), flags & ~re.IGNORECASE


_COLLECTIVE = re.compile(*_folded("COLLECTIVE_RE"))
_TENSOR_CORE = re.compile(*_folded("TENSOR_CORE_RE"))
_MATMUL: re.Pattern[str]  # is_matmul's; the names of a trace are scanned with _MATMUL_M
_defer("_MATMUL", *_folded("MATMUL_RE", ((r"|^Cijk_|", r"|Cijk_(?<=^Cijk_)|"), (r"|\bbmm|", r"|bmm(?<!\wbmm)|"))))
_FUSED_ATTENTION = re.compile(*_folded("FUSED_ATTENTION_RE"))
_ELEMENTWISE = re.compile(*_folded("ELEMENTWISE_RE", (
    (r"|\bbn_fw|\bbn_bw|", r"|bn_fw(?<!\wbn_fw)|bn_bw(?<!\wbn_bw)|"),
    (r"|\bindex_elementwise|", r"|index_elementwise(?<!\windex_elementwise)|"),
    (r"(?<![a-z])(add|mul|div|where|copy)_kernel",
     "|".join(f"{k}_kernel(?<![a-z]{k}_kernel)" for k in ("add", "mul", "div", "where", "copy"))))))


# --- All names at once: one scan of their joined text per pattern ------------------------------
# ``Trace.name_ids(is_x)`` calls ``is_x.batch(names)`` when it exists: the names (each cut to
# MAX_NAME_CHARS) are joined with line breaks and each pattern scans the joined text once, in
# ``re``'s C loop, instead of one Python call per name and classifier. The result is the same as
# calling ``is_x`` on every name: names holding a line break themselves (none in real traces) are
# classified one by one, and a pattern's multi-line twin (``re.M``) anchors at each name's start.


class _Joined:
    """The names' joined text (as given and lower-cased), where each name starts, and the scans done."""

    def __init__(self, names: list[str]) -> None:
        long = max(map(len, names), default=0) > MAX_NAME_CHARS
        heads = [_head(n) for n in names] if long else list(names)
        self.odd = [i for i, h in enumerate(heads) if "\n" in h]
        for i in self.odd:
            heads[i] = heads[i].replace("\n", " ")  # classified one by one below
        self.heads = heads
        self.text = "\n".join(heads)
        lows = heads if self.text.isascii() else [h.lower() for h in heads]
        self.low = self.text.lower() if self.text.isascii() else "\n".join(lows)
        self.starts = _starts(heads)
        self.low_starts = self.starts if lows is heads else _starts(lows)
        self.scans: dict[tuple[re.Pattern[str], bool], np.ndarray] = {}
        self.kernel_candidates: np.ndarray | None = None  # names where some kernel class may match


def _starts(parts: list[str]) -> np.ndarray:
    """Where each of ``parts`` starts in ``"\\n".join(parts)``."""
    out = np.zeros(len(parts), dtype=np.int64)
    if len(parts) > 1:
        np.cumsum(np.fromiter(map(len, parts[:-1]), dtype=np.int64, count=len(parts) - 1) + 1, out=out[1:])
    return out


#: The joined texts of the last two name lists classified (a trace's names, and the names its
#: host events carry: see ``Context.host_name_ids``), most recent last.
_cache: list[tuple[list[str], int, _Joined]] = []
_cache_lock = threading.Lock()


def _joined(names: list[str]) -> _Joined:
    """The joined text of ``names``, kept for the two lists analysed last (the classifiers of one trace share it)."""
    with _cache_lock:
        for entry in _cache:
            if entry[0] is names and entry[1] == len(names):
                return entry[2]
    j = _Joined(names)
    with _cache_lock:
        _cache[:] = [*_cache[-1:], (names, len(names), j)]
    return j


def _find(text: str, starts: np.ndarray, pattern: re.Pattern[str], count: int) -> np.ndarray:
    """Which of the ``count`` names joined in ``text`` (each starting at ``starts``) ``pattern`` matches."""
    hit = np.zeros(count, dtype=bool)
    found = [m.start() for m in pattern.finditer(text)]
    if found:
        hit[np.searchsorted(starts, found, side="right") - 1] = True
    return hit


def _scan(names: list[str], pattern: re.Pattern[str], low: bool) -> np.ndarray:
    j = _joined(names)
    key = (pattern, low)
    hit = j.scans.get(key)
    if hit is None:
        if _KERNEL_CLASSES.get(pattern) is low:  # only the names that may match a kernel class can match it
            hit = _scan_among(j, pattern, _kernel_candidates(j), low)
        else:
            hit = _find(j.low if low else j.text, j.low_starts if low else j.starts, pattern, len(names))
        j.scans[key] = hit
    return hit


def _kernel_candidates(j: _Joined) -> np.ndarray:
    """The names that may match a kernel class: those holding, for some alternative of some class,
    the rarest two-letter piece of the text that alternative must contain (:data:`_KERNEL_LITERALS`).
    A superset of the names each class matches; all names when some alternative needs no text or
    the names are not ASCII."""
    if j.kernel_candidates is None:
        j.kernel_candidates = np.ones(len(j.heads), dtype=bool)
        if _KERNEL_LITERALS is not None and j.low.isascii() and len(j.low) > 1:
            b = np.frombuffer(j.low.encode("ascii"), dtype=np.uint8)
            pairs = (b[:-1].astype(np.uint16) << 8) | b[1:]
            # how rare each piece is, from about 2 million of them (bincount wants intp: 8 bytes a piece)
            count = np.bincount(pairs[::max(1, pairs.size >> 21)].astype(np.intp), minlength=1 << 16)
            wanted = np.zeros(1 << 16, dtype=bool)
            for lit in _KERNEL_LITERALS:
                codes = [(ord(x) << 8) | ord(y) for x, y in itertools.pairwise(lit)]
                wanted[min(codes, key=count.__getitem__)] = True
            at = np.flatnonzero(wanted[pairs])
            j.kernel_candidates = np.zeros(len(j.heads), dtype=bool)
            j.kernel_candidates[np.searchsorted(j.low_starts, at, side="right") - 1] = True
    return j.kernel_candidates


def _scan_among(j: _Joined, pattern: re.Pattern[str], among: np.ndarray, low: bool) -> np.ndarray:
    """``pattern`` over the names (lower-cased when ``low``) where ``among`` holds; False elsewhere. The
    names are joined with line breaks as in the full text, so anchors and look-behinds see the same."""
    hit = np.zeros(len(j.heads), dtype=bool)
    idx = np.flatnonzero(among)
    if idx.size:
        lows = [j.heads[i].lower() if low else j.heads[i] for i in idx.tolist()]
        hit[idx] = _find("\n".join(lows), _starts(lows), pattern, idx.size)
    return hit


#: The characters that give a branch structure (groups, classes, escapes): a branch holding none
#: splits into itself, so :func:`_branches` need not check it.
_GROUPING = frozenset("\\()[")
#: The characters :func:`_required_text` does not read as plain text: a branch holding none of them
#: is all plain, and contains itself whole.
_NOT_PLAIN = frozenset("\\()[.^$|*+?{}")


def _branches(pattern: str) -> list[str]:
    """The top-level alternatives of ``pattern``: of ``(a|b|c)`` when one group spans it all, else of the pattern."""
    def split(body: str) -> list[str] | None:
        out, depth, cur, i = [], 0, "", 0
        while i < len(body):
            c = body[i]
            if c == "\\":
                cur, i = cur + body[i:i + 2], i + 2
                continue
            if c == "[":  # a character class: copied whole (a ``|`` or ``(`` inside means itself)
                end = i + 1 + (body[i + 1:i + 2] == "^")
                end += body[end:end + 1] == "]"
                while end < len(body) and body[end] != "]":
                    end += 1 + (body[end] == "\\")
                if end >= len(body):
                    return None
                cur, i = cur + body[i:end + 1], end + 1
                continue
            depth += (c == "(") - (c == ")")
            if depth < 0:
                return None
            if c == "|" and depth == 0:
                out.append(cur)
                cur = ""
            else:
                cur += c
            i += 1
        return [*out, cur] if depth == 0 else None

    if pattern.startswith("(") and not pattern.startswith("(?") and pattern.endswith(")"):
        inner = split(pattern[1:-1])
        if inner is not None and all(split(b) is not None for b in inner if not _GROUPING.isdisjoint(b)):
            return inner
    return [pattern]


def _required_text(branch: str) -> str | None:
    """The longest run of plain characters that every match of ``branch`` (one alternative of a
    pattern) contains, read outside its groups, classes and assertions; None when it has no run of
    two characters or more."""
    if _NOT_PLAIN.isdisjoint(branch):  # the loop below would keep every character
        return branch if len(branch) >= 2 else None
    runs, cur, depth, i = [], "", 0, 0
    while i < len(branch):
        c = branch[i]
        nxt = branch[i + 1:i + 2]
        if c == "\\":
            lit = branch[i + 1:i + 2]
            step = 2
            c = lit if lit and not lit.isalnum() else ""  # \. \( \#: the character itself; \d \w \b: not plain
        else:
            step = 1
            if c in "()":
                depth += 1 if c == "(" else -1
                c = ""
            elif c == "[":
                end = i + 1 + (branch[i + 1:i + 2] == "^")
                end += branch[end:end + 1] == "]"
                while end < len(branch) and branch[end] != "]":
                    end += 1 + (branch[end] == "\\")
                step, c = end + 1 - i, ""
            elif c in ".^$|*+?{}":
                c = ""
        nxt = branch[i + step:i + step + 1]
        if nxt in ("?", "*", "{") or depth or not c:  # optional (or repeated from zero) or not plain text
            runs.append(cur)
            cur = ""
        else:
            cur += c
        i += step
    runs.append(cur)
    best = max(runs, key=len)
    return best if len(best) >= 2 else None


_subsets: tuple[list[str], np.ndarray, list[str]] | None = None


def classify(names: list[str], predicate: Callable[[str], object], among: np.ndarray) -> np.ndarray:
    """``predicate`` over the ``names`` where ``among`` holds (all at once when it has a ``batch``
    twin), False over the others. The subset of one ``names``/``among`` pair is kept, so that
    several classifiers over it share one joined text."""
    global _subsets
    with _cache_lock:
        kept = _subsets
    if kept is not None and kept[0] is names and kept[1].shape == among.shape and np.array_equal(kept[1], among):
        subset = kept[2]
    else:
        subset = [names[i] for i in np.flatnonzero(among).tolist()]
        with _cache_lock:
            _subsets = (names, among.copy(), subset)
    out = np.zeros(len(names), dtype=bool)
    batch = getattr(predicate, "batch", None)
    hit = batch(subset) if batch is not None else np.fromiter((bool(predicate(n)) for n in subset), dtype=bool, count=len(subset))
    out[among] = hit
    return out


def _whole(members: frozenset[str]) -> re.Pattern[str]:
    """A multi-line pattern for names that are exactly one of ``members``."""
    return re.compile("^(?:" + "|".join(map(re.escape, sorted(members, key=len, reverse=True))) + ")$", re.M)


def _batch(scalar: Callable[[str], bool], combine: Callable[[list[str]], np.ndarray]) -> Callable[[str], bool]:
    """Give ``scalar`` (a one-name classifier) its all-names twin ``scalar.batch``."""

    def batch(names: list[str]) -> np.ndarray:
        names = names if isinstance(names, list) else list(names)
        hit = combine(names).copy() if names else np.zeros(0, dtype=bool)  # the scans are shared: a copy
        for i in _joined(names).odd if names else ():
            hit[i] = bool(scalar(names[i]))
        return hit

    setattr(scalar, "batch", batch)  # noqa: B010 (a function attribute, which mypy cannot declare)
    return scalar


_STEP_M = re.compile(_text("STEP_RE"), re.M)
_DATALOADER_M = re.compile("^" + re.escape(DATALOADER_PREFIX), re.M)
_MATMUL_M = re.compile(_text("_MATMUL"), _DEFERRED["_MATMUL"][1] | re.M)
_INDUCTOR_M = re.compile(_text("INDUCTOR_FUSED_RE"), re.M)
_SOFTMAX_LOW = re.compile("softmax")
_batch(is_step, lambda n: _scan(n, _STEP_M, False))
_batch(is_dataloader, lambda n: _scan(n, _DATALOADER_M, False))
_SYNC_CALLS_M, _GRAPH_LAUNCH_M, _STREAM_WAIT_M = map(_whole, (SYNC_CALLS, GRAPH_LAUNCH_CALLS, STREAM_WAIT_CALLS))
_batch(is_sync_call, lambda n: _scan(n, _SYNC_CALLS_M, False))
_batch(is_graph_launch, lambda n: _scan(n, _GRAPH_LAUNCH_M, False))
_batch(is_stream_wait, lambda n: _scan(n, _STREAM_WAIT_M, False))
_batch(is_nccl, lambda n: _scan(n, _COLLECTIVE, True))
_batch(is_tensor_core, lambda n: _scan(n, _TENSOR_CORE, True))
_batch(is_matmul, lambda n: _scan(n, _MATMUL_M, True) & ~_scan(n, _COLLECTIVE, True))
_batch(is_training, lambda n: _scan(n, TRAINING_RE, False))
_batch(is_fused_attention, lambda n: _scan(n, _FUSED_ATTENTION, True))
_batch(is_softmax, lambda n: _scan(n, _SOFTMAX_LOW, True) & ~_scan(n, _FUSED_ATTENTION, True))
_batch(is_elementwise, lambda n: _scan(n, _ELEMENTWISE, True) & ~_scan(n, _INDUCTOR_M, False) & ~_scan(n, _COLLECTIVE, True))
#: The classes read from kernel names, scanned only over the names their union matches (most
#: kernel names match none; a trace with hundreds of thousands of distinct names stays fast).
#: Each with whether it reads the lower-cased names (the folded patterns) or the names as given.
_KERNEL_CLASSES: dict[re.Pattern[str], bool] = {
    **dict.fromkeys((_COLLECTIVE, _TENSOR_CORE, _MATMUL_M, _FUSED_ATTENTION, _ELEMENTWISE, _SOFTMAX_LOW), True),
    TRAINING_RE: False, _INDUCTOR_M: False}
_required = [_required_text(b) for p in sorted(_KERNEL_CLASSES, key=lambda p: p.pattern) for b in _branches(p.pattern)]
#: The text each alternative of a kernel class must contain, lower-cased (a name holding it as given
#: holds it lower-cased; None: some alternative needs none, so no name is skipped).
_KERNEL_LITERALS: tuple[str, ...] | None = (None if None in _required
                                             else tuple(sorted({x.lower() for x in _required if x})))
#: The host classes' multi-line twins (``.`` and ``\w`` never cross a line break, so ``.*`` stays in its name).
_COMPILE_M, _NOT_COMPILE_M = re.compile(_text("COMPILE_RE"), re.M), NOT_COMPILE_RE  # anchors: per name
_batch(is_compile, lambda n: _scan(n, _COMPILE_M, False) & ~_scan(n, _NOT_COMPILE_M, False))
_COMM_HOST_M = re.compile(_text("COMM_HOST_RE"), re.M)
_batch(is_comm_host, lambda n: _scan(n, _COMM_HOST_M, False))


# --- What kind of window: start-up, graph capture, one-off host work (analysis.segments) ----
#: Stream capture and graph instantiation (CUDA Runtime API "Graph Management" /
#: "Stream Management": ``cudaStreamBeginCapture``, ``cudaStreamEndCapture``,
#: ``cudaGraphInstantiate[WithFlags|WithParams]``; Driver API ``cuStreamBeginCapture``...;
#: HIP Runtime API twins ``hipStreamBeginCapture``... ``hipGraphInstantiateWithFlags``).
BEGIN_CAPTURE_CALLS = frozenset({"cudaStreamBeginCapture", "cudaStreamBeginCapture_v2", "cuStreamBeginCapture",
                                 "cuStreamBeginCapture_v2", "hipStreamBeginCapture"})
END_CAPTURE_CALLS = frozenset({"cudaStreamEndCapture", "cuStreamEndCapture", "hipStreamEndCapture"})
GRAPH_INSTANTIATE_RE: re.Pattern[str]
_defer("GRAPH_INSTANTIATE_RE", r"^(cuda|cu|hip)GraphInstantiate")
#: Host frames and annotations that record a graph: ``torch.cuda.graph``'s ``capture_begin`` /
#: ``capture_end`` (torch/cuda/graphs.py), cudagraph-trees' recording (torch/_inductor/
#: cudagraph_trees.py: ``CUDAGraphNode._record``, ``CUDAGraphTreeManager.record_function``),
#: vLLM's capture loop (vllm/v1/worker/gpu_model_runner.py ``capture_model`` /
#: ``_capture_cudagraphs``; its ``capture_<batch>_<mode>`` annotations) and SGLang's
#: (sglang/srt/model_executor/cuda_graph_runner.py ``capture``).
CAPTURE_FRAME_RE: re.Pattern[str]
_defer(
    "CAPTURE_FRAME_RE",
    r"(torch/cuda/graphs\.py\(\d+\): (capture_begin|capture_end)|"
    r"cudagraph_trees\.py\(\d+\): (_record|record_function)\b|"
    r"gpu_model_runner\.py\(\d+\): (capture_model|_capture_cudagraphs)|"
    r"cuda_graph_runner\.py\(\d+\): capture|^capture_\d+(_\w+)?$)"
)
#: Runtime and driver calls whose first call does one-off work, by source: context creation
#: (CUDA C++ Programming Guide, "Initialization": the primary context is created on the first
#: runtime call that needs it; PyTorch's first CUDA call is often
#: ``cudaDeviceGetStreamPriorityRange`` or ``cudaFree(0)``), lazy module loading (CUDA C++
#: Programming Guide, "Lazy Loading": with CUDA_MODULE_LOADING=LAZY, the default from CUDA 12.2,
#: a kernel's module is loaded by its first launch), stream/event creation and library handle
#: creation in the first cuBLAS/cuDNN/hipBLASLt call. A call only counts as start-up when it lasts
#: orders of magnitude longer than its peers (``segments.OUTLIER_RATIO``).
COLD_CALL_RE: re.Pattern[str]
_defer(
    "COLD_CALL_RE",
    r"^(cuda|cu|hip)(LaunchKernel|LaunchKernelExC?|LaunchCooperativeKernel|ModuleLaunchKernel|ExtModuleLaunchKernel|"
    r"ExtLaunchKernel|StreamCreate\w*|EventCreate\w*|DeviceGetStreamPriorityRange|Free|Malloc\w*|"
    r"ModuleLoad\w*|LibraryLoad\w*|GetDevice\w*|SetDevice|DeviceGetAttribute|FuncGetAttributes|"
    r"OccupancyMaxActiveBlocksPerMultiprocessor\w*|DevicePrimaryCtxRetain|CtxCreate\w*|Init|"
    r"LaunchKernel_v2|MemGetInfo)$"
)
#: Operators inside which a blocking sync is the library's, not the user's: cuDNN's algorithm
#: search when ``torch.backends.cudnn.benchmark`` is on (it times candidate algorithms with
#: events: aten/src/ATen/native/cudnn/Conv_v7.cpp), MIOpen's find step (``miopen_convolution``),
#: and the caching allocator freeing cached blocks after a failed allocation
#: (c10/cuda/CUDACachingAllocator.cpp ``synchronize_and_free_events``), inside the op that allocates.
LIBRARY_SYNC_OP_RE: re.Pattern[str]
_defer(
    "LIBRARY_SYNC_OP_RE",
    r"(^aten::cudnn_|^aten::miopen_|^Cudnn|^Miopen|cudnnFind|miopenFind|"
    r"^aten::(empty|empty_strided|empty_like|new_empty|new_empty_strided)$)"
)
LIBRARY_SYNC_KIND = (("cudnn", "cuDNN's algorithm search (cudnn.benchmark)"),
                     ("miopen", "MIOpen's algorithm search"),
                     ("empty", "the caching allocator freeing cached blocks"))
#: Host frames that load code or a model before any GPU work (``one_off_host``): Python's
#: import machinery (``<frozen importlib._bootstrap>``), transformers' ``from_pretrained``,
#: ``torch.load``/``load_state_dict`` (torch/serialization.py, torch/nn/modules/module.py),
#: safetensors and huggingface_hub downloads.
ONE_OFF_FRAME_RE: re.Pattern[str]
_defer(
    "ONE_OFF_FRAME_RE",
    r"(<frozen importlib\._bootstrap|importlib/__init__\.py|\): _find_and_load|\): from_pretrained|"
    r"torch/serialization\.py|\): load_state_dict|safetensors|huggingface_hub/|\): _load_pretrained_model)"
)
#: Serving engines, from their own module paths and annotations (vLLM, SGLang, TensorRT-LLM,
#: Hugging Face TGI, LMDeploy): the workload is serving.
ENGINE_RE: re.Pattern[str]
_defer("ENGINE_RE", r"(^|/)(vllm|sglang|tensorrt_llm|text_generation_server|lmdeploy)/|^execute_model|^capture_\d+")


def is_capture_call(name: str) -> bool:
    head = _head(name)
    return head in BEGIN_CAPTURE_CALLS or head in END_CAPTURE_CALLS or bool(_compiled("GRAPH_INSTANTIATE_RE").match(head))


def is_capture_frame(name: str) -> bool:
    return bool(_compiled("CAPTURE_FRAME_RE").search(_head(name)))


def is_cold_call(name: str) -> bool:
    return bool(_compiled("COLD_CALL_RE").match(_head(name)))


def is_library_sync_op(name: str) -> bool:
    return bool(_compiled("LIBRARY_SYNC_OP_RE").search(_head(name)))


def is_one_off_frame(name: str) -> bool:
    return bool(_compiled("ONE_OFF_FRAME_RE").search(_head(name)))


def is_engine(name: str) -> bool:
    return bool(_compiled("ENGINE_RE").search(_head(name)))


_CAPTURE_CALLS_M = _whole(BEGIN_CAPTURE_CALLS | END_CAPTURE_CALLS)
_GRAPH_INSTANTIATE_M = re.compile(_text("GRAPH_INSTANTIATE_RE"), re.M)
_batch(is_capture_call, lambda n: _scan(n, _CAPTURE_CALLS_M, False) | _scan(n, _GRAPH_INSTANTIATE_M, False))
_CAPTURE_FRAME_M, _COLD_CALL_M, _LIBRARY_SYNC_OP_M, _ONE_OFF_FRAME_M, _ENGINE_M = (
    re.compile(_text(p), re.M) for p in ("CAPTURE_FRAME_RE", "COLD_CALL_RE", "LIBRARY_SYNC_OP_RE", "ONE_OFF_FRAME_RE",
                                         "ENGINE_RE"))
_batch(is_capture_frame, lambda n: _scan(n, _CAPTURE_FRAME_M, False))
_batch(is_cold_call, lambda n: _scan(n, _COLD_CALL_M, False))
_batch(is_library_sync_op, lambda n: _scan(n, _LIBRARY_SYNC_OP_M, False))
_batch(is_one_off_frame, lambda n: _scan(n, _ONE_OFF_FRAME_M, False))
_batch(is_engine, lambda n: _scan(n, _ENGINE_M, False))


#: The architecture a library kernel was built for, from its name: cuBLAS and cuDNN prefix
#: their kernels with it (``volta_sgemm_128x64_nn``, ``turing_fp16_s1688gemm_*``,
#: ``ampere_sgemm_*``; CUTLASS-generated ones ``sm80_xmma_*``, ``sm90_xmma_*``). A kernel runs
#: only on a GPU of its architecture or later, so the largest one seen is a lower bound on the
#: device's compute capability — used only when the trace has no ``deviceProperties``.
ARCH_PREFIX_RE: re.Pattern[str]
_defer("ARCH_PREFIX_RE", r"^(?:void )?(?:cutlass::Kernel<cutlass_\d+_tensorop_)?(volta|turing|ampere|hopper|sm(\d{2,3}))_")
ARCH_CC = {"volta": (7, 0), "turing": (7, 5), "ampere": (8, 0), "hopper": (9, 0)}


def kernel_arch(name: str) -> tuple[int, int] | None:
    """``"volta_sgemm_128x64_nn"`` → ``(7, 0)``; ``"sm90_xmma_gemm_..."`` → ``(9, 0)``; else ``None``."""
    m = _compiled("ARCH_PREFIX_RE").match(name)
    if not m:
        return None
    if m.group(2):
        d = m.group(2)
        return int(d[:-1]), int(d[-1])
    return ARCH_CC[m.group(1)]


#: Matmul and convolution kernels from libraries that autocast reaches (it changes the dtype of
#: the library call's inputs): cuBLAS/cuBLASLt (``*gemm*`` with a ``volta_``/``ampere_``/``sm90_``
#: prefix, ``cublas``, ``nvjet``), CUTLASS (``cutlass``, ``xmma``), cuDNN (``cudnn``, ``scudnn``,
#: ``implicit_convolve``, ``winograd``, ``fprop``/``dgrad``/``wgrad``), AMD Tensile/hipBLASLt
#: (``Cijk_``), rocBLAS, MIOpen (``igemm``, ``miopen``), Composable Kernel (``ck_``), Triton and
#: Inductor (``triton_``, vLLM's ``_matmul_ogs``), fused attention, and cuBLAS's unprefixed
#: kernels (``sgemm_*``, ``gemv2T_kernel``, ``gemmSN_*``, ``splitKreduce``). A matmul-named kernel outside this list
#: is taken as hand-written: autocast does not change its dtype.
LIBRARY_MATMUL_RE: re.Pattern[str]
_defer(
    "LIBRARY_MATMUL_RE",
    r"(cublas|nvjet|cutlass|xmma|cudnn|implicit_convolve|winograd|fprop|dgrad|wgrad|^Cijk_|rocblas|hipblas|"
    r"igemm|miopen|^ck_|ck::|triton|^_matmul|matmul_ogs|flash|fmha|attn|attention|"
    r"^(void )?(volta|turing|ampere|hopper|maxwell|kepler|sm\d{2,3})_\w*(gemm|conv)|"
    r"^(void )?([sdhcz]gemm|gemv|gemmSN|gemmk1|splitKreduce|dot_kernel|reduce_1Block))",
    re.IGNORECASE,
)


def is_library_matmul(name: str) -> bool:
    return bool(_compiled("LIBRARY_MATMUL_RE").search(_head(name)))


_LIBRARY_MATMUL_M = re.compile(_folded("LIBRARY_MATMUL_RE")[0], re.M)
_batch(is_library_matmul, lambda n: _scan(n, _LIBRARY_MATMUL_M, True))


#: Factory and random operators that build a tensor where they run (PyTorch "Tensor creation
#: ops"): on the CPU, followed by a host-to-device copy, they are host work that creating the
#: tensor on the device (``device="cuda"``) or prefetching removes.
TENSOR_CREATION_OPS = frozenset({"aten::normal_", "aten::randn", "aten::rand", "aten::randint", "aten::randperm",
                                 "aten::uniform_", "aten::random_", "aten::bernoulli_", "aten::arange",
                                 "aten::linspace", "aten::full", "aten::ones", "aten::zeros", "aten::eye"})
