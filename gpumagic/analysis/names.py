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
