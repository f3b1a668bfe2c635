"""JSON text to event structs: the typed decode, Kineto's JSON slips repaired, a lenient
fallback.

msgspec decodes the text into the structs of :mod:`.schema` (flow arrows skipped). The typed
decoders are not strict: a number written as a string (ROCm's roctracer writes ``"bytes": "1"``)
is read as the number, so such traces stay on the fast path. A file whose values still do not
fit the schema takes the lenient path, event by event. A file that is not strictly valid JSON
(trailing commas, unescaped backslashes, raw control characters) is repaired once, in bounded
memory, and decoded again.
"""

from __future__ import annotations

import re

import msgspec

from gpumagic.errors import TraceError
from gpumagic.trace import schema
from gpumagic.trace.columns import by_phase

REPAIRED_NOTE = ("The trace was not strictly valid JSON (a known Kineto slip such as a trailing "
                 "comma or an unescaped backslash); it was repaired before reading.")
FLOWS = (schema.FLOW_DECODER, schema.FLOW_EVENTS_DECODER)

_TRAILING_COMMA = re.compile(rb",(\s*[\]}])")
_BAD_ESCAPE = re.compile(rb'\\(?!["\\/bfnrtu])')
#: Control characters other than tab, newline and carriage return, which JSON forbids raw.
_CONTROL_TO_SPACE = bytes(32 if b < 32 and b not in (9, 10, 13) else b for b in range(256))
#: The repair works through the text this many bytes at a time, so that its memory is bounded
#: by the text's size plus one window, whatever the text holds.
REPAIR_WINDOW = 1 << 20


def decode(raw: bytes | bytearray, source: str = "<bytes>",
           decoders: schema.Decoders = schema.FAST) -> tuple[schema.TraceFile | schema.FastTraceFile, list[str]]:
    """Decode JSON bytes with the typed schema; repair Kineto's known JSON slips if needed.

    Flow arrows' bodies are skipped (:class:`~schema.FastTraceFile`; ``decoders``
    :data:`~schema.COMMS` reads the collectives' message args too). A file whose values do not
    fit the schema takes the lenient path, which returns a :class:`~schema.TraceFile` with every
    event, flows included. Raises :class:`TraceError` in one sentence.
    """
    try:
        return _decode(raw, source, decoders)
    except RecursionError:  # msgspec refuses nesting deeper than Python's recursion limit
        raise TraceError(f"{source}: the JSON is nested too deeply to be a profiler trace") from None


def _decode(raw: bytes | bytearray, source: str,
            decoders: schema.Decoders) -> tuple[schema.TraceFile | schema.FastTraceFile, list[str]]:
    notes: list[str] = []
    try:
        return decode_typed(raw, decoders), notes
    except msgspec.ValidationError:
        return _decode_lenient(raw, source, notes), notes
    except msgspec.DecodeError as first_error:
        message = f"{source}: not valid JSON ({short(first_error)})"
    repaired = repair(raw)
    if repaired is raw:
        raise TraceError(message)
    try:
        tf = decode_typed(repaired, decoders)
    except msgspec.ValidationError:
        tf = _decode_lenient(repaired, source, notes)
    except msgspec.DecodeError:
        raise TraceError(message.replace("not valid JSON", "not valid JSON, truncated or corrupt", 1)) from None
    notes.append(REPAIRED_NOTE)
    return tf, notes


def decode_typed(raw: bytes | bytearray | memoryview, decoders: tuple):
    """``raw`` decoded by ``decoders[0]`` (a whole file) or, for a bare event array, ``decoders[1]``."""
    file_decoder, events_decoder = decoders[0], decoders[1]
    if first_char(raw) == b"[":
        return file_decoder.type(traceEvents=events_decoder.decode(raw))
    return file_decoder.decode(raw)


_SPACE = re.compile(rb"\s*")


def first_char(raw: bytes | bytearray | memoryview) -> bytes:
    """The first non-blank byte (without copying the text, as ``bytearray.lstrip`` would)."""
    blank = _SPACE.match(raw)
    at = blank.end() if blank else 0
    return bytes(raw[at:at + 1])


def _decode_lenient(raw: bytes | bytearray, source: str, notes: list[str]) -> schema.TraceFile:
    """Slow path for a file whose values do not fit the schema: convert event by event."""
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise TraceError(f"{source}: not valid JSON ({short(exc)})") from None
    if isinstance(obj, list):
        obj = {"traceEvents": obj}
    if not isinstance(obj, dict):
        raise TraceError(f"{source}: not a PyTorch profiler trace (the JSON is not an object)")
    raw_events = obj.pop("traceEvents", None)
    try:
        tf = msgspec.convert(obj, schema.TraceFile, strict=False)
    except msgspec.ValidationError:
        tf = schema.TraceFile()
        notes.append("The trace's header fields had unexpected types and were ignored.")
    if raw_events is None:
        return tf
    if not isinstance(raw_events, list):
        raise TraceError(f"{source}: not a PyTorch profiler trace (traceEvents is not a list)")
    events, dropped = [], 0
    for item in raw_events:
        try:
            events.append(msgspec.convert(item, schema.Event, strict=False))
        except msgspec.ValidationError:
            dropped += 1
    tf.traceEvents = events
    if dropped:
        notes.append(f"{dropped} events had fields of unexpected types and were skipped.")
    return tf


def repair(raw: bytes | bytearray) -> bytes | bytearray:
    """The text with trailing commas dropped, stray backslashes escaped and raw control
    characters made spaces. Works window by window (cut where no repair can straddle the cut),
    so memory stays at one copy of the text plus one window, even for a file of a billion NULs
    or of nothing but backslashes. Returns ``raw`` itself when nothing changed."""
    out = bytearray()
    changed = False
    start, n = 0, len(raw)
    with memoryview(raw) as view:
        while start < n:
            end = _safe_cut(raw, min(n, start + REPAIR_WINDOW))
            window = bytes(view[start:end])
            fixed = _BAD_ESCAPE.sub(rb"\\\\", _TRAILING_COMMA.sub(rb"\1", window)).translate(_CONTROL_TO_SPACE)
            changed = changed or fixed != window
            out += fixed
            start = end
    return out if changed else raw


_ENDS_NO_REPAIR = re.compile(rb"[^ \t\n\r,\\]")


def _safe_cut(raw: bytes | bytearray, at: int) -> int:
    """The first offset from ``at`` whose preceding byte ends no repair (a repair's match is a
    comma with blanks up to a bracket, or a backslash judged by the byte after it)."""
    if at >= len(raw):
        return len(raw)
    m = _ENDS_NO_REPAIR.search(raw, at - 1)
    return len(raw) if m is None else m.start() + 1


def short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:120]


def flow_lists(events: list) -> tuple[list, list]:
    by_type = by_phase(events)
    return by_type.get(schema.FlowStart, []), by_type.get(schema.FlowEnd, [])


def flows_from_bytes(raw: bytes | bytearray) -> tuple[list, list]:
    """The second pass for a trace whose GPU events lack correlation ids: its flow arrows."""
    for data in (raw, repair(raw)):
        try:
            return flow_lists(decode_typed(data, FLOWS).traceEvents or [])
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue
    return [], []
