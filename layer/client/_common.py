"""What the blocking and the asyncio client share: channel settings, error mapping, the message
types, request building and the ack batcher (pure bookkeeping, no I/O, no locking: each client
adds its own)."""

from __future__ import annotations

import enum
import json
import math
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

import grpc

from layer.api.errors import ErrorCode, error_of
from layer.api.frames import (
    ACK_WHERE_CODEC,
    ACK_WHERE_REPLY_CODEC,
    ALTER_QUEUE_CODEC,
    BROWSE_CODEC,
    BROWSE_REPLY_CODEC,
    CLIENT_FRAME_CODEC,
    CLUSTER_CODEC,
    CLUSTER_REPLY_CODEC,
    CREATE_QUEUE_CODEC,
    CREATE_TEMPORARY_QUEUE_CODEC,
    DEAD_LETTERS_CODEC,
    DEAD_LETTERS_REPLY_CODEC,
    DEFINITION_LIST_CODEC,
    DEFINITION_REPLY_CODEC,
    DELETE_QUEUE_CODEC,
    DELETE_QUEUE_REPLY_CODEC,
    LIST_DEFINITIONS_CODEC,
    LIST_QUEUES_CODEC,
    PUBLISH_CODEC,
    PUBLISHED_CODEC,
    QUEUE_LIST_CODEC,
    REDRIVE_CODEC,
    REDRIVE_REPLY_CODEC,
    RELOAD_CODEC,
    RELOAD_REPLY_CODEC,
    REPLAY_CODEC,
    REPLAY_REPLY_CODEC,
    SERVICE_NAME,
    STATS_CODEC,
    STATS_REPLY_CODEC,
    Ack,
    AckResult,
    Error,
    Publish,
    Replace,
    Replay,
)
from layer.api.service import AckFailure, DeliveredMessage
from layer.engine.model import AckOp, Bookmark
from layer.exceptions import ConnectFailed, InvalidRequest, QLayerError

SERVICE = f"/{SERVICE_NAME}/"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
ACK_BATCH_SIZE = 256  # an ack batch this large is sent at once
ACK_FLUSH_INTERVAL_S = 0.005  # pending acks are sent at the latest this long after the first
# The most operations one Ack frame carries (a batch queued while reconnecting can grow past
# ACK_BATCH_SIZE); well under the MAX_ACK_OFFSETS a server takes in one frame.
ACK_FRAME_MAX = 10_000

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Ping every 10 s, give up after 5 s without an answer: a dead server or cut network fails
    # the subscription within seconds instead of leaving the consumer waiting forever.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.ping_timeout_ms", 5_000),  # what grpc 1.85 times pings out by
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]

Headers = list[tuple[str, bytes | None]]

DELIVER_AFTER_HEADER = "deliver_after"
_INT32_MAX = 2**31 - 1


class Keep(enum.Enum):
    """The type of ``KEEP``: "leave this setting as it is" where None means something else."""

    KEEP = "keep"


KEEP = Keep.KEEP


def default_client_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


TLS_HINT = (
    " (over TLS: a coordinator with tls_client_ca refuses a client certificate that is"
    " missing, expired or not signed by that CA, and its log says which)"
)


def with_tls_hint(error: QLayerError, tls: bool) -> QLayerError:
    """A failed connect over TLS may be the coordinator refusing the client's certificate:
    gRPC tells the client only that the socket closed, so say what to check."""
    if tls and isinstance(error, ConnectFailed) and TLS_HINT not in str(error):
        return ConnectFailed(f"{error}{TLS_HINT}")
    return error


def tls_credentials(
    root_cert: bytes | None, client_cert: tuple[bytes, bytes] | None
) -> grpc.ChannelCredentials:
    """TLS to the coordinator: ``root_cert`` verifies it (None: the system's roots);
    ``client_cert`` (certificate chain, private key) is presented for mutual TLS."""
    if client_cert is None:
        return grpc.ssl_channel_credentials(root_certificates=root_cert)
    chain, key = client_cert
    return grpc.ssl_channel_credentials(
        root_certificates=root_cert, private_key=key, certificate_chain=chain
    )


