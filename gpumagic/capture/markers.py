"""Make the step markers nest with torch's own ``Optimizer.step#...`` annotations.

The optimizer step post-hook runs inside ``Optimizer.step``'s ``record_function`` scope, so the
marker it closes and the one it opens both have an edge a few microseconds *inside* that
annotation. Trace viewers require the complete ("X") events of one thread to nest (the Trace
Event Format says so, and Perfetto drops an overlapping slice), so each marker edge that falls
inside an ``Optimizer.step`` annotation on the same thread is moved to that annotation's end::

    before:  |--- ProfilerStep#1 ---------|--- ProfilerStep#2 ---...
                         [Optimizer.step#SGD.step ]
    after:   |--- ProfilerStep#1 -------------------|--- ProfilerStep#2 ...

When recording stops from the hook, the optimizer annotation around it is still open; the
profiler writes it with ``"finished": false`` and an end at the moment recording stopped (after
the capture's own stop work). Such a cut-off annotation does not move a marker: it is shortened
to end with the last marker edge inside it, where the optimizer step really was.

Only the few marker and optimizer events are decoded and rewritten in place: the rest of a
possibly large trace is left as bytes. An event this cannot parse is left as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

_NAMES = re.compile(rb'"name"\s*:\s*"(ProfilerStep#\d+|Optimizer\.step#[^"\\]*)"')
_STEP_PREFIX = "ProfilerStep#"
#: Kineto writes times in microseconds with three decimals (nanosecond resolution).
_DECIMALS = 3


def nest_step_markers(raw: bytes) -> bytes:
    """``raw`` with every CPU ``ProfilerStep#`` edge moved out of enclosing optimizer steps."""
    markers, optimizer_spans, cut_off = [], [], []
    for start, end, event in _events(raw):
        if event["name"].startswith(_STEP_PREFIX):
            markers.append((start, end, event))
        elif event.get("args", {}).get("finished") is False:
            cut_off.append((start, end, event))
        else:
            optimizer_spans.append((event["pid"], event["tid"], event["ts"], event["ts"] + event["dur"]))
    edits, final_markers = [], []
    for start, end, event in markers:
        moved = _moved(event, optimizer_spans)
        if moved is not None:
            edits.append((start, end, json.dumps(moved).encode()))
        final_markers.append(moved or event)
    for start, end, event in cut_off:
        shortened = _shortened(event, final_markers)
        if shortened is not None:
            edits.append((start, end, json.dumps(shortened).encode()))
    for start, end, replacement in sorted(edits, reverse=True):
        raw = raw[:start] + replacement + raw[end:]
    return raw


def _moved(event: dict[str, Any], spans: list[tuple[Any, Any, float, float]]) -> dict[str, Any] | None:
    """A copy of ``event`` with its edges moved, or None when neither edge moves."""
    own = [(t0, t1) for pid, tid, t0, t1 in spans if pid == event["pid"] and tid == event["tid"]]
    begin, finish = event["ts"], event["ts"] + event["dur"]
    new_begin, new_finish = _outside(begin, own), _outside(finish, own)
    if (new_begin, new_finish) == (begin, finish):
        return None
    return {**event, "ts": round(new_begin, _DECIMALS), "dur": round(max(0.0, new_finish - new_begin), _DECIMALS)}


def _shortened(event: dict[str, Any], markers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A copy of the cut-off ``event`` ending at the last marker end inside it, or None."""
    begin, finish = event["ts"], event["ts"] + event["dur"]
    ends = [m["ts"] + m["dur"] for m in markers if (m["pid"], m["tid"]) == (event["pid"], event["tid"])]
    inside = [t for t in ends if begin < t < finish]
    if not inside:
        return None
    return {**event, "dur": round(max(inside) - begin, _DECIMALS)}


def _outside(t: float, spans: list[tuple[float, float]]) -> float:
    """The end of the outermost span strictly containing ``t``, or ``t`` itself."""
    containing = [t1 for t0, t1 in spans if t0 < t < t1]
    return max(containing, default=t)


def _events(raw: bytes) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``(start, end, event)`` of the CPU annotations named like step markers or optimizer steps."""
    for match in _NAMES.finditer(raw):
        start = raw.rfind(b"{", 0, match.start())
        end = _object_end(raw, start) if start >= 0 else -1
        if end < 0:
            continue
        try:
            event = json.loads(raw[start:end])
        except ValueError:
            continue
        if _is_cpu_annotation(event, match.group(1).decode()):
            yield start, end, event


def _is_cpu_annotation(event: Any, name: str) -> bool:
    return (isinstance(event, dict) and event.get("name") == name and event.get("ph") == "X"
            and event.get("cat") == "user_annotation"
            and isinstance(event.get("ts"), (int, float)) and isinstance(event.get("dur"), (int, float)))


def _object_end(raw: bytes, start: int) -> int:
    """Index just past the JSON object that opens at ``raw[start]``, or -1 if it does not close."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(raw)):
        c = raw[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:  # quote
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c == 0x7B:  # {
            depth += 1
        elif c == 0x7D:  # }
            depth -= 1
            if depth == 0:
                return i + 1
    return -1
