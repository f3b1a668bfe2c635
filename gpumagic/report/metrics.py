"""``Report.metrics`` as typed records: one frozen :class:`msgspec.Struct` per section.

The analysis (:mod:`gpumagic.analysis.metrics` and its helpers) builds them; rules and views read
their attributes (``report.metrics.idle.host_wait_ms``). The report layer declares them so that it
owns the contract: :meth:`Report.to_dict` encodes them with :func:`msgspec.to_builtins` (the field
order below is the key order of the JSON), :func:`gpumagic.report.model.report_from_dict` decodes
them with :func:`msgspec.convert`, and ``gpumagic schema`` prints the JSON Schema generated from
them (:mod:`gpumagic.report.schema`). Every field's description states its unit; docs/metrics.md
explains how each value is measured.

Units, as the names say: ``_ms`` milliseconds, ``_us`` microseconds, ``_ns`` nanoseconds relative
to the trace origin, ``_frac`` a share 0..1 of the analysis window unless said otherwise,
``_bytes`` bytes. A value the trace cannot give is ``None`` (``null`` in JSON).

Adding a section: declare a ``Record`` subclass here (each field ``Annotated[type, Meta(description=...)]``
with its unit), add it to :class:`Metrics` (nullable with a default of ``None`` when it may be
missing), build it in the analysis, document it in docs/metrics.md, and regenerate the committed
schema (``python -m gpumagic schema report > docs/schema/report.schema.json``).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

R = TypeVar("R")


def _d(text: str) -> Meta:
    return Meta(description=text)


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """Base of the metrics records. For code written against the plain-dict form (notebooks,
    scripts), ``record["key"]`` reads a field as ``record.key`` does (an unknown key raises
    KeyError, never a silent ``None``), ``record.get("key", default)`` is ``dict.get``, and
    ``keys()``, ``values()``, ``items()`` and ``"key" in record`` list the fields as a dict's. New
    code reads attributes, which type checkers see."""

    def __getitem__(self, key: str) -> Any:
        if key not in self.__struct_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key``, or ``default`` when there is none (as ``dict.get``)."""
        return getattr(self, key) if key in self.__struct_fields__ else default

    def __contains__(self, key: object) -> bool:
        return key in self.__struct_fields__

    def __iter__(self) -> Iterator[str]:
        """The field names, as iterating a dict gives its keys."""
        return iter(self.__struct_fields__)

    def keys(self) -> tuple[str, ...]:
        """The field names, in the JSON's order."""
        return tuple(self.__struct_fields__)

    def values(self) -> list[Any]:
        return [getattr(self, k) for k in self.__struct_fields__]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.__struct_fields__]


# -- trace -----------------------------------------------------------------------------------


class DeviceMetrics(Record, frozen=True):
    """One GPU as the trace's ``deviceProperties`` lists it."""

    id: Annotated[int, _d("device index in the trace")]
    name: Annotated[str, _d("device name, e.g. 'NVIDIA H100 80GB HBM3'")]
    compute_capability: Annotated[float, _d("CUDA compute capability major.minor (0.0 when not given)")]
    total_memory_bytes: Annotated[int, _d("device memory (bytes; 0 when not given)")]


class Distributed(Record, frozen=True):
    """The trace's ``distributedInfo``."""

    backend: Annotated[str | None, _d("process-group backend, e.g. 'nccl'")]
    rank: Annotated[int | None, _d("this process's rank")]
    world_size: Annotated[int | None, _d("number of ranks in the job")]


class TraceMetrics(Record, frozen=True):
    """What was analysed."""

    source: Annotated[str, _d("the trace's path, or a description of where it came from")]
    events: Annotated[int, _d("number of events in the trace (count)")]
    schema: Annotated[str | None, _d("'2021' for Operator/Runtime/Kernel categories, else 'current'")]
    devices: Annotated[list[DeviceMetrics], _d("the GPUs the trace lists")]
    cpu_only: Annotated[bool, _d("no GPU work in the trace")]
    distributed: Annotated[Distributed | None, _d("the job this trace is one rank of; null for a single process")]
    workload: Annotated[str, _d("'training' (a backward pass or an optimizer step ran), 'serving' (a serving engine's "
                                "own annotations) or 'inference'")]


# -- window and steps ------------------------------------------------------------------------


class WindowMetrics(Record, frozen=True):
    """The analysis window: every duration and fraction is over it."""

    start_ns: Annotated[int, _d("window start (ns from the trace origin)")]
    end_ns: Annotated[int, _d("window end (ns from the trace origin)")]
    dur_ms: Annotated[float, _d("window duration (ms)")]
    source: Annotated[str, _d("'steps' when ProfilerStep# markers bound it, else 'trace' (the whole trace)")]
    segments: Annotated[list[SegmentMetrics], _d("what each part of the window is (analysis/segments.py), in time "
                                                 "order; at most 50, the longest kept")] = msgspec.field(default_factory=list)
    steady_frac: Annotated[float | None, _d("share of the window in steady segments (0..1); null only in older reports")] = None
    steady_judged_ms: Annotated[list[float] | None, _d("[start, end] of the steady stretch the steady-state rules judged "
                                                       "(ms from start_ns); null when the window is all steady or has none")] = None


class SegmentMetrics(Record, frozen=True):
    """A part of the window and what it is: 'steady' unless positively identified as another kind."""

    kind: Annotated[str, _d("'steady', 'cold_start', 'graph_capture', 'compile', 'one_off_host', 'evaluation' "
                            "(an evaluation loop a gpumagic capture saw) or 'idle_tail'")]
    start_ms: Annotated[float, _d("start (ms from window.start_ns)")]
    dur_ms: Annotated[float, _d("duration (ms)")]
    evidence: Annotated[list[str], _d("what identified it, in short sentences")]


