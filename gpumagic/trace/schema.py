"""The schema-typed view of a Kineto / Chrome-trace JSON file.

msgspec decodes straight into these structs and skips every field not declared here (input
shapes, call stacks, grid sizes...), which is what makes loading fast. Field names follow the
JSON written by ``torch.profiler`` from 2021 to today (``baseTimeNanoseconds``, ``cuda_driver``...).
References: Kineto's ``ChromeTraceLogger`` (libkineto/src/output_json.cpp) and the Trace Event
Format document (the phases ``ph``).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Union

import msgspec

#: The JSON keys of fields whose names differ: :class:`_LaunchArgs`', then :class:`Args`',
#: :class:`OpArgs`' and :class:`CommArgs`' (each struct gives its own, whole mapping).
LAUNCH_ARGS_KEYS = {"nbytes": "bytes", "seq": "Sequence number"}
ARGS_KEYS = {
    **LAUNCH_ARGS_KEYS,
    "mem_bytes": "Bytes",
    "total_allocated": "Total Allocated",
    "total_reserved": "Total Reserved",
    "device_id": "Device Id",
    "device_type": "Device Type",
}
OP_ARGS_KEYS = {**LAUNCH_ARGS_KEYS, "dims": "Input Dims", "types": "Input type", "concrete": "Concrete Inputs"}
COMM_ARGS_KEYS = {**OP_ARGS_KEYS, "coll": "Collective name", "in_n": "In msg nelems", "out_n": "Out msg nelems",
                  "group": "Group size"}


class _LaunchArgs(msgspec.Struct, frozen=True, gc=False, rename=LAUNCH_ARGS_KEYS):
    """The ``args`` of a duration event that every decode reads; -1 means absent. (``correlation``
    links a launch to the kernel or copy it enqueued; operators' ``External id`` is not needed
    and not read. ``seq``: an operator's autograd ``Sequence number``, which the profiler writes
    only while grad mode is on, and which advances by one for each autograd node created on the
    thread: see :mod:`gpumagic.analysis.inference`.)"""

    correlation: int = -1
    stream: int = -1
    device: int = -1
    nbytes: int = -1
    seq: int = -1


class Args(_LaunchArgs, frozen=True, gc=False, rename=ARGS_KEYS):
    """The few ``args`` the analysis reads, of any event: :class:`_LaunchArgs` plus the
    ``[memory]`` instants' allocator totals and the metadata's names."""

    mem_bytes: int = 0
    total_allocated: int = -1
    total_reserved: int = -1
    device_id: int = -1
    device_type: int = -1
    name: str | None = None  # metadata events: process_name / thread_name
    labels: str | None = None  # metadata events: process_labels ("GPU 0", "CPU")


#: Shared by every event without ``args`` (the struct is frozen, so sharing is safe).
NO_ARGS = Args()


class _Event(msgspec.Struct, gc=False, tag_field="ph"):
    """Events are told apart by their phase ``ph`` while decoding (a tagged union), so each kind
    carries only the fields it needs and the loader selects kinds without a pass over strings."""


class _Duration(_Event):
    """A duration event's fields but its ``args``, which each flavour of decode reads its own
    way: operators, annotations, runtime calls, kernels, copies, memsets. ``pid``/``tid`` are
    ints, or strings in older and synthetic lanes."""

    cat: str | None = None
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0


class Complete(_Duration, tag="X"):
    """A duration event with every arg the analysis reads (:class:`Args`): what a parsed dict or
    the lenient path converts to."""

    args: Args = NO_ARGS


#: An absent raw value (no such key in the event's args).
RAW_ABSENT = msgspec.Raw(b"")


class OpArgs(_LaunchArgs, frozen=True, gc=False, rename=OP_ARGS_KEYS):
    """A duration event's ``args`` as loading from bytes decodes them: of :class:`Args`, only what
    duration events carry (:class:`_LaunchArgs`: the allocator's totals belong to ``[memory]``
    instants, the names to metadata), plus what ``record_shapes``/``with_flops`` add to
    operators (see :mod:`.ops`), read in the same pass as everything else. The shapes are kept
    as :class:`msgspec.Raw` (a view into the text): only operators' are decoded further, by
    :func:`.columns.extract`.

    Fewer fields are faster to decode, not only to store: each key of an event's ``args`` that no
    field takes (``Python id``, ``Ev Idx``, ``External id``... most of them) is compared with
    every field's name before it is skipped. Against :class:`Args`' fields plus these, the
    decode of the MI300X capture trace (120k Python-function events with three such keys each)
    took 0.88x the time, the V100, A100 and ResNet-50 traces' 0.94-0.95x."""

    dims: msgspec.Raw = RAW_ABSENT
    types: msgspec.Raw = RAW_ABSENT
    concrete: msgspec.Raw = RAW_ABSENT
    flops: float = -1.0


