"""What machine and library versions a capture ran with, for the bundle.

Built only from the platform, ``/proc`` hardware facts and package metadata: nothing from the
process environment (no variables, user names, host names or paths) goes into a saved file.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from typing import Any

#: Libraries whose version helps explain a trace; reported only when already imported.
_LIBRARIES = ("torch", "numpy", "IPython", "ipykernel", "ipywidgets", "transformers", "accelerate",
              "lightning", "pytorch_lightning", "deepspeed", "triton")
#: Distribution names that differ from the import name.
_DISTRIBUTIONS = {"IPython": "ipython", "pytorch_lightning": "pytorch-lightning"}


def machine_info(nvml_driver: str | None = None) -> dict[str, Any]:
    """OS, CPU, memory and (when CUDA is initialised) GPU facts."""
    info: dict[str, Any] = {
        "os": platform.system(),
        "os_release": platform.release(),
        "arch": platform.machine(),
        "cpu_count": os.cpu_count(),
        **usable_cpus(),
        "cpu_model": _cpu_model(),
        "cpu_flags": cpu_flags(),
        "memory_bytes": _memory_bytes(),
    }
    info.update(_gpu_info())
    if nvml_driver:
        info["nvidia_driver"] = nvml_driver
    return info


def usable_cpus(cgroup_root: str | os.PathLike = "/sys/fs/cgroup") -> dict[str, Any]:
    """The cores this process may run on: ``cpu_affinity`` (``os.sched_getaffinity``, where the
    platform has it), ``cpu_quota_cores`` (a cgroup CPU quota, where one is set: cgroup v2
    ``cpu.max`` or v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``) and ``usable_cores``, the
    smaller of the two (else ``os.cpu_count()``). ``usable_cores_source`` says which."""
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    quota = _cgroup_quota_cores(Path(cgroup_root))
    usable: float = len(affinity) if affinity else (os.cpu_count() or 1)
    source = "affinity" if affinity else "cpu_count"
    if quota is not None and quota < usable:
        usable, source = quota, "cgroup quota"
    return {"cpu_affinity": affinity, "cpu_quota_cores": quota, "usable_cores": round(float(usable), 2),
            "usable_cores_source": source}


def _cgroup_quota_cores(root: Path) -> float | None:
    """CPU quota in cores, or None when unlimited or unknown (cgroup v2 ``cpu.max`` is
    ``"max 100000"`` or ``"<quota> <period>"``; v1 has a quota of -1 when unlimited)."""
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else round(int(quota) / int(period), 2)
        v1q, v1p = root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"
        if v1q.is_file() and v1p.is_file():
            quota_us, period_us = int(v1q.read_text()), int(v1p.read_text())
            return None if quota_us <= 0 or period_us <= 0 else round(quota_us / period_us, 2)
    except (OSError, ValueError):  # unreadable or malformed: no quota known
        return None
    return None


def versions() -> dict[str, str]:
    """Python, gpumagic and the already-imported libraries of :data:`_LIBRARIES`."""
    out = {"python": platform.python_version(), "gpumagic": _version("gpumagic")}
    for name in _LIBRARIES:
        if name in sys.modules:
            out[_DISTRIBUTIONS.get(name, name)] = getattr(sys.modules[name], "__version__", None) or _version(
                _DISTRIBUTIONS.get(name, name))
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):  # not installed: nothing to report
        out["nvidia-ml-py"] = importlib.metadata.version("nvidia-ml-py")
    return {k: str(v) for k, v in out.items()}


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        module = sys.modules.get(distribution)
        return str(getattr(module, "__version__", "unknown"))


#: The CPU features that decide whether 16-bit floating point runs natively on the CPU, as Linux
#: names them in ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``). x86: AVX512_BF16 and AMX-BF16
#: compute bfloat16 natively, AVX512_FP16 and AMX-FP16 float16; with AVX512BW/VL/DQ alone oneDNN
#: emulates bfloat16 in FP32 registers (PyTorch's ``mkldnn_bf16_device_check``); with AVX2 alone
#: PyTorch falls back to generic kernels. Arm: ``bf16`` (FEAT_BF16), ``asimdhp``/``fphp`` (FP16
#: arithmetic).
CPU_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_bf16", "amx_fp16", "bf16", "asimdhp", "fphp", "sve")


def cpu_flags(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> list[str] | None:
    """The :data:`CPU_FLAGS` the first processor of ``cpuinfo`` lists, sorted; None where the file
    is unreadable or names no features (not Linux: unknown, which the analysis treats as such)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            present = set(value.split())
            return sorted(f for f in CPU_FLAGS if f in present)
    return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _gpu_info() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return {"cuda": None, "gpus": []}
    gpus = []
    if torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": p.name, "total_memory_bytes": int(p.total_memory),
                         "compute_capability": f"{p.major}.{p.minor}", "sm_count": p.multi_processor_count})
    return {"cuda": torch.version.cuda, "gpus": gpus}