class StepMetrics(Record, frozen=True):
    """The recorded steps (``ProfilerStep#`` markers)."""

    count: Annotated[int, _d("number of steps (count)")]
    names: Annotated[list[str], _d("step marker names, in time order")]
    bounds_ns: Annotated[list[tuple[int, int]], _d("[start, end] of each step (ns from the trace origin)")]
    durations_ms: Annotated[list[float], _d("duration of each step (ms)")]
    median_ms: Annotated[float | None, _d("median step duration (ms); null without steps")]
    p90_ms: Annotated[float | None, _d("90th percentile of the step durations (ms); null without steps")]
    first_step_outlier: Annotated[bool, _d("the first step took at least twice the median of the others (warm-up in the window)")]
    first_over_median: Annotated[float | None, _d("first step ÷ median of the others (ratio); null with fewer than 3 steps")]
    all_ms: Annotated[list[float] | None, _d("every optimizer step of the cell, recorded or not, in order: its duration "
                                             "on the host (ms; gpumagic's own hook work left out); null without "
                                             "gpumagic's step timer (a plain trace)")] = None
    all_wait_ms: Annotated[list[float] | None, _d("each step of all_ms: its time waiting in the DataLoader's next() "
                                                  "(ms; null without a gpumagic capture or a DataLoader in the cell)")] = None
    all_recorded: Annotated[list[int] | None, _d("indices into all_ms of the recorded steps (the ProfilerStep# markers)")] = None
    all_profiled: Annotated[int | None, _d("how many leading steps of all_ms ran while the profiler recorded, "
                                           "recorded or skipped (count); the outlier check judges only later steps")] = None
    outliers: Annotated[list[StepOutlier] | None, _d("steps of all_ms beyond the spread of the rest, at least 2× "
                                                     "their median and 20 ms longer (analysis/everystep.py)")] = None
    torch_save_count: Annotated[int | None, _d("torch.save calls during the steps of all_ms after the first (count); "
                                               "null without gpumagic's step timer")] = None
    torch_save_frac: Annotated[float | None, _d("share of those steps' time spent in torch.save (0..1); null without "
                                                "gpumagic's step timer or without such steps")] = None
    evaluation_count: Annotated[int | None, _d("evaluation loops (a module in eval mode and no optimizer step) during "
                                               "the steps of all_ms after the first (count; the timer cannot tell them "
                                               "from a reinforcement-learning rollout in eval mode, which the window's "
                                               "segments can); null without gpumagic's step timer")] = None
    evaluation_frac: Annotated[float | None, _d("share of those steps' time spent in evaluation loops (0..1); null "
                                                "without gpumagic's step timer or without such steps")] = None


class StepCause(Record, frozen=True):
    """Something gpumagic saw run during a step."""

    kind: Annotated[str, _d("'gc' (a Python garbage collection), 'torch.save', 'compile' (torch.compile compiling "
                            "or recompiling), 'eval' (an evaluation loop: a module in evaluation mode with no "
                            "optimizer step before it left it), 'loader' (a DataLoader starting its worker "
                            "processes, until their first batch, or stopping them: each epoch without "
                            "persistent_workers) or 'data' (the step's wait in the DataLoader's next())")]
    ms: Annotated[float, _d("how long it ran inside the step (ms)")]
    detail: Annotated[str, _d("what gpumagic knows of it (a collection's generation, a compile id)")]


class StepOutlier(Record, frozen=True):
    """A step of ``steps.all_ms`` much slower than the others."""

    index: Annotated[int, _d("index into steps.all_ms")]
    ms: Annotated[float, _d("its duration (ms)")]
    over_median: Annotated[float, _d("its duration ÷ the median of the judged steps that are no outlier (ratio)")]
    excess_ms: Annotated[float, _d("its duration minus that median (ms)")]
    causes: Annotated[list[StepCause], _d("what ran during it, longest first; empty when nothing gpumagic "
                                          "watches coincided")]


# -- GPU -------------------------------------------------------------------------------------


class GpuDeviceMetrics(Record, frozen=True):
    """One GPU's activity in the window."""

    device: Annotated[int, _d("device index")]
    busy_frac: Annotated[float, _d("share of the window with a kernel, memcpy or memset running (0..1)")]
    busy_ms: Annotated[float, _d("union of kernel, memcpy and memset time over all its streams (ms)")]
    kernel_ms: Annotated[float, _d("union of kernel time (ms)")]
    memcpy_ms: Annotated[float, _d("union of memcpy time (ms)")]
    memset_ms: Annotated[float, _d("union of memset time (ms)")]
    streams: Annotated[list[int], _d("stream ids with work")]


class GpuMetrics(Record, frozen=True):
    """The primary GPU (the one with most kernel time) and every GPU."""

    primary_device: Annotated[int | None, _d("index of the primary GPU; null for a CPU-only trace")]
    primary_name: Annotated[str | None, _d("its deviceProperties name (kernels may number the GPU otherwise, as ROCm traces do)")]
    busy_frac: Annotated[float | None, _d("share of the window the primary GPU was busy (0..1); null for a CPU-only trace")]
    busy_ms: Annotated[float, _d("primary GPU: union of kernel, memcpy and memset time over all its streams (ms)")]
    per_device: Annotated[list[GpuDeviceMetrics], _d("every GPU with work")]
    energy_j: Annotated[float | None, _d("energy the primary GPU used over the window (J), from NVML: its total-energy "
                                         "counter where the device has one, else the integral of its power samples; "
                                         "null without NVML samples")] = None
    energy_j_per_step: Annotated[float | None, _d("energy_j ÷ the recorded steps (J); null without steps or energy")] = None
    energy_j_per_sample: Annotated[float | None, _d("energy_j_per_step ÷ (the batch size the capture was told, "
                                                    "capture.batch_size, × capture.accumulation_steps, batches per "
                                                    "optimizer step) (J per training sample); null without a batch "
                                                    "size, steps or energy")] = None
    idle_energy_frac: Annotated[float | None, _d("share of energy_j used while the GPU was idle (0..1): each sampling "
                                                 "interval's energy split by the share of it the GPU was idle")] = None
    energy_source: Annotated[str | None, _d("'counter' (nvmlDeviceGetTotalEnergyConsumption) or 'power' "
                                            "(nvmlDeviceGetPowerUsage samples integrated); null without energy")] = None


# -- breakdown -------------------------------------------------------------------------------


