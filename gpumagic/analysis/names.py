"""What an event's name says: step markers, data-loader waits, syncs, NCCL, tensor cores.

Classifiers run once per *distinct* name (a few thousand at most), never per event.
"""

from __future__ import annotations

import re

STEP_RE = re.compile(r"^ProfilerStep#\d+$")
DATALOADER_PREFIX = "enumerate(DataLoader)"

#: Host calls that block until the GPU (or a stream/event) has finished its queued work.
#: CUDA runtime/driver and their ROCm (HIP) twins; ``cudaMemcpy`` without ``Async`` is
#: synchronous with respect to the host (CUDA Runtime API, "API synchronization behavior").
SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
})
#: Operators that force a sync to read a value on the host (PyTorch docs,
#: ``torch.cuda.set_sync_debug_mode``; ``.item()`` lowers to ``_local_scalar_dense``).
SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero",
                      "aten::equal", "aten::masked_select", "aten::unique", "aten::_unique2"})
#: Host calls that grow the caching allocator (cold start) or create the context.
ALLOC_CALLS = frozenset({"cudaMalloc", "cudaMallocAsync", "cudaHostAlloc", "cudaMallocHost", "cudaFree",
                         "cuMemAlloc_v2", "cuMemCreate", "hipMalloc", "hipFree", "hipHostMalloc"})
INIT_CALLS = frozenset({"cuInit", "cuDevicePrimaryCtxRetain", "cudaGetDeviceCount", "cudaSetDevice",
                        "cudaGetDeviceProperties", "cudaGetDeviceProperties_v2", "hipInit", "hipGetDeviceCount"})
COMPILE_RE = re.compile(r"(convert_frame\.py.*_compile|compile_fx|async_compile|codecache|"
                        r"TorchDynamo|torch/_inductor/.*compile|triton/compiler|autotune|cudnnFind)")

NCCL_RE = re.compile(r"nccl|rccl", re.IGNORECASE)

#: Kernel-name fragments that mean tensor-core instructions (HMMA/IMMA/GMMA/wgmma) are used.
#: cuBLAS/cuDNN encode the MMA shape or precision in the name (``h884``, ``s1688``, ``16816``,
#: ``tf32``, ``bf16``); cutlass names ``tensorop``; Hopper's cuBLAS kernels are ``nvjet``
#: and ``sm90_xmma_*gmma*``; flash-attention and fused MHA kernels always use tensor cores.
TENSOR_CORE_RE = re.compile(
    r"(h884|h1688|s1688|h16816|s16816|i8816|i16832|884gemm|1688gemm|16816gemm|tensorop|wmma|hmma|"
    r"imma|gmma|wgmma|nvjet|tf32|bf16|fp16|f16f16|_f16_|e4m3|e5m2|fp8|flash|fmha|sm90_xmma|sm100_)",
    re.IGNORECASE,
)
#: Matmul and convolution kernels: the work tensor cores accelerate.
MATMUL_RE = re.compile(
    r"(gemm|gemv|conv|wgrad|dgrad|fprop|matmul|cutlass|nvjet|xmma|flash|fmha|attention|winograd|"
    r"implicit_convolve|cublas|mma)",
    re.IGNORECASE,
)

COPY_KIND_RE = re.compile(r"Memcpy (HtoD|DtoH|DtoD|PtoP|HtoH)(?: \((\w+) -> (\w+)\))?")


def is_step(name: str) -> bool:
    return bool(STEP_RE.match(name))


def is_dataloader(name: str) -> bool:
    return name.startswith(DATALOADER_PREFIX)


def is_sync_call(name: str) -> bool:
    return name in SYNC_CALLS


def is_nccl(name: str) -> bool:
    return bool(NCCL_RE.search(name))


def is_tensor_core(name: str) -> bool:
    return bool(TENSOR_CORE_RE.search(name))


def is_matmul(name: str) -> bool:
    return bool(MATMUL_RE.search(name)) and not is_nccl(name)


def is_compile(name: str) -> bool:
    return bool(COMPILE_RE.search(name))


