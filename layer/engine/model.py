"""The queue engine's vocabulary: identities, settings, events in, effects out.

Everything here is plain data. The engine (``layer.engine.queue.QueueEngine``) consumes the events
and emits the effects; the coordinator turns effects into changelog records, dead letters, RocksDB
writes and pushes to consumers. Times are floats in seconds on the engine's injected clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple


class Bookmark(NamedTuple):
    """A message's identity: stable across restarts and coordinators."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"

    @classmethod
    def parse(cls, text: str) -> Bookmark:
        """Parse ``topic/partition/offset`` (Kafka topic names cannot contain '/')."""
        parts = text.rsplit("/", 2)
        if len(parts) != 3 or not parts[0]:
            raise ValueError(f"bookmark {text!r} is not topic/partition/offset")
        topic = parts[0]
        try:
            partition, offset = int(parts[1]), int(parts[2])
        except ValueError:
            raise ValueError(f"bookmark {text!r} is not topic/partition/offset") from None
        if partition < 0 or offset < 0:
            raise ValueError(f"bookmark {text!r} has a negative partition or offset")
        return cls(topic, partition, offset)


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class Semantics(StrEnum):
    AT_LEAST_ONCE = "at-least-once"
    AT_MOST_ONCE = "at-most-once"


class Fairness(StrEnum):
    FAST = "fast"
    ROUND_ROBIN = "round-robin"
    PROPORTIONAL = "proportional"


class Leasing(StrEnum):
    STRICT = "strict"
    LENIENT = "lenient"


class DoneReason(StrEnum):
    """Why a message left the queue. Every reason but ACKED and DELIVERED dead-letters it."""

    ACKED = "acked"
    DELIVERED = "delivered"  # at-most-once: removed when handed out
    CONSUMER_EXPIRE = "consumer_expire"  # the consumer acked with the expire option
    MAX_CANCELS = "max_cancels"
    MAX_DELIVERIES = "max_deliveries"
    EXPIRATION = "expiration"  # older than the queue's expiration while not leased
    BARRIER = "barrier"  # a barrier message, sent to every matching subscription
    CONFLATED = "conflated"  # replaced by a newer message with the same conflate key
    UNPARSEABLE = "unparseable"  # its payload did not parse (on_unparseable = "dead-letter")

    @property
    def dead_letter(self) -> bool:
        # identity tests, not a set lookup: an enum's hash is a Python call, and this is asked
        # for every message that leaves
        return not (
            self is DoneReason.ACKED
            or self is DoneReason.DELIVERED
            or self is DoneReason.BARRIER
            or self is DoneReason.CONFLATED
        )


class GroupMode(StrEnum):
    """How a message group stays with one consumer (Qpid's message groups)."""

    STICKY = "sticky"  # while the owning subscription lives
    SHARED = "shared"  # only while the owner holds unacked messages of the group


class ReturnReason(StrEnum):
    CANCEL = "cancel"
    TIMEOUT = "timeout"
    DISCONNECT = "disconnect"


class AckOp(StrEnum):
    ACK = "ack"
    CANCEL = "cancel"
    EXPIRE = "expire"
    EXTEND = "extend"


class AckError(StrEnum):
    """Why one bookmark of an ack batch was refused. Refusals never change state."""

    UNKNOWN_BOOKMARK = "unknown_bookmark"  # not a message of this queue (or already done)
    NOT_LEASE_HOLDER = "not_lease_holder"  # strict leasing, leased to someone else
    NOT_LEASED = "not_leased"  # cancel / extend of a message nobody holds


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The subset of a queue's configuration the engine needs (built from the queue config)."""

    semantics: Semantics = Semantics.AT_LEAST_ONCE
    lease_period: float = 60.0
    max_per_subscription_backlog: int = 10_000
    fairness: Fairness = Fairness.PROPORTIONAL
    leasing: Leasing = Leasing.STRICT
    max_deliveries: int = 0  # 0 = unlimited
    max_cancels: int = 0  # 0 = unlimited
    expiration: float | None = None  # seconds in the queue before expiring; None = never
    target_queue_depth: int = 0  # 0 = unlimited
    priority: bool = False  # order by Arrival.priority (highest first) instead of arrival order
    groups: GroupMode | None = None  # message groups by Arrival.group; None = no groups
    exclusive: bool = False  # one active subscription (the oldest) gets everything
    conflate: bool = False  # last-value queue by Arrival.conflate_key
    # Qpid's sorted queue: order by Arrival.sort_key (ascending; None last), oldest first
    # among equals. Not with priority or conflate.
    sort: bool = False
    # messages may carry an expiry of their own (Arrival.expires_at; ``expiration`` still caps)
    message_ttl: bool = False
    # After a lease timeout the message waits min(max, initial * multiplier ** (deliveries - 1))
    # seconds before it is available again; None = at once.
    redelivery_backoff: tuple[float, float, float] | None = None
    track_view: bool = False  # report ViewChange effects (the queue publishes a view topic)

    def validate(self, name: str) -> None:
        """Raise ValueError naming every setting that is out of range."""
        problems = []
        if not self.lease_period > 0:
            problems.append(f"lease_period must be > 0 (got {self.lease_period})")
        if self.max_per_subscription_backlog < 1:
            problems.append(
                "max_per_subscription_backlog must be >= 1"
                f" (got {self.max_per_subscription_backlog})"
            )
        if self.max_deliveries < 0:
            problems.append(f"max_deliveries must be >= 0 (got {self.max_deliveries})")
        if self.max_cancels < 0:
            problems.append(f"max_cancels must be >= 0 (got {self.max_cancels})")
        if self.expiration is not None and not self.expiration > 0:
            problems.append(f"expiration must be > 0 or None (got {self.expiration})")
        if self.target_queue_depth < 0:
            problems.append(f"target_queue_depth must be >= 0 (got {self.target_queue_depth})")
        if self.redelivery_backoff is not None:
            initial, multiplier, cap = self.redelivery_backoff
            if not (initial >= 0 and multiplier >= 1 and cap >= initial):
                problems.append(
                    "redelivery_backoff needs initial >= 0, multiplier >= 1, max >= initial"
                    f" (got {self.redelivery_backoff})"
                )
        if self.sort and (self.priority or self.conflate):
            problems.append("sort cannot be combined with priority or conflate (as Qpid refuses)")
        if problems:
            raise ValueError(f"queue {name!r}: " + "; ".join(problems))

    def backoff(self, deliveries: int) -> float:
        """The redelivery delay after a lease timeout of a message delivered this many times."""
        if self.redelivery_backoff is None:
            return 0.0
        initial, multiplier, cap = self.redelivery_backoff
        exponent = min(max(deliveries - 1, 0), 64)
        return float(min(cap, initial * multiplier**exponent))


