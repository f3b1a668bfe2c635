"""The DataLoader tuner's result: the measured grid and the recommendation (plain data).

:func:`gpumagic.tune_dataloader` (the measurement, :mod:`gpumagic.capture.dataloader`) returns a
:class:`TuneResult`; its views (text, HTML, bar chart) are in :mod:`gpumagic.render.tuner`, reached
through :mod:`gpumagic.report.views`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from gpumagic.report.views import Viewable, view
from gpumagic.tuning import stats

#: Settings within 5 % of the fastest count as equally fast; the one with fewer workers wins
#: (each worker holds a copy of the dataset and a CPU core). Our choice: repeated measurements of
#: the same setting on an idle machine differ by a few percent.
NEAR_BEST_FRAC = 0.05

@dataclass(frozen=True)
class TuneConfig:
    """One DataLoader setting of the grid."""

    num_workers: int
    pin_memory: bool
    persistent_workers: bool = False
    prefetch_factor: int | None = None

    def loader_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kw.update(persistent_workers=self.persistent_workers, prefetch_factor=self.prefetch_factor)
        return kw

    @property
    def label(self) -> str:
        parts = [f"{self.num_workers} worker{'s' if self.num_workers != 1 else ''}"]
        if self.pin_memory:
            parts.append("pinned")
        if self.num_workers > 0:
            parts += ["persistent"] if self.persistent_workers else []
            parts.append(f"prefetch {self.prefetch_factor}")
        return ", ".join(parts)


@dataclass
class TuneRow:
    """What one setting measured. ``status`` is ``"ok"``, ``"failed"``, ``"timed out"`` or ``"skipped"``."""

    config: TuneConfig
    status: str = "ok"
    batches: int = 0
    seconds: float = 0.0
    batches_per_s: float | None = None
    samples_per_s: float | None = None
    startup_s: float | None = None
    restart_s: float | None = None
    error: str = ""
    #: Seconds of each measured batch, over all rounds (the samples of the speed-up intervals).
    batch_s: list[float] = field(default_factory=list, repr=False)
    #: 95 % interval of this setting's speed-up over the single-process one (mean batch time
    #: there ÷ here, the ratio of the rates; :mod:`gpumagic.tuning.stats`), None with too few batches.
    speedup_ci: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("config"))
        d.pop("batch_s")
        return d

    def merge(self, other: TuneRow) -> None:
        """Add another round's measurement of the same setting."""
        if other.status != "ok":
            self.status, self.error = other.status, other.error
            self.batches_per_s = self.samples_per_s = None
            return
        if self.status != "ok":
            return
        self.batches += other.batches
        self.seconds = round(self.seconds + other.seconds, 4)
        self.batch_s += other.batch_s
        if self.batches and self.seconds > 0:
            scale = (self.samples_per_s / self.batches_per_s) if self.samples_per_s and self.batches_per_s else None
            self.batches_per_s = round(self.batches / self.seconds, 3)
            self.samples_per_s = None if scale is None else round(self.batches_per_s * scale, 1)
        if self.restart_s is None or (other.restart_s is not None and other.restart_s < self.restart_s):
            self.restart_s = other.restart_s


@dataclass
class TuneResult(Viewable):
    """The measured grid, the recommendation, and warnings about fragile worker setups."""

    rows: list[TuneRow]
    batch_size: int | None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    _view_kind: ClassVar[str] = "tune"

    @property
    def best(self) -> TuneRow | None:
        """The fastest setting, preferring fewer workers among those within 5 % of it; the
        single-process setting ("no change") when the best one's speed-up interval over it
        includes no change (or is too short to say)."""
        ok = [r for r in self.rows if r.batches_per_s]
        if not ok:
            return None
        top = max(r.batches_per_s for r in ok)
        near = [r for r in ok if r.batches_per_s >= (1 - NEAR_BEST_FRAC) * top]
        pick = min(near, key=lambda r: (r.config.num_workers, r.config.prefetch_factor or 0, -r.batches_per_s))
        base = self.baseline
        if base is not None and pick is not base and base.batch_s and pick.batch_s and self.change_of(pick) != stats.FASTER:
            return base
        return pick

    def change_of(self, row: TuneRow) -> str:
        """"faster", "slower" or "no clear change" of ``row`` against the single-process setting."""
        base = self.baseline
        if base is None or not row.batch_s or not base.batch_s:
            return stats.NO_CLEAR_CHANGE
        ci = stats.speedup_interval(base.batch_s, row.batch_s, statistic="mean")
        return stats.change_of(row.batches_per_s / base.batches_per_s if row.batches_per_s and base.batches_per_s
                               else None, ci)

    @property
    def baseline(self) -> TuneRow | None:
        """The measured single-process setting (``num_workers=0``), if any."""
        return next((r for r in self.rows if r.config.num_workers == 0 and r.batches_per_s), None)

    @property
    def speedup(self) -> float | None:
        """Best over baseline batches per second."""
        best, base = self.best, self.baseline
        return None if best is None or base is None else best.batches_per_s / base.batches_per_s

    @property
    def recommended_kwargs(self) -> dict[str, Any]:
        best = self.best
        if best is None:
            return {}
        kw = {"batch_size": self.batch_size} if self.batch_size else {}
        kw.update(best.config.loader_kwargs())
        return kw

    @property
    def code(self) -> str:
        kw = self.recommended_kwargs
        if not kw:
            return ""
        args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
        return f"# keep your other arguments (shuffle, collate_fn, ...)\nloader = DataLoader(dataset, {args})"

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        rows = [r.to_dict() | {"change": self.change_of(r)} for r in self.rows]
        return {"rows": rows,
                "best": None if best is None else best.to_dict(), "speedup": self.speedup,
                "speedup_ci": None if best is None else best.speedup_ci, "batch_size": self.batch_size,
                "recommended_kwargs": self.recommended_kwargs,
                "code": self.code, "warnings": list(self.warnings), "notes": list(self.notes), "elapsed_s": self.elapsed_s}

    def figure(self, theme: str = "light"):
        """Batches per second by setting, as a matplotlib Figure (Agg; no pyplot), for ``theme``
        (``'light'`` or ``'dark'``)."""
        return view("tune", "figure")(self, theme)

    def png(self, theme: str = "light") -> bytes:
        """:meth:`figure` as PNG bytes."""
        return view("tune", "png")(self, theme)

    def __repr__(self) -> str:
        best = self.best
        return f"<gpumagic TuneResult: {len(self.rows)} settings, best: {best.config.label if best else 'none'}>"