NO_OP_ARGS = OpArgs()


class FastComplete(_Duration, tag="X"):
    """A duration event as loading from bytes decodes it: with operators' shapes as raw text."""

    args: OpArgs = NO_OP_ARGS


class CommArgs(OpArgs, frozen=True, gc=False, rename=COMM_ARGS_KEYS):
    """:class:`OpArgs` plus what a collective's events record about its message (see
    :mod:`.comms`), as raw text: read in the same pass when a job's rank is loaded
    (``from_bytes(..., comms=True)``), instead of a second decode of the whole file. Not the
    default: the extra keys cost a single trace's decode 3 to 9 %, for facts only the job
    analysis reads."""

    coll: msgspec.Raw = RAW_ABSENT
    dtype: msgspec.Raw = RAW_ABSENT
    in_n: msgspec.Raw = RAW_ABSENT
    out_n: msgspec.Raw = RAW_ABSENT
    group: msgspec.Raw = RAW_ABSENT


NO_COMM_ARGS = CommArgs()


class CommComplete(FastComplete, tag="X"):
    """A duration event as a job's rank is decoded: :class:`FastComplete` with :class:`CommArgs`."""

    args: CommArgs = NO_COMM_ARGS


class Instant(_Event, tag="i"):
    """An instant event; ``[memory]`` records carry the allocator's totals in ``args``."""

    cat: str | None = None
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    args: Args = NO_ARGS


class Metadata(_Event, tag="M"):
    """``process_name``, ``thread_name``, ``process_labels``..."""

    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    args: Args = NO_ARGS


class _Flow(_Event):
    """A flow arrow's end point; ``id`` pairs a start with its end."""

    cat: str | None = None
    id: int | str | None = None
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0


class FlowStart(_Flow, tag="s"):
    """A flow arrow's start (``ac2g``: on the launch)."""


class FlowEnd(_Flow, tag="f"):
    """A flow arrow's end (``ac2g``: on the GPU event)."""


#: Every other phase of the Trace Event Format, read and ignored.
_OTHER_PHASES = "BEIbneCtPONDVvRc("


def _skipped(tag: str) -> type:
    """A field-less event of phase ``tag``: the decoder checks its phase and skips its body."""
    return msgspec.defstruct(f"Skipped_{ord(tag)}", [], bases=(_Event,), tag=tag, module=__name__)


_SKIPPED = {tag: _skipped(tag) for tag in "XiMsf" + _OTHER_PHASES}


def event_union(*kept: type[msgspec.Struct]) -> Any:
    """The tagged union of ``kept`` (structs tagged on ``ph``) and a field-less type for every other
    phase: a decoder of it reads only the kept phases' fields (also :mod:`~gpumagic.trace.ops`,
    :mod:`~gpumagic.trace.comms`, :mod:`~gpumagic.trace.links`)."""
    tags = {t.__struct_config__.tag for t in kept}
    return Union.__getitem__((*kept, *(t for tag, t in _SKIPPED.items() if tag not in tags)))


#: Every event the analysis reads, flows included (``load`` of a dict or of these structs).
Event = event_union(Complete, Instant, Metadata, FlowStart, FlowEnd)
#: What loading from bytes decodes first: flow arrows are only needed when a trace lacks
#: ``correlation`` args (then :data:`FlowEvent` is decoded in a second pass), so skip their bodies.
FastEvent = event_union(FastComplete, Instant, Metadata)
#: The same, each duration event with its collective-message args too (a job's ranks).
CommEvent = event_union(CommComplete, Instant, Metadata)
#: The second pass: flow arrows only.
FlowEvent = event_union(FlowStart, FlowEnd)


class DeviceProperties(msgspec.Struct):
    id: int = 0
    name: str = ""
    totalGlobalMem: int = 0
    computeMajor: int = 0
    computeMinor: int = 0
    numSms: int = 0