def copy_kind(name: str) -> tuple[str, str]:
    """``"Memcpy HtoD (Pageable -> Device)"`` → ``("HtoD", "pageable")``.

    The memory kind is that of the host side (source for HtoD, destination for DtoH):
    ``pageable``, ``pinned``, ``device`` (device-to-device) or ``unknown``.
    """
    m = COPY_KIND_RE.match(name)
    if not m:
        return "other", "unknown"
    direction, src, dst = m.group(1), m.group(2), m.group(3)
    if direction in ("DtoD", "PtoP"):
        return direction, "device"
    host = {"HtoD": src, "DtoH": dst}.get(direction, src)
    return direction, (host or "unknown").lower()


# --- Kernel-level classes (issue 14): fused attention, softmax, elementwise/reduction -----------
#: Fused attention kernels: FlashAttention (``flash_fwd_kernel``/``flash_bwd``, the names in
#: PyTorch's ``aten/src/ATen/native/transformers/cuda/flash_attn``), memory-efficient attention
#: (``fmha_cutlassF``/``fmha_cutlassB``, xFormers' kernels vendored in PyTorch's
#: ``mem_eff_attention``), cuDNN's SDPA (``cudnn_generated_fort_native_sdpa``, names seen in
#: cuDNN frontend traces), fused MHA (``fmha``), AMD Composable Kernel ``ck_fmha``/``fmha_fwd``
#: and aiter ``mha_fwd``, Triton attention (``attn_fwd``/``attn_bwd`` in the TraceLens MI300X
#: traces, vLLM's ``unified_attention``/``paged_attention``).
FUSED_ATTENTION_RE = re.compile(
    r"(flash_fwd|flash_bwd|flash_attn|FlashAttn|fmha|efficient_attention|mem_eff|native_sdpa|_sdpa_|"
    r"attn_fwd|attn_bwd|unified_attention|paged_attention|mha_fwd|mha_bwd)",
    re.IGNORECASE,
)
#: Softmax kernels: PyTorch's ``cunn_SoftMaxForward``/``softmax_warp_forward`` (aten/src/ATen/
#: native/cuda/SoftMax.cu, PersistentSoftmax.cuh), MIOpen ``SoftmaxForward``, Triton ``*softmax*``.
SOFTMAX_RE = re.compile(r"softmax", re.IGNORECASE)
#: Memory-bound elementwise, reduction and normalisation kernels, the work fusion collapses.
#: PyTorch's TensorIterator kernels are ``elementwise_kernel``, ``vectorized_elementwise_kernel``,
#: ``unrolled_elementwise_kernel`` and ``reduce_kernel`` (aten/src/ATen/native/cuda/Loops.cuh,
#: Reduce.cuh); optimizers' ``multi_tensor_apply_kernel`` (ForeachFunctors.cuh); normalisation:
#: cuDNN ``bn_fw_*``/``bn_bw_*``, PyTorch ``batch_norm_*``, ``layer_norm``, ``group_norm``,
#: ``rms_norm``, ck_tile ``rmsnorm``; softmax; ``CatArrayBatchedCopy``. Triton kernels that
#: Inductor generated (``triton_poi_``/``triton_red_``/``triton_per_``) are already fused and do
#: not count.
ELEMENTWISE_RE = re.compile(
    r"(elementwise_kernel|reduce_kernel|multi_tensor_apply|\bbn_fw|\bbn_bw|batch_norm|layer_norm|LayerNorm|"
    r"group_norm|rms_?norm|softmax|CatArrayBatchedCopy|\bindex_elementwise|fill_kernel|"
    r"(?<![a-z])(add|mul|div|where|copy)_kernel)",
    re.IGNORECASE,
)
INDUCTOR_FUSED_RE = re.compile(r"^triton_(poi|red|per|tem)_")


def is_fused_attention(name: str) -> bool:
    return bool(FUSED_ATTENTION_RE.search(name))


def is_softmax(name: str) -> bool:
    return bool(SOFTMAX_RE.search(name)) and not is_fused_attention(name)


def is_elementwise(name: str) -> bool:
    return bool(ELEMENTWISE_RE.search(name)) and not INDUCTOR_FUSED_RE.match(name) and not is_nccl(name)