class BreakdownMetrics(Record, frozen=True):
    """Exclusive time per category: each moment counts once, for the first category in ``order``
    active then. Categories: kernel, memcpy, memset, communication, runtime, dataloader,
    cpu_exec, other."""

    order: Annotated[list[str], _d("category names, in priority order")]
    total_ms: Annotated[dict[str, float], _d("category -> exclusive time in the window (ms)")]
    frac: Annotated[dict[str, float], _d("category -> share of the window (0..1)")]
    per_step_ms: Annotated[list[dict[str, float]], _d("one dict per step: category -> exclusive time in that step (ms)")]


# -- idle ------------------------------------------------------------------------------------


class GapMetrics(Record, frozen=True):
    """One idle gap of the primary GPU."""

    start_ns: Annotated[int, _d("gap start (ns from the trace origin)")]
    end_ns: Annotated[int, _d("gap end (ns from the trace origin)")]
    cause: Annotated[str, _d("the larger part of the gap: 'host_wait', 'launch_latency', or for queued work the "
                             "dependency the trace shows ('stream_wait', 'collective', 'graph_launch'), else 'other'")]
    host_wait_ms: Annotated[float, _d("the part of the gap spent waiting for the host to launch work (ms)")]


class IdleMetrics(Record, frozen=True):
    """The primary GPU's idle time in the window, split at the launch of the work that ends each gap."""

    total_ms: Annotated[float, _d("idle time in the window (ms)")]
    host_wait_ms: Annotated[float, _d("idle time waiting for the host to launch work (ms)")]
    launch_latency_ms: Annotated[float, _d("idle time of the normal launch delay (ms)")]
    other_ms: Annotated[float, _d("idle time with work queued that did not start: dependencies, other ranks (ms)")]
    launch_latency_max_us: Annotated[float, _d("launch delay counted as normal (µs)")]
    long_gap_count: Annotated[int, _d("gaps of 1 ms or more (count)")]
    long_gap_ms: Annotated[float, _d("total time of the gaps of 1 ms or more (ms)")]
    gaps: Annotated[list[GapMetrics], _d("the up to 50 longest gaps, in time order")]


# -- kernels, copies -------------------------------------------------------------------------


class KernelMetrics(Record, frozen=True):
    """One kernel name on the primary GPU."""

    name: Annotated[str, _d("kernel name")]
    count: Annotated[int, _d("launches in the window (count)")]
    total_ms: Annotated[float, _d("summed duration (ms)")]
    mean_us: Annotated[float, _d("mean duration (µs)")]
    tensor_core: Annotated[bool, _d("the name shows tensor cores (NVIDIA) or matrix cores/MFMA (AMD)")]
    matmul: Annotated[bool, _d("a matmul, convolution or attention kernel")]


class KernelsMetrics(Record, frozen=True):
    """Kernels of the primary GPU in the window."""

    count: Annotated[int, _d("kernels (count)")]
    total_ms: Annotated[float, _d("summed kernel duration (ms)")]
    median_us: Annotated[float | None, _d("median kernel duration (µs); null without kernels")]
    short_frac: Annotated[float | None, _d("share of kernels shorter than short_kernel_us (0..1 of the kernel count); null without kernels")]
    tensor_core_ms: Annotated[float, _d("summed duration of tensor-core (NVIDIA) or matrix-core/MFMA (AMD) kernels (ms)")]
    matmul_ms: Annotated[float, _d("summed duration of matmul, convolution and attention kernels (ms)")]
    matmul_tensor_core_ms: Annotated[float, _d("summed duration of the matmul kernels that use tensor cores (ms)")]
    short_kernel_us: Annotated[float, _d("what counts as a short kernel (µs)")]
    graph_frac: Annotated[float | None, _d("share of kernels replayed by cudaGraphLaunch/hipGraphLaunch (0..1 of the "
                                           "kernel count); null without kernels")]
    top: Annotated[list[KernelMetrics], _d("the up to 15 kernel names with most time, largest first")]
    matmul_fp64_ms: Annotated[float, _d("summed duration of the matmul kernels that compute in float64 (ms; "
                                        "dgemm/zgemm/dgemv, f64/d884/dmma, double templates, Tensile type D or Z)")] = 0.0
    matmul_bf16_ms: Annotated[float, _d("summed duration of the matmul kernels whose names say bfloat16 inputs "
                                        "(ms; bf16, bfloat16, Tensile type B)")] = 0.0
    matmul_fp16_ms: Annotated[float, _d("summed duration of the matmul kernels whose names say float16 inputs "
                                        "(ms; fp16, f16f16, h884/h1688/h16816, __half, Tensile type H)")] = 0.0
    matmul_fp32_matrix_ms: Annotated[float, _d(
        "summed duration of the matmul kernels that multiply float32 on AMD matrix cores at the FP32 rate (ms; "
        "Tensile/hipBLASLt type S or C with an MFMA instruction and no xfloat32 mark, MIOpen xdlops fp32): "
        "counted in matmul_tensor_core_ms too, yet not reduced precision")] = 0.0


class CopyGroupMetrics(Record, frozen=True):
    """Copies of one direction and host-memory kind."""

    direction: Annotated[str, _d("'HtoD', 'DtoH', 'DtoD', 'PtoP' or 'other'")]
    memory: Annotated[str, _d("host memory: 'pageable', 'pinned', 'device' or 'unknown'")]
    count: Annotated[int, _d("copies (count)")]
    bytes: Annotated[int, _d("bytes copied (bytes)")]
    ms: Annotated[float, _d("summed copy duration (ms)")]
    gbps: Annotated[float | None, _d("bytes ÷ duration (GB/s); null when the duration is 0")]


class CopiesMetrics(Record, frozen=True):
    """Memory copies on the primary GPU in the window."""

    count: Annotated[int, _d("copies (count)")]
    total_ms: Annotated[float, _d("summed copy duration (ms)")]
    total_bytes: Annotated[int, _d("bytes copied (bytes)")]
    groups: Annotated[list[CopyGroupMetrics], _d("per direction and memory kind, most time first")]


# -- syncs -----------------------------------------------------------------------------------


class SyncCallMetrics(Record, frozen=True):
    """The blocking calls of one name."""

    count: Annotated[int, _d("calls (count)")]
    ms: Annotated[float, _d("summed call duration (ms)")]
    blocked_ms: Annotated[float, _d("the part of it during which the GPU still had queued work (ms)")]


