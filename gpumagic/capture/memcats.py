"""What filled memory: torch.profiler's memory profile, by category, read from the live profiler.

The Chrome trace's ``[memory]`` records carry only the allocator's totals. What each allocation
*was* (a parameter, a gradient, optimizer state, an activation, a temporary, an input) is worked
out by torch's own memory profiler (``torch.profiler._memory_profiler.MemoryProfile``, the code
behind ``profile.export_memory_timeline``) from the profiler's operator tree, which needs
``profile_memory=True``, ``record_shapes=True`` and ``with_stack=True`` together
(``_KinetoProfile._memory_profile`` refuses otherwise). That tree is gone once the trace is
exported, so this module reads it on the stopped profiler and hands the bundle a plain block::

    {"device": "cuda:0", "categories": ["parameter", ...],
     "t_ns": [...], "bytes": [[...], ...],              # one row per kept moment, profiler clock
     "peak_t_ns": ..., "peak_bytes": [...],            # the moment of the most live bytes
     "category_peaks": [...],                          # each category's own maximum
     "top": [{"bytes", "category", "frame", "module", "op", "t_ns"}, ...]}

``t_ns`` are on the profiler's clock, the clock of the trace's ``baseTimeNanoseconds`` + ``ts``
(the reader subtracts the trace's origin). ``MemoryProfile`` is a private torch API: any failure
is a note, never an error in the user's cell.
"""

from __future__ import annotations

from typing import Any

from gpumagic.capture.steps import STEP_MARKER_PREFIX

#: Category names, in the order of the rows' columns. torch's ``Category`` members, lower case,
#: and ``unknown`` for allocations torch could not assign (its ``None``: no tensor id, e.g.
#: an allocator workspace).
CATEGORIES = ("parameter", "optimizer_state", "gradient", "activation", "temporary", "input",
              "autograd_detail", "unknown")
#: Moments kept for the chart: the row of most live bytes of each of this many equal runs of rows
#: (so the peak is always kept and the envelope drawn, whatever the length of the recording).
MAX_POINTS = 1000
#: Largest live allocations at the peak kept with their frame.
TOP_ALLOCATIONS = 10
#: Python frames of torch itself are skipped to find the frame of the user's code that asked.
TORCH_FRAME_PREFIXES = ("torch/", "<built-in", "nn.Module: ", "nn.Module:", "<frozen ")


def category_block(prof: Any, device: str) -> dict[str, Any]:
    """The memory profile of ``prof`` (a stopped ``torch.profiler.profile`` with memory, shapes
    and stacks on) for ``device`` (``"cuda:0"``, ``"cpu"``). Raises whatever torch raises."""
    import torch
    from torch.profiler import _memory_profiler as mpmod

    profile = prof._memory_profile()
    dev = torch.device(device)
    index = {getattr(mpmod.Category, name.upper(), None): i for i, name in enumerate(CATEGORIES)
             if name != "unknown"}
    unknown = CATEGORIES.index("unknown")
    cats = profile._categories

    def column(key: Any, version: int) -> int:
        c = cats.get(key, version) if isinstance(key, mpmod.TensorKey) else None
        return index.get(c, unknown) if c is not None else unknown

    events = [e for e in profile.timeline if e[2][0].device == dev]
    times: list[int] = []
    rows: list[list[int]] = []
    sizes = [0] * len(CATEGORIES)
    peak_total, peak_at, peak_sizes = -1, -1, sizes
    first_t = next((e[0] for e in events if e[0] >= 0), 0)
    lo, hi = _steps_span(profile)
    own_peaks = [0] * len(CATEGORIES)
    for n, (t, action, (key, version), nbytes) in enumerate(events):
        _apply(sizes, action, mpmod.Action, column, key, version, nbytes)
        if n + 1 < len(events) and events[n + 1][0] == t:
            continue  # a moment is the state after all of its events (as torch's timeline coalesces them)
        t = first_t if t < 0 else t
        if times and times[-1] == t:
            rows[-1] = sizes.copy()
        else:
            times.append(t)
            rows.append(sizes.copy())
        if lo is None or lo <= t <= hi:
            own_peaks = [max(a, b) for a, b in zip(own_peaks, sizes, strict=True)]
            total = sum(sizes)
            if total > peak_total:
                peak_total, peak_at, peak_sizes = total, n, sizes.copy()
    block: dict[str, Any] = {"device": str(dev), "categories": list(CATEGORIES)}
    block["t_ns"], block["bytes"] = _thin(times, rows, MAX_POINTS)
    if peak_at < 0:
        block.update(peak_t_ns=None, peak_bytes=None, category_peaks=None, top=[])
        return block
    peak_t = events[peak_at][0]
    block["peak_t_ns"] = first_t if peak_t < 0 else peak_t
    block["peak_bytes"] = peak_sizes
    block["category_peaks"] = own_peaks
    live = _live_at(events[:peak_at + 1], mpmod)
    block["top"] = _top(profile, live, column, mpmod, TOP_ALLOCATIONS)
    return block


