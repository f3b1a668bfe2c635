"""The knobs of one capture, validated once, shared by the magic and the Python API."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from gpumagic.capture.errors import OptionsError
from gpumagic.report.labels import label_problem

#: Optimizer steps left unrecorded at the start: the first step pays one-off costs (lazy
#: allocation, cuDNN autotuning, compilation) that say nothing about the steady state.
DEFAULT_SKIP_STEPS = 1
#: Steps recorded after the skipped ones: enough for a median and a p90, few enough that the
#: trace stays small (torch.profiler's own examples use ``schedule(active=3..5)``).
DEFAULT_RECORD_STEPS = 5
#: Recording cap, in seconds, while no optimizer step has been seen (inference, data prep).
DEFAULT_MAX_SECONDS = 5.0
#: NVML / CPU sampling period. NVML's utilisation counters are averages over 1/6 s to 1 s
#: (NVML API reference, nvmlDeviceGetUtilizationRates), so sampling faster adds little.
DEFAULT_INTERVAL_MS = 100
#: Below this the samplers would mostly measure themselves.
MIN_INTERVAL_MS = 10
#: The longest sampling period: one hour. Waits beyond ``threading.TIMEOUT_MAX`` raise
#: OverflowError on a sampler thread, and a period longer than any cell records nothing anyway.
MAX_INTERVAL_MS = 3_600_000
#: The longest recording cap: 30 days, far inside what ``threading`` waits accept
#: (``threading.TIMEOUT_MAX``, about 292 years on Linux, is the platform's own limit).
MAX_SECONDS_LIMIT = 30 * 86_400.0
#: The largest step counts accepted (``skip``, ``steps``): more than any training run has.
MAX_COUNT = 10**12


@dataclass(frozen=True)
class CaptureOptions:
    """What to record. ``max_seconds=None`` means the default cap, or no cap with ``all_steps``.

    ``all_steps`` records the whole cell: every step from the start, no skip, no step limit.
    ``nvml`` and ``cpu`` turn the GPU (NVML) and host CPU samplers on or off; ``save`` is a
    path to write the bundle to.
    ``shapes``/``stack``/``memory`` turn on torch.profiler's ``record_shapes``/``with_stack``/
    ``profile_memory``; they inflate host time and the trace, so they are off by default.
    ``flops`` turns on ``with_flops`` (the profiler's own FLOP counts) and, with it, shapes.
    ``top_ops``: operators the report's Operators table lists (``metrics.operators.top``).
    ``loader_stages`` times each stage of a DataLoader iterated while recording, in the main process
    and in its workers (:mod:`gpumagic.capture.stages`); on by default.
    ``batch_size``: the batch the code trains on, when known: the ``out-of-memory`` finding then
    estimates the largest batch that would fit, and ``metrics.gpu.energy_j_per_sample`` is the energy
    per step ÷ (it × ``accumulation_steps``, the batches whose gradients one optimizer step
    accumulates; default 1). ``memory`` also turns on shapes and stacks, which
    torch's memory profile by category needs.
    ``modules`` wraps every ``nn.Module`` call in a range for ``metrics.modules``
    (:mod:`gpumagic.capture.modules`); it slows module calls, so it is off by default.
    """

    label: str = ""
    skip: int = DEFAULT_SKIP_STEPS
    steps: int = DEFAULT_RECORD_STEPS
    all_steps: bool = False
    max_seconds: float | None = None
    interval_ms: int = DEFAULT_INTERVAL_MS
    nvml: bool = True
    cpu: bool = True
    shapes: bool = False
    stack: bool = False
    memory: bool = False
    save: str | None = None
    flops: bool = False
    top_ops: int = 20
    loader_stages: bool = True
    batch_size: int | None = None
    accumulation_steps: int = 1
    modules: bool = False

    def __post_init__(self) -> None:
        _check_int("skip", self.skip, 0)
        _check_int("steps", self.steps, 1)
        _check_int("interval_ms", self.interval_ms, MIN_INTERVAL_MS, MAX_INTERVAL_MS)
        _check_int("top_ops", self.top_ops, 0, MAX_COUNT)
        if self.batch_size is not None:
            _check_int("batch_size", self.batch_size, 1)
        _check_int("accumulation_steps", self.accumulation_steps, 1)
        if self.max_seconds is not None:
            ok = isinstance(self.max_seconds, (int, float)) and not isinstance(self.max_seconds, bool)
            if not ok or not math.isfinite(self.max_seconds) or not 0 < self.max_seconds <= MAX_SECONDS_LIMIT:
                raise OptionsError(f"max_seconds must be a positive number of seconds up to {MAX_SECONDS_LIMIT:g} "
                                   f"(use all_steps / --all for no cap), not {self.max_seconds!r}")
        if self.save is not None and (not isinstance(self.save, (str, os.PathLike)) or not str(self.save).strip()):
            raise OptionsError(f"save needs a file name such as run.json.gz, not {self.save!r}")
        problem = label_problem(self.label)
        if problem is not None:  # refused before anything runs: the label is stored after the code ran
            raise OptionsError(problem)

    @property
    def cap_seconds(self) -> float | None:
        """The recording cap in force before the first optimizer step (None: no cap)."""
        if self.max_seconds is not None:
            return float(self.max_seconds)
        return None if self.all_steps else DEFAULT_MAX_SECONDS

    @property
    def first_recorded_step(self) -> int:
        """How many optimizer steps complete before the first recorded step begins."""
        return 0 if self.all_steps else self.skip

    @property
    def last_recorded_step(self) -> int | None:
        """After this many completed optimizer steps recording stops (None: never)."""
        return None if self.all_steps else self.skip + self.steps

    def describe(self) -> dict:
        """The options as plain data, for the bundle's ``capture`` block."""
        return {
            "skip": self.first_recorded_step,
            "steps": None if self.all_steps else self.steps,
            "all_steps": self.all_steps,
            "max_seconds": self.cap_seconds,
            "interval_ms": self.interval_ms,
            "nvml": self.nvml,
            "record_shapes": self.shapes or self.flops or self.memory,
            "with_flops": self.flops,
            "with_stack": self.stack or self.memory,
            "profile_memory": self.memory,
            "loader_stages": self.loader_stages,
            "batch_size": self.batch_size,
            "accumulation_steps": self.accumulation_steps,
            "modules": self.modules,
        }


def _check_int(name: str, value: object, minimum: int, maximum: int = MAX_COUNT) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise OptionsError(f"{name} must be an integer >= {minimum} and <= {maximum}, not {_short(value)}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