class SyncMetrics(Record, frozen=True):
    """Host calls in the window that block until the GPU has finished."""

    count: Annotated[int, _d("blocking calls (count)")]
    call_ms: Annotated[float, _d("their summed duration (ms)")]
    blocked_ms: Annotated[float, _d("the part of it during which the GPU still had queued work (ms)")]
    harmful_count: Annotated[int, _d("calls that blocked at least min_blocked_us with GPU work after them (count)")]
    harmful_blocked_ms: Annotated[float, _d("the time the harmful calls blocked (ms)")]
    starved_ms: Annotated[float, _d("GPU idle time the harmful calls caused (ms)")]
    min_blocked_us: Annotated[float, _d("blocked time from which a call counts as harmful (µs)")]
    by_name: Annotated[dict[str, SyncCallMetrics], _d("call name -> its calls")]
    sync_ops: Annotated[dict[str, int], _d("operator that synchronises (e.g. aten::item) -> calls (count)")]
    library_count: Annotated[int, _d("syncs inside library code (cuDNN/MIOpen algorithm search, the caching allocator), "
                                     "not counted in count (count)")] = 0


# -- memory, communication, host -------------------------------------------------------------


class TopAllocation(Record, frozen=True):
    """One of the largest allocations live at the memory peak (torch.profiler's memory profile)."""

    bytes: Annotated[int, _d("size of the allocation (bytes)")]
    category: Annotated[str, _d("what it holds: one of the by_category names except allocator_cache")]
    frame: Annotated[str | None, _d("the Python frame outside torch that made it ('train.py(12): step'); null when "
                                    "made before the recording or not known")]
    module: Annotated[str | None, _d("the innermost nn.Module it was made in ('Linear_0'); null when none")]
    op: Annotated[str | None, _d("the innermost operator that made it ('aten::addmm'); null when none")]
    at_ms: Annotated[float | None, _d("when it was made (ms after the window's start; negative before it); null "
                                      "when made before the recording")]


class MemoryMetrics(Record, frozen=True, omit_defaults=True):
    """The primary GPU's memory (its CUDA or HIP allocator records, else NVML samples)."""

    peak_allocated_bytes: Annotated[int | None, _d("peak memory allocated by tensors (bytes); null without allocator records")]
    peak_reserved_bytes: Annotated[int | None, _d("peak memory reserved by the caching allocator (bytes)")]
    capacity_bytes: Annotated[int | None, _d("device memory (bytes)")]
    peak_frac: Annotated[float | None, _d("peak allocated ÷ capacity (0..1); null without allocator records")]
    source: Annotated[str | None, _d("'allocator', 'nvml' or null")]
    nvml_peak_used_bytes: Annotated[int | None, _d("peak used memory in the NVML samples (bytes; includes the CUDA "
                                                   "context and other processes); absent without NVML samples")] = None
    allocated_range_bytes: Annotated[int | None, _d("max − min allocated over the window's allocator records (bytes)")] = None
    pool: Annotated[bool | None, _d("memory held up front (allocated moved ≤ 5 % of the device, no driver allocation): "
                                    "a serving engine's pool, not pressure; null when unknown")] = None
    floor_growth_per_step_bytes: Annotated[int | None, _d(
        "how much the allocator's floor (its lowest total in a step: what stays allocated between steps) rose a step, "
        "first to last step with allocator records (bytes; negative when it fell): the primary GPU's records, the "
        "CPU's in a trace without a GPU; null with fewer than two such steps")] = None
    by_category: Annotated[dict[str, int] | None, _d(
        "peak memory by category over the window: category (parameter, optimizer_state, gradient, activation, "
        "temporary, input, autograd_detail, unknown — torch.profiler's memory profile — and allocator_cache, "
        "reserved − allocated, with CUDA allocator records) -> that category's own peak (bytes); null without a "
        "memory profile (see categories_missing)")] = None
    at_peak: Annotated[dict[str, int] | None, _d(
        "what held the memory at the window's peak of live bytes: the same categories -> bytes then (bytes; the "
        "torch categories add up to that peak)")] = None
    by_category_device: Annotated[str | None, _d("the device by_category describes ('cuda:0', 'cpu')")] = None
    by_category_peak_ms: Annotated[float | None, _d("when at_peak was taken: the peak of live bytes (ms after the window's start)")] = None
    top_allocations: Annotated[list[TopAllocation] | None, _d(
        "the largest allocations live at that peak, largest first; null when the recording's peak lies outside "
        "the window or there is no memory profile")] = None
    categories_missing: Annotated[str | None, _d("why by_category is null (e.g. not captured with --memory)")] = None


class CommunicationMetrics(Record, frozen=True):
    """Collective kernels (NCCL, RCCL, custom all-reduce) on the primary GPU."""

    count: Annotated[int, _d("collective kernels (count)")]
    ms: Annotated[float, _d("union of their time (ms)")]
    frac: Annotated[float, _d("share of the window (0..1)")]
    overlap_frac: Annotated[float | None, _d("share of communication time that overlaps compute kernels (0..1 of "
                                             "it); null without communication")]
    exposed_ms: Annotated[float, _d("communication time not overlapped by compute kernels (ms)")]
    exposed_frac: Annotated[float, _d("exposed_ms as a share of the window (0..1)")]
    host_calls: Annotated[int, _d("host-side collective calls (record_param_comms, c10d::, nccl:, DeepEP) (count)")] = 0
    maybe_undercounted: Annotated[bool, _d("the program communicates but no kernel is recognised as a collective")] = False


class MainThread(Record, frozen=True):
    """The host thread that runs the steps."""

    pid: Annotated[int, _d("process id")]
    tid: Annotated[int, _d("thread id")]


