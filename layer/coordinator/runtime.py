"""One queue inside the coordinator: its engine, its inbox of fetched messages, its subscriptions.

Runs on the coordinator's event loop only (the ingest thread hands batches over with
``call_soon_threadsafe``), so nothing here needs a lock.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from confluent_kafka import Message

from layer.api.service import DeliverySink, QueueStats
from layer.config import QueueConfig
from layer.coordinator.counters import Counters
from layer.coordinator.ingest import Fetched, bookmark_of
from layer.coordinator.publish_route import PublishRoute
from layer.coordinator.stages import Stages
from layer.documents import DocumentReader
from layer.engine.model import (
    Arrival,
    Bookmark,
    Change,
    LowWater,
    TopicPartition,
    ViewChange,
)
from layer.engine.queue import QueueEngine
from layer.exceptions import UnknownQueue
from layer.expr import Expression, compile_expression
from layer.state.base import Store, StoreBatch, StoredMessage

if TYPE_CHECKING:
    from layer.coordinator.view_history import ViewHistory

log = logging.getLogger(__name__)


DELIVER_AFTER = "deliver_after"  # header: not deliverable before this UNIX time (seconds)


def deliver_after(headers: tuple[tuple[str, bytes | None], ...]) -> float | None:
    """The time in a ``deliver_after`` header (ASCII decimal UNIX seconds), if any and valid."""
    for key, value in headers:
        if key == DELIVER_AFTER and value is not None:
            try:
                when = float(value.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                return None
            return when if when == when and when != float("inf") else None
    return None


class Expressions:
    """A queue's compiled expressions and the reader of its documents."""

    __slots__ = ("reader", "priority", "barrier", "filter", "group", "conflate", "needed")

    def __init__(self, config: QueueConfig) -> None:
        compiled = {opt: compile_expression(text) for opt, text in config.expressions.items()}
        self.priority = compiled.get("priority")
        self.barrier = compiled.get("barrier")
        self.filter = compiled.get("filter")
        self.group = compiled.get("group_key")
        self.conflate = compiled.get("conflate_key")
        self.needed = bool(compiled)
        # json queues always parse: a payload that is not JSON is reported with its dead letter
        parse = self.needed or config.message_type == "json"
        self.reader = DocumentReader(config.message_type, config.avro_schema) if parse else None


@dataclass(slots=True)
class SubscriptionState:
    id: str
    queue: str
    sink: DeliverySink
    backlog: int
    client: str
    filter: str | None = None
    closed: bool = False
    # the queues it is in: [queue], or the configured queues a regex ``queue`` matched
    queues: list[str] = field(default_factory=list)
    # queues this subscription left by a replace while it still held leases there
    draining: set[str] = field(default_factory=set)
    # paused (backlog 0 in its queue) because its stream holds a backlog's worth unsent
    stalled: bool = False


