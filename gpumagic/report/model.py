"""What the user holds: findings as typed records, metrics as plain data, and notes.

Every renderer (text, HTML, timeline, widget) reads these records; none of them computes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gpumagic.report.views import view

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.trace.model import Trace

Severity = Literal["high", "medium", "low"]
#: Version of the JSON report's layout and meanings; bumped whenever a key's meaning changes
#: (CHANGELOG.md says what changed). 2: issue 10 (syncs, idle split, gains counted once).
SCHEMA_VERSION = 2
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


@dataclass(frozen=True)
class Window:
    """A time window to highlight, in ns relative to the trace origin.

    ``lane`` says where it belongs: ``"gpu"`` (GPU timeline, device ``device``), ``"cpu"``
    (the main host thread) or ``""`` (the whole timeline).
    """

    start_ns: int
    end_ns: int
    lane: str = ""
    device: int = -1
    label: str = ""


@dataclass(frozen=True)
class Evidence:
    """The numbers behind a finding, a one-line summary of them, and where to look."""

    summary: str
    numbers: dict[str, float | int | str] = field(default_factory=dict)
    windows: tuple[Window, ...] = ()


@dataclass(frozen=True)
class Fix:
    """A change to make. ``flavor`` is ``"pytorch"`` or ``"huggingface"`` (TrainingArguments)."""

    flavor: Literal["pytorch", "huggingface"]
    description: str
    code: str


@dataclass(frozen=True)
class Finding:
    """One diagnosis. ``est_gain`` is an upper bound on the share of step time it could save
    (0..1); ``gain_method`` says how that bound was estimated."""

    id: str
    severity: Severity
    title: str
    why: str
    evidence: Evidence
    est_gain: float
    gain_method: str
    fixes: tuple[Fix, ...]
    doc_url: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["evidence"]["windows"] = [asdict(w) for w in self.evidence.windows]
        d["fixes"] = [asdict(f) for f in self.fixes]
        return d


def metric(metrics: dict[str, Any], *path: str) -> Any:
    """``metrics[a][b]...``, or ``None`` where any level is missing or null (a report rebuilt
    from JSON, or one of a CPU-only trace, lacks some sections)."""
    node: Any = metrics
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """By estimated gain (largest first), then severity, then id for a stable order."""
    return sorted(findings, key=lambda f: (-round(f.est_gain, 6), SEVERITY_ORDER[f.severity], f.id))


@dataclass
class Report:
    """The result of analysing one trace.

    ``metrics`` is a JSON-ready dict (see :mod:`gpumagic.analysis.metrics` for its keys);
    ``findings`` are sorted by estimated gain; ``notes`` say what was and was not captured
    or what was tolerated in the input. ``trace`` is kept for the timeline renderers and is
    not part of :meth:`to_dict`. ``combined_gain`` (0..1) is the estimated share of step time
    saved by fixing every finding together, counting overlapping time once; no finding's
    ``est_gain`` exceeds it.
    """

    metrics: dict[str, Any]
    findings: list[Finding]
    notes: list[str]
    trace: Trace | None = field(default=None, repr=False, compare=False)
    label: str = ""
    combined_gain: float = 0.0
    #: Set when a labelled run is recorded: None, or how it compares with the label's previous
    #: run (``compared_with``, ``change``, ``speedup``, ``speedup_ci``, ``conditions``,
    #: ``explained_by``); see :func:`gpumagic.tuning.runs.regression`.
    regression: dict[str, Any] | None = None

    def finding(self, finding_id: str) -> Finding | None:
        for f in self.findings:
            if f.id == finding_id:
                return f
        return None

    @property
    def finding_ids(self) -> list[str]:
        return [f.id for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "label": self.label,
            "combined_gain": self.combined_gain,
            "regression": self.regression,
            "metrics": self.metrics,
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
        }

    def to_json(self, indent: int | None = 2) -> str:
        import json

        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def to_text(self, width: int = 100) -> str:
        return view("report", "text")(self, width=width)

    def to_html(self) -> str:
        """One self-contained HTML document (no network, no CDN)."""
        return view("report", "html")(self)

    def save_html(self, path):
        """Write one self-contained HTML file (no network); returns the path."""
        return view("report", "save_html")(self, path)

    def timeline(self, step: int | None = None, finding: str | None = None):
        """The timeline as a matplotlib ``Figure`` (object-oriented API, no pyplot state): lanes
        per host thread and GPU stream, idle gaps by cause, samples; ``step`` zooms to one step
        (an index into ``metrics["steps"]``), ``finding`` highlights that finding's evidence.
        Save it with ``fig.savefig(path)``. Raises ValueError for a report without its trace
        (one rebuilt from JSON)."""
        return view("report", "timeline")(self, step=step, finding=finding)

    def timeline_png(self, step: int | None = None, finding: str | None = None) -> bytes:
        """:meth:`timeline` as PNG bytes, e.g. for ``IPython.display.Image``."""
        return view("report", "timeline_png")(self, step=step, finding=finding)

    def widget(self):
        """The interactive ipywidgets view (a VBox), to display or embed."""
        return view("report", "widget")(self)

    def _repr_mimebundle_(self, include=None, exclude=None):
        """The static report: self-contained HTML and text (see gpumagic.render.display)."""
        return view("report", "mimebundle")(self, include=include, exclude=exclude)

    def _ipython_display_(self):
        """``display(report)`` in IPython: the static report, then the live view in a kernel."""
        view("report", "show")(self)

    def __repr__(self) -> str:
        ids = ", ".join(self.finding_ids) or "no findings"
        return f"<gpumagic Report: {ids}>"
