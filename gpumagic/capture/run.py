"""What one capture leaves behind: the bundle bytes, the Report built from them, and notes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpumagic.capture import bundle
from gpumagic.capture.errors import CaptureError
from gpumagic.capture.options import CaptureOptions

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Report
    from gpumagic.trace.model import Trace


@dataclass
class Run:
    """The result of a capture. ``report`` is None while recording and when nothing was recorded.

    ``bundle`` is the Kineto trace with its ``"gpumagic"`` block (uncompressed JSON bytes);
    :meth:`save` writes it for ``gpumagic analyze``.
    """

    options: CaptureOptions
    label: str = ""
    notes: list[str] = field(default_factory=list)
    bundle: bytes | None = field(default=None, repr=False)
    report: Report | None = None
    finished: bool = False
    saved_to: Path | None = None
    #: True when code in the profiled block started its own torch profiler, which took ours
    #: over: the report then holds only notes saying so.
    taken_over: bool = False
    #: Why the bundle asked for with ``save=`` could not be written (the report is kept).
    save_error: str | None = None
    #: Why no report could be built from the recording (a gpumagic bug: the profiled code's own
    #: result stands), and where the recording was kept for ``gpumagic analyze`` or a bug report.
    analysis_error: str | None = None
    kept_at: Path | None = None

    @property
    def analysis_warning(self) -> str | None:
        """The one line that says the report failed and where the recording is; None when it did not fail."""
        if self.analysis_error is None:
            return None
        where = self.saved_to or self.kept_at
        kept = (f" The recording is kept in {where} (gpumagic analyze reads it)." if where else
                " The recording is in this run's bundle (run.save(path) writes it).")
        return (f"no report: the analysis failed on this recording ({self.analysis_error}). This is a gpumagic bug; "
                f"please report it.{kept}")

    @property
    def trace(self) -> Trace | None:
        """The analysed trace (with samples), or None without a report."""
        return None if self.report is None else self.report.trace

    def save(self, path: str | os.PathLike) -> Path:
        """Write the bundle to ``path`` (gzip when it ends in ``.gz``); returns the path written."""
        if not self.finished:
            raise CaptureError("the run is still recording: save it after the profiled code has finished")
        if self.bundle is None:
            raise CaptureError("nothing was recorded, so there is no trace to save")
        try:
            self.saved_to = bundle.write(path, self.bundle)
        except ValueError as exc:
            raise CaptureError(str(exc)) from None
        return self.saved_to

    def __repr__(self) -> str:
        state = "recording" if not self.finished else (repr(self.report) if self.report else "no report")
        label = f" {self.label!r}" if self.label else ""
        return f"<gpumagic Run{label}: {state}>"
