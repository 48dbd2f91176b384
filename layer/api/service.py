"""What the API server needs from the coordinator: the seam between transport and queue logic.

The gRPC server (``layer.api.server``) decodes frames and calls a ``QueueService``; the
coordinator implements it. Everything runs on one asyncio loop.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from layer.api.errors import ErrorCode
from layer.engine.model import AckOp, Bookmark
from layer.exceptions import QLayerError


def bytes_json(data: bytes | None) -> str | dict[str, str] | None:
    """Bytes (a key, a payload, a header value) as JSON shows them: UTF-8 text when they are,
    else ``{"base64": ...}``; None as null. The CLI's JSON lines and the console use it."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


# Built per message: not frozen (a frozen __init__ costs ~6x), and never mutated.
@dataclass(slots=True, unsafe_hash=True)
class DeliveredMessage:
    """A message handed to a subscription."""

    bookmark: Bookmark
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int
    deliveries: int
    cancels: int
    lease_deadline_ms: int | None  # wall-clock epoch ms; None for at-most-once, barriers, browse
    barrier: bool = False  # a barrier message: sent to every matching subscription, never acked
    queue: str = ""  # the queue it came from (a subscription to a regex spans several)
    parse_error: str | None = None  # the payload did not parse (on_unparseable = "deliver")


@dataclass(frozen=True, slots=True)
class OffsetRuns:
    """Offsets of one partition as inclusive runs: ``runs`` is ``[first, last, first, last...]``."""

    topic: str
    partition: int
    runs: list[int]

    def offsets(self) -> Iterable[int]:
        runs = self.runs
        for i in range(0, len(runs), 2):
            yield from range(runs[i], runs[i + 1] + 1)

    def count(self) -> int:
        runs = self.runs
        return sum(runs[i + 1] - runs[i] + 1 for i in range(0, len(runs), 2))

    def bookmarks(self) -> list[str]:
        """Every offset named, as ``topic/partition/offset``."""
        prefix = f"{self.topic}/{self.partition}/"
        return [prefix + str(offset) for offset in self.offsets()]


@dataclass(frozen=True, slots=True)
class AckFailure:
    """One operation of an ack batch that was refused; ``error`` says why."""

    bookmark: str  # as sent by the client (it may not even parse)
    error: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class RedriveResult:
    """What a redrive did: ``moved`` dead letters were published into the queue again;
    ``already`` had been redriven before (never twice); ``unmatched`` did not match the filter."""

    moved: int
    already: int
    unmatched: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead letter of a queue, decoded from its envelope (``avro/dead_letter.avsc``)."""

    bookmark: str  # where the letter is: dead-letter topic/partition/offset
    original: str  # the message's bookmark when it was dead-lettered
    reason: str
    detail: str | None
    deliveries: int
    cancels: int
    key: bytes | None
    payload: bytes | None
    headers: list[tuple[str, bytes | None]]
    message_timestamp_ms: int
    dead_lettered_at_ms: int
    redriven: bool  # moved back into the queue by a redrive


@dataclass(frozen=True, slots=True)
class AckWhereResult:
    """What an ack by filter did: ``acked`` messages finished; ``skipped`` matched but were
    leased to someone else under strict leasing (or are not deliverable now)."""

    acked: int
    skipped: int


@dataclass(frozen=True, slots=True)
class ClusterMember:
    """A member of a cluster: its id, API address and the control partitions it owns;
    ``alive``: it answered a health check of the member that answered (itself: True)."""

    id: str
    address: str
    partitions: list[int] = field(default_factory=list)
    alive: bool = True


@dataclass(frozen=True, slots=True)
class QueueOwner:
    """Which member serves a queue (``member`` empty: none right now, it is moving)."""

    queue: str
    partition: int
    member: str = ""
    address: str = ""


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """The metadata call's answer (``layer.coordinator.membership``)."""

    cluster: str
    member: str
    members: list[ClusterMember]
    queues: list[QueueOwner]
    # a coordinator not in a cluster: ``cluster`` is its id, ``members`` itself alone
    standalone: bool = False


@dataclass(frozen=True, slots=True)
class QueueDefinitionInfo:
    """A queue's definition as the cluster's definitions topic holds it: its ``[[queue]]``
    table (option -> value as TOML writes it) and who wrote it last."""

    name: str
    options: dict[str, str]
    origin: str = "api"  # or "file:<coordinator id>"
    changed_by: str = ""
    changed_at_ms: int = 0
    temporary: bool = False