def replace_error(frame: Error) -> QLayerError:
    """The qlayer exception for an Error frame refusing a Replace; it carries the server's text
    (for a bad filter: the expression, what is wrong and the column)."""
    return error_of(frame.code, frame.message)


def cancel_seconds(delay: float | None) -> float:
    """The Ack frame's ``seconds`` for a cancel: the redelivery delay, 0 for none."""
    if delay is None:
        return 0.0
    if not (math.isfinite(delay) and delay >= 0):
        raise ValueError(f"cancel delay must be a finite number of seconds >= 0, got {delay}")
    return float(delay)


def check_limit(limit: int | None) -> None:
    if limit is not None and not 0 <= limit <= _INT32_MAX:
        raise ValueError(f"limit must be between 0 and {_INT32_MAX}, got {limit}")


def replace_request(
    request_id: int,
    current: tuple[str, int, str | None],
    queue: str | None,
    filter: str | None | Keep,
    max_backlog: int | None,
) -> Replace:
    """The Replace frame for a new spec; ``current`` is (queue, max_backlog, filter) and fills in
    what the caller left out. Encoded once here, so a bad argument fails this call instead of
    the stream (where the frame is written)."""
    old_queue, old_backlog, old_filter = current
    frame = Replace(
        request_id=request_id,
        queue=old_queue if queue is None else queue,
        max_backlog=old_backlog if max_backlog is None else max_backlog,
        filter=old_filter if filter is KEEP else filter,
    )
    CLIENT_FRAME_CODEC.encode(frame)
    return frame


def lease_error(failure: AckFailure) -> QLayerError:
    """The exception for one refused operation (a ``LeaseError`` mostly; ``InvalidRequest``
    for a malformed bookmark or bad seconds)."""
    return error_of(failure.error, f"{failure.bookmark}: {failure.message}")


def _deliver_after(deliver_after: float | None, delay: float | None) -> float | None:
    if deliver_after is not None and delay is not None:
        raise ValueError("give deliver_after (a UNIX time) or delay (seconds from now), not both")
    if delay is not None:
        if not (math.isfinite(delay) and delay >= 0):
            raise ValueError(f"delay must be a finite number of seconds >= 0, got {delay}")
        return time.time() + delay
    if deliver_after is not None and not math.isfinite(deliver_after):
        raise ValueError(f"deliver_after must be a finite UNIX time, got {deliver_after}")
    return deliver_after


def publish_request(
    queue: str,
    data: bytes | str | Mapping[str, Any],
    key: bytes | str | None,
    headers: Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None,
    deliver_after: float | None = None,
    delay: float | None = None,
) -> Publish:
    if isinstance(data, bytes):
        value = data
    elif isinstance(data, str):
        value = data.encode()
    elif isinstance(data, Mapping):
        value = json.dumps(data, separators=(",", ":")).encode()
    else:
        raise InvalidRequest(f"cannot publish {type(data).__name__}: use bytes, str or dict")
    items = headers.items() if isinstance(headers, Mapping) else headers or ()
    encoded = [(k, v.encode() if isinstance(v, str) else v) for k, v in items]
    when = _deliver_after(deliver_after, delay)
    if when is not None:
        if any(k == DELIVER_AFTER_HEADER for k, _ in encoded):
            raise ValueError(
                f"a {DELIVER_AFTER_HEADER!r} header and a deliver_after/delay argument: give one"
            )
        encoded.append((DELIVER_AFTER_HEADER, f"{when:.3f}".encode("ascii")))
    return Publish(
        queue=queue,
        value=value,
        key=key.encode() if isinstance(key, str) else key,
        headers=encoded,
    )