@dataclass
class QueueRuntime:
    config: QueueConfig
    engine: QueueEngine
    changelog_topic: str
    inbox: deque[Message] = field(default_factory=deque)
    subscriptions: dict[str, SubscriptionState] = field(default_factory=dict)
    # Restored from the changelog for messages not read yet (state dir wiped): skip the done ones;
    # the others get their delivery counts back from the engine (QueueEngine.restore_counts).
    restored_done: set[Bookmark] = field(default_factory=set)
    restored_delays: dict[Bookmark, float] = field(default_factory=dict)
    # Changes the coordinator itself originates (a partition's start), written with the next round.
    pending_changes: list[Change] = field(default_factory=list)
    known_partitions: set[TopicPartition] = field(default_factory=set)
    counters: Counters = field(default_factory=Counters)
    # Payloads of recently admitted messages, so handing them out needs no RocksDB read. Bounded:
    # beyond ``payload_cache_size`` messages, payloads are read back from the store.
    payload_cache: dict[Bookmark, StoredMessage] = field(default_factory=dict)
    payload_cache_size: int = 20_000
    route: PublishRoute | None = None  # copies publishes to the queue's name (publish_route)
    # Write a run record (layer.state.base.RunRecord) for every message admitted: the store's
    # run records cover the queue (set by the restore when they do).
    record_runs: bool = False
    # Where deliveries' time goes (set by the coordinator); with it, fetches are timed.
    stages: Stages | None = None
    # (wall clock fetched, messages of that fetch still in the inbox), oldest first
    fetched_at: deque[list[float]] = field(default_factory=deque)
    # Where its view rounds go (view_topic): the generation being written (set by the restore)
    views: ViewHistory | None = None
    # Its leases as the view topic says (bookmark -> +1 lease change; view_topic only)
    view_leases: dict[Bookmark, ViewChange] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.exprs = Expressions(self.config)
        self._docs: dict[Bookmark, object] = {}  # parsed documents for subscription filters

    @property
    def name(self) -> str:
        return self.config.name

    def arrival(
        self, bookmark: Bookmark, stored: StoredMessage, doc: object, now: float
    ) -> Arrival:
        """The engine's view of a message: its queue-level expressions evaluated once."""
        exprs = self.exprs
        wall = time.time()
        not_before = deliver_after(stored.headers)
        restored = self.restored_delays.pop(bookmark, None)
        if restored is not None and (not_before is None or restored > not_before):
            not_before = restored
        return Arrival(
            bookmark,
            stored.timestamp_ms / 1000.0 if stored.timestamp_ms else now,
            stored.priority,
            0,  # delivery and cancel counts: the engine's restored ones, if any
            0,
            None if exprs.group is None else exprs.group.key(doc, wall),
            None if exprs.conflate is None else exprs.conflate.key(doc, wall),
            exprs.barrier is not None and exprs.barrier.matches(doc, wall),
            not_before,
        )

    def parse(self, msg: Message) -> tuple[StoredMessage | None, object]:
        """The local copy of a message and its document; (None, None) when the queue's filter
        leaves it out. A payload that does not parse is still queued (its expressions see NULL);
        its error travels with it to the consumer's dead letter."""
        value = msg.value()
        exprs = self.exprs
        doc: object = None
        error: str | None = None
        if exprs.reader is not None:
            doc, error = exprs.reader.read(value)
            if error is not None:
                self.counters.unparseable += 1
            elif exprs.filter is not None and not exprs.filter.matches(doc):
                self.counters.filtered += 1
                return None, None
        headers = cast(list[tuple[str, bytes | None]], msg.headers() or [])
        _ts_type, ts = msg.timestamp()
        stored = StoredMessage(
            key=msg.key(),
            value=value,
            headers=tuple(headers),
            timestamp_ms=ts if ts and ts > 0 else 0,
            priority=None if exprs.priority is None else exprs.priority.priority(doc),
            error=error,
        )
        return stored, doc

    def take_fetched(self, fetched: Fetched) -> None:
        """A fetch of the queue's topics, into the inbox (admitted by the next round). A
        partition read for the first time starts at the offset the reader began at, a change
        that goes with that round."""
        for started in fetched.started:
            if started.partition not in self.known_partitions:
                self.engine.start_partition(started.partition, started.offset)
                self.known_partitions.add(started.partition)
                self.pending_changes.append(LowWater(started.partition, started.offset))
        for tp, high in fetched.high_watermarks.items():
            self.engine.set_high_watermark(tp, high)
        self.inbox.extend(fetched.messages)
        if self.stages is not None and fetched.messages and fetched.at:
            self._time_fetch(fetched, self.stages)

    def _time_fetch(self, fetched: Fetched, stages: Stages) -> None:
        """The fetch stage of up to 16 of its messages, evenly spaced, each weighing for the
        ones it stands for; the fetch is remembered for the round that admits it."""
        messages = fetched.messages
        step = max(1, len(messages) // 16)
        for msg in messages[::step]:
            ts = msg.timestamp()[1]
            if ts > 0:
                stages.add("fetch", fetched.at - ts / 1000.0, step)
        self.fetched_at.append([fetched.at, float(len(messages))])

    def _time_admitted(self, taken: int, stages: Stages) -> None:
        """``taken`` messages left the inbox: the round-wait stage of their fetches."""
        started = time.time()
        marks = self.fetched_at
        while taken > 0 and marks:
            mark = marks[0]
            n = min(taken, int(mark[1]))
            stages.add("round_wait", started - mark[0], n)
            taken -= n
            mark[1] -= n
            if mark[1] <= 0:
                marks.popleft()

    def admit(self, now: float, batch: StoreBatch, limit: int = 4096) -> int:
        """Move fetched messages from the inbox into the engine, as far as its room allows.

        At most ``limit`` a round: a burst of publishes must not make one round so long that
        deliveries and acks wait behind it. Plain messages (the queue gives them no group,
        conflation or barrier key, and they are not delayed) at consecutive offsets of one
        partition, of one priority, go in as one run (``QueueEngine.add_run``), and are
        recorded as one (``StoreBatch.put_run``) when ``record_runs``."""
        room = min(self.engine.room(), limit)
        if not self.inbox or room <= 0:
            return 0
        engine = self.engine
        exprs = self.exprs
        plain_queue = exprs.group is None and exprs.conflate is None and exprs.barrier is None
        record = self.record_runs
        read_to: dict[TopicPartition, int] = {}
        name = self.name
        inbox = self.inbox
        restored_done = self.restored_done
        payload_cache, cache_size = self.payload_cache, self.payload_cache_size
        admitted = 0
        before = len(inbox)
        run_tp: TopicPartition | None = None
        run_start = 0
        run_times: list[float] = []
        run_priority: int | None = None

        def flush() -> None:
            assert run_tp is not None
            engine.add_run(run_tp, run_start, run_times, now, run_priority)
            if record:
                batch.put_run(name, run_tp, run_start, array("d", run_times), run_priority)

        while inbox and room > 0:
            msg = inbox.popleft()
            bookmark = bookmark_of(msg)
            tp = TopicPartition(bookmark.topic, bookmark.partition)
            read_to[tp] = bookmark.offset + 1
            if restored_done and bookmark in restored_done:
                restored_done.discard(bookmark)
                continue
            stored, doc = self.parse(msg)
            if stored is None:
                continue
            batch.put_message(name, bookmark, stored)
            if len(payload_cache) < cache_size:
                payload_cache[bookmark] = stored
            room -= 1
            admitted += 1
            headers = stored.headers
            if (
                plain_queue
                and not self.restored_delays
                and (not headers or deliver_after(headers) is None)
            ):
                ts = stored.timestamp_ms / 1000.0 if stored.timestamp_ms else now
                if (
                    run_times
                    and tp == run_tp
                    and bookmark.offset == run_start + len(run_times)
                    and stored.priority == run_priority
                ):
                    run_times.append(ts)
                    continue
                if run_times:
                    flush()
                run_tp, run_start, run_times, run_priority = (
                    tp,
                    bookmark.offset,
                    [ts],
                    stored.priority,
                )
                continue
            if run_times:
                flush()
                run_times = []
            arrival = self.arrival(bookmark, stored, doc, now)
            engine.add([arrival], now)
            if record:
                times = array("d", (arrival.timestamp,))
                batch.put_run(name, tp, bookmark.offset, times, stored.priority, whole=True)
        if run_times:
            flush()
        if self.stages is not None:
            self._time_admitted(before - len(inbox), self.stages)
        self.counters.ingested += admitted
        for tp, position in read_to.items():
            engine.mark_read(tp, position)
            batch.put_read_position(name, tp, position)
        return admitted

    def stats(self, now: float, rounds: int, fetch_wait_ms: float) -> QueueStats:
        """The queue's figures now (``rounds``: the coordinator's rounds so far;
        ``fetch_wait_ms``: its reader's current fetch wait)."""
        s = self.engine.stats(now)
        counters = self.counters
        return QueueStats(
            queue=self.name,
            available=s.available,
            leased=s.leased,
            # fetched but not admitted yet: within the engine's count once the fetch's high
            # watermark is known (the same fetch brings both)
            inactive=max(s.inactive, len(self.inbox)),
            subscriptions=s.subscriptions,
            oldest_available_age_s=(
                now - s.oldest_available_at if s.oldest_available_at is not None else None
            ),
            delivered_total=counters.delivered,
            acked_total=counters.acked,
            dead_lettered_total=counters.dead_lettered,
            extra={
                **{f"{name}_total": n for name, n in counters.values().items()},
                "delayed": s.delayed,
                "held": s.held,
                "unread": max(s.unread, len(self.inbox)),
                "rounds_total": rounds,
                "stalled_subscriptions": sum(sub.stalled for sub in self.subscriptions.values()),
                "fetch_wait_ms": float(fetch_wait_ms),
                **(self.stages.extra() if self.stages is not None else {}),
            },
        )

    def document(self, store: Store, bookmark: Bookmark) -> object:
        """The parsed message, for subscription filters (None when gone or unparseable)."""
        docs = self._docs
        if bookmark in docs:
            return docs[bookmark]
        stored = self.payload_cache.get(bookmark)
        if stored is None:
            stored = store.get_messages(self.name, [bookmark])[0]
        doc = None
        if stored is not None and self.exprs.reader is not None:
            doc = self.exprs.reader.read(stored.value)[0]
        if len(docs) >= self.payload_cache_size:
            docs.clear()  # a bounded memo: filters re-match only on requeues
        docs[bookmark] = doc
        return doc

    def matcher(self, store: Store, expression: Expression) -> Callable[[Bookmark], bool]:
        """A subscription's content filter as the engine's predicate on bookmarks."""
        document = self.document

        def match(bookmark: Bookmark) -> bool:
            return expression.matches(document(store, bookmark))

        return match

    def payloads(
        self, store: Store, bookmarks: list[Bookmark]
    ) -> dict[Bookmark, StoredMessage | None]:
        """The stored copies of these messages: from the cache, the rest in one store read."""
        cache = self.payload_cache
        found: dict[Bookmark, StoredMessage | None] = {}
        missing = []
        for bm in bookmarks:
            stored = cache.get(bm)
            if stored is None:
                missing.append(bm)
            else:
                found[bm] = stored
        if missing:
            found.update(zip(missing, store.get_messages(self.name, missing), strict=True))
        return found


def lookup(runtimes: Mapping[str, QueueRuntime], queue: str) -> QueueRuntime:
    """The runtime of a configured queue; ``UnknownQueue`` names the configured ones."""
    rt = runtimes.get(queue)
    if rt is None:
        raise UnknownQueue(
            f"queue {queue!r} is not configured (configured: {', '.join(sorted(runtimes))})"
        )
    return rt