def _steps_span(profile: Any) -> tuple[int | None, int]:
    """From the first step marker's start to the last one's end (the analysis window, which the
    peak is looked for in), or ``(None, 0)`` without markers: the whole recording."""
    spans = [(e.start_time_ns, e.end_time_ns) for e in profile._op_tree.dfs()
             if e.name.startswith(STEP_MARKER_PREFIX)]
    if not spans:
        return None, 0
    return min(a for a, _ in spans), max(b for _, b in spans)


def _apply(sizes: list[int], action: Any, actions: Any, column: Any, key: Any, version: int, nbytes: int) -> None:
    """One timeline event, as torch's ``MemoryProfileTimeline._coalesce_timeline`` applies it."""
    if action in (actions.PREEXISTING, actions.CREATE):
        sizes[column(key, version)] += int(nbytes)
    elif action == actions.INCREMENT_VERSION:
        sizes[column(key, version)] -= int(nbytes)
        sizes[column(key, version + 1)] += int(nbytes)
    elif action == actions.DESTROY:
        sizes[column(key, version)] -= int(nbytes)


def _live_at(events: list, mpmod: Any) -> dict[Any, list]:
    """``{key: [version, bytes, created_t_ns or -1]}`` of the tensors live after ``events``
    (allocations without a tensor id all share one ``Key(device)``: they are not listed)."""
    actions = mpmod.Action
    live: dict[Any, list] = {}
    for t, action, (key, version), nbytes in events:
        if not isinstance(key, mpmod.TensorKey):
            continue
        if action in (actions.PREEXISTING, actions.CREATE):
            live[key] = [version, int(nbytes), t if action == actions.CREATE else -1]
        elif action == actions.INCREMENT_VERSION and key in live:
            live[key][0] = version + 1
        elif action == actions.DESTROY:
            live.pop(key, None)
    return live


def _top(profile: Any, live: dict[Any, list], column: Any, mpmod: Any, limit: int) -> list[dict[str, Any]]:
    """The ``limit`` largest live allocations, each with the Python frame (outside torch), the
    ``nn.Module`` and the operator that made it (None for one made before the recording)."""
    largest = sorted(live.items(), key=lambda kv: -kv[1][1])[:limit]
    wanted = {key for key, _ in largest}
    made: dict[Any, Any] = {}
    from torch._C._profiler import _EventType

    if wanted:
        for event in profile._op_tree.dfs():
            if event.typed[0] == _EventType.Allocation and event.typed[1].alloc_size > 0:
                key = mpmod.TensorKey.from_allocation(event.typed[1])
                if key in wanted:
                    made[key] = event
    out = []
    for key, (version, nbytes, t) in largest:
        where = _where(made.get(key), (_EventType.TorchOp, _EventType.PyCall))
        out.append({"bytes": nbytes, "category": CATEGORIES[column(key, version)],
                    "t_ns": None if t < 0 else int(t), **where})
    return out


def _where(event: Any, kinds: tuple[Any, Any]) -> dict[str, str | None]:
    """The innermost operator, ``nn.Module`` and Python frame outside torch above an allocation."""
    torch_op, py_call = kinds
    op = module = frame = None
    parent = event.parent if event is not None else None
    while parent is not None and frame is None:
        kind, name = parent.typed[0], parent.name
        if kind == torch_op and op is None:
            op = name
        elif kind == py_call:
            if name.startswith("nn.Module: ") and module is None:
                module = name[len("nn.Module: "):]
            elif not name.startswith(TORCH_FRAME_PREFIXES):
                frame = name
        parent = parent.parent
    return {"frame": frame, "module": module, "op": op}


def _thin(times: list[int], rows: list[list[int]], limit: int) -> tuple[list[int], list[list[int]]]:
    """At most ``limit`` rows: of each run of consecutive rows, the one with most live bytes."""
    if len(rows) <= limit:
        return times, rows
    step = -(-len(rows) // limit)
    keep = [max(range(i, min(i + step, len(rows))), key=lambda j: sum(rows[j])) for i in range(0, len(rows), step)]
    return [times[j] for j in keep], [rows[j] for j in keep]