class MessageBase:
    """A delivered message. ``bookmark`` (``topic/partition/offset``) is its identity;
    ``data`` is the payload (``b""`` for a null value); ``lease_deadline`` is wall-clock epoch
    seconds (None for at-most-once queues and barriers). ``barrier`` marks a barrier message:
    sent to every subscription whose filter matches, never leased, so it needs no ack.
    ``queue`` is the queue it came from (a subscription to a regex spans several).
    ``parse_error`` is set when the payload did not parse as the queue's ``message_type``
    (a queue with ``on_unparseable = "deliver"``): the parser's error; None otherwise."""

    # The delivered message itself, its fields read when asked for: a consumer that reads
    # the payload and acks needs two of them, not fourteen copied per message received.
    __slots__ = ("_d", "_id")

    def __init__(self, delivered: DeliveredMessage) -> None:
        # (the clients' Message and AsyncMessage set these two themselves: keep them alike)
        self._d = delivered
        self._id = delivered.bookmark  # what an ack sends: no bookmark text to parse again

    @property
    def topic(self) -> str:
        return self._id.topic

    @property
    def partition(self) -> int:
        return self._id.partition

    @property
    def offset(self) -> int:
        return self._id.offset

    @property
    def key(self) -> bytes | None:
        return self._d.key

    @property
    def data(self) -> bytes:
        return self._d.value or b""

    @property
    def headers(self) -> Headers:
        return self._d.headers

    @property
    def timestamp(self) -> float:
        """The Kafka record's timestamp, epoch seconds."""
        return self._d.timestamp_ms / 1000.0

    @property
    def deliveries(self) -> int:
        return self._d.deliveries

    @property
    def cancels(self) -> int:
        return self._d.cancels

    @property
    def lease_deadline(self) -> float | None:
        deadline = self._d.lease_deadline_ms
        return deadline / 1000.0 if deadline is not None else None

    @property
    def barrier(self) -> bool:
        return self._d.barrier

    @property
    def queue(self) -> str:
        return self._d.queue

    @property
    def parse_error(self) -> str | None:
        return self._d.parse_error

    @property
    def bookmark(self) -> str:
        """``topic/partition/offset``: made when asked for, not for every message received."""
        return f"{self.topic}/{self.partition}/{self.offset}"

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return json.loads(self.data)

    def header(self, key: str) -> bytes | None:
        """The last value of header ``key`` (None if absent or valueless)."""
        for k, v in reversed(self.headers):
            if k == key:
                return v
        return None

    def __repr__(self) -> str:
        barrier = ", barrier=True" if self.barrier else ""
        error = f", parse_error={self.parse_error!r}" if self.parse_error else ""
        return (
            f"{type(self).__name__}(bookmark={self.bookmark!r}, deliveries={self.deliveries}, "
            f"data={self.data[:40]!r}{barrier}{error})"
        )


@dataclass(frozen=True, slots=True)
class BrowsedMessage:
    """A message listed by ``browse``: available in the queue, not leased to anyone (browsing
    leases nothing). ``bookmark`` is ``topic/partition/offset``; ``deliveries`` and ``cancels``
    are the counts so far; ``barrier`` marks a barrier message; ``parse_error`` is set when
    the payload did not parse (a queue with ``on_unparseable = "deliver"``)."""

    bookmark: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int
    deliveries: int
    cancels: int
    barrier: bool = False
    parse_error: str | None = None

    @classmethod
    def of(cls, delivered: DeliveredMessage) -> BrowsedMessage:
        return cls(
            bookmark=str(delivered.bookmark),
            key=delivered.key,
            value=delivered.value,
            headers=tuple(delivered.headers),
            timestamp_ms=delivered.timestamp_ms,
            deliveries=delivered.deliveries,
            cancels=delivered.cancels,
            barrier=delivered.barrier,
            parse_error=delivered.parse_error,
        )

    def json(self) -> Any:
        """The value parsed as JSON."""
        return json.loads(self.value or b"")

    def header(self, key: str) -> bytes | None:
        """The last value of header ``key`` (None if absent or valueless)."""
        for k, v in reversed(self.headers):
            if k == key:
                return v
        return None


