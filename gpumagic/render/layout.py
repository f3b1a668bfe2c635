"""Which lanes the timeline shows, what each draws, and the time range in view.

Pure numpy over the trace's columns; no matplotlib here, so this part is cheap to test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from gpumagic.analysis import names as event_names
from gpumagic.render import palette
from gpumagic.render._format import fmt_ms
from gpumagic.trace.model import Kind

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Report
    from gpumagic.trace.model import Trace

#: Other host threads or worker processes shown besides the main thread, busiest first.
MAX_EXTRA_HOST_ROWS = 4
#: A host lane other than the main thread is shown only when busy this share of the view.
MIN_HOST_ROW_SHARE = 0.01
#: Digits of a thread/process id kept in a lane label.
MAX_ID_DIGITS = 7
#: GPU streams shown, busiest first (a trace rarely has more).
MAX_GPU_ROWS = 8
#: Margin added on each side of a zoomed step, as a share of its duration.
ZOOM_MARGIN = 0.02

_HOST_KINDS = (Kind.CPU_OP, Kind.RUNTIME, Kind.DRIVER, Kind.SYNC)


@dataclass(frozen=True)
class TimelineView:
    """The time range drawn (ns from the trace origin) and where the x axis puts zero."""

    start_ns: int
    end_ns: int
    origin_ns: int
    origin_label: str
    title: str


@dataclass(frozen=True)
class Layer:
    """One colour of a lane: a boolean mask over ``trace.events``."""

    label: str
    color: str
    mask: np.ndarray


@dataclass(frozen=True)
class LaneRow:
    """One horizontal lane of the timeline."""

    label: str
    kind: Literal["cpu_main", "cpu", "gpu", "phases"]
    layers: tuple[Layer, ...]
    device: int = -1


def plan_view(report: Report, step: int | None) -> TimelineView:
    """The whole analysis window, or one step (with a small margin) when ``step`` is given."""
    m = report.metrics
    start, end = _window(report)
    bounds = [] if m is None else m.steps.bounds_ns
    names = [] if m is None else m.steps.names
    origin = origin_label(report)
    if step is None:
        title = f"Timeline \u2014 {_steps_phrase(len(bounds))}, {fmt_ms((end - start) / 1e6)}"
        return TimelineView(start, end, start, origin, title)
    if not 0 <= step < len(bounds):
        raise ValueError(f"step {step} is out of range: this report has {len(bounds)} recorded steps")
    s, e = int(bounds[step][0]), int(bounds[step][1])
    margin = int((e - s) * ZOOM_MARGIN)
    title = f"Timeline \u2014 {step_label(step, names)} ({step + 1} of {len(bounds)}), {fmt_ms((e - s) / 1e6)}"
    return TimelineView(max(s - margin, 0), e + margin, start, origin, title)


def origin_label(report: Report) -> str:
    """What time zero is on the x axes: the first step's start, or the trace's start."""
    steps = report.metrics is not None and report.metrics.window.source == "steps"
    return "the first step" if steps else "the start of the trace"


def step_label(index: int, names: list[str]) -> str:
    """``'step 3'`` from ``'ProfilerStep#3'``, else the 1-based position."""
    name = names[index] if index < len(names) else ""
    number = name.rsplit("#", 1)[-1] if "#" in name else ""
    return f"step {number}" if number.isdigit() else f"step {index + 1}"


def _steps_phrase(n: int) -> str:
    return "no step markers" if n == 0 else ("1 step" if n == 1 else f"all {n} steps")


def _window(report: Report) -> tuple[int, int]:
    start, end = (None, None) if report.metrics is None else (report.metrics.window.start_ns, report.metrics.window.end_ns)
    if start is not None and end is not None and end > start:
        return int(start), int(end)
    ev = report.trace.events if report.trace is not None else None
    if ev is None or len(ev) == 0:
        return 0, 1
    return int(ev.ts_ns.min()), max(int(ev.end_ns.max()), int(ev.ts_ns.min()) + 1)


def plan_rows(report: Report, trace: Trace, view: TimelineView) -> list[LaneRow]:
    """The step phases (when the trace has steps), the main thread, then other busy host lanes,
    then GPU streams by (device, stream)."""
    ev = trace.events
    in_view = (ev.ts_ns < view.end_ns) & (ev.ts_ns + ev.dur_ns > view.start_ns)
    names = _name_masks(report, trace)
    host = np.isin(ev.kind, [int(k) for k in _HOST_KINDS]) & ~names["step"][ev.name]
    loader = names["dataloader"][ev.name]
    main = _main_lane(report, trace)
    rows: list[LaneRow] = []
    phases = None if report.metrics is None else report.metrics.phases
    if phases is not None and phases.spans_ns:  # drawn from metrics.phases, not from events
        rows.append(LaneRow("step phases", "phases", ()))
    if main is not None:
        rows.append(_host_row("main thread", "cpu_main", ev.lane == main, host, loader, names["sync"][ev.name]))
    min_busy_ns = MIN_HOST_ROW_SHARE * (view.end_ns - view.start_ns)
    extra = _busiest(trace, (host | loader) & in_view, exclude=main, gpu=False, min_total_ns=min_busy_ns)
    for lane in extra[:MAX_EXTRA_HOST_ROWS]:
        rows.append(_host_row(_host_label(trace, lane, main), "cpu", ev.lane == lane, host, loader, names["sync"][ev.name]))
    gpu_mask = np.isin(ev.kind, [int(Kind.KERNEL), int(Kind.MEMCPY), int(Kind.MEMSET)])
    gpu_lanes = _busiest(trace, gpu_mask, exclude=None, gpu=True)[:MAX_GPU_ROWS]
    for lane in sorted(gpu_lanes, key=lambda i: _device_stream(trace, i)):
        rows.append(_gpu_row(trace, lane, names["nccl"][ev.name]))
    return rows


def _name_masks(report: Report, trace: Trace) -> dict[str, np.ndarray]:
    """Boolean arrays over ``trace.names``, classified by the analysis's own name rules."""
    m = report.metrics
    syncs = event_names.SYNC_CALLS | event_names.SYNC_OPS | set(() if m is None else m.syncs.by_name)
    if m is not None and m.trace.cpu_only:
        syncs = set()  # .item() on a CPU tensor blocks on nothing: no GPU to wait for
    return {
        "step": trace.name_ids(event_names.is_step),
        "dataloader": trace.name_ids(event_names.is_dataloader),
        "sync": trace.name_ids(lambda n: n in syncs),
        "nccl": trace.name_ids(event_names.is_nccl),
    }