class LoaderStage(Record, frozen=True):
    """One stage of the data pipeline, timed at capture in the main process or the DataLoader's
    workers (gpumagic.capture.stages)."""

    name: Annotated[str, _d("the function's qualified name, or a callable object's class's ('Dataset.__getitem__', "
                            "'RandomResizedCrop', 'default_collate', 'pin_memory'); 'other' is the rest of each batch's "
                            "fetch that no stage covers")]
    ms_per_batch: Annotated[float, _d("the stage's self wall-clock time (time in stages it calls not included) per "
                                      "batch, summed over the processes that ran it (ms)")]
    share: Annotated[float, _d("ms_per_batch ÷ the sum over the stages (0..1; the stages' shares add up to 1)")]
    where: Annotated[str, _d("'main' (the training process) or 'worker' (a DataLoader worker process)")]


class HostMetrics(Record, frozen=True):
    """The host side: data loading, runtime calls, CPU operators and how busy the CPU was."""

    dataloader_ms: Annotated[float, _d("union of data-loader time (ms)")]
    dataloader_frac: Annotated[float, _d("share of the window in the data loader (0..1)")]
    runtime_ms: Annotated[float, _d("union of CUDA/HIP runtime call time (ms)")]
    cpu_op_ms: Annotated[float, _d("union of CPU operator time (ms)")]
    main_thread: Annotated[MainThread | None, _d("the thread that runs the steps; null when none is found")]
    usable_cores: Annotated[float | None, _d("cores this process may use, recorded at capture from os.sched_getaffinity "
                                             "and a cgroup CPU quota (cores); null for a plain trace")]
    usable_cores_source: Annotated[str | None, _d("'affinity', 'cgroup quota', 'cpu_count' or 'unknown'; null only in "
                                                  "reports from before it was recorded")]
    cpu_busy_cores: Annotated[float | None, _d("mean busy usable cores in the CPU samples (cores)")]
    cpu_saturation: Annotated[float | None, _d("cpu_busy_cores ÷ usable_cores (0..1)")]
    loader_cpu_bound: Annotated[bool | None, _d("the data-loader wait is mostly CPU work; null when unknown")]
    # who kept the cores busy (issue 21): from the CPU samples of a gpumagic capture, null for a plain trace
    own_busy_cores: Annotated[float | None, _d("cores this process and its DataLoader workers used (cores)")] = None
    own_main_thread_cores: Annotated[float | None, _d("cores the main thread used (cores)")] = None
    own_other_threads_cores: Annotated[float | None, _d("cores the process's other threads (intra-op, ...) used (cores)")] = None
    own_workers_cores: Annotated[float | None, _d("cores the DataLoader workers used (cores)")] = None
    other_busy_cores: Annotated[float | None, _d("cores other processes used (cores); null under a cgroup CPU quota")] = None
    shared_machine: Annotated[bool | None, _d("other processes used at least half a core and a quarter of the usable cores")] = None
    loader_runqueue_wait_frac: Annotated[float | None, _d("share of the window the loading threads waited for a core (0..1)")] = None
    main_runqueue_wait_frac: Annotated[float | None, _d("share of the window the main thread was runnable but had no "
                                                        "core (0..1; /proc schedstat, a gpumagic capture)")] = None
    load_average_1m: Annotated[float | None, _d("highest 1-minute load average in the window (runnable tasks)")] = None
    gpu_other_processes: Annotated[int | None, _d("other compute processes on the primary GPU, most seen (count; NVML)")] = None
    gpu_throttle_reasons: Annotated[list[str] | None, _d("clock slowdown reasons NVML reported in the window")] = None
    gpu_sm_clock_mhz: Annotated[float | None, _d("median SM clock in the window (MHz; NVML)")] = None
    dataloader_batches: Annotated[int | None, _d("batches the loop waited for in the window: the merged data-loader "
                                                 "spans (count); null in reports from before it was recorded")] = None
    dataloader_batch_ms: Annotated[float | None, _d("median data-loader wait per batch (ms); null when no batch")] = None
    loader_in_workers: Annotated[bool | None, _d("the DataLoader received its batches from worker processes (the "
                                                 "trace's iterator is _MultiProcessingDataLoaderIter; false: "
                                                 "_SingleProcessDataLoaderIter, num_workers=0); null when the trace "
                                                 "names neither or both")] = None
    intra_op_threads: Annotated[int | None, _d("torch.get_num_threads() when the capture ran (threads one operator "
                                               "may use); null for a plain trace")] = None
    cpu_bf16: Annotated[str | None, _d("how the CPU computes bfloat16, from its recorded features: 'native' "
                                       "(AVX512_BF16, AMX-BF16, Arm BF16), 'emulated' (through FP32 on AVX-512), "
                                       "'none' (generic kernels); null when unknown")] = None
    cpu_fp16: Annotated[str | None, _d("the same for float16: 'native' (AVX512_FP16, AMX-FP16) or 'none'; null when "
                                       "unknown (Arm included)")] = None
    cpu_low_precision_calls: Annotated[int | None, _d("host matrix-operator calls seen in bfloat16/float16 (autocast's "
                                                      "casts inside them, or recorded input types) (count); null with "
                                                      "a GPU")] = None
    optimizer_step_frac: Annotated[float | None, _d("share of the window inside torch.optim's "
                                                    "Optimizer.step#<Class>.step spans, less the forward and backward "
                                                    "passes a closure runs inside them (0-1); null without a step")] = None
    optimizer_impl: Annotated[str | None, _d("the implementation the optimizer steps ran: 'fused' (an "
                                             "aten::_fused_* kernel), 'foreach' (aten::_foreach_* operators) or "
                                             "'for-loop' (per parameter, torch.optim's own classes); null without a step or "
                                             "for another library's optimizer")] = None
    loader_stages: Annotated[list[LoaderStage] | None, _d("the data pipeline's stages, largest first, timed while a "
                                                          "gpumagic capture recorded; null for a plain trace or when "
                                                          "no DataLoader batch was made")] = None


class ConditionsMetrics(Record, frozen=True):
    """What a comparison must know about how the run was made (from the bundle; null in a plain trace)."""

    torch: Annotated[str | None, _d("torch version")]
    cuda: Annotated[str | None, _d("CUDA version torch was built with")]
    gpumagic: Annotated[str | None, _d("gpumagic version")]
    capture_options: Annotated[list[str] | None, _d("capture options that change what the profiler costs (shapes, stacks, memory, ...)")]


# -- compute, small copies, samples ----------------------------------------------------------