W = TypeVar("W")


def parse_bookmark(text: str) -> Bookmark | AckFailure:
    """``topic/partition/offset`` as a Bookmark, or the refusal a server would give it (the
    wire carries offsets, so a bookmark that does not parse is refused here, not sent)."""
    try:
        return Bookmark.parse(text)
    except ValueError as exc:
        return AckFailure(text, ErrorCode.MALFORMED_BOOKMARK, f"malformed bookmark: {exc}")


@dataclass(slots=True)
class _Batch(Generic[W]):
    op: AckOp
    seconds: float
    bookmarks: list[Bookmark] = field(default_factory=list)
    waiters: list[W | None] = field(default_factory=list)


@dataclass(slots=True)
class Resolution(Generic[W]):
    """The outcome of one AckResult."""

    done: list[tuple[W, AckFailure | None]]  # waiters to complete
    unwaited_failures: list[AckFailure]  # refusals nobody waits for
    acked: int  # bookmarks confirmed by an ACK op


class AckBatcher(Generic[W]):
    """Pending and in-flight ack batches of one subscription.

    Consecutive operations with the same op (and seconds) share a batch, so ordering across ops
    is kept: ``ack a, cancel b, ack c`` makes three batches, sent in that order. A batch goes
    as one Ack frame of offset runs per partition (``Ack.of``); a message named twice in a
    batch is operated on once, and both callers get its outcome.
    """

    def __init__(self) -> None:
        self._pending: list[_Batch[W]] = []
        self._pending_count = 0
        self._first_pending_at = 0.0
        self._in_flight: dict[int, _Batch[W]] = {}
        self._next_id = 1

    @property
    def pending(self) -> int:
        return self._pending_count

    @property
    def first_pending_at(self) -> float:
        """``time.monotonic()`` when the oldest pending operation was added."""
        return self._first_pending_at

    @property
    def in_flight(self) -> int:
        """Batches sent and not answered yet."""
        return len(self._in_flight)

    @property
    def last_request_id(self) -> int:
        return self._next_id - 1

    def in_flight_through(self, request_id: int) -> bool:
        """Is any batch up to ``request_id`` still unanswered?"""
        return any(rid <= request_id for rid in self._in_flight)

    def add(self, op: AckOp, bookmark: Bookmark, seconds: float, waiter: W | None) -> int:
        """Queue one operation; returns the size of the batch it joined."""
        pending = self._pending
        if pending:
            last = pending[-1]
            bookmarks = last.bookmarks
            if last.op is op and last.seconds == seconds and len(bookmarks) < ACK_FRAME_MAX:
                # the usual case (an ack after an ack): join the last batch
                bookmarks.append(bookmark)
                last.waiters.append(waiter)
                self._pending_count += 1
                return len(bookmarks)
        else:
            self._first_pending_at = time.monotonic()
        last = _Batch(op, seconds, [bookmark], [waiter])
        pending.append(last)
        self._pending_count += 1
        return 1

    def take(self) -> list[Ack]:
        """The pending batches as frames to send now (they become in flight)."""
        frames: list[Ack] = []
        for batch in self._pending:
            request_id = self._next_id
            self._next_id += 1
            self._in_flight[request_id] = batch
            frames.append(Ack.of(request_id, batch.op, batch.bookmarks, batch.seconds))
        self._pending = []
        self._pending_count = 0
        return frames

    def resolve(self, result: AckResult) -> Resolution[W]:
        batch = self._in_flight.pop(result.request_id, None)
        if batch is None:
            return Resolution([], list(result.failures), 0)
        if not result.failures:  # the usual answer: everything accepted
            acked = len(batch.bookmarks) if batch.op == AckOp.ACK else 0
            return Resolution([(w, None) for w in batch.waiters if w is not None], [], acked)
        refused = {f.bookmark: f for f in result.failures}
        done: list[tuple[W, AckFailure | None]] = []
        unwaited: list[AckFailure] = []
        acked = 0
        for bookmark, waiter in zip(batch.bookmarks, batch.waiters, strict=True):
            failure = refused.get(str(bookmark))
            if failure is None and batch.op == AckOp.ACK:
                acked += 1
            if waiter is not None:
                done.append((waiter, failure))
            elif failure is not None:
                unwaited.append(failure)
        return Resolution(done, unwaited, acked)

    def abandon(self) -> tuple[list[W], int]:
        """The stream ended: forget everything; returns the waiters to fail and how many
        operations nobody waited for."""
        batches = [*self._pending, *self._in_flight.values()]
        self._pending, self._pending_count, self._in_flight = [], 0, {}
        waiters = [w for b in batches for w in b.waiters if w is not None]
        unwaited = sum(1 for b in batches for w in b.waiters if w is None)
        return waiters, unwaited


