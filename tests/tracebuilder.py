"""Build small Kineto traces by hand for unit tests (times in µs, like the real format)."""

from __future__ import annotations

import gzip
import json
import os
from typing import Any

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
PID = 100
MAIN = 100


class TraceBuilder:
    def __init__(self, cc: tuple[int, int] | None = (8, 0), total_mem: int = 80 * 2**30, gpu_name: str = "Test GPU"):
        self.events: list[dict[str, Any]] = []
        self.devices = [] if cc is None else [{"id": 0, "name": gpu_name, "totalGlobalMem": total_mem,
                                                "computeMajor": cc[0], "computeMinor": cc[1], "numSms": 80}]
        self._corr = 1000

    def add(self, **e: Any) -> dict[str, Any]:
        e.setdefault("ph", "X")
        e.setdefault("pid", PID)
        e.setdefault("tid", MAIN)
        self.events.append(e)
        return e

    def step(self, n: int, ts: float, dur: float) -> None:
        self.add(cat="user_annotation", name=f"ProfilerStep#{n}", ts=ts, dur=dur)

    def op(self, name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = MAIN) -> None:
        self.add(cat=cat, name=name, ts=ts, dur=dur, tid=tid)

    def dataloader(self, ts: float, dur: float, workers: bool = False) -> None:
        """A ``next(loader)`` span, named as PyTorch names it: the multi-process iterator's with
        ``workers``, else the single-process one's (``num_workers=0``)."""
        kind = "_MultiProcessingDataLoaderIter" if workers else "_SingleProcessDataLoaderIter"
        self.op(f"enumerate(DataLoader)#{kind}.__next__", ts, dur, cat="user_annotation")

    def runtime(self, name: str, ts: float, dur: float, corr: int | None = None) -> None:
        args = {"cbid": 1}
        if corr is not None:
            args["correlation"] = corr
        self.add(cat="cuda_runtime", name=name, ts=ts, dur=dur, args=args)

    def _gpu(self, cat: str, name: str, ts: float, dur: float, launch_ts: float | None, stream: int,
             device: int, extra: dict | None = None, launch: str = "cudaLaunchKernel") -> None:
        self._corr += 1
        if launch_ts is None:
            launch_ts = ts - 5.0
        self.runtime(launch, launch_ts, 3.0, self._corr)
        args = {"device": device, "stream": stream, "correlation": self._corr, **(extra or {})}
        self.add(cat=cat, name=name, ts=ts, dur=dur, pid=device, tid=stream, args=args)

    def kernel(self, name: str, ts: float, dur: float, launch_ts: float | None = None, stream: int = 7, device: int = 0,
               launch: str = "cudaLaunchKernel"):
        self._gpu("kernel", name, ts, dur, launch_ts, stream, device, launch=launch)

    def memcpy(self, name: str, ts: float, dur: float, nbytes: int, launch_ts: float | None = None, stream: int = 7):
        self._gpu("gpu_memcpy", name, ts, dur, launch_ts, stream, 0, {"bytes": nbytes}, "cudaMemcpyAsync")

    def memory(self, ts: float, allocated: int, reserved: int, device: int = 0) -> None:
        self.add(ph="i", cat="cpu_instant_event", name="[memory]", ts=ts, s="t",
                 args={"Device Type": 1, "Device Id": device, "Bytes": 0, "Total Allocated": allocated,
                       "Total Reserved": reserved})

    def to_dict(self) -> dict[str, Any]:
        return {"schemaVersion": 1, "deviceProperties": self.devices, "traceEvents": list(self.events)}

    def write(self, path, gz: bool = False) -> str:
        data = json.dumps(self.to_dict()).encode()
        if gz:
            data = gzip.compress(data)
        with open(path, "wb") as fh:
            fh.write(data)
        return str(path)


def busy_steps(tb: TraceBuilder, steps: int, step_us: float, kernel_us: float, kernel_name: str = "k_elementwise",
               start: float = 0.0) -> None:
    """``steps`` steps of ``step_us``; each runs one kernel of ``kernel_us`` at the step's start."""
    for i in range(steps):
        t = start + i * step_us
        tb.step(i + 1, t, step_us)
        tb.kernel(kernel_name, t + 10.0, kernel_us, launch_ts=t + 1.0)