class ComputeMetrics(Record, frozen=True):
    """Compute efficiency: FLOPs of the matmul-family and convolution operators in the window and
    MFU. FLOPs need recorded shapes (--shapes) or FLOP counts (--flops)."""

    flops: Annotated[float | None, _d("FLOPs of the operators starting in the window, each piece of work once (FLOP)")]
    flops_per_step: Annotated[float | None, _d("flops ÷ steps (FLOP)")]
    achieved_tflops: Annotated[float | None, _d("flops ÷ window duration (TFLOP/s)")]
    peak_tflops: Annotated[float | None, _d("dense peak of the device for dtype, from its datasheet (TFLOP/s)")]
    mfu: Annotated[float | None, _d("achieved_tflops ÷ peak_tflops (0..1)")]
    flops_source: Annotated[str | None, _d("'profiler' (the profiler's counts), 'shapes' (estimated from input shapes) or null")]
    dtype: Annotated[str | None, _d("'fp32', 'tf32', 'bf16', 'fp16', 'fp8' or null: the dtype that did most FLOPs")]
    device_name: Annotated[str | None, _d("the primary GPU's name")]
    device_sku: Annotated[str | None, _d("the peak table's entry for it; null when blank or unknown")]
    peak_source: Annotated[str | None, _d("where peak_tflops comes from (a datasheet)")]
    ops_counted: Annotated[int, _d("operators whose FLOPs were counted (count)")]
    ops_unresolved: Annotated[int, _d("family operators whose shapes did not allow a count (count)")]
    matmul_kernel_tflops: Annotated[float | None, _d("flops ÷ the time of matmul-named kernels (TFLOP/s); null above peak")]
    flops_coverage: Annotated[float | None, _d("share of matmul-family kernel time launched inside counted operators "
                                               "(0..1); below 0.5 MFU is withheld")] = None
    mfu_lower_bound: Annotated[bool | None, _d("MFU is a lower bound: the counted FLOPs cover under 90 % of the "
                                               "matmul-family kernel time")] = None


class SmallCopyDirection(Record, frozen=True):
    """Small copies of one direction."""

    count: Annotated[int, _d("copies (count)")]
    per_step: Annotated[float, _d("copies per step (count)")]
    bytes: Annotated[int, _d("bytes copied (bytes)")]
    median_bytes: Annotated[int, _d("median copy size (bytes)")]
    max_bytes: Annotated[int, _d("largest copy (bytes)")]
    size_classes: Annotated[dict[str, int], _d("size class ('<=1KiB', '<=8KiB', '<=64KiB') -> copies (count)")]
    gpu_ms: Annotated[float, _d("summed copy duration on the GPU (ms)")]
    host_ms: Annotated[float, _d("time of the host calls that issued them (ms)")]
    gpu_frac: Annotated[float, _d("gpu_ms as a share of the window (0..1)")]
    host_frac: Annotated[float, _d("host_ms as a share of the window (0..1)")]
    cost_frac: Annotated[float, _d("host ∪ GPU time of those copies while the GPU was busy with nothing else (0..1 of the window)")]


class SmallCopyMetrics(Record, frozen=True):
    """Host↔device copies of at most ``max_bytes``."""

    max_bytes: Annotated[int, _d("largest size counted as small (bytes)")]
    directions: Annotated[dict[str, SmallCopyDirection], _d("'HtoD' / 'DtoH' -> its small copies")]


class SampleMetrics(Record, frozen=True):
    """NVML and host-CPU samples inside the window."""

    count: Annotated[int, _d("samples (count)")]
    gpu_util_mean: Annotated[float | None, _d("mean NVML GPU utilisation (percent)")]
    gpu_mem_used_max_bytes: Annotated[int | None, _d("largest NVML used memory (bytes)")]
    cpu_util_mean: Annotated[float | None, _d("mean host CPU utilisation (percent)")]
    workers_util_mean: Annotated[float | None, _d("mean CPU utilisation of the data-loader workers (percent)")]


# -- what bounds each step (issue 25) ---------------------------------------------------------


class PhaseTimes(Record, frozen=True):
    """One value per phase of a training step."""

    data: Annotated[float, _d("waiting for the next batch: DataLoader spans (ms)")]
    forward: Annotated[float, _d("from the forward pass's first operator (the first whose backward node the step "
                                 "evaluates) to the end of the last backward pass, less the backward; without a "
                                 "backward, the step's first host operator to its last (ms)")]
    backward: Annotated[float, _d("the autograd engine's work in each backward pass, its own thread included (ms)")]
    optimizer: Annotated[float, _d("Optimizer.step#… and Optimizer.zero_grad#…, less the forward and backward "
                                   "passes a step runs itself (LBFGS's closure) (ms)")]
    other: Annotated[float, _d("host work between them: the rest of the step (ms)")]
    evaluation: Annotated[float, _d("an evaluation loop inside the step, its loader waits and forward passes included: "
                                    "a module in eval mode and no optimizer step (gpumagic's step timer; 0 in a trace "
                                    "gpumagic did not record, and in older reports) (ms)")] = 0.0


class PhasesFound(Record, frozen=True):
    """Which markers the trace had."""

    dataloader: Annotated[bool, _d("DataLoader spans recorded")]
    backward: Annotated[bool, _d("a backward pass recorded")]
    optimizer: Annotated[bool, _d("an optimizer step recorded")]


class PhasesMetrics(Record, frozen=True):
    """Each step split into data / forward / backward / optimizer / evaluation / other, on the
    host's step (the bounds of ``steps``): per step the six add up to ``steps.durations_ms``."""

    order: Annotated[list[str], _d("the phases, in order")]
    per_step: Annotated[list[PhaseTimes], _d("each recorded step's phases (ms)")]
    median_ms: Annotated[PhaseTimes, _d("per phase, the median over the steps (ms)")]
    found: Annotated[PhasesFound, _d("which markers the split could use")]
    spans_ns: Annotated[list[dict[str, list[list[int]]]],
                        _d("per step, each phase but 'other' as [start, end] pairs (ns from the trace origin): the timeline's lane")]
    gpu_per_step: Annotated[list[PhaseTimes], _d("per step, the GPU time of the work launched in each phase (ms); empty without a GPU")]
    gpu_median_ms: Annotated[PhaseTimes | None, _d("per phase, the median GPU time (ms); null without a GPU")]
    recompute_median_ms: Annotated[float | None, _d(
        "part of backward: the forward operators it ran again (activation checkpointing: aten::linear, "
        "aten::layer_norm, ... inside the autograd engine's nodes, each node from its start to its last such "
        "operator), host time per step, the median (ms); null when no step recomputed")] = None