# The unary methods of the service: name -> (request codec, reply codec).
UNARY_METHODS: dict[str, tuple[Any, Any]] = {
    "Publish": (PUBLISH_CODEC, PUBLISHED_CODEC),
    "Stats": (STATS_CODEC, STATS_REPLY_CODEC),
    "ListQueues": (LIST_QUEUES_CODEC, QUEUE_LIST_CODEC),
    "Browse": (BROWSE_CODEC, BROWSE_REPLY_CODEC),
    "AckWhere": (ACK_WHERE_CODEC, ACK_WHERE_REPLY_CODEC),
    "Redrive": (REDRIVE_CODEC, REDRIVE_REPLY_CODEC),
    "DeadLetters": (DEAD_LETTERS_CODEC, DEAD_LETTERS_REPLY_CODEC),
    "Reload": (RELOAD_CODEC, RELOAD_REPLY_CODEC),
    "CreateQueue": (CREATE_QUEUE_CODEC, DEFINITION_REPLY_CODEC),
    "AlterQueue": (ALTER_QUEUE_CODEC, DEFINITION_REPLY_CODEC),
    "DeleteQueue": (DELETE_QUEUE_CODEC, DELETE_QUEUE_REPLY_CODEC),
    "ListDefinitions": (LIST_DEFINITIONS_CODEC, DEFINITION_LIST_CODEC),
    "CreateTemporaryQueue": (CREATE_TEMPORARY_QUEUE_CODEC, DEFINITION_REPLY_CODEC),
    "Cluster": (CLUSTER_CODEC, CLUSTER_REPLY_CODEC),
}
SUBSCRIBE_METHOD = SERVICE + "Subscribe"
REPLAY_METHOD = SERVICE + "Replay"
REPLAY_CODECS = (REPLAY_CODEC, REPLAY_REPLY_CODEC)

Since = str | Sequence[str] | datetime | float | None


def _epoch_ms(what: str, when: datetime | float) -> int:
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise InvalidRequest(f"replay {what}: a datetime needs a timezone, got {when!r}")
        return int(when.timestamp() * 1000)
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        raise InvalidRequest(f"replay {what}: epoch seconds or a datetime, got {when!r}")
    return int(when * 1000)


def replay_request(
    queue: str,
    since: Since,
    until: datetime | float | None,
    follow: bool,
    filter: str | None,
) -> Replay:
    """The Replay request: ``since`` is a bookmark (``topic/partition/offset``, replayed after
    it), several (one per partition), a time (an aware ``datetime`` or epoch seconds), or None
    (from the beginning); ``until`` a time."""
    bookmarks: tuple[str, ...] = ()
    since_ms = None
    if isinstance(since, str):
        bookmarks = (since,)
    elif isinstance(since, (datetime, int, float)):
        since_ms = _epoch_ms("since", since)
    elif since is not None:
        bookmarks = tuple(since)
        if not all(isinstance(b, str) for b in bookmarks):
            raise InvalidRequest(f"replay since: bookmarks are strings, got {since!r}")
    until_ms = None if until is None else _epoch_ms("until", until)
    return Replay(queue, bookmarks, since_ms, until_ms, follow, filter)