def _host_row(label, kind, on_lane, host, loader, sync) -> LaneRow:
    layers = (
        Layer(palette.CATEGORY_LABEL["cpu_exec"], palette.CATEGORY_COLOR["cpu_exec"], on_lane & host & ~loader & ~sync),
        Layer(palette.CATEGORY_LABEL["dataloader"], palette.CATEGORY_COLOR["dataloader"], on_lane & loader),
        Layer("host sync (blocks on the GPU)", palette.HOST_SYNC, on_lane & sync & host),
    )
    return LaneRow(label, kind, layers)


def _gpu_row(trace: Trace, lane: int, nccl_by_event: np.ndarray) -> LaneRow:
    ev = trace.events
    on = ev.lane == lane
    layers = (
        Layer(palette.CATEGORY_LABEL["kernel"], palette.CATEGORY_COLOR["kernel"], on & (ev.kind == Kind.KERNEL) & ~nccl_by_event),
        Layer(palette.CATEGORY_LABEL["communication"], palette.CATEGORY_COLOR["communication"], on & (ev.kind == Kind.KERNEL) & nccl_by_event),
        Layer(palette.CATEGORY_LABEL["memcpy"], palette.CATEGORY_COLOR["memcpy"], on & (ev.kind == Kind.MEMCPY)),
        Layer(palette.CATEGORY_LABEL["memset"], palette.CATEGORY_COLOR["memset"], on & (ev.kind == Kind.MEMSET)),
    )
    device, stream = _device_stream(trace, lane)
    on_kernels = on & (ev.kind == Kind.KERNEL)
    nccl_ns = int(ev.dur_ns[on_kernels & nccl_by_event].sum())
    kernel_ns = int(ev.dur_ns[on_kernels].sum())
    label = f"GPU{device} \u00b7 stream {stream}" + (" \u00b7 NCCL" if kernel_ns and nccl_ns * 2 > kernel_ns else "")
    return LaneRow(label, "gpu", layers, device=device)


def _main_lane(report: Report, trace: Trace) -> int | None:
    """The lane ``metrics.host.main_thread`` names, else the host lane with most CPU-op time."""
    want = None if report.metrics is None else report.metrics.host.main_thread
    for i, lane in enumerate(trace.lanes):
        if want is not None and not lane.gpu and lane.pid == want.pid and lane.tid == want.tid:
            return i
    ev = trace.events
    ops = ev.kind == Kind.CPU_OP
    busiest = _busiest(trace, ops, exclude=None, gpu=False)
    return busiest[0] if busiest else None


def _busiest(trace: Trace, mask: np.ndarray, exclude: int | None, gpu: bool, min_total_ns: float = 0) -> list[int]:
    """Lanes (host or GPU) whose events under ``mask`` sum to more than ``min_total_ns``, largest first."""
    ev = trace.events
    total = np.bincount(ev.lane[mask], weights=ev.dur_ns[mask].astype(np.float64), minlength=len(trace.lanes))
    lanes = [
        i for i in np.argsort(-total, kind="stable")
        if total[i] > max(min_total_ns, 0) and i != exclude and trace.lanes[i].gpu == gpu
    ]
    return [int(i) for i in lanes]


def _host_label(trace: Trace, lane: int, main: int | None) -> str:
    """``'thread 25772'``; another process is likely a DataLoader worker: ``'DataLoader worker · pid 812'``."""
    this = trace.lanes[lane]
    if main is not None and this.pid != trace.lanes[main].pid:
        return f"DataLoader worker \u00b7 pid {_short_id(this.pid)}"
    return f"thread {_short_id(this.tid)}"


def _short_id(n: int) -> str:
    """Thread ids can be pointers (``-1220540864``): keep the last digits so labels fit."""
    text = str(n)
    return text if len(text) <= MAX_ID_DIGITS else "\u2026" + text[-MAX_ID_DIGITS:]


def _device_stream(trace: Trace, lane: int) -> tuple[int, int]:
    ev = trace.events
    idx = np.flatnonzero((ev.lane == lane) & (ev.device >= 0))
    if idx.size:
        return int(ev.device[idx[0]]), int(ev.stream[idx[0]])
    return trace.lanes[lane].pid, trace.lanes[lane].tid
