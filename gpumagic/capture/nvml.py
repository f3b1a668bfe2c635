"""GPU samples from NVML (``nvidia-ml-py``), behind a small backend protocol.

:class:`PynvmlBackend` talks to the driver; :class:`FakeNvml` replays scripted readings so
the sampler is tested without a GPU (the way httpx's ``MockTransport`` stands in for a network).
Devices are matched by UUID, so ``CUDA_VISIBLE_DEVICES`` remapping cannot mix them up: the
samples carry the CUDA index the trace uses, read from the NVML device with the same UUID.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Protocol

from gpumagic.capture.sampler import PeriodicSampler

#: NVML reads per device per sample; PCIe throughput blocks ~20 ms per direction (NVML API
#: reference, nvmlDeviceGetPcieThroughput), which bounds how many devices a sample can cover.
MAX_DEVICES = 8

GPU_FIELDS = ("gpu_util", "mem_util", "mem_used_bytes", "mem_total_bytes", "power_w",
              "sm_clock_mhz", "pcie_tx_kbps", "pcie_rx_kbps", "other_processes", "throttle_reasons", "energy_mj")
#: Bits of NVML's clock-event ("throttle") reasons that slow the clocks below what the work
#: asks for (NVML API reference, group nvmlClocksEventReasons / nvmlClocksThrottleReasons):
#: GpuIdle (0x1), ApplicationsClocksSetting (0x2) and SyncBoost (0x10) are not a slowdown of a
#: busy GPU and are left out; DisplayClockSetting (0x100) likewise.
THROTTLE_BITS = {0x4: "power cap", 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
                 0x40: "hardware thermal slowdown", 0x80: "power brake"}


def throttle_names(mask: int) -> list[str]:
    """The slowdown reasons set in an NVML clock-event mask, in bit order."""
    return [name for bit, name in THROTTLE_BITS.items() if int(mask) & bit]


class NvmlUnavailable(Exception):
    """NVML cannot be used here (no library, no driver, unknown device); the message says why."""


class NvmlBackend(Protocol):
    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def handle(self, uuid: str) -> Any: ...
    def all_handles(self) -> list[tuple[int, Any]]: ...
    def read(self, handle: Any, only: Collection[str] | None = None) -> dict[str, float]: ...


class PynvmlBackend:
    """The real thing. ``read`` leaves out any field the device does not support."""

    def __init__(self) -> None:
        self._nv = None

    def init(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise NvmlUnavailable("nvidia-ml-py is not installed") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML did not initialise ({exc})") from None
        self._nv = pynvml

    def shutdown(self) -> None:
        if self._nv is not None:
            self._nv.nvmlShutdown()
            self._nv = None

    def driver_version(self) -> str:
        v = self._nv.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)

    def handle(self, uuid: str) -> Any:
        nv = self._nv
        try:
            return nv.nvmlDeviceGetHandleByUUID(uuid)
        except nv.NVMLError as exc:
            raise NvmlUnavailable(f"NVML has no device {uuid} ({exc})") from None

    def all_handles(self) -> list[tuple[int, Any]]:
        """``(nvml_index, handle)`` of every GPU the driver shows (the live monitor watches them all)."""
        nv = self._nv
        return [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]

    def read(self, handle: Any, only: Collection[str] | None = None) -> dict[str, float]:
        """The readings of one device; ``only`` limits them to these reader names (``util``, ``mem``,
        ``power_w``, ``sm_clock_mhz``, ``pcie_tx_kbps``, ``pcie_rx_kbps``, ``other_processes``,
        ``throttle_reasons``, ``energy_mj``). ``energy_mj`` is the total-energy counter
        (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver was loaded).
        ``other_processes`` counts compute processes on the device other than this one
        (``nvmlDeviceGetComputeRunningProcesses``); ``throttle_reasons`` is NVML's clock-event bit mask
        (``nvmlDeviceGetCurrentClocksEventReasons``, called ``...ThrottleReasons`` before driver 535)."""
        nv = self._nv
        readers = {
            "util": lambda: nv.nvmlDeviceGetUtilizationRates(handle),
            "mem": lambda: nv.nvmlDeviceGetMemoryInfo(handle),
            "power_w": lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # mW -> W
            "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
            "pcie_tx_kbps": lambda: nv.nvmlDeviceGetPcieThroughput(handle, nv.NVML_PCIE_UTIL_TX_BYTES),
            "pcie_rx_kbps": lambda: nv.nvmlDeviceGetPcieThroughput(handle, nv.NVML_PCIE_UTIL_RX_BYTES),
            "other_processes": lambda: sum(1 for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)
                                           if p.pid != os.getpid()),
            "throttle_reasons": lambda: (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                                         or nv.nvmlDeviceGetCurrentClocksThrottleReasons)(handle),
            # mJ since the driver was loaded (Volta and newer; NVML_ERROR_NOT_SUPPORTED before)
            "energy_mj": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle),
        }
        out: dict[str, float] = {}
        for key, reader in readers.items():
            if only is not None and key not in only:
                continue
            try:
                value = reader()
            except (nv.NVMLError, AttributeError):  # not supported here (device or library version), or momentarily unreadable
                continue
            if key == "util":
                out["gpu_util"], out["mem_util"] = value.gpu, value.memory
            elif key == "mem":
                out["mem_used_bytes"], out["mem_total_bytes"] = value.used, value.total
            else:
                out[key] = value
        return out


class FakeNvml:
    """Scripted NVML: ``readings`` maps a UUID to the readings it returns, in a loop.

    ``init_error`` makes :meth:`init` fail with that message; ``fail_after`` makes :meth:`read`
    raise ``RuntimeError`` once that many reads have been served.
    """

    def __init__(self, readings: dict[str, Sequence[dict[str, float]]], *, driver: str = "555.42",
                 init_error: str | None = None, fail_after: int | None = None) -> None:
        self._readings = {u: itertools.cycle(list(r)) for u, r in readings.items()}
        self._driver = driver
        self._init_error = init_error
        self._fail_after = fail_after
        self.reads = 0
        self.initialised = False

    def init(self) -> None:
        if self._init_error is not None:
            raise NvmlUnavailable(self._init_error)
        self.initialised = True

    def shutdown(self) -> None:
        self.initialised = False

    def driver_version(self) -> str:
        return self._driver

    def handle(self, uuid: str) -> Any:
        if uuid not in self._readings:
            raise NvmlUnavailable(f"NVML has no device {uuid}")
        return uuid

    def all_handles(self) -> list[tuple[int, Any]]:
        return list(enumerate(self._readings))

    def read(self, handle: Any, only: Collection[str] | None = None) -> dict[str, float]:
        if self._fail_after is not None and self.reads >= self._fail_after:
            raise RuntimeError("scripted NVML failure")
        self.reads += 1
        return dict(next(self._readings[handle]))


class NvmlSampler(PeriodicSampler):
    """One row per device per sample: ``t_epoch_ns``, ``device`` (CUDA index) and GPU_FIELDS."""

    name = "nvml"

    def __init__(self, backend: NvmlBackend, handles: Iterable[tuple[int, Any]], interval_s: float) -> None:
        super().__init__(interval_s)
        self.backend = backend
        self.handles = list(handles)

    def read(self, t_epoch_ns: int) -> list[dict[str, Any]]:
        return [{"t_epoch_ns": t_epoch_ns, "device": index, **self.backend.read(h)} for index, h in self.handles]


def open_sampler(backend: NvmlBackend, devices: Sequence[tuple[int, str]], interval_s: float,
                 notes: list[str]) -> tuple[NvmlSampler | None, str | None]:
    """Initialise NVML and map ``(cuda_index, uuid)`` pairs to handles.

    Returns the sampler (None when nothing can be sampled) and the driver version; appends a
    note for each thing that went wrong. Shuts NVML down again when it returns no sampler.
    """
    try:
        backend.init()
    except NvmlUnavailable as exc:
        notes.append(f"GPU samples not recorded: {exc}.")
        return None, None
    handles = []
    for index, uuid in devices[:MAX_DEVICES]:
        try:
            handles.append((index, backend.handle(nvml_uuid(uuid))))
        except NvmlUnavailable as exc:
            notes.append(f"GPU samples not recorded for cuda:{index}: {exc}.")
    if len(devices) > MAX_DEVICES:
        notes.append(f"GPU samples cover the first {MAX_DEVICES} of {len(devices)} devices in use.")
    if not handles:
        backend.shutdown()
        return None, None
    return NvmlSampler(backend, handles, interval_s), backend.driver_version()


def nvml_uuid(uuid: str) -> str:
    """NVML spells GPU UUIDs ``GPU-xxxxxxxx-...``; torch prints them without the prefix."""
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def torch_devices() -> list[tuple[int, str]]:
    """``(cuda_index, uuid)`` of the devices this process uses: those holding torch memory,
    and the current device. Empty without CUDA. Initialises CUDA only when it is available."""
    import torch

    if not torch.cuda.is_available():
        return []
    current = torch.cuda.current_device()
    used = [i for i in range(torch.cuda.device_count()) if i == current or torch.cuda.memory_reserved(i) > 0]
    return [(i, str(torch.cuda.get_device_properties(i).uuid)) for i in used]