class DistributedInfo(msgspec.Struct):
    backend: str | None = None
    rank: int | None = None
    world_size: int | None = None


class Header(msgspec.Struct):
    """The top-level fields besides ``traceEvents``. ``gpumagic`` holds what a gpumagic bundle
    adds (samples, machine)."""

    deviceProperties: list[DeviceProperties] = []
    displayTimeUnit: str | None = None
    baseTimeNanoseconds: int | None = None
    schemaVersion: int | str | None = None
    distributedInfo: DistributedInfo | None = None
    gpumagic: Any = None  # checked field by field when read (trace.bundled)


#: The names of the header fields, for merging the headers of a file decoded in pieces.
HEADER_FIELDS = Header.__struct_fields__


def header_of(tf: Header) -> Header:
    """The header fields of a decoded file, without its events (which can then be freed)."""
    return Header(**{f: getattr(tf, f) for f in HEADER_FIELDS})


class TraceFile(Header):
    """The top-level object, every event decoded."""

    traceEvents: list[Event] | None = None  # type: ignore[valid-type]  # a union built at import


class FastTraceFile(Header):
    """The top-level object as loading from bytes first decodes it (flow arrows skipped)."""

    traceEvents: list[FastEvent] | None = None  # type: ignore[valid-type]  # a union built at import


class CommTraceFile(FastTraceFile):
    """:class:`FastTraceFile` with the collectives' message args (:class:`CommComplete`)."""

    traceEvents: list[CommEvent] | None = None  # type: ignore[valid-type]  # a union built at import


class FlowTraceFile(msgspec.Struct):
    """The top-level object, flow arrows only."""

    traceEvents: list[FlowEvent] | None = None  # type: ignore[valid-type]  # a union built at import


class PieceTraceFile(msgspec.Struct, forbid_unknown_fields=True):
    """A middle piece of a file decoded in pieces (see :mod:`.pieces`): its events and nothing
    else, so that a piece that ran out of ``traceEvents`` into another top-level key fails."""

    traceEvents: list[FastEvent]  # type: ignore[valid-type]  # a union built at import


class CommPieceTraceFile(PieceTraceFile, forbid_unknown_fields=True):
    """:class:`PieceTraceFile` with the collectives' message args."""

    traceEvents: list[CommEvent]  # type: ignore[valid-type]  # a union built at import


class Outline(msgspec.Struct):
    """Where ``traceEvents`` lies in a text: msgspec skips everything else and hands back the
    array's text as a :class:`msgspec.Raw` that points into the decoded buffer."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"")


# Not strict: a number written as a string ("bytes": "1", as ROCm's roctracer writes some args)
# is read as the number instead of sending the whole file to the lenient path.
FAST_DECODER = msgspec.json.Decoder(FastTraceFile, strict=False)
FAST_EVENTS_DECODER = msgspec.json.Decoder(list[FastEvent], strict=False)  # type: ignore[valid-type]  # a union built at import
FLOW_DECODER = msgspec.json.Decoder(FlowTraceFile, strict=False)
FLOW_EVENTS_DECODER = msgspec.json.Decoder(list[FlowEvent], strict=False)  # type: ignore[valid-type]  # a union built at import
PIECE_DECODER = msgspec.json.Decoder(PieceTraceFile, strict=False)


class Decoders(NamedTuple):
    """The typed decoders of one flavour of the loader's first pass: a whole file (``{...}``),
    a bare event array (``[...]``) and a middle piece of a file decoded in pieces."""

    file: msgspec.json.Decoder
    events: msgspec.json.Decoder
    piece: msgspec.json.Decoder


#: The loader's first pass (flow arrows skipped, operators' shapes as raw text).
FAST = Decoders(FAST_DECODER, FAST_EVENTS_DECODER, PIECE_DECODER)
#: The same plus the collectives' message args, for a job's ranks (:mod:`.comms`).
COMMS = Decoders(msgspec.json.Decoder(CommTraceFile, strict=False),
                 msgspec.json.Decoder(list[CommEvent], strict=False),  # type: ignore[valid-type]  # a union built at import
                 msgspec.json.Decoder(CommPieceTraceFile, strict=False))
OUTLINE_DECODER = msgspec.json.Decoder(Outline)