@dataclass(frozen=True, slots=True)
class ReloadChange:
    """One option of a queue the reload changes (values shown as written in TOML)."""

    queue: str
    option: str
    old: str
    new: str

    def __str__(self) -> str:
        return f"queue {self.queue!r}: {self.option} {self.old} -> {self.new}"


@dataclass(frozen=True, slots=True)
class ReloadRefusal:
    """An option that cannot change while the coordinator runs; ``where`` is ``queue 'x'`` or a
    section such as ``[coordinator]``."""

    where: str
    option: str
    old: str
    new: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: option {self.option!r} ({self.old} -> {self.new}): {self.reason}"


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What a reload of the config file did. It is all or nothing: ``applied`` is False when
    anything was refused, and then nothing changed (``added``, ``removed`` and ``changed`` say
    what would have)."""

    source: str
    applied: bool
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[ReloadChange] = field(default_factory=list)
    refused: list[ReloadRefusal] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The summary people read: the CLI prints it, SIGHUP logs it."""
        if self.refused:
            n = len(self.refused)
            head = (
                f"reload of {self.source} refused, nothing changed: {n} option"
                f"{'s' if n != 1 else ''} cannot change while the coordinator runs"
                " (restart it to apply them)"
            )
            return [head, *(f"  refused {r}" for r in self.refused)]
        if not (self.added or self.removed or self.changed):
            return [f"reloaded {self.source}: no changes"]
        head = (
            f"reloaded {self.source}: added {len(self.added)}, removed {len(self.removed)},"
            f" changed {len(self.changed)}"
        )
        return [
            head,
            *(f"  added queue {name!r}" for name in self.added),
            *(
                f"  removed queue {name!r} (subscriptions ended; its state is kept)"
                for name in self.removed
            ),
            *(f"  changed {change}" for change in self.changed),
        ]


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    available: int
    leased: int
    inactive: int
    subscriptions: int
    oldest_available_age_s: float | None
    delivered_total: int
    acked_total: int
    dead_lettered_total: int
    # more figures by name: counts are ints (``*_total`` counters survive restarts), measures
    # (``*_s``, ``*_ms``) floats
    extra: dict[str, float | int] = field(default_factory=dict)
    # in a cluster: the member serving the queue, whose figures these are ("" alone)
    owner: str = ""


@dataclass(frozen=True, slots=True)
class StatsMissing:
    """Queues of the cluster whose stats could not be had: their owner (``member`` at
    ``address``) did not answer, or refused (``reason``); ``member`` empty: no owner now."""

    member: str
    address: str
    reason: str
    queues: list[str]


@dataclass(frozen=True, slots=True)
class ClusterStats:
    """Stats of every queue of the cluster (each from its owner), and those missing."""

    queues: list[QueueStats]
    missing: list[StatsMissing] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    underlying_topic: str
    semantics: str
    message_type: str
    lease_period_s: float
    max_per_subscription_backlog: int
    dead_letter_topic: str | None
    default_publish_target: str | None


class DeliverySink(Protocol):
    """Where the coordinator pushes a subscription's messages. Never blocks."""

    def deliver(self, messages: Sequence[DeliveredMessage]) -> None: ...

    @property
    def unsent(self) -> int:
        """Messages given to ``deliver`` and not yet written to the transport. A subscription
        whose sink holds its backlog's worth gets no more until it drains (a client that
        stopped reading must not take messages it cannot receive, nor grow memory)."""
        ...

    def close(self, reason: str, error: QLayerError | None = None) -> None:
        """The coordinator ends the subscription (shutdown; with ``error``, e.g. its queue was
        removed, the stream fails with that error instead); the stream should finish."""
        ...