class PathKinds(Record, frozen=True):
    """One value per kind of link on the critical path."""

    gpu_compute: Annotated[float, _d("kernels (other than communication)")]
    gpu_comm: Annotated[float, _d("communication kernels (NCCL/RCCL and the like)")]
    gpu_copy: Annotated[float, _d("copies and memsets on the GPU")]
    host_launch: Annotated[float, _d("host launch and runtime calls")]
    host_compute: Annotated[float, _d("host operators and Python, including host time with nothing recorded")]
    data: Annotated[float, _d("waiting for the DataLoader")]
    sync_wait: Annotated[float, _d("the host blocked until the GPU finished")]
    other: Annotated[float, _d("anything else")]


class PathBound(Record, frozen=True):
    """The group of link kinds with the largest share of the critical path."""

    what: Annotated[str, _d("the group in words, e.g. 'host Python and launches'")]
    frac: Annotated[float, _d("its share of the critical path (0..1)")]
    kinds: Annotated[list[str], _d("the kinds of PathKinds it groups")]


class PathLink(Record, frozen=True):
    """A name that takes critical-path time."""

    name: Annotated[str, _d("the kernel, operator or call")]
    kind: Annotated[str, _d("its kind of link (a key of PathKinds)")]
    ms: Annotated[float, _d("its time on the critical path (ms)")]


class PathLinks(Record, frozen=True):
    """How the walk went from one link to the one before it (counts)."""

    gpu_stream: Annotated[int, _d("to the previous event on the same stream (count)")]
    launch: Annotated[int, _d("to the launch call, by correlation id (count)")]
    cross_stream: Annotated[int, _d("to another stream's event, by an event wait or adjacency (count)")]
    sync: Annotated[int, _d("from a blocking sync to the GPU work it waited for (count)")]
    unlinked: Annotated[int, _d("with no recorded dependency: the host at the event's start (count)")]


class CriticalPathMetrics(Record, frozen=True):
    """Per step, the longest dependency chain through host work, launches, kernels, copies, syncs,
    waits and collectives (analysis/critical_path.py); it covers each step once."""

    kinds: Annotated[list[str], _d("the kinds of link, in order")]
    frac: Annotated[PathKinds, _d("share of the critical path by kind (0..1, summing to 1)")]
    ms: Annotated[PathKinds, _d("time on the critical path by kind, all steps (ms)")]
    per_step_ms: Annotated[list[float], _d("each step's critical-path length (ms); empty without step markers")]
    per_step_bound: Annotated[list[str], _d("each step's largest kind")]
    bound: Annotated[PathBound, _d("what bounds the steps, in one phrase, with its share")]
    top: Annotated[list[PathLink], _d("the names that take the most critical-path time")]
    host_unrecorded_ms: Annotated[float, _d("host time on the path with no recorded event (ms), booked as host_compute")]
    links: Annotated[PathLinks, _d("how the chain was followed (counts)")]
    notes: Annotated[list[str], _d("what the trace lacked for the walk, and how it fell back")]


class OperatorRow(Record, frozen=True):
    """One operator (by name and input shapes where recorded) and the kernels it launched."""

    name: Annotated[str, _d("operator name, e.g. 'aten::addmm'")]
    shapes: Annotated[str | None, _d("its input shapes, when recorded")]
    count: Annotated[int, _d("calls (count)")]
    gpu_ms: Annotated[float, _d("GPU time of the kernels it launched (ms)")]
    flops: Annotated[float | None, _d("FLOPs, when known for every call")]
    bytes: Annotated[float | None, _d("bytes moved, a lower bound (inputs read and a matmul's output written)")]
    dtype: Annotated[str | None, _d("the inputs' dtype")]
    flops_source: Annotated[str | None, _d("'shapes' or 'profiler' when the FLOPs are known")]
    tflops: Annotated[float | None, _d("achieved TFLOP/s over its GPU time")]
    tbps: Annotated[float | None, _d("achieved TB/s over its GPU time")]
    intensity: Annotated[float | None, _d("arithmetic intensity (FLOP per byte)")]
    peak_tflops: Annotated[float | None, _d("the device's peak for the dtype (TFLOP/s)")]
    peak_tbps: Annotated[float | None, _d("the device's memory bandwidth (TB/s)")]
    bound: Annotated[str | None, _d("'compute' or 'memory' on the roofline")]
    frac_of_peak: Annotated[float | None, _d("achieved ÷ peak TFLOP/s (0..1; above 1: see above_peak)")]
    frac_of_roof: Annotated[float | None, _d("achieved ÷ the roofline's limit at its intensity (0..1)")]
    above_peak: Annotated[bool, _d("faster than the dtype's peak: fewer FLOPs than counted (Winograd, FFT) or a faster dtype (TF32)")]


class OperatorsMetrics(Record, frozen=True):
    """The operators with the most GPU time (analysis/operators.py)."""

    top: Annotated[list[OperatorRow], _d("by GPU time, the first N (--top-ops, 20 by default)")]
    count: Annotated[int, _d("operators that launched GPU work (count)")]
    kernel_ms: Annotated[float, _d("kernel time on the primary device (ms)")]
    attributed_ms: Annotated[float, _d("of it, attributed to an operator (ms)")]
    uncovered_ms: Annotated[float, _d("kernel time whose FLOPs are not known (ms)")]
    graph_uncovered_ms: Annotated[float, _d("of it, in graph replays (ms)")]
    shapes: Annotated[bool, _d("the trace recorded input shapes")]
    peak_tbps: Annotated[float | None, _d("the device's memory bandwidth (TB/s)")]
    peak_bandwidth_source: Annotated[str | None, _d("where that bandwidth comes from (datasheet)")]
    device_name: Annotated[str | None, _d("the device the peaks are for")]


