"""The API's wire format: Avro frames (schemas ``avro/api_*.avsc``) behind a version byte.

Each gRPC message is one frame: the byte ``FRAME_VERSION`` followed by the schemaless Avro
encoding of the frame's record. The ``*_CODEC`` objects' ``encode`` / ``decode`` plug straight
into gRPC's serializer hooks and convert between the wire records and the plain dataclasses below
(which reuse ``layer.api.service``'s types). ``decode`` raises ``SerializationError`` for anything
malformed: wrong version, truncated or trailing bytes, an unknown union branch or enum symbol, bad
UTF-8.

Schemaless data can only be read with the schema that wrote it, so any change to a frame's layout
bumps ``FRAME_VERSION``: a peer of another version is refused with a message naming both versions
instead of misreading the bytes. Version 2 added content filters (Subscribe, Replace, Browse,
AckWhere), barrier messages and the Error's request id; version 3 the queue of a message.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import fastavro

from layer import avro_fast
from layer.api.service import AckFailure, DeliveredMessage, QueueInfo, QueueStats
from layer.engine.model import AckError, AckOp, Bookmark
from layer.exceptions import SerializationError

__all__ = [
    "ACK_WHERE_CODEC",
    "ACK_WHERE_REPLY_CODEC",
    "BROWSE_CODEC",
    "BROWSE_REPLY_CODEC",
    "CLIENT_FRAME_CODEC",
    "FRAME_VERSION",
    "LIST_QUEUES_CODEC",
    "PUBLISHED_CODEC",
    "PUBLISH_CODEC",
    "QUEUE_LIST_CODEC",
    "SERVER_FRAME_CODEC",
    "STATS_CODEC",
    "STATS_REPLY_CODEC",
    "Ack",
    "AckResult",
    "AckWhere",
    "AckWhereReply",
    "REDRIVE_CODEC",
    "REDRIVE_REPLY_CODEC",
    "Redrive",
    "RedriveReply",
    "Browse",
    "BrowseReply",
    "ClientFrame",
    "Close",
    "Error",
    "FrameCodec",
    "ListQueues",
    "Messages",
    "Publish",
    "Published",
    "QueueList",
    "Replace",
    "Replaced",
    "ServerFrame",
    "Stats",
    "StatsReply",
    "Subscribe",
    "Subscribed",
]

FRAME_VERSION = 3
_VERSION_BYTE = bytes([FRAME_VERSION])
_SCHEMA_DIR = Path(__file__).resolve().parents[2] / "avro"
_NS = "qlayer.api."

Headers = list[tuple[str, bytes | None]]


# --- client -> server (subscription stream) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscribe:
    queue: str
    max_backlog: int
    client_name: str = ""
    filter: str | None = None  # a content filter expression


@dataclass(frozen=True, slots=True)
class Ack:
    request_id: int
    op: AckOp
    bookmarks: list[str]
    seconds: float = 0.0


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


ClientFrame = Subscribe | Ack | Close | Replace


# --- server -> client (subscription stream) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscribed:
    subscription_id: str
    backlog: int
    lease_period_s: float


@dataclass(frozen=True, slots=True)
class Messages:
    messages: list[DeliveredMessage]


@dataclass(frozen=True, slots=True)
class AckResult:
    request_id: int
    failures: list[AckFailure]


@dataclass(frozen=True, slots=True)
class Error:
    """A problem that does not end the stream; ``request_id`` names the ``Replace`` it
    refuses (None for a frame-level problem such as ``malformed_frame``)."""

    code: str
    message: str
    request_id: int | None = None


@dataclass(frozen=True, slots=True)
class Replaced:
    request_id: int
    backlog: int


ServerFrame = Subscribed | Messages | AckResult | Error | Replaced


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


# --- schemas ----------------------------------------------------------------------------------

# Every api_*.avsc shares one namespace; Header and Message are referenced by name from several
# of them, so they have files of their own, parsed first.
_NAMED: dict[str, Any] = {}


def _schema(name: str) -> Any:
    path = _SCHEMA_DIR / f"api_{name}.avsc"
    try:
        raw = json.loads(path.read_text())
        return fastavro.parse_schema(raw, named_schemas=_NAMED)
    except (OSError, ValueError, fastavro.schema.SchemaParseException) as exc:
        raise SerializationError(f"cannot load frame schema {path}: {exc}") from exc


_schema("header")
_schema("message")

T = TypeVar("T")


class FrameCodec(Generic[T]):
    """Encodes and decodes one frame type; ``encode``/``decode`` are gRPC serializer hooks."""

    def __init__(
        self,
        schema_name: str,
        to_record: Callable[[T], dict[str, Any]],
        from_record: Callable[[dict[str, Any]], T],
    ) -> None:
        self.name = schema_name
        self._schema = _schema(schema_name)
        self._to_record = to_record
        self._from_record = from_record

    def encode(self, frame: T) -> bytes:
        buffer = io.BytesIO()
        buffer.write(_VERSION_BYTE)
        try:
            fastavro.schemaless_writer(buffer, self._schema, self._to_record(frame))
        except Exception as exc:  # fastavro raises ValueError, TypeError, OverflowError...
            raise SerializationError(f"cannot encode {self.name} frame {frame!r}: {exc}") from exc
        return buffer.getvalue()

    def decode(self, data: bytes) -> T:
        if not data:
            raise SerializationError(f"malformed {self.name} frame: empty")
        if data[0] != FRAME_VERSION:
            raise SerializationError(
                f"malformed {self.name} frame: version {data[0]} (this build speaks "
                f"{FRAME_VERSION})"
            )
        buffer = io.BytesIO(data)
        buffer.seek(1)
        try:
            record = fastavro.schemaless_reader(buffer, self._schema, None, return_record_name=True)
            if not isinstance(record, dict):
                raise ValueError(f"decoded a {type(record).__name__}, not a record")
            frame = self._from_record(record)
        except Exception as exc:  # EOFError, IndexError, UnicodeDecodeError, ValueError...
            raise SerializationError(
                f"malformed {self.name} frame ({len(data)} bytes): {type(exc).__name__}: {exc}"
            ) from exc
        if buffer.tell() != len(data):
            raise SerializationError(
                f"malformed {self.name} frame: {len(data) - buffer.tell()} trailing bytes"
            )
        return frame


# --- conversions ------------------------------------------------------------------------------


def _headers_to(headers: Sequence[tuple[str, bytes | None]]) -> list[dict[str, Any]]:
    return [{"key": key, "value": value} for key, value in headers]


def _headers_from(records: Sequence[Mapping[str, Any]]) -> Headers:
    return [(r["key"], r["value"]) for r in records]


def _union(record: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name, body = record["body"]
    return name.removeprefix(_NS), body


def _client_to(frame: ClientFrame) -> dict[str, Any]:
    if isinstance(frame, Subscribe):
        body: dict[str, Any] = {
            "queue": frame.queue,
            "max_backlog": frame.max_backlog,
            "client_name": frame.client_name,
            "filter": frame.filter,
        }
    elif isinstance(frame, Ack):
        body = {
            "request_id": frame.request_id,
            "op": AckOp(frame.op).name,
            "bookmarks": list(frame.bookmarks),
            "seconds": float(frame.seconds),
        }
    elif isinstance(frame, Close):
        body = {}
    elif isinstance(frame, Replace):
        body = {
            "request_id": frame.request_id,
            "queue": frame.queue,
            "max_backlog": frame.max_backlog,
            "filter": frame.filter,
        }
    else:
        raise TypeError(f"not a client frame: {type(frame).__name__}")
    return {"body": (_NS + type(frame).__name__, body)}


def _client_from(record: dict[str, Any]) -> ClientFrame:
    name, body = _union(record)
    if name == "Subscribe":
        return Subscribe(body["queue"], body["max_backlog"], body["client_name"], body["filter"])
    if name == "Ack":
        return Ack(body["request_id"], AckOp[body["op"]], body["bookmarks"], body["seconds"])
    if name == "Close":
        return Close()
    if name == "Replace":
        return Replace(body["request_id"], body["queue"], body["max_backlog"], body["filter"])
    raise ValueError(f"unknown client frame {name!r}")


def _message_to(message: DeliveredMessage) -> dict[str, Any]:
    return {
        "topic": message.bookmark.topic,
        "partition": message.bookmark.partition,
        "offset": message.bookmark.offset,
        "key": message.key,
        "value": message.value,
        "headers": _headers_to(message.headers),
        "timestamp_ms": message.timestamp_ms,
        "deliveries": message.deliveries,
        "cancels": message.cancels,
        "lease_deadline_ms": message.lease_deadline_ms,
        "barrier": message.barrier,
        "queue": message.queue,
    }


def _message_from(r: Mapping[str, Any]) -> DeliveredMessage:
    return DeliveredMessage(
        bookmark=Bookmark(r["topic"], r["partition"], r["offset"]),
        key=r["key"],
        value=r["value"],
        headers=_headers_from(r["headers"]),
        timestamp_ms=r["timestamp_ms"],
        deliveries=r["deliveries"],
        cancels=r["cancels"],
        lease_deadline_ms=r["lease_deadline_ms"],
        barrier=r["barrier"],
        queue=r["queue"],
    )


def _ack_error(text: str) -> AckError | str:
    try:
        return AckError(text)
    except ValueError:
        return text


def _server_to(frame: ServerFrame) -> dict[str, Any]:
    if isinstance(frame, Subscribed):
        body: dict[str, Any] = {
            "subscription_id": frame.subscription_id,
            "backlog": frame.backlog,
            "lease_period_s": float(frame.lease_period_s),
        }
    elif isinstance(frame, Messages):
        body = {"messages": [_message_to(m) for m in frame.messages]}
    elif isinstance(frame, AckResult):
        body = {
            "request_id": frame.request_id,
            "failures": [
                {"bookmark": f.bookmark, "error": str(f.error), "message": f.message}
                for f in frame.failures
            ],
        }
    elif isinstance(frame, Error):
        body = {"code": frame.code, "message": frame.message, "request_id": frame.request_id}
    elif isinstance(frame, Replaced):
        body = {"request_id": frame.request_id, "backlog": frame.backlog}
    else:
        raise TypeError(f"not a server frame: {type(frame).__name__}")
    return {"body": (_NS + type(frame).__name__, body)}


def _server_from(record: dict[str, Any]) -> ServerFrame:
    name, body = _union(record)
    if name == "Subscribed":
        return Subscribed(body["subscription_id"], body["backlog"], body["lease_period_s"])
    if name == "Messages":
        return Messages([_message_from(m) for m in body["messages"]])
    if name == "AckResult":
        failures = [
            AckFailure(f["bookmark"], _ack_error(f["error"]), f["message"])
            for f in body["failures"]
        ]
        return AckResult(body["request_id"], failures)
    if name == "Error":
        return Error(body["code"], body["message"], body["request_id"])
    if name == "Replaced":
        return Replaced(body["request_id"], body["backlog"])
    raise ValueError(f"unknown server frame {name!r}")


def _publish_to(frame: Publish) -> dict[str, Any]:
    return {
        "queue": frame.queue,
        "value": frame.value,
        "key": frame.key,
        "headers": _headers_to(frame.headers),
    }


def _publish_from(r: dict[str, Any]) -> Publish:
    return Publish(r["queue"], r["value"], r["key"], _headers_from(r["headers"]))


def _published_to(frame: Published) -> dict[str, Any]:
    topic, partition, offset = frame.bookmark
    return {"topic": topic, "partition": partition, "offset": offset}


def _published_from(r: dict[str, Any]) -> Published:
    return Published(Bookmark(r["topic"], r["partition"], r["offset"]))


def _stats_to(s: QueueStats) -> dict[str, Any]:
    return {
        "queue": s.queue,
        "available": s.available,
        "leased": s.leased,
        "inactive": s.inactive,
        "subscriptions": s.subscriptions,
        "oldest_available_age_s": s.oldest_available_age_s,
        "delivered_total": s.delivered_total,
        "acked_total": s.acked_total,
        "dead_lettered_total": s.dead_lettered_total,
        "extra": {k: float(v) for k, v in s.extra.items()},
    }


def _stats_from(r: Mapping[str, Any]) -> QueueStats:
    return QueueStats(
        queue=r["queue"],
        available=r["available"],
        leased=r["leased"],
        inactive=r["inactive"],
        subscriptions=r["subscriptions"],
        oldest_available_age_s=r["oldest_available_age_s"],
        delivered_total=r["delivered_total"],
        acked_total=r["acked_total"],
        dead_lettered_total=r["dead_lettered_total"],
        extra=dict(r["extra"]),
    )


def _info_to(q: QueueInfo) -> dict[str, Any]:
    return {
        "name": q.name,
        "underlying_topic": q.underlying_topic,
        "semantics": q.semantics,
        "message_type": q.message_type,
        "lease_period_s": float(q.lease_period_s),
        "max_per_subscription_backlog": q.max_per_subscription_backlog,
        "dead_letter_topic": q.dead_letter_topic,
        "default_publish_target": q.default_publish_target,
    }


def _info_from(r: Mapping[str, Any]) -> QueueInfo:
    return QueueInfo(
        name=r["name"],
        underlying_topic=r["underlying_topic"],
        semantics=r["semantics"],
        message_type=r["message_type"],
        lease_period_s=r["lease_period_s"],
        max_per_subscription_backlog=r["max_per_subscription_backlog"],
        dead_letter_topic=r["dead_letter_topic"],
        default_publish_target=r["default_publish_target"],
    )


CLIENT_FRAME_CODEC: FrameCodec[ClientFrame] = FrameCodec("client_frame", _client_to, _client_from)


class _ServerFrameCodec(FrameCodec[ServerFrame]):
    """Messages frames, one per delivery batch, take the hand-written encoder (the same bytes;
    fastavro's writer cost as much as the rest of a delivery)."""

    def encode(self, frame: ServerFrame) -> bytes:
        if isinstance(frame, Messages):
            try:
                return avro_fast.api_messages_frame(FRAME_VERSION, frame.messages)
            except (TypeError, ValueError, AttributeError, UnicodeEncodeError) as exc:
                raise SerializationError(f"cannot encode {self.name} frame: {exc!r}") from exc
        return super().encode(frame)


SERVER_FRAME_CODEC: FrameCodec[ServerFrame] = _ServerFrameCodec(
    "server_frame", _server_to, _server_from
)
PUBLISH_CODEC: FrameCodec[Publish] = FrameCodec("publish", _publish_to, _publish_from)
PUBLISHED_CODEC: FrameCodec[Published] = FrameCodec("published", _published_to, _published_from)
STATS_CODEC: FrameCodec[Stats] = FrameCodec(
    "stats", lambda f: {"queue": f.queue}, lambda r: Stats(r["queue"])
)
STATS_REPLY_CODEC: FrameCodec[StatsReply] = FrameCodec(
    "stats_reply",
    lambda f: {"queues": [_stats_to(s) for s in f.queues]},
    lambda r: StatsReply([_stats_from(s) for s in r["queues"]]),
)
LIST_QUEUES_CODEC: FrameCodec[ListQueues] = FrameCodec(
    "list_queues", lambda f: {}, lambda r: ListQueues()
)
QUEUE_LIST_CODEC: FrameCodec[QueueList] = FrameCodec(
    "queue_list",
    lambda f: {"queues": [_info_to(q) for q in f.queues]},
    lambda r: QueueList([_info_from(q) for q in r["queues"]]),
)
BROWSE_CODEC: FrameCodec[Browse] = FrameCodec(
    "browse",
    lambda f: {"queue": f.queue, "filter": f.filter, "limit": f.limit},
    lambda r: Browse(r["queue"], r["filter"], r["limit"]),
)
BROWSE_REPLY_CODEC: FrameCodec[BrowseReply] = FrameCodec(
    "browse_reply",
    lambda f: {"messages": [_message_to(m) for m in f.messages]},
    lambda r: BrowseReply([_message_from(m) for m in r["messages"]]),
)
ACK_WHERE_CODEC: FrameCodec[AckWhere] = FrameCodec(
    "ack_where",
    lambda f: {"queue": f.queue, "filter": f.filter, "expire": f.expire},
    lambda r: AckWhere(r["queue"], r["filter"], r["expire"]),
)
ACK_WHERE_REPLY_CODEC: FrameCodec[AckWhereReply] = FrameCodec(
    "ack_where_reply",
    lambda f: {"acked": f.acked, "skipped": f.skipped},
    lambda r: AckWhereReply(r["acked"], r["skipped"]),
)
REDRIVE_CODEC: FrameCodec[Redrive] = FrameCodec(
    "redrive",
    lambda f: {"queue": f.queue, "filter": f.filter, "limit": f.limit},
    lambda r: Redrive(r["queue"], r["filter"], r["limit"]),
)
REDRIVE_REPLY_CODEC: FrameCodec[RedriveReply] = FrameCodec(
    "redrive_reply",
    lambda f: {"moved": f.moved, "already": f.already, "unmatched": f.unmatched},
    lambda r: RedriveReply(r["moved"], r["already"], r["unmatched"]),
)
