"""What the user holds: findings and metrics as typed records, and notes.

Every renderer (text, HTML, timeline, widget) reads these records; none of them computes.
:meth:`Report.to_dict` writes the JSON report and :func:`report_from_dict` reads it back; the
metrics records are declared in :mod:`gpumagic.report.metrics`.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import msgspec

from gpumagic.report.metrics import Metrics
from gpumagic.report.views import Viewable, view

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.trace.model import Trace

Severity = Literal["high", "medium", "low"]
#: Version of the JSON report's layout and meanings; bumped whenever a key's meaning changes
#: (CHANGELOG.md says what changed). 2: issue 10 (syncs, idle split, gains counted once).
#: 3: issue 31 (``syncs.count`` leaves library syncs out, ``trace.workload`` may be "serving",
#: steady-state findings judge the steady part of the window); issues 21 and 25 add keys.
SCHEMA_VERSION = 3
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
    numbers: dict[str, float | int | str | None] = field(default_factory=dict)
    windows: tuple[Window, ...] = ()


@dataclass(frozen=True)
class Fix:
    """A change to make. ``flavor`` is ``"pytorch"`` or ``"huggingface"`` (TrainingArguments).
    ``diagnostic``: the snippet finds or confirms the cause (a measurement, a profile to record)
    rather than changing the code; views show it after the changes, labelled "Diagnostic"."""

    flavor: Literal["pytorch", "huggingface"]
    description: str
    code: str
    diagnostic: bool = False


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


#: Findings that say the code computes something other than what it means — the updates discard or
#: pile up gradients, the optimizer forgets its state, the model trains in eval mode or predicts in
#: training mode. They claim no speed gain, yet they come before every speed-up: a faster step of a
#: training run that does not learn what it should is no gain.
MISTAKES = frozenset({"gradients-never-reset", "optimizer-state-reset", "updates-without-gradients",
                      "gradients-reset-mid-accumulation", "training-in-eval-mode", "inference-train-mode"})


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """The :data:`MISTAKES` first, then by estimated gain (largest first), then severity, then id
    for a stable order."""
    return sorted(findings, key=lambda f: (f.id not in MISTAKES, -round(f.est_gain, 6), SEVERITY_ORDER[f.severity], f.id))


@dataclass
class Report(Viewable):
    """The result of analysing one trace.

    ``metrics`` holds the typed records of :mod:`gpumagic.report.metrics` (``None`` when nothing
    was measured: only the notes say why; its JSON is then ``{}``); ``findings`` are sorted by
    estimated gain, the :data:`MISTAKES` first (:func:`sort_findings`); ``notes`` say what was and was not captured
    or what was tolerated in the input. ``trace`` is kept for the timeline renderers and is
    not part of :meth:`to_dict`. ``combined_gain`` (0..1) is the estimated share of step time
    saved by fixing every finding together, counting overlapping time once; no finding's
    ``est_gain`` exceeds it.
    """

    metrics: Metrics | None
    findings: list[Finding]
    notes: list[str]
    trace: Trace | None = field(default=None, repr=False, compare=False)
    label: str = ""
    combined_gain: float = 0.0
    #: Set when a labelled run is recorded: None, or how it compares with the label's previous
    #: run (``compared_with``, ``change``, ``speedup``, ``speedup_ci``, ``conditions``,
    #: ``explained_by``); see :func:`gpumagic.tuning.runs.regression`.
    regression: dict[str, Any] | None = None

    _view_kind: ClassVar[str] = "report"

    def _protected_paths(self) -> list[str]:
        """The trace this report was made from: :meth:`save_html` never writes over it."""
        source = "" if self.trace is None else getattr(self.trace, "source", "")
        return [source] if source else []

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
            "metrics": {} if self.metrics is None else self.metrics.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """The report :meth:`to_dict` wrote (see :func:`report_from_dict`)."""
        return report_from_dict(d)

    def to_json(self, indent: int | None = 2) -> str:
        import json

        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def to_text(self, width: int | None = None) -> str:
        """The text report, every line at most ``width`` characters (fix code excepted); ``None``:
        ``COLUMNS``, else the terminal's width, else 100."""
        text: str = view("report", "text")(self, width=width)
        return text

    def timeline(self, step: int | None = None, finding: str | None = None, theme: str = "light") -> Any:
        """The timeline as a matplotlib ``Figure`` (object-oriented API, no pyplot state): lanes
        per host thread and GPU stream, idle gaps by cause, samples; ``step`` zooms to one step
        (an index into ``metrics.steps``), ``finding`` highlights that finding's evidence,
        ``theme`` is ``"light"`` (white background) or ``"dark"`` (for a dark notebook or slide).
        Save it with ``fig.savefig(path)``. Raises ValueError for a report without its trace
        (one rebuilt from JSON) or an unknown theme."""
        return view("report", "timeline")(self, step=step, finding=finding, theme=theme)

    def timeline_png(self, step: int | None = None, finding: str | None = None, theme: str = "light") -> bytes:
        """:meth:`timeline` as PNG bytes, e.g. for ``IPython.display.Image``."""
        png: bytes = view("report", "timeline_png")(self, step=step, finding=finding, theme=theme)
        return png

    def widget(self) -> Any:
        """The interactive ipywidgets view (a VBox), to display or embed."""
        return view("report", "widget")(self)

    def _ipython_display_(self) -> None:
        """``display(report)`` in IPython: the static report, then the live view in a kernel."""
        view("report", "show")(self)

    def __repr__(self) -> str:
        ids = ", ".join(self.finding_ids) or "no findings"
        return f"<gpumagic Report: {ids}>"