class ModuleRow(Record, frozen=True):
    """One ``nn.Module`` instance, its times totalled over the window (analysis/modules.py; ``--modules``)."""

    path: Annotated[str, _d("dotted path, e.g. model.encoder.layer.3.attention (the tree is in the dots)")]
    type: Annotated[str, _d("the module's class name")]
    calls: Annotated[int, _d("forward calls in the window (count)")]
    forward_ms: Annotated[float, _d("host time of its forward calls, children included (ms)")]
    backward_ms: Annotated[float | None, _d("host time of the backward nodes its forward operators made, "
                                            "by the trace's forward-backward links; null without links (ms)")]
    forward_gpu_ms: Annotated[float | None, _d("GPU time launched by its forward calls; null without GPU activity (ms)")] = None
    backward_gpu_ms: Annotated[float | None, _d("GPU time launched by those backward nodes; null without GPU activity (ms)")] = None


class CompileReason(Record, frozen=True):
    """One graph-break or recompilation reason and where in the code it happened."""

    reason: Annotated[str, _d("dynamo's reason (a graph break's first line; a recompile's failed guard)")]
    file: Annotated[str | None, _d("source file (the graph break's line; the recompiled function's file)")]
    line: Annotated[int | None, _d("line in that file (the recompiled function's first line)")]
    count: Annotated[int, _d("times it happened in the cell (count)")]

    @property
    def place(self) -> str:
        """``file:line`` (``""`` when unknown). A compiled ``nn.Module`` is entered through dynamo's
        own frame (``torch/_dynamo/external_utils.py``'s ``wrap_inline``: "an extra frame around fn
        that is not in skipfiles"), so a recompilation of ``torch.compile(model)`` names that file:
        said so, as no line of the user's."""
        if not self.file:
            return ""
        at = f"{self.file}:{self.line}" if self.line is not None else self.file
        if "/torch/_dynamo/" in self.file.replace("\\", "/"):
            return f"a compiled module's call, entered through dynamo's wrapper {at}"
        return at


class CompileMetrics(Record, frozen=True):
    """What torch.compile did in the cell (analysis/compile.py), from dynamo's counters and logs."""

    compile_ms: Annotated[float, _d("compiling inside the window: the window's compile segments (ms)")]
    graph_breaks: Annotated[int, _d("graph breaks in the cell: the rise of dynamo's graph_break counter (count)")]
    break_reasons: Annotated[list[CompileReason], _d("graph breaks by reason and source line, most frequent first")]
    recompiles: Annotated[int, _d("recompilations in the cell: calls whose every cached entry failed its guards "
                                  "(count)")]
    recompile_reasons: Annotated[list[CompileReason], _d("recompilations by the guard that failed on the first "
                                                         "entry compiled, most frequent first")]
    cell_compile_ms: Annotated[float | None, _d("dynamo's own frame-compilation time over the whole cell, "
                                                "recorded steps or not (a backward compiled lazily at its "
                                                "first call is not in it); null in traces without it (ms)")] = None
    recompiles_first_change: Annotated[int, _d(
        "recompilations at the first change of a tensor's size or an integer argument of a function; "
        "dynamo then compiles it as dynamic (dynamic=None, the default), so these do not recur (count)")] = 0
    recompiles_few_values: Annotated[int, _d(
        "the other recompilations whose failed guards were all on properties with few values (a tensor's dtype, "
        "device or requires_grad, grad mode or autocast, a module's training flag): each value compiles once and "
        "dynamo reuses its entry when the value comes back, so these do not recur either (count)")] = 0
    recompiles_dtype: Annotated[int, _d(
        "recompilations in which some compiled entry failed a dtype guard: a tensor of another dtype reached "
        "the compiled code (count)")] = 0


# -- all of them -----------------------------------------------------------------------------


class Metrics(Record, frozen=True, omit_defaults=True):
    """Everything measured over the analysis window (docs/metrics.md explains each value)."""

    trace: TraceMetrics
    window: WindowMetrics
    steps: StepMetrics
    gpu: GpuMetrics
    breakdown: BreakdownMetrics
    idle: IdleMetrics
    kernels: KernelsMetrics
    copies: CopiesMetrics
    syncs: SyncMetrics
    memory: MemoryMetrics
    communication: CommunicationMetrics
    host: HostMetrics
    compute: Annotated[ComputeMetrics | None, _d("null only in reports from before gpumagic counted FLOPs")]
    small_copies: Annotated[SmallCopyMetrics | None, _d("null only in reports from before gpumagic measured small copies")]
    conditions: Annotated[ConditionsMetrics | None, _d("null only in reports from before gpumagic recorded them")] = None
    phases: Annotated[PhasesMetrics | None, _d("present when the trace has step markers")] = None
    critical_path: Annotated[CriticalPathMetrics | None, _d("null only in reports from before gpumagic followed it")] = None
    operators: Annotated[OperatorsMetrics | None, _d("null only in reports from before gpumagic tabulated operators")] = None
    samples: Annotated[SampleMetrics | None, _d("present when NVML or CPU samples were recorded")] = None
    modules: Annotated[list[ModuleRow] | None, _d("time per nn.Module instance, largest first; present with --modules")] = None
    compile: Annotated[CompileMetrics | None, _d("torch.compile's graph breaks, recompiles and compile time; "
                                                 "present when the cell compiled")] = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (``samples`` absent when None)."""
        out: dict[str, Any] = msgspec.to_builtins(self, enc_hook=_plain_number)
        return out


def as_record(data: Any, record: type[R]) -> R:
    """``data`` (the plain-dict form, numpy scalars allowed) as the typed ``record``; for analysis
    code that builds a section as a dict. Raises msgspec.ValidationError when it does not fit."""
    return msgspec.convert(msgspec.to_builtins(data, enc_hook=_plain_number), record)


def _plain_number(obj: Any) -> bool | int | float:
    """A numpy scalar (the analysis computes with numpy) as the Python number it equals."""
    if type(obj).__name__ == "bool_":  # numpy.bool_ is no numbers.Integral
        return bool(obj)
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        return float(obj)
    raise TypeError(f"cannot encode a {type(obj).__name__} in a report")
