"""The API's wire format: protobuf (``layer/api/proto/qlayer/v1/queue.proto``, the reference).

Each gRPC message is one protobuf message of ``queue.proto``, encoded and decoded by the
generated stubs (the C-backed ``upb`` runtime). The ``*_CODEC`` objects' ``encode`` /
``decode`` plug straight into gRPC's serializer hooks and convert between the protobuf messages
and the plain dataclasses below (which reuse ``layer.api.service``'s types), so the server and
the clients never touch protobuf objects. ``decode`` raises ``SerializationError`` naming what
is wrong for anything malformed: bytes that are not protobuf, bad UTF-8, a frame without a
body, an unknown enum value, an Ack whose offsets are not valid runs.

Fields this build does not know are skipped (protobuf's forward compatibility): a newer peer
that added fields still talks to this one. A change of meaning therefore never reuses a field
number; it adds a field.

Acks travel as runs of offsets per partition (``OffsetRuns``): a batch of 500 consecutive
offsets of one partition is a topic, a partition and two numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Generic, TypeVar

from google.protobuf.message import DecodeError, EncodeError

from layer.api.deliveries import DeliveryBatch
from layer.api.errors import ErrorCode, parse_code
from layer.api.proto.qlayer.v1 import queue_pb2 as pb
from layer.api.service import (
    AckFailure,
    ClusterInfo,
    ClusterMember,
    DeadLetter,
    DeliveredMessage,
    OffsetRuns,
    QueueDefinitionInfo,
    QueueInfo,
    QueueOwner,
    QueueStats,
    ReloadChange,
    ReloadRefusal,
    ReloadResult,
    StatsMissing,
)
from layer.engine.model import AckOp, Bookmark
from layer.exceptions import SerializationError

__all__ = [
    "ACK_WHERE_CODEC",
    "ACK_WHERE_REPLY_CODEC",
    "BROWSE_CODEC",
    "CLUSTER_CODEC",
    "CLUSTER_REPLY_CODEC",
    "ClusterRequest",
    "DEAD_LETTERS_CODEC",
    "DEAD_LETTERS_REPLY_CODEC",
    "BROWSE_REPLY_CODEC",
    "CLIENT_FRAME_CODEC",
    "LIST_QUEUES_CODEC",
    "MAX_ACK_OFFSETS",
    "PUBLISHED_CODEC",
    "PUBLISH_CODEC",
    "QUEUE_LIST_CODEC",
    "REDRIVE_CODEC",
    "REDRIVE_REPLY_CODEC",
    "RELOAD_CODEC",
    "CREATE_QUEUE_CODEC",
    "ALTER_QUEUE_CODEC",
    "DELETE_QUEUE_CODEC",
    "DELETE_QUEUE_REPLY_CODEC",
    "DEFINITION_REPLY_CODEC",
    "LIST_DEFINITIONS_CODEC",
    "DEFINITION_LIST_CODEC",
    "CreateQueue",
    "CreateTemporaryQueue",
    "CREATE_TEMPORARY_QUEUE_CODEC",
    "AlterQueue",
    "DeleteQueue",
    "DeleteQueueReply",
    "DefinitionReply",
    "ListDefinitions",
    "DefinitionList",
    "RELOAD_REPLY_CODEC",
    "REPLAY_CODEC",
    "REPLAY_REPLY_CODEC",
    "SERVER_FRAME_CODEC",
    "SERVICE_NAME",
    "STATS_CODEC",
    "STATS_REPLY_CODEC",
    "Ack",
    "AckResult",
    "AckWhere",
    "AckWhereReply",
    "Batch",
    "Browse",
    "DeadLetters",
    "DeadLettersReply",
    "BrowseReply",
    "Check",
    "Checked",
    "ClientFrame",
    "Close",
    "Error",
    "FrameCodec",
    "ListQueues",
    "Messages",
    "OffsetRuns",
    "Publish",
    "Published",
    "QueueList",
    "Redrive",
    "RedriveReply",
    "Reload",
    "ReloadReply",
    "Replace",
    "Replaced",
    "Replay",
    "ReplayReply",
    "ServerFrame",
    "Stats",
    "StatsReply",
    "Subscribe",
    "Subscribed",
]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["QueueService"].full_name  # qlayer.v1.QueueService
# The most offsets one Ack frame may name (queue.proto says so): the server expands them, so a
# frame of a few bytes must not make it build billions of operations.
MAX_ACK_OFFSETS = 100_000

Headers = list[tuple[str, bytes | None]]


# --- client -> server (subscription stream) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscribe:
    queue: str
    max_backlog: int
    client_name: str = ""
    filter: str | None = None  # a content filter expression
    batch_frames: bool = False  # the client takes Batch frames
    message_columns: bool = False  # the client takes Messages as columns
    common_columns: bool = False  # ... and reads a column alike for all from its common_ field


@dataclass(frozen=True, slots=True)
class Ack:
    """One lease operation on a batch of messages, named by runs of offsets per partition."""

    request_id: int
    op: AckOp
    offsets: list[OffsetRuns]
    seconds: float = 0.0

    @classmethod
    def of(
        cls, request_id: int, op: AckOp, bookmarks: Iterable[Bookmark], seconds: float = 0.0
    ) -> Ack:
        """The frame for ``bookmarks``: grouped by partition, sorted, consecutive offsets
        joined into runs (an offset named twice is named once)."""
        by_partition: dict[tuple[str, int], list[int]] = {}
        for topic, partition, offset in bookmarks:
            found = by_partition.get((topic, partition))
            if found is None:
                by_partition[(topic, partition)] = [offset]
            else:
                found.append(offset)
        offsets = []
        for (topic, partition), listed in by_partition.items():
            listed.sort()
            runs = [listed[0], listed[0]]
            for offset in listed:
                if offset > runs[-1] + 1:
                    runs += (offset, offset)
                elif offset > runs[-1]:
                    runs[-1] = offset
            offsets.append(OffsetRuns(topic, partition, runs))
        return cls(request_id, op, offsets, seconds)

    @property
    def bookmarks(self) -> list[str]:
        """Every message named, as ``topic/partition/offset``, partition by partition."""
        return [text for runs in self.offsets for text in runs.bookmarks()]

    def count(self) -> int:
        return sum(r.count() for r in self.offsets)


@dataclass(frozen=True, slots=True)
class Close:
    pass


@dataclass(frozen=True, slots=True)
class Replace:
    """The whole new subscription spec; answered by ``Replaced`` or by an ``Error`` with the
    same ``request_id`` (the old subscription then stays in force)."""

    request_id: int
    queue: str
    max_backlog: int
    filter: str | None = None


@dataclass(frozen=True, slots=True)
class Check:
    """Is the Messages frame stamped ``made_at`` (the server's clock) still the server's to
    deliver? Answered by ``Checked`` with the same ``request_id``."""

    request_id: int
    made_at: float


ClientFrame = Subscribe | Ack | Close | Replace | Check


# --- server -> client (subscription stream) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscribed:
    subscription_id: str
    backlog: int
    lease_period_s: float
    server_time: float = 0.0  # the server's monotonic clock at the answer
    stale_after_s: float = 0.0  # a frame older than this (by the client's bound) is checked


@dataclass(frozen=True, slots=True)
class Checked:
    """The answer to a ``Check``: ``current`` False means drop the frame."""

    request_id: int
    current: bool
    server_time: float
    wall_ms: int = 0  # the server's wall clock at the answer (that of lease deadlines)


@dataclass(frozen=True, slots=True)
class Messages:
    messages: Sequence[DeliveredMessage]  # a DeliveryBatch from the coordinator
    # on the wire as MessageColumns (to a client that set Subscribe.message_columns)
    columns: bool = False
    made_at: float = 0.0  # the server's monotonic clock when it decided to write the frame
    # a column alike for every message sent once (to a client that set common_columns)
    common: bool = False


@dataclass(frozen=True, slots=True)
class AckResult:
    request_id: int
    failures: list[AckFailure]


@dataclass(frozen=True, slots=True)
class Error:
    """A problem that does not end the stream; ``request_id`` names the ``Replace`` it
    refuses (None for a frame-level problem such as ``malformed_frame``)."""

    code: ErrorCode
    message: str
    request_id: int | None = None


@dataclass(frozen=True, slots=True)
class Replaced:
    request_id: int
    backlog: int


@dataclass(frozen=True, slots=True)
class Batch:
    """Frames written as one gRPC message (to a client that asked for them with
    ``Subscribe.batch_frames``), taken in order as if each had come alone; never holds a
    Subscribed or another Batch."""

    frames: list[Messages | AckResult | Error | Replaced | Checked]


ServerFrame = Subscribed | Messages | AckResult | Error | Replaced | Checked | Batch


# --- unary calls ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Publish:
    queue: str
    value: bytes
    key: bytes | None = None
    headers: Headers = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Published:
    bookmark: Bookmark


@dataclass(frozen=True, slots=True)
class Stats:
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class StatsReply:
    queues: list[QueueStats]
    missing: list[StatsMissing] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ListQueues:
    pass


@dataclass(frozen=True, slots=True)
class QueueList:
    queues: list[QueueInfo]


@dataclass(frozen=True, slots=True)
class Browse:
    queue: str
    filter: str | None = None
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class BrowseReply:
    messages: list[DeliveredMessage]


@dataclass(frozen=True, slots=True)
class AckWhere:
    queue: str
    filter: str
    expire: bool = False


@dataclass(frozen=True, slots=True)
class AckWhereReply:
    acked: int
    skipped: int


@dataclass(frozen=True, slots=True)
class Redrive:
    queue: str
    filter: str | None = None
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class RedriveReply:
    moved: int
    already: int
    unmatched: int


@dataclass(frozen=True, slots=True)
class DeadLetters:
    queue: str
    filter: str | None = None
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class DeadLettersReply:
    letters: list[DeadLetter]


@dataclass(frozen=True, slots=True)
class Replay:
    """Replay through the queue's name (see ReplayRequest in queue.proto)."""

    queue: str
    since_bookmarks: tuple[str, ...] = ()
    since_ms: int | None = None
    until_ms: int | None = None
    follow: bool = False
    filter: str | None = None


@dataclass(frozen=True, slots=True)
class ReplayReply:
    messages: list[DeliveredMessage]


@dataclass(frozen=True, slots=True)
class Reload:
    pass


@dataclass(frozen=True, slots=True)
class ReloadReply:
    result: ReloadResult


@dataclass(frozen=True, slots=True)
class CreateQueue:
    options: dict[str, str]  # the [[queue]] table, each value a TOML literal


@dataclass(frozen=True, slots=True)
class CreateTemporaryQueue:
    queue: str
    options: dict[str, str]


@dataclass(frozen=True, slots=True)
class AlterQueue:
    name: str
    options: dict[str, str]


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    name: str
    force: bool = False


@dataclass(frozen=True, slots=True)
class DeleteQueueReply:
    pass


@dataclass(frozen=True, slots=True)
class DefinitionReply:
    definition: QueueDefinitionInfo


@dataclass(frozen=True, slots=True)
class ListDefinitions:
    pass


@dataclass(frozen=True, slots=True)
class DefinitionList:
    definitions: list[QueueDefinitionInfo]


@dataclass(frozen=True, slots=True)
class ClusterRequest:
    pass


# --- the codec --------------------------------------------------------------------------------

T = TypeVar("T")


class FrameCodec(Generic[T]):
    """Encodes and decodes one frame type; ``encode``/``decode`` are gRPC serializer hooks."""

    def __init__(
        self,
        proto: type[Any],
        to_proto: Callable[[T], Any],
        from_proto: Callable[[Any], T],
    ) -> None:
        self.name = proto.DESCRIPTOR.name
        self._proto = proto
        self._to_proto = to_proto
        self._from_proto = from_proto

    def encode(self, frame: T) -> bytes:
        try:
            data: bytes = self._to_proto(frame).SerializeToString()
        except (ValueError, TypeError, AttributeError, EncodeError) as exc:  # out of range...
            raise SerializationError(f"cannot encode {self.name} frame {frame!r}: {exc}") from exc
        return data

    def decode(self, data: bytes) -> T:
        try:
            message = self._proto.FromString(data)
        except (DecodeError, ValueError) as exc:
            raise SerializationError(
                f"malformed {self.name} frame ({len(data)} bytes): not a valid {self.name}"
                f" message: {exc}"
            ) from exc
        try:
            return self._from_proto(message)
        except (ValueError, KeyError) as exc:
            raise SerializationError(f"malformed {self.name} frame: {exc}") from exc


def _opt(message: Any, name: str) -> Any:
    """A proto3 ``optional`` field's value, None when unset."""
    return getattr(message, name) if message.HasField(name) else None


def _headers_to(headers: Sequence[tuple[str, bytes | None]]) -> list[Any]:
    return [pb.Header(key=key, value=value) for key, value in headers]


def _headers_from(headers: Iterable[Any]) -> Headers:
    return [(h.key, h.value if h.HasField("value") else None) for h in headers]


# AckOp <-> the enum of queue.proto (0 is ACK_OP_UNSPECIFIED: never valid)
_OP_TO = {
    AckOp.ACK: pb.ACK_OP_ACK,
    AckOp.CANCEL: pb.ACK_OP_CANCEL,
    AckOp.EXPIRE: pb.ACK_OP_EXPIRE,
    AckOp.EXTEND: pb.ACK_OP_EXTEND,
}
_OP_FROM = {number: op for op, number in _OP_TO.items()}


def _ack_from(ack: Any) -> Ack:
    op = _OP_FROM.get(ack.op)
    if op is None:
        raise ValueError(
            f"Ack op {ack.op} is not one of {', '.join(f'{n} ({o})' for n, o in _OP_FROM.items())}"
        )
    offsets: list[OffsetRuns] = []
    total = 0
    for entry in ack.offsets:
        topic, partition, runs = entry.topic, entry.partition, list(entry.runs)
        where = f"Ack offsets of {topic!r} partition {partition}"
        if not topic:
            raise ValueError("Ack offsets with an empty topic")
        if partition < 0:
            raise ValueError(f"{where}: negative partition")
        if len(runs) % 2:
            raise ValueError(f"{where}: {len(runs)} runs values, not first/last pairs")
        for i in range(0, len(runs), 2):
            first, last = runs[i], runs[i + 1]
            if first < 0:
                raise ValueError(f"{where}: negative offset {first}")
            if last < first:
                raise ValueError(f"{where}: run {first}..{last} ends before it starts")
            total += last - first + 1
            if total > MAX_ACK_OFFSETS:
                raise ValueError(
                    f"Ack names more than {MAX_ACK_OFFSETS:,} offsets (run {first}..{last}"
                    f" of {topic!r} partition {partition}): split it into several Acks"
                )
        offsets.append(OffsetRuns(topic, partition, runs))
    return Ack(ack.request_id, op, offsets, ack.seconds)


def _client_to(frame: ClientFrame) -> Any:
    if isinstance(frame, Ack):
        return pb.ClientFrame(
            ack=pb.Ack(
                request_id=frame.request_id,
                op=_OP_TO[AckOp(frame.op)],
                offsets=[
                    pb.OffsetRuns(topic=r.topic, partition=r.partition, runs=r.runs)
                    for r in frame.offsets
                ],
                seconds=frame.seconds,
            )
        )
    if isinstance(frame, Subscribe):
        return pb.ClientFrame(
            subscribe=pb.Subscribe(
                queue=frame.queue,
                max_backlog=frame.max_backlog,
                client_name=frame.client_name,
                filter=frame.filter,
                batch_frames=frame.batch_frames,
                message_columns=frame.message_columns,
                common_columns=frame.common_columns,
            )
        )
    if isinstance(frame, Close):
        return pb.ClientFrame(close=pb.Close())
    if isinstance(frame, Replace):
        return pb.ClientFrame(
            replace=pb.Replace(
                request_id=frame.request_id,
                queue=frame.queue,
                max_backlog=frame.max_backlog,
                filter=frame.filter,
            )
        )
    if isinstance(frame, Check):
        return pb.ClientFrame(check=pb.Check(request_id=frame.request_id, made_at=frame.made_at))
    raise TypeError(f"not a client frame: {type(frame).__name__}")


def _client_from(message: Any) -> ClientFrame:
    kind = message.WhichOneof("body")
    if kind == "ack":
        return _ack_from(message.ack)
    if kind == "subscribe":
        s = message.subscribe
        return Subscribe(
            s.queue,
            s.max_backlog,
            s.client_name,
            _opt(s, "filter"),
            s.batch_frames,
            s.message_columns,
            s.common_columns,
        )
    if kind == "close":
        return Close()
    if kind == "replace":
        r = message.replace
        return Replace(r.request_id, r.queue, r.max_backlog, _opt(r, "filter"))
    if kind == "check":
        return Check(message.check.request_id, message.check.made_at)
    raise ValueError(
        "ClientFrame without a body (none of subscribe, ack, close, replace, check set)"
    )


def _add_messages(repeated: Any, messages: Iterable[DeliveredMessage]) -> None:
    """Append ``messages`` to a ``repeated Message`` field: the encoding every delivery costs,
    so one ``add`` call per message and header objects only where there are headers."""
    add = repeated.add
    header = pb.Header
    for m in messages:
        topic, partition, offset = m.bookmark
        headers = m.headers
        add(
            topic=topic,
            partition=partition,
            offset=offset,
            key=m.key,
            value=m.value,
            headers=[header(key=k, value=v) for k, v in headers] if headers else None,
            timestamp_ms=m.timestamp_ms,
            deliveries=m.deliveries,
            cancels=m.cancels,
            lease_deadline_ms=m.lease_deadline_ms,
            barrier=m.barrier,
            queue=m.queue,
            parse_error=m.parse_error,
        )


# MessageColumns.flags
_KEY, _VALUE, _DEADLINE, _BARRIER, _ERROR, _HEADERS = 1, 2, 4, 8, 16, 32


def _add_columns(columns: Any, messages: Sequence[DeliveredMessage]) -> None:
    """``messages`` into a MessageColumns: a column at a time (each one C call over a list),
    the only per-message Python a comprehension that picks a field."""
    n = len(messages)
    if not n:
        return
    topics, partitions, offsets = zip(*[m.bookmark for m in messages], strict=True)
    columns.topic.extend(topics)
    columns.partition.extend(partitions)
    columns.offset.extend(offsets)
    keys = [m.key for m in messages]
    values = [m.value for m in messages]
    deadlines = [m.lease_deadline_ms for m in messages]
    errors = [m.parse_error for m in messages]
    headers = [m.headers for m in messages]
    barriers = [m.barrier for m in messages]
    if (
        keys.count(None) == n
        and errors.count(None) == n
        and not any(headers)
        and not any(barriers)
        and None not in values
        and None not in deadlines
    ):
        # a plain batch (the common case): every message has the same flags
        columns.flags.extend([_VALUE | _DEADLINE] * n)
    else:
        fields = zip(keys, values, deadlines, barriers, errors, headers, strict=True)
        columns.flags.extend(
            [
                (k is not None) + 2 * (v is not None) + 4 * (d is not None) + 8 * b
                + 16 * (e is not None) + 32 * bool(h)
                for k, v, d, b, e, h in fields
            ]
        )  # fmt: skip
    columns.key.extend([b"" if k is None else k for k in keys])
    columns.value.extend([b"" if v is None else v for v in values])
    columns.timestamp_ms.extend([m.timestamp_ms for m in messages])
    columns.deliveries.extend([m.deliveries for m in messages])
    columns.cancels.extend([m.cancels for m in messages])
    columns.lease_deadline_ms.extend([0 if d is None else d for d in deadlines])
    columns.queue.extend([m.queue for m in messages])
    columns.parse_error.extend([e for e in errors if e is not None])
    if any(headers):
        header = pb.Header
        columns.header_count.extend([len(h) for h in headers if h])
        columns.headers.extend([header(key=k, value=v) for h in headers for k, v in h])


def _add_batch(columns: Any, batch: DeliveryBatch, common: bool = False) -> None:
    """``batch`` into a MessageColumns, as ``_add_columns`` writes its messages: its columns
    extend the frame's as they are, the sparse ones (deadline exceptions, barriers, headers,
    parse errors) filled in where there are any. ``common`` (the client set common_columns):
    a column alike for every message goes once, in its ``common_`` field."""
    n = len(batch.bookmarks)
    if not n:
        return
    topics, partitions, offsets = zip(*batch.bookmarks, strict=True)
    _extend(columns, "topic", topics, common)
    columns.partition.extend(partitions)
    columns.offset.extend(offsets)
    keys, values = batch.keys, batch.values
    common_deadline, deadlines = batch.deadline_ms, batch.deadlines
    all_leased = common_deadline is not None if deadlines is None else None not in deadlines
    no_keys = keys.count(None) == n
    all_values = None not in values
    barriers, headers, errors = batch.barriers, batch.headers, batch.errors
    if no_keys and all_values and all_leased and not (barriers or headers or errors):
        flags = [_VALUE | _DEADLINE] * n  # a plain batch (the common case)
    else:
        flags = [(k is not None) + 2 * (v is not None) for k, v in zip(keys, values, strict=True)]
        if deadlines is not None:
            flags = [f + 4 * (d is not None) for f, d in zip(flags, deadlines, strict=True)]
        elif common_deadline is not None:
            flags = [f | _DEADLINE for f in flags]
        for i in barriers:
            flags[i] |= _BARRIER
        for i in errors:
            flags[i] |= _ERROR
        for i, h in headers.items():
            if h:
                flags[i] |= _HEADERS
    _extend(columns, "flags", flags, common)
    if not (common and no_keys):  # no key at all: the flags say so
        columns.key.extend([b""] * n if no_keys else [b"" if k is None else k for k in keys])
    columns.value.extend(values if all_values else [b"" if v is None else v for v in values])
    columns.timestamp_ms.extend(batch.times)
    _extend(columns, "deliveries", batch.deliveries, common)
    _extend(columns, "cancels", batch.cancels, common)
    lease_deadlines: Sequence[int | None]
    if deadlines is None:
        lease_deadlines = [0 if common_deadline is None else common_deadline] * n
    else:
        lease_deadlines = deadlines if all_leased else [0 if d is None else d for d in deadlines]
    _extend(columns, "lease_deadline_ms", lease_deadlines, common)
    _extend(columns, "queue", [batch.queue] * n, common)
    if errors:
        columns.parse_error.extend([errors[i] for i in sorted(errors)])
    if headers:
        header = pb.Header
        lists = [headers[i] for i in sorted(headers) if headers[i]]
        columns.header_count.extend([len(h) for h in lists])
        columns.headers.extend([header(key=k, value=v) for h in lists for k, v in h])


def _extend(columns: Any, name: str, values: Sequence[Any], common: bool) -> None:
    """The per-message column ``name``, or its ``common_`` field when ``common`` and every
    value is the same."""
    if common and values.count(values[0]) == len(values):
        setattr(columns, f"common_{name}", values[0])
    else:
        getattr(columns, name).extend(values)


_PER_MESSAGE = (
    "topic", "partition", "offset", "key", "value", "timestamp_ms", "deliveries", "cancels",
    "lease_deadline_ms", "queue",
)  # fmt: skip
# the per-message columns that a frame to a client with common_columns may send once
_COMMON = ("topic", "queue", "flags", "deliveries", "cancels", "lease_deadline_ms")


def _column(columns: Any, name: str, n: int) -> Any:
    """The per-message column ``name`` of ``n`` messages: as sent, or its ``common_`` value
    ``n`` times when the column was left empty for it."""
    values = getattr(columns, name)
    if len(values) == n:
        return values
    if not values and name in _COMMON and columns.HasField(f"common_{name}"):
        return repeat(getattr(columns, f"common_{name}"), n)
    raise ValueError(f"MessageColumns: {name} has {len(values)} entries, offset {n}")


# a Bookmark from a (topic, partition, offset) tuple without NamedTuple's Python-level __new__
_new_tuple = tuple.__new__


def _columns_from(columns: Any) -> list[DeliveredMessage]:
    n = len(columns.offset)
    flags = list(_column(columns, "flags", n))
    keys = columns.key
    if not keys and n:  # left out: no message has a key (the flags must agree)
        if any(f & _KEY for f in flags):
            raise ValueError("MessageColumns: key is empty, the flags say some have one")
        keys = repeat(b"", n)
    elif len(keys) != n:
        raise ValueError(f"MessageColumns: key has {len(keys)} entries, offset {n}")
    for name in _PER_MESSAGE:
        if name not in _COMMON and name != "key" and len(getattr(columns, name)) != n:
            raise ValueError(
                f"MessageColumns: {name} has {len(getattr(columns, name))} entries, offset {n}"
            )
    topic_column = _column(columns, "topic", n)
    queue_column = _column(columns, "queue", n)
    deliveries_column = _column(columns, "deliveries", n)
    cancels_column = _column(columns, "cancels", n)
    deadline_column = _column(columns, "lease_deadline_ms", n)
    common = flags[0] if n else 0
    uniform = flags.count(common) == n  # every message with the same flags (a plain batch)
    errors = iter(list(columns.parse_error))
    with_error = (n if common & _ERROR else 0) if uniform else sum(1 for f in flags if f & _ERROR)
    if with_error != len(columns.parse_error):
        raise ValueError("MessageColumns: parse_error does not match the flags")
    counts = list(columns.header_count)
    with_headers = (
        (n if common & _HEADERS else 0) if uniform else sum(1 for f in flags if f & _HEADERS)
    )
    if with_headers != len(counts) or sum(counts) != len(columns.headers):
        raise ValueError("MessageColumns: header_count or headers do not match the flags")
    all_headers = _headers_from(columns.headers) if counts else []
    lists: list[Headers] = []
    at = 0
    for count in counts:
        lists.append(all_headers[at : at + count])
        at += count
    per_message = iter(lists)
    bookmarks = map(
        _new_tuple,
        repeat(Bookmark),
        zip(topic_column, columns.partition, columns.offset, strict=False),
    )
    if uniform and not common & (_KEY | _HEADERS | _ERROR):
        # every message alike, with no key, headers or parse error (a plain batch): the fields
        # from the columns without a test per message
        barrier = bool(common & _BARRIER)
        values = columns.value if common & _VALUE else repeat(None)
        deadlines = deadline_column if common & _DEADLINE else repeat(None)
        return [
            DeliveredMessage(
                bookmark, None, value, [], timestamp_ms, deliveries, cancels, deadline, barrier,
                queue,
            )
            for bookmark, value, timestamp_ms, deliveries, cancels, deadline, queue in zip(
                bookmarks, values, columns.timestamp_ms, deliveries_column, cancels_column,
                deadlines, queue_column, strict=False,  # the lengths are checked above
            )
        ]  # fmt: skip
    return [
        DeliveredMessage(
            bookmark,
            key if f & _KEY else None,
            value if f & _VALUE else None,
            next(per_message) if f & _HEADERS else [],
            timestamp_ms,
            deliveries,
            cancels,
            deadline if f & _DEADLINE else None,
            bool(f & _BARRIER),
            queue,
            next(errors) if f & _ERROR else None,
        )
        for f, bookmark, key, value, timestamp_ms, deliveries, cancels, deadline, queue in zip(
            flags, bookmarks, keys, columns.value,
            columns.timestamp_ms, deliveries_column, cancels_column, deadline_column,
            queue_column, strict=False,  # the lengths are checked above
        )
    ]  # fmt: skip


def _messages_from(messages: Iterable[Any]) -> list[DeliveredMessage]:
    out = []
    for m in messages:
        out.append(
            DeliveredMessage(
                Bookmark(m.topic, m.partition, m.offset),
                m.key if m.HasField("key") else None,
                m.value if m.HasField("value") else None,
                _headers_from(m.headers) if m.headers else [],
                m.timestamp_ms,
                m.deliveries,
                m.cancels,
                m.lease_deadline_ms if m.HasField("lease_deadline_ms") else None,
                m.barrier,
                m.queue,
                m.parse_error if m.HasField("parse_error") else None,
            )
        )
    return out


def _server_to(frame: ServerFrame) -> Any:
    out = pb.ServerFrame()
    if isinstance(frame, Batch):
        out.batch.SetInParent()
        add = out.batch.frames.add
        for inner in frame.frames:
            if isinstance(inner, Batch | Subscribed):
                raise TypeError(f"a Batch cannot hold a {type(inner).__name__}")
            _fill_server(add(), inner)
        return out
    _fill_server(out, frame)
    return out


def _fill_server(out: Any, frame: ServerFrame) -> None:
    """Set the body of the (empty) ``pb.ServerFrame`` ``out`` to ``frame``."""
    if isinstance(frame, Messages):
        out.messages.SetInParent()  # an empty batch is still a Messages frame
        if frame.made_at:
            out.messages.made_at = frame.made_at
        if frame.columns:
            out.messages.columns.SetInParent()
            if isinstance(frame.messages, DeliveryBatch):
                _add_batch(out.messages.columns, frame.messages, frame.common)
            else:
                _add_columns(out.messages.columns, frame.messages)
        else:
            _add_messages(out.messages.messages, frame.messages)
    elif isinstance(frame, AckResult):
        out.ack_result.SetInParent()
        out.ack_result.request_id = frame.request_id
        out.ack_result.failures.extend(
            pb.AckFailure(bookmark=f.bookmark, error=str(f.error), message=f.message)
            for f in frame.failures
        )
    elif isinstance(frame, Subscribed):
        out.subscribed.CopyFrom(
            pb.Subscribed(
                subscription_id=frame.subscription_id,
                backlog=frame.backlog,
                lease_period_s=frame.lease_period_s,
                server_time=frame.server_time,
                stale_after_s=frame.stale_after_s,
            )
        )
    elif isinstance(frame, Error):
        out.error.CopyFrom(
            pb.Error(code=str(frame.code), message=frame.message, request_id=frame.request_id)
        )
    elif isinstance(frame, Replaced):
        out.replaced.CopyFrom(pb.Replaced(request_id=frame.request_id, backlog=frame.backlog))
    elif isinstance(frame, Checked):
        out.checked.CopyFrom(
            pb.Checked(
                request_id=frame.request_id,
                current=frame.current,
                server_time=frame.server_time,
                wall_ms=frame.wall_ms,
            )
        )
    else:
        raise TypeError(f"not a server frame: {type(frame).__name__}")


def _server_from(message: Any) -> ServerFrame:
    kind = message.WhichOneof("body")
    if kind == "messages":
        made_at = message.messages.made_at
        if message.messages.HasField("columns"):
            return Messages(_columns_from(message.messages.columns), True, made_at)
        return Messages(_messages_from(message.messages.messages), made_at=made_at)
    if kind == "ack_result":
        r = message.ack_result
        failures = [AckFailure(f.bookmark, parse_code(f.error), f.message) for f in r.failures]
        return AckResult(r.request_id, failures)
    if kind == "subscribed":
        s = message.subscribed
        return Subscribed(
            s.subscription_id, s.backlog, s.lease_period_s, s.server_time, s.stale_after_s
        )
    if kind == "error":
        e = message.error
        return Error(parse_code(e.code), e.message, _opt(e, "request_id"))
    if kind == "replaced":
        return Replaced(message.replaced.request_id, message.replaced.backlog)
    if kind == "checked":
        c = message.checked
        return Checked(c.request_id, c.current, c.server_time, c.wall_ms)
    if kind == "batch":
        frames: list[Messages | AckResult | Error | Replaced | Checked] = []
        for inner in message.batch.frames:
            decoded = _server_from(inner)
            if isinstance(decoded, Batch | Subscribed):
                raise ValueError(f"a Batch frame holds a {type(decoded).__name__}")
            frames.append(decoded)
        return Batch(frames)
    raise ValueError(
        "ServerFrame without a body this client knows (none of subscribed, messages,"
        " ack_result, error, replaced, checked, batch set)"
    )


def _stats_to(s: QueueStats) -> Any:
    return pb.QueueStats(
        queue=s.queue,
        available=s.available,
        leased=s.leased,
        inactive=s.inactive,
        subscriptions=s.subscriptions,
        oldest_available_age_s=s.oldest_available_age_s,
        delivered_total=s.delivered_total,
        acked_total=s.acked_total,
        dead_lettered_total=s.dead_lettered_total,
        extra={k: float(v) for k, v in s.extra.items()},
        owner=s.owner,
    )


def _stats_from(r: Any) -> QueueStats:
    return QueueStats(
        queue=r.queue,
        available=r.available,
        leased=r.leased,
        inactive=r.inactive,
        subscriptions=r.subscriptions,
        oldest_available_age_s=_opt(r, "oldest_available_age_s"),
        delivered_total=r.delivered_total,
        acked_total=r.acked_total,
        dead_lettered_total=r.dead_lettered_total,
        extra={k: _count_or_measure(k, v) for k, v in sorted(r.extra.items())},  # by name
        owner=r.owner,
    )


def _count_or_measure(name: str, value: float) -> float | int:
    """A stats figure from the wire (a double): counts come back as integers (a double holds
    every integer up to 2**53 exactly); measures (``*_s``, ``*_ms``) stay floats."""
    if value.is_integer() and not name.endswith(("_s", "_ms")):
        return int(value)
    return value


def _info_to(q: QueueInfo) -> Any:
    return pb.QueueInfo(
        name=q.name,
        underlying_topic=q.underlying_topic,
        semantics=q.semantics,
        message_type=q.message_type,
        lease_period_s=q.lease_period_s,
        max_per_subscription_backlog=q.max_per_subscription_backlog,
        dead_letter_topic=q.dead_letter_topic,
        default_publish_target=q.default_publish_target,
    )


def _info_from(r: Any) -> QueueInfo:
    return QueueInfo(
        name=r.name,
        underlying_topic=r.underlying_topic,
        semantics=r.semantics,
        message_type=r.message_type,
        lease_period_s=r.lease_period_s,
        max_per_subscription_backlog=r.max_per_subscription_backlog,
        dead_letter_topic=_opt(r, "dead_letter_topic"),
        default_publish_target=_opt(r, "default_publish_target"),
    )


def _reload_to(f: ReloadReply) -> Any:
    r = f.result
    return pb.ReloadReply(
        source=r.source,
        applied=r.applied,
        added=r.added,
        removed=r.removed,
        changed=[
            pb.ReloadChange(queue=c.queue, option=c.option, old=c.old, new=c.new) for c in r.changed
        ],
        refused=[
            pb.ReloadRefusal(where=x.where, option=x.option, old=x.old, new=x.new, reason=x.reason)
            for x in r.refused
        ],
    )


def _reload_from(r: Any) -> ReloadReply:
    return ReloadReply(
        ReloadResult(
            source=r.source,
            applied=r.applied,
            added=list(r.added),
            removed=list(r.removed),
            changed=[ReloadChange(c.queue, c.option, c.old, c.new) for c in r.changed],
            refused=[ReloadRefusal(x.where, x.option, x.old, x.new, x.reason) for x in r.refused],
        )
    )


CLIENT_FRAME_CODEC: FrameCodec[ClientFrame] = FrameCodec(pb.ClientFrame, _client_to, _client_from)
SERVER_FRAME_CODEC: FrameCodec[ServerFrame] = FrameCodec(pb.ServerFrame, _server_to, _server_from)
PUBLISH_CODEC: FrameCodec[Publish] = FrameCodec(
    pb.PublishRequest,
    lambda f: pb.PublishRequest(
        queue=f.queue, value=f.value, key=f.key, headers=_headers_to(f.headers)
    ),
    lambda r: Publish(r.queue, r.value, _opt(r, "key"), _headers_from(r.headers)),
)
PUBLISHED_CODEC: FrameCodec[Published] = FrameCodec(
    pb.PublishReply,
    lambda f: pb.PublishReply(
        topic=f.bookmark.topic, partition=f.bookmark.partition, offset=f.bookmark.offset
    ),
    lambda r: Published(Bookmark(r.topic, r.partition, r.offset)),
)
STATS_CODEC: FrameCodec[Stats] = FrameCodec(
    pb.StatsRequest,
    lambda f: pb.StatsRequest(queue=f.queue),
    lambda r: Stats(_opt(r, "queue")),
)
STATS_REPLY_CODEC: FrameCodec[StatsReply] = FrameCodec(
    pb.StatsReply,
    lambda f: pb.StatsReply(
        queues=[_stats_to(s) for s in f.queues],
        missing=[
            pb.StatsMissing(member=m.member, address=m.address, reason=m.reason, queues=m.queues)
            for m in f.missing
        ],
    ),
    lambda r: StatsReply(
        [_stats_from(s) for s in r.queues],
        [StatsMissing(m.member, m.address, m.reason, list(m.queues)) for m in r.missing],
    ),
)
LIST_QUEUES_CODEC: FrameCodec[ListQueues] = FrameCodec(
    pb.ListQueuesRequest, lambda f: pb.ListQueuesRequest(), lambda r: ListQueues()
)
QUEUE_LIST_CODEC: FrameCodec[QueueList] = FrameCodec(
    pb.ListQueuesReply,
    lambda f: pb.ListQueuesReply(queues=[_info_to(q) for q in f.queues]),
    lambda r: QueueList([_info_from(q) for q in r.queues]),
)
BROWSE_CODEC: FrameCodec[Browse] = FrameCodec(
    pb.BrowseRequest,
    lambda f: pb.BrowseRequest(queue=f.queue, filter=f.filter, limit=f.limit),
    lambda r: Browse(r.queue, _opt(r, "filter"), _opt(r, "limit")),
)


def _browse_reply_to(f: BrowseReply) -> Any:
    out = pb.BrowseReply()
    _add_messages(out.messages, f.messages)
    return out


BROWSE_REPLY_CODEC: FrameCodec[BrowseReply] = FrameCodec(
    pb.BrowseReply, _browse_reply_to, lambda r: BrowseReply(_messages_from(r.messages))
)
ACK_WHERE_CODEC: FrameCodec[AckWhere] = FrameCodec(
    pb.AckWhereRequest,
    lambda f: pb.AckWhereRequest(queue=f.queue, filter=f.filter, expire=f.expire),
    lambda r: AckWhere(r.queue, r.filter, r.expire),
)
ACK_WHERE_REPLY_CODEC: FrameCodec[AckWhereReply] = FrameCodec(
    pb.AckWhereReply,
    lambda f: pb.AckWhereReply(acked=f.acked, skipped=f.skipped),
    lambda r: AckWhereReply(r.acked, r.skipped),
)
RELOAD_CODEC: FrameCodec[Reload] = FrameCodec(
    pb.ReloadRequest, lambda f: pb.ReloadRequest(), lambda r: Reload()
)
RELOAD_REPLY_CODEC: FrameCodec[ReloadReply] = FrameCodec(pb.ReloadReply, _reload_to, _reload_from)


def _definition_to(d: QueueDefinitionInfo) -> Any:
    return pb.QueueDefinition(
        name=d.name,
        options=d.options,
        origin=d.origin,
        changed_by=d.changed_by,
        changed_at_ms=d.changed_at_ms,
        temporary=d.temporary,
    )


def _definition_from(r: Any) -> QueueDefinitionInfo:
    return QueueDefinitionInfo(
        r.name, dict(r.options), r.origin, r.changed_by, r.changed_at_ms, r.temporary
    )


CREATE_QUEUE_CODEC: FrameCodec[CreateQueue] = FrameCodec(
    pb.CreateQueueRequest,
    lambda f: pb.CreateQueueRequest(options=f.options),
    lambda r: CreateQueue(dict(r.options)),
)
CREATE_TEMPORARY_QUEUE_CODEC: FrameCodec[CreateTemporaryQueue] = FrameCodec(
    pb.CreateTemporaryQueueRequest,
    lambda f: pb.CreateTemporaryQueueRequest(queue=f.queue, options=f.options),
    lambda r: CreateTemporaryQueue(r.queue, dict(r.options)),
)
ALTER_QUEUE_CODEC: FrameCodec[AlterQueue] = FrameCodec(
    pb.AlterQueueRequest,
    lambda f: pb.AlterQueueRequest(name=f.name, options=f.options),
    lambda r: AlterQueue(r.name, dict(r.options)),
)
DELETE_QUEUE_CODEC: FrameCodec[DeleteQueue] = FrameCodec(
    pb.DeleteQueueRequest,
    lambda f: pb.DeleteQueueRequest(name=f.name, force=f.force),
    lambda r: DeleteQueue(r.name, r.force),
)
DELETE_QUEUE_REPLY_CODEC: FrameCodec[DeleteQueueReply] = FrameCodec(
    pb.DeleteQueueReply, lambda f: pb.DeleteQueueReply(), lambda r: DeleteQueueReply()
)
DEFINITION_REPLY_CODEC: FrameCodec[DefinitionReply] = FrameCodec(
    pb.QueueDefinitionReply,
    lambda f: pb.QueueDefinitionReply(definition=_definition_to(f.definition)),
    lambda r: DefinitionReply(_definition_from(r.definition)),
)
LIST_DEFINITIONS_CODEC: FrameCodec[ListDefinitions] = FrameCodec(
    pb.ListDefinitionsRequest, lambda f: pb.ListDefinitionsRequest(), lambda r: ListDefinitions()
)
DEFINITION_LIST_CODEC: FrameCodec[DefinitionList] = FrameCodec(
    pb.ListDefinitionsReply,
    lambda f: pb.ListDefinitionsReply(definitions=[_definition_to(d) for d in f.definitions]),
    lambda r: DefinitionList([_definition_from(d) for d in r.definitions]),
)
CLUSTER_CODEC: FrameCodec[ClusterRequest] = FrameCodec(
    pb.ClusterRequest, lambda f: pb.ClusterRequest(), lambda r: ClusterRequest()
)
CLUSTER_REPLY_CODEC: FrameCodec[ClusterInfo] = FrameCodec(
    pb.ClusterReply,
    lambda f: pb.ClusterReply(
        cluster=f.cluster,
        member=f.member,
        members=[
            pb.ClusterMember(id=m.id, address=m.address, partitions=m.partitions, alive=m.alive)
            for m in f.members
        ],
        queues=[
            pb.QueueOwner(queue=q.queue, partition=q.partition, member=q.member, address=q.address)
            for q in f.queues
        ],
        standalone=f.standalone,
    ),
    lambda r: ClusterInfo(
        r.cluster,
        r.member,
        [ClusterMember(m.id, m.address, list(m.partitions), m.alive) for m in r.members],
        [QueueOwner(q.queue, q.partition, q.member, q.address) for q in r.queues],
        r.standalone,
    ),
)
REDRIVE_CODEC: FrameCodec[Redrive] = FrameCodec(
    pb.RedriveRequest,
    lambda f: pb.RedriveRequest(queue=f.queue, filter=f.filter, limit=f.limit),
    lambda r: Redrive(r.queue, _opt(r, "filter"), _opt(r, "limit")),
)
REDRIVE_REPLY_CODEC: FrameCodec[RedriveReply] = FrameCodec(
    pb.RedriveReply,
    lambda f: pb.RedriveReply(moved=f.moved, already=f.already, unmatched=f.unmatched),
    lambda r: RedriveReply(r.moved, r.already, r.unmatched),
)
DEAD_LETTERS_CODEC: FrameCodec[DeadLetters] = FrameCodec(
    pb.DeadLettersRequest,
    lambda f: pb.DeadLettersRequest(queue=f.queue, filter=f.filter, limit=f.limit),
    lambda r: DeadLetters(r.queue, _opt(r, "filter"), _opt(r, "limit")),
)


def _letter_to(d: DeadLetter) -> Any:
    return pb.DeadLetter(
        bookmark=d.bookmark,
        original=d.original,
        reason=d.reason,
        detail=d.detail,
        deliveries=d.deliveries,
        cancels=d.cancels,
        key=d.key,
        payload=d.payload,
        headers=_headers_to(d.headers),
        message_timestamp_ms=d.message_timestamp_ms,
        dead_lettered_at_ms=d.dead_lettered_at_ms,
        redriven=d.redriven,
    )


def _letter_from(r: Any) -> DeadLetter:
    return DeadLetter(
        bookmark=r.bookmark,
        original=r.original,
        reason=r.reason,
        detail=_opt(r, "detail"),
        deliveries=r.deliveries,
        cancels=r.cancels,
        key=_opt(r, "key"),
        payload=_opt(r, "payload"),
        headers=list(_headers_from(r.headers)),
        message_timestamp_ms=r.message_timestamp_ms,
        dead_lettered_at_ms=r.dead_lettered_at_ms,
        redriven=r.redriven,
    )


DEAD_LETTERS_REPLY_CODEC: FrameCodec[DeadLettersReply] = FrameCodec(
    pb.DeadLettersReply,
    lambda f: pb.DeadLettersReply(letters=[_letter_to(d) for d in f.letters]),
    lambda r: DeadLettersReply([_letter_from(d) for d in r.letters]),
)


REPLAY_CODEC: FrameCodec[Replay] = FrameCodec(
    pb.ReplayRequest,
    lambda f: pb.ReplayRequest(
        queue=f.queue,
        since_bookmarks=list(f.since_bookmarks),
        since_ms=f.since_ms,
        until_ms=f.until_ms,
        follow=f.follow,
        filter=f.filter,
    ),
    lambda r: Replay(
        r.queue,
        tuple(r.since_bookmarks),
        _opt(r, "since_ms"),
        _opt(r, "until_ms"),
        r.follow,
        _opt(r, "filter"),
    ),
)


def _replay_reply_to(f: ReplayReply) -> Any:
    out = pb.ReplayReply()
    _add_messages(out.messages, f.messages)
    return out


REPLAY_REPLY_CODEC: FrameCodec[ReplayReply] = FrameCodec(
    pb.ReplayReply, _replay_reply_to, lambda r: ReplayReply(_messages_from(r.messages))
)