def report_from_dict(d: dict[str, Any]) -> Report:
    """A Report rebuilt from :meth:`Report.to_dict` (no trace), with the same typed records.

    Keys this version does not know are ignored. A schema-2 report written by an earlier
    gpumagic may lack what was added since (``metrics.compute``, ``gpu.primary_name``, the host
    CPU fields…): those read as ``None``. Raises :class:`ValueError` for data of another shape."""
    if not isinstance(d, dict):
        raise ValueError(f"a report is a JSON object, not {type(d).__name__}")
    gain = d.get("combined_gain")
    regression = d.get("regression")
    try:
        raw = d.get("metrics") or None
        metrics = None if raw is None else msgspec.convert(_fill_missing(raw, _metrics_info()), Metrics)
        findings = msgspec.convert(d.get("findings") or [], list[Finding])
    except msgspec.ValidationError as exc:
        raise ValueError(f"not a gpumagic report: {exc}") from None
    return Report(metrics=metrics, findings=findings, notes=[str(n) for n in d.get("notes") or []],
                  label=str(d.get("label") or ""),
                  combined_gain=float(gain) if isinstance(gain, (int, float)) and not isinstance(gain, bool) else 0.0,
                  regression=regression if isinstance(regression, dict) else None)


@functools.cache
def _metrics_info() -> msgspec.inspect.Type:
    """The type tree of :class:`Metrics`, built on first use (tens of milliseconds: not at import,
    which every ``gpumagic analyze`` pays)."""
    return msgspec.inspect.type_info(Metrics)


def _fill_missing(value: Any, t: msgspec.inspect.Type) -> Any:
    """``value`` (decoded JSON of type ``t``) with every missing field that may be null set to null,
    so that a report from before a field existed still converts."""
    ins = msgspec.inspect
    if isinstance(t, ins.Metadata):
        return _fill_missing(value, t.type)
    if isinstance(t, ins.UnionType):
        structs = [u for u in t.types if isinstance(u, ins.StructType)]
        return _fill_missing(value, structs[0]) if structs and isinstance(value, dict) else value
    if isinstance(t, ins.StructType) and isinstance(value, dict):
        out = dict(value)
        for f in t.fields:
            if f.encode_name in out:
                out[f.encode_name] = _fill_missing(out[f.encode_name], f.type)
            elif f.required and _nullable(f.type):
                out[f.encode_name] = None
        return out
    if isinstance(t, ins.ListType) and isinstance(value, list):
        return [_fill_missing(v, t.item_type) for v in value]
    if isinstance(t, ins.DictType) and isinstance(value, dict):
        return {k: _fill_missing(v, t.value_type) for k, v in value.items()}
    return value


def _nullable(t: msgspec.inspect.Type) -> bool:
    ins = msgspec.inspect
    if isinstance(t, ins.Metadata):
        return _nullable(t.type)
    return isinstance(t, ins.NoneType) or (isinstance(t, ins.UnionType) and any(isinstance(u, ins.NoneType) for u in t.types))