# Built per message: not frozen (a frozen __init__ costs ~6x), and never mutated.
@dataclass(slots=True, unsafe_hash=True)
class Arrival:
    """A message read from an underlying topic that enters the queue.

    ``priority`` is already evaluated by the coordinator (None = lowest, as for a missing or
    non-numeric priority). ``deliveries`` and ``cancels`` carry counts restored from the changelog.
    """

    bookmark: Bookmark
    timestamp: float  # enqueue time, on the engine clock
    priority: int | None = None
    deliveries: int = 0
    cancels: int = 0
    group: object = None  # message group key (hashable); None = no group
    conflate_key: object = None  # last-value key (hashable); None = never conflated
    barrier: bool = False  # matches the queue's barrier expression
    not_before: float | None = None  # not deliverable before this time (delayed message)
    sort_key: str | None = None  # sorted queues: the value it is sorted by; None sorts last
    expires_at: float | None = None  # its own expiry time (message_ttl); None = the queue's
    # its payload did not parse and the queue dead-letters such messages: done on arrival
    unparseable: bool = False


# ---------------------------------------------------------------------------------------------
# Effects: what the engine decided. Drained in order with QueueEngine.drain().
# ---------------------------------------------------------------------------------------------


# Built per message: not frozen (a frozen __init__ costs ~6x), and never mutated.
@dataclass(slots=True, unsafe_hash=True)
class Delivery:
    """Hand this message to this subscription (and, at-least-once, lease it until ``deadline``)."""

    subscription: str
    bookmark: Bookmark
    deliveries: int  # including this one
    cancels: int
    deadline: float | None  # None for at-most-once and barrier messages
    barrier: bool = False  # a barrier message: sent, not leased; no ack expected


# Built per message: not frozen (a frozen __init__ costs ~6x), and never mutated.
@dataclass(slots=True, unsafe_hash=True)
class Leased:
    """Durable: the message is leased (its delivery count went up). ``count`` > 1: the run of
    ``count`` consecutive offsets from ``bookmark``, each leased alike (see ``singles``)."""

    bookmark: Bookmark
    holder: str
    deadline: float
    deliveries: int
    cancels: int
    count: int = 1


# Built per message: not frozen (a frozen __init__ costs ~6x), and never mutated.
@dataclass(slots=True, unsafe_hash=True)
class Returned:
    """Durable: a lease ended without ack; the message is available again."""

    bookmark: Bookmark
    reason: ReturnReason
    deliveries: int
    cancels: int
    not_before: float | None = None  # delayed redelivery: available again at this time
    count: int = 1  # > 1: the run of consecutive offsets from ``bookmark`` (see ``singles``)


# Built per message: not frozen (a frozen __init__ costs ~6x), and never mutated.
@dataclass(slots=True, unsafe_hash=True)
class Done:
    """Durable: the message left the queue. Dead-letter it when ``reason.dead_letter``.
    ``count`` > 1: the run of ``count`` consecutive offsets from ``bookmark`` that left alike
    (see ``singles``)."""

    bookmark: Bookmark
    reason: DoneReason
    deliveries: int
    cancels: int
    at: float
    count: int = 1


