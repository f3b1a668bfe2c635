"""What torch.compile did during the cell: graph breaks and recompilations, from dynamo's own records.

Read before and after the cell, so that the bundle holds this cell's share only:

- ``torch._dynamo.utils.counters["graph_break"]``: a Counter of graph-break reasons (dynamo
  counts one per break each time it traces the frame);
- ``torch._dynamo.utils.guard_failures``: per code object, one string per cache entry whose guards
  failed on a call (``torch/_dynamo/guards.py``, ``get_guard_fail_reason``), prefixed with that
  entry's compile id, ``"0/1: tensor 'x' size mismatch at index 0. expected 5, actual 8"``. A call
  checks the entries newest first, so a recompilation appends one string per entry, down to the
  frame's first (``…/0``); each is kept with its entry's number (``entry``);
- ``torch._dynamo.utils.compilation_time_metrics["_compile.compile_inner"]``: seconds spent in
  each frame compilation (dynamo's ``dynamo_timed``);
- the ``graph_breaks`` log artifact (``torch._dynamo.symbolic_convert``'s
  ``torch._logging.getArtifactLogger(__name__, "graph_breaks")``), captured by a handler while
  the cell runs: each record says ``in user code at FILE:LINE`` and ``Graph Break Reason: …``,
  which the counter alone does not.

Nothing here imports ``torch._dynamo``: a cell that does not use torch.compile pays nothing, and
one that imports it during the cell starts from empty counters.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections import Counter
from typing import Any

#: dynamo's graph-break artifact loggers (torch/_dynamo/symbolic_convert.py, convert_frame.py, exc.py).
GRAPH_BREAK_LOGGERS = ("torch._dynamo.symbolic_convert.__graph_breaks", "torch._dynamo.convert_frame.__graph_breaks",
                       "torch._dynamo.exc.__graph_breaks")
#: The key of a frame compilation in ``compilation_time_metrics`` (torch/_dynamo/convert_frame.py).
COMPILE_KEY = "_compile.compile_inner"
#: At most this many log records are kept (a loop that breaks in every iteration logs once per trace).
MAX_RECORDS = 1000
_BREAK_RE = re.compile(r"in user code at (?P<file>.+?):(?P<line>\d+)\s*\nGraph Break Reason: (?P<reason>.*)", re.S)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.messages) < MAX_RECORDS:
            with contextlib.suppress(Exception):  # a record that cannot be formatted says nothing
                self.messages.append(record.getMessage())


class DynamoWatch:
    """Counters before the cell, a log handler during it, the difference after."""

    def __init__(self) -> None:
        self._before: dict[str, Any] = _snapshot()
        self._handler = _Records()
        self._saved: list[tuple[logging.Logger, int, bool]] = []

    def start(self) -> DynamoWatch:
        for name in GRAPH_BREAK_LOGGERS:
            log = logging.getLogger(name)
            self._saved.append((log, log.level, log.propagate))
            log.addHandler(self._handler)
            if not log.isEnabledFor(logging.DEBUG):  # the user did not ask for these records:
                log.setLevel(logging.DEBUG)  # dynamo writes one only when DEBUG is on,
                log.propagate = False  # and it reaches our handler only, not the console
        return self

    def stop(self) -> None:
        """Put the loggers back as they were. Idempotent."""
        while self._saved:
            log, level, propagate = self._saved.pop()
            log.removeHandler(self._handler)
            log.setLevel(level)
            log.propagate = propagate

    def facts(self) -> dict[str, Any] | None:
        """This cell's compile facts for the bundle, or None when dynamo was never used."""
        after = _snapshot()
        if not after:
            return None
        before = self._before
        breaks = Counter(after["breaks"])
        breaks.subtract(before.get("breaks", {}))
        failures = []
        for key, (file, line, reasons) in after["failures"].items():
            seen = before.get("failures", {}).get(key, (file, line, []))[2]
            failures += [{"reason": _guard_text(r), "file": file, "line": line, "entry": _entry(r)}
                         for r in reasons[len(seen):]]
        compile_s = after["compile_s"] - before.get("compile_s", 0.0)
        graph_breaks = sum(n for n in breaks.values() if n > 0)
        if not graph_breaks and not failures and compile_s <= 0:
            return None
        return {
            "graph_breaks": graph_breaks,
            "break_counts": {r: n for r, n in breaks.items() if n > 0},
            "break_logs": _parse_breaks(self._handler.messages),
            "recompiles": failures,
            "compile_ms": round(max(compile_s, 0.0) * 1000.0, 3),
        }


def _snapshot() -> dict[str, Any]:
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return {}
    failures = {}
    for code, reasons in list(getattr(utils, "guard_failures", {}).items()):
        file, line = getattr(code, "co_filename", None), getattr(code, "co_firstlineno", None)
        failures[id(code)] = (file, line, [str(r) for r in reasons])
    times = getattr(utils, "compilation_time_metrics", {}).get(COMPILE_KEY, [])
    return {
        "breaks": dict(getattr(utils, "counters", {}).get("graph_break", {})),
        "failures": failures,
        "compile_s": float(sum(times)),
    }


#: The source comment dynamo pads a guard's text with (``n == 0      #   # train.py:3 in f``).
_SOURCE_NOTE = re.compile(r"\s+#.*$")
_COMPILE_ID = re.compile(r"^\[?\d+/(?P<entry>\d+)(?:_\d+)?\]?:\s*")


def _entry(reason: str) -> int | None:
    """The number of the cache entry whose guard failed (``1`` in ``"0/1: …"``), or None."""
    m = _COMPILE_ID.match(reason.strip())
    return int(m.group("entry")) if m else None


def _guard_text(reason: str) -> str:
    """A guard failure without its compile id and user stack: ``tensor 'x' size mismatch …``."""
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    return _SOURCE_NOTE.sub("", _COMPILE_ID.sub("", first))[:500]


def _parse_breaks(messages: list[str]) -> list[dict[str, Any]]:
    """``{reason, file, line}`` per logged graph break; the reason is dynamo's graph-break type
    and its ``Explanation:`` where given (torch/_dynamo/graph_break_registry.json), else its first line."""
    out = []
    for text in messages:
        m = _BREAK_RE.search(text)
        if m is None:
            continue
        lines = [x.strip() for x in m.group("reason").splitlines() if x.strip()]
        if not lines:
            continue
        reason = lines[0]
        at = next((i for i, x in enumerate(lines[:8]) if x.startswith("Explanation:")), None)
        if at:  # dynamo's graph-break type is the line above its explanation
            reason = f"{lines[at - 1]}: {lines[at][len('Explanation:'):].strip()}"
        out.append({"reason": reason, "file": m.group("file"), "line": int(m.group("line"))})
    return out