class Subscription(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def backlog(self) -> int:
        """The effective max backlog (capped by the queue)."""
        ...

    @property
    def lease_period_s(self) -> float: ...

    async def ack(
        self, op: AckOp, offsets: Sequence[OffsetRuns], seconds: float = 0.0
    ) -> list[AckFailure]:
        """Apply ``op`` to the messages named by runs of offsets per partition (as the wire
        carries them: no object per message on the way in). Returns only when every accepted
        change is durable (at-least-once acks answered only after their done record is in the
        changelog).
        The returned list holds the refused bookmarks; empty means all accepted."""
        ...

    async def replace(self, queue: str, max_backlog: int, filter: str | None) -> int:
        """Replace the subscription atomically (queue, content filter, backlog); its leases stay.
        Returns the new effective backlog. Raises like ``subscribe``."""
        ...

    async def close(self) -> None:
        """The client went away: return all its leases at once. Idempotent."""
        ...


class QueueService(Protocol):
    async def subscribe(
        self,
        queue: str,
        max_backlog: int,
        sink: DeliverySink,
        client: str = "",
        filter: str | None = None,
    ) -> Subscription:
        """Raises ``UnknownQueue`` for an unknown queue, ``InvalidRequest`` for a bad backlog,
        ``ExpressionError`` (an ``InvalidRequest``) for a bad filter."""
        ...

    async def browse(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> list[DeliveredMessage]:
        """The queue's available messages in delivery order (read-only: nothing is leased);
        ``lease_deadline_ms`` is None, ``deliveries``/``cancels`` are the counts so far."""
        ...

    async def ack_where(self, queue: str, filter: str, expire: bool = False) -> AckWhereResult:
        """Ack (or, with ``expire``, expire) every deliverable message matching ``filter`` on
        behalf of no subscription; durable when it returns."""
        ...

    async def redrive(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> RedriveResult:
        """Publish the queue's dead letters (matching ``filter``, at most ``limit``) into it
        again, each at most once ever; durable when it returns."""
        ...

    async def dead_letters(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        """The queue's dead letters (matching ``filter`` on the payload, at most ``limit``), in
        the order they were dead-lettered; ``InvalidRequest`` when it has no dead-letter topic."""
        ...

    async def publish(
        self,
        queue: str,
        value: bytes,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> Bookmark:
        """Publish to the queue's publish target; returns the bookmark once the broker has it."""
        ...

    def replay(
        self,
        queue: str,
        since_bookmarks: Sequence[str] = (),
        since_ms: int | None = None,
        until_ms: int | None = None,
        follow: bool = False,
        filter: str | None = None,
    ) -> AsyncIterator[list[DeliveredMessage]]:
        """The records of the queue's underlying topics from a point on, in batches, as plain
        publish/subscribe: nothing leased or acked, the queue's state untouched (see
        ``ReplayRequest`` in queue.proto). Raises (on the first ``__anext__``) like ``browse``;
        closing the iterator stops the reading."""
        ...

    async def stats(self, queue: str | None = None) -> list[QueueStats]:
        """Stats of one queue (``UnknownQueue`` if not configured) or of all served here."""
        ...

    async def cluster_stats(self) -> ClusterStats:
        """Stats of every queue: in a cluster, of every queue of it, each from its owner, and
        the queues whose owner could not be reached; alone, those of ``stats()``."""
        ...

    def queues(self) -> list[QueueInfo]: ...

    async def reload(self) -> ReloadResult:
        """Read the config file again and apply it, all or nothing (see ``ReloadResult``);
        ``ConfigError`` for a file that does not load (nothing changes)."""
        ...

    async def create_queue(self, options: Mapping[str, str], by: str) -> QueueDefinitionInfo:
        """Define a queue for the cluster (``options``: its table, values as TOML literals);
        ``ConfigError`` as the file's, ``QueueExists``."""
        ...

    async def create_temporary_queue(
        self, name: str, options: Mapping[str, str], by: str
    ) -> QueueDefinitionInfo:
        """A temporary queue: deleted with its state once unused for the grace period."""
        ...

    async def alter_queue(
        self, name: str, options: Mapping[str, str], by: str
    ) -> QueueDefinitionInfo:
        """New values of a queue's options; ``ConfigError`` for one that cannot change live."""
        ...

    async def delete_queue(self, name: str, force: bool, by: str) -> None:
        """Delete a queue for the cluster; ``QueueBusy`` while messages are leased, unless
        ``force``."""
        ...

    def definitions(self) -> list[QueueDefinitionInfo]:
        """The cluster's queue definitions."""
        ...

    async def cluster_info(self) -> ClusterInfo:
        """The cluster's members (each probed: ``alive``) and the owner of each queue."""
        ...