# Built per message: not frozen (a frozen __init__ costs ~6x), and never mutated.
@dataclass(slots=True, unsafe_hash=True)
class LowWater:
    """Durable: every offset of this partition below ``offset`` is done; records below may go."""

    partition: TopicPartition
    offset: int


# Built per message: not frozen (a frozen __init__ costs ~6x), and never mutated.
@dataclass(slots=True, unsafe_hash=True)
class Forget:
    """Durable: tombstone the done records of ``count`` messages from this bookmark (the
    low-water mark has passed them): a run the mark passed is one Forget, not one a message."""

    bookmark: Bookmark
    count: int = 1


Change = Leased | Returned | Done | LowWater | Forget


def singles(changes: Iterable[Change]) -> Iterator[Change]:
    """``changes`` with each run of a Leased, Returned or Done (``count`` > 1) as one change a
    message, in offset order: for readers that go message by message (the view's lease changes,
    a round whose runs overlap, tests). Forgets stay runs."""
    for change in changes:
        count = getattr(change, "count", 1)
        if count == 1 or type(change) is Forget:
            yield change
            continue
        topic, partition, first = change.bookmark  # type: ignore[union-attr]
        for offset in range(first, first + count):
            bm = Bookmark(topic, partition, offset)
            if type(change) is Leased:
                yield Leased(bm, change.holder, change.deadline, change.deliveries, change.cancels)
            elif type(change) is Done:
                yield Done(bm, change.reason, change.deliveries, change.cancels, change.at)
            elif type(change) is Returned:
                yield Returned(
                    bm, change.reason, change.deliveries, change.cancels, change.not_before
                )


class ViewChange(NamedTuple):
    """A message entered (+1) or left (-1) the queue's live contents: what a browse shows
    (available and barrier-held messages). Only with ``EngineSettings.track_view``."""

    bookmark: Bookmark
    sign: int
    deliveries: int
    cancels: int
    priority: int | None = None  # the message's priority (priority queues only)
    # A lease change (the coordinator's, not the engine's): the set of leased messages, beside
    # the live contents: +1 the lease began, held by ``holder`` since ``leased_at`` (ms), -1 it
    # ended. None: a change of the live contents.
    holder: str | None = None
    leased_at: int = 0


@dataclass(slots=True)
class ViewChanges:
    """View changes as columns (what a view topic's round is made of): building a ViewChange
    per change cost the coordinator more than publishing it. Iterating gives ViewChanges."""

    bookmarks: list[Bookmark] = field(default_factory=list)
    signs: list[int] = field(default_factory=list)
    deliveries: list[int] = field(default_factory=list)
    cancels: list[int] = field(default_factory=list)
    priorities: list[int | None] | None = None  # None: no change has a priority

    @classmethod
    def of(cls, changes: Iterable[ViewChange]) -> ViewChanges:
        columns = cls()
        for change in changes:
            columns.append(change)
        return columns

    def append(self, change: ViewChange) -> None:
        if change.priority is not None and self.priorities is None:
            self.priorities = [None] * len(self.signs)
        self.bookmarks.append(change.bookmark)
        self.signs.append(change.sign)
        self.deliveries.append(change.deliveries)
        self.cancels.append(change.cancels)
        if self.priorities is not None:
            self.priorities.append(change.priority)

    def __len__(self) -> int:
        return len(self.signs)

    def __iter__(self) -> Iterator[ViewChange]:
        priorities = self.priorities or [None] * len(self.signs)
        for row in zip(
            self.bookmarks, self.signs, self.deliveries, self.cancels, priorities, strict=True
        ):
            yield ViewChange(*row)


def lease_change(bookmark: Bookmark, sign: int, holder: str, leased_at: int,
                 deliveries: int, cancels: int) -> ViewChange:  # fmt: skip
    """A change of the set of leased messages (see ``ViewChange.holder``)."""
    return ViewChange(bookmark, sign, deliveries, cancels, None, holder, leased_at)


@dataclass(slots=True)
class Effects:
    """Everything decided since the last drain, in order."""

    changes: list[Change]
    deliveries: list[Delivery]
    # Net per drain: a message that came and went within one drain is not in it; one that
    # left and came back is in it twice (-1 then +1), so a reader's counts stay right.
    view: ViewChanges = field(default_factory=ViewChanges)

    def __bool__(self) -> bool:
        return bool(self.changes or self.deliveries)


# Built per message: not frozen (a frozen __init__ costs ~6x), and never mutated.
@dataclass(slots=True, unsafe_hash=True)
class AckOutcome:
    bookmark: Bookmark
    error: AckError | None = None  # None = accepted


@dataclass(frozen=True, slots=True)
class EngineStats:
    available: int
    leased: int
    inactive: int  # beyond target_queue_depth, known but not active (0 when not read yet)
    subscriptions: int
    oldest_available_at: float | None
    done_total: int
    dead_lettered_total: int
    delivered_total: int
    delayed: int = 0  # waiting for a delayed (re)delivery time
    held: int = 0  # behind a barrier not sent yet (counted in neither available nor leased)
    # in the underlying partitions, not read into the queue yet (the lag an autoscaler watches)
    unread: int = 0
