"""One queue inside the coordinator: its engine, its inbox of fetched messages, its subscriptions.

Runs on the coordinator's event loop only (the ingest thread hands batches over with
``call_soon_threadsafe``), so nothing here needs a lock.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import groupby, islice, repeat
from operator import is_
from typing import TYPE_CHECKING, cast

from confluent_kafka import Message

from layer.api.service import DeliverySink, QueueStats
from layer.config import OnUnparseable, QueueConfig
from layer.coordinator.counters import Counters
from layer.coordinator.ingest import Fetched, bookmark_of
from layer.coordinator.publish_route import PublishRoute
from layer.coordinator.stages import Stages
from layer.documents import DocumentReader
from layer.engine.model import (
    Arrival,
    Bookmark,
    Change,
    Done,
    DoneReason,
    LowWater,
    TopicPartition,
    ViewChange,
)
from layer.engine.priorities import qpid_level
from layer.engine.queue import QueueEngine
from layer.exceptions import UnknownQueue
from layer.expr import Expression, Record, compile_expression
from layer.expr.values import text_to_number
from layer.state.base import Store, StoreBatch, StoredMessage

if TYPE_CHECKING:
    from layer.coordinator.view_history import ViewHistory

log = logging.getLogger(__name__)

_INF = float("inf")
_VALUE = Message.value
_HEADERS = Message.headers
_TOPIC = Message.topic
_PARTITION_OF = Message.partition
_OFFSET_OF = Message.offset
_KEY = Message.key
_TIMESTAMP = Message.timestamp


# the most messages one blob (layer.state.blobs) holds: a delivery reads and decodes a whole
# blob for a few of them (then keeps it a while: KeyValueStore._BLOB_CACHE)
BLOB_MESSAGES = 1024
UNPARSEABLE_LOG_INTERVAL = 10.0  # seconds between log lines about unparseable messages
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


DISCARD_LOG_INTERVAL = 10.0  # seconds between two log lines of dead_letter_if discards
# the reasons dead_letter_if decides on (Solace: TTL expiry, max redelivery); the others
# (a consumer's expire, ...) are always dead-lettered
DMQ_REASONS = frozenset({DoneReason.EXPIRATION, DoneReason.MAX_DELIVERIES, DoneReason.MAX_CANCELS})
# last_value: the conflation key of every message is (LAST_VALUE, topic, partition)
LAST_VALUE = object()


def sort_value(
    expression: Expression, doc: object, now: float, record: Record | None = None
) -> str | None:
    """A sorted queue's sort value: the expression's value when it is a string (as Qpid's
    sort key must be a String property); anything else (NULL, a number) sorts last."""
    value = expression.evaluate(doc, now, record)
    return value if type(value) is str else None


def expires_at(
    expression: Expression,
    doc: object,
    now: float,
    timestamp: float,
    record: Record | None = None,
) -> float | None:
    """A message's own expiry time: its enqueue time plus the ``ttl`` expression's value in
    seconds (a number, or a string holding one). NULL, anything else, and a value that is not
    > 0 give none (Solace: a TTL of 0 never expires); the queue's ``expiration`` still caps."""
    value = expression.evaluate(doc, now, record)
    if type(value) is str:
        value = text_to_number(value)
    if type(value) not in (int, float):
        return None
    seconds = float(value)  # type: ignore[arg-type]
    if not 0 < seconds < _INF:  # also NaN
        return None
    return timestamp + seconds


class Expressions:
    """A queue's compiled expressions and the reader of its documents.

    ``uses_record``: some expression reads the Kafka record (KEY(), HEADER(...), ...), so a
    ``Record`` is built for each message; otherwise none is. ``levels``: the Qpid priority levels
    (``priorities``), into which the priority expression's value is mapped.
    """

    __slots__ = (
        "reader",
        "checker",
        "priority",
        "barrier",
        "filter",
        "group",
        "conflate",
        "needed",
        "uses_record",
        "levels",
        "sort",
        "ttl",
        "dead_letter_if",
        "last_value",
        "plain",
    )

    def __init__(self, config: QueueConfig) -> None:
        compiled = {opt: compile_expression(text) for opt, text in config.expressions.items()}
        self.priority = compiled.get("priority")
        self.barrier = compiled.get("barrier")
        self.filter = compiled.get("filter")
        self.group = compiled.get("group_key")
        self.conflate = compiled.get("conflate_key")
        self.sort = compiled.get("sort_key")
        self.ttl = compiled.get("ttl")
        self.dead_letter_if = compiled.get("dead_letter_if")
        self.last_value = config.last_value
        # the queue gives its messages nothing of their own: they may go in as runs
        self.plain = (
            self.group is None
            and self.conflate is None
            and self.barrier is None
            and self.sort is None
            and self.ttl is None
            and not self.last_value
        )
        self.needed = bool(compiled)
        self.uses_record = any(e.uses_record for e in compiled.values())
        self.levels = config.priorities
        # json queues always parse: a payload that is not JSON is reported with its dead letter;
        # a bytes queue's expressions read only the record (the loader refuses field paths)
        documents = config.message_type != "bytes"
        parse = (self.needed and documents) or config.message_type == "json"
        self.reader = DocumentReader(config.message_type, config.avro_schema) if parse else None
        # what a publish through the API must parse as: json, or avro with its schema
        typed = config.message_type == "json" or config.avro_schema is not None
        self.checker = self.reader or (
            DocumentReader(config.message_type, config.avro_schema) if typed else None
        )

    def document_of(self, stored: StoredMessage) -> object:
        """A stored message's parsed payload for the expressions (None: no reader, or it does
        not parse)."""
        return self.reader.read(stored.value)[0] if self.reader is not None else None

    def priority_of(self, doc: object, record: Record | None) -> int | None:
        """The message's priority: the expression's value, as a Qpid level with ``priorities``."""
        if self.priority is None:
            return None
        value = self.priority.priority(doc, None, record)
        return value if self.levels is None else qpid_level(value, self.levels)


def record_of(stored: StoredMessage, bookmark: Bookmark) -> Record:
    """The Kafka fields of a queued message, for expressions that read them."""
    return Record(
        stored.key, stored.headers, stored.timestamp_ms, bookmark.topic, bookmark.partition
    )


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
    # when it last became stalled (monotonic), and whether that stall was logged (one that
    # lasts STALL_LOG_AFTER is: a stream that is only behind by a round's push is not)
    stalled_since: float = 0.0
    stall_logged: bool = False


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
    # Per partition number, [topic, start, end]: every message this process admitted at
    # offsets start .. end - 1 of that partition is in a blob (layer.state.blobs), none in
    # MESSAGES, so their being done deletes nothing there (``in_blobs``).
    blob_spans: dict[int, list[object]] = field(default_factory=dict)
    # Per partition, the last offsets of the blobs this process wrote and has not deleted, in
    # order; and (set by a restore) the read position below which blobs written before it may
    # be: they go in one range delete once the low-water mark reaches it (``blobs_below``).
    blob_ends: dict[TopicPartition, deque[int]] = field(default_factory=dict)
    blobs_before: dict[TopicPartition, int] = field(default_factory=dict)
    # Per partition, the low-water mark below which this process last range-deleted the
    # entries (``layer.coordinator.records.ENTRY_SWEEP``): the entries of messages the mark passed
    # since then are still stored, hidden from readers by the mark.
    entries_swept: dict[TopicPartition, int] = field(default_factory=dict)
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
        self._discards_logged_at = -_INF  # dead_letter_if: when a discard was last logged
        self._discards_unlogged = 0  # discards since then, not logged one by one
        self._unparseable_logged_at = -UNPARSEABLE_LOG_INTERVAL
        self._unparseable_unlogged = 0

    def dead_letter_eligible(self, change: Done, stored: StoredMessage | None) -> bool:
        """Whether a message that leaves for ``change.reason`` (a dead-letter reason) is
        dead-lettered. Only with ``dead_letter_if`` and for the reasons Solace's DMQ
        eligibility covers (expiration, max_deliveries, max_cancels): the expression decides,
        on the message's payload; NULL or false discards it, counted (``discarded``) and logged
        (at most one line per ``DISCARD_LOG_INTERVAL`` seconds, with how many went unlogged).
        A message whose payload is gone already is dead-lettered: nothing is lost unseen."""
        expression = self.exprs.dead_letter_if
        if expression is None or change.reason not in DMQ_REASONS or stored is None:
            return True
        doc = self.exprs.document_of(stored)
        record = record_of(stored, change.bookmark) if self.exprs.uses_record else None
        if expression.matches(doc, time.time(), record):
            return True
        self.counters.discarded += 1
        wall = time.monotonic()
        if wall - self._discards_logged_at >= DISCARD_LOG_INTERVAL:
            more = self._discards_unlogged
            log.warning(
                "queue=%s discarded %s (%s, deliveries=%d): dead_letter_if %r is not true%s",
                self.name,
                change.bookmark,
                change.reason.value,
                change.deliveries,
                expression.text,
                f" ({more} more discarded since the last line)" if more else "",
                extra={
                    "queue": self.name,
                    "bookmark": str(change.bookmark),
                    "reason": change.reason.value,
                    "unlogged": more,
                },
            )
            self._discards_logged_at = wall
            self._discards_unlogged = 0
        else:
            self._discards_unlogged += 1
        return False

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
        record = record_of(stored, bookmark) if exprs.uses_record else None
        timestamp = stored.timestamp_ms / 1000.0 if stored.timestamp_ms else now
        if exprs.last_value:  # one per partition, as Solace's partitioned LVQs
            conflate_key: object = (LAST_VALUE, bookmark.topic, bookmark.partition)
        else:
            conflate_key = None if exprs.conflate is None else exprs.conflate.key(doc, wall, record)
        return Arrival(
            bookmark,
            timestamp,
            stored.priority,
            0,  # delivery and cancel counts: the engine's restored ones, if any
            0,
            None if exprs.group is None else exprs.group.key(doc, wall, record),
            conflate_key,
            exprs.barrier is not None and exprs.barrier.matches(doc, wall, record),
            not_before,
            None if exprs.sort is None else sort_value(exprs.sort, doc, wall, record),
            None if exprs.ttl is None else expires_at(exprs.ttl, doc, wall, timestamp, record),
            # also when a restart reads it back: its done record may not have been committed
            stored.error is not None and self._dead_letter_unparseable(),
        )

    def _dead_letter_unparseable(self) -> bool:
        return self.config.on_unparseable == OnUnparseable.DEAD_LETTER

    def unparseable_seen(self, bookmark: Bookmark, error: str, count: int = 1) -> None:
        """Count ``count`` unparseable messages, and log (at most one line every
        ``UNPARSEABLE_LOG_INTERVAL`` seconds per queue, saying how many went unlogged)."""
        self.counters.unparseable += count
        now = time.monotonic()
        if now - self._unparseable_logged_at < UNPARSEABLE_LOG_INTERVAL:
            self._unparseable_unlogged += count
            return
        action = "dead-lettered" if self._dead_letter_unparseable() else "delivering"
        unlogged = self._unparseable_unlogged
        log.warning(
            "queue=%s %s unparseable %s message %s: %s%s",
            self.name,
            action,
            self.config.message_type,
            bookmark,
            error,
            f" ({unlogged} more since the last such line)" if unlogged else "",
        )
        self._unparseable_logged_at = now
        self._unparseable_unlogged = count - 1

    def parse(self, msg: Message) -> tuple[StoredMessage | None, object]:
        """The local copy of a message and its document; (None, None) when the queue's filter
        leaves it out. A payload that does not parse is not filtered out (its expressions see
        NULL): its error goes with it, to its dead letter (``on_unparseable = "dead-letter"``,
        done on arrival) or to the consumer (``"deliver"``: the message's ``parse_error``)."""
        value = msg.value()
        exprs = self.exprs
        doc: object = None
        error: str | None = None
        headers = tuple(cast(list[tuple[str, bytes | None]], msg.headers() or []))
        _ts_type, ts = msg.timestamp()
        timestamp_ms = ts if ts and ts > 0 else 0
        record = None
        if exprs.uses_record:
            record = Record(msg.key(), headers, timestamp_ms, msg.topic(), msg.partition())
        if exprs.reader is not None:
            if exprs.needed:
                doc, error = exprs.reader.read(value)
            else:  # no expression reads the document: only whether it parses matters
                error = exprs.reader.check(value)
            if error is not None:
                self.unparseable_seen(bookmark_of(msg), error)
        if (
            error is None
            and exprs.filter is not None
            and not exprs.filter.matches(doc, None, record)
        ):
            self.counters.filtered += 1
            return None, None
        stored = StoredMessage(
            key=msg.key(),
            value=value,
            headers=headers,
            timestamp_ms=timestamp_ms,
            priority=exprs.priority_of(doc, record),
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
        recorded as one (``StoreBatch.put_run``) when ``record_runs``.

        A plain message without headers on a queue whose expressions read no document (most of
        a throughput run) takes a short way: no ``Bookmark``, ``StoredMessage`` (but for the
        payload cache) or parsed document is made for it, its JSON is only checked
        (``DocumentReader.check``) and its key, value and timestamp go into its partition's
        blob (``layer.state.blobs``: one store value for up to ``BLOB_MESSAGES`` of them, not
        a ``StoredMessage`` record each). One that does not parse goes the long way, which
        words it; a message that goes the long way is stored alone (MESSAGES)."""
        room = min(self.engine.room(), limit)
        if not self.inbox or room <= 0:
            return 0
        engine = self.engine
        exprs = self.exprs
        plain_queue = exprs.plain
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

        spans = self.blob_spans

        def put_blob(
            tp: TopicPartition,
            offsets: list[int],
            keys: list[bytes | None],
            values: list[bytes | None],
            times: list[int],
        ) -> None:
            batch.put_blob(name, tp, offsets, keys, values, times)
            first, last = offsets[0], offsets[-1]
            self.blob_written(tp, last)
            span = spans.get(tp.partition)
            if last - first != len(offsets) - 1:  # a gap: maybe a message in MESSAGES
                spans.pop(tp.partition, None)
            elif span is not None and span[0] == tp.topic and span[2] == first:
                span[2] = last + 1
            else:
                spans[tp.partition] = [tp.topic, first, last + 1]

        # the short way (see above): its partition at hand, and the blob being built there
        short = plain_queue and not exprs.needed and not self.restored_delays
        reader = exprs.reader
        check = reader.check if reader is not None else None
        # JSON checked per batch: the loop below takes exactly the first ``room`` of the inbox
        # (the short way's queue has no filter, and none is restored as done), so when all of
        # them pass, none needs its own check
        values: list[bytes | None] | None = None
        if short and not restored_done:
            values = list(map(_VALUE, islice(inbox, room)))
            if reader is None or reader.check_all(values):
                check = None
            else:
                values = None
        at_topic: str | None = None
        at_partition = -1
        at_tp = TopicPartition("", -1)
        # per partition, the blob being built: offsets, keys, values, timestamps (ms)
        Pending = tuple[list[int], list[bytes | None], list[bytes | None], list[int]]
        pending: dict[TopicPartition, Pending] = {}
        blob_offsets: list[int] = []
        blob_keys: list[bytes | None] = []
        blob_values: list[bytes | None] = []
        blob_times: list[int] = []
        if values is not None and not any(map(_HEADERS, islice(inbox, len(values)))):
            # every message taken goes the short way: by columns (``_admit_columns``)
            taken = [inbox.popleft() for _ in values]
            for tp, start, at_times in self._admit_columns(taken, values, now, pending):
                engine.add_run(tp, start, at_times, now, None)
                if record:
                    batch.put_run(name, tp, start, array("d", at_times), None)
                read_to[tp] = start + len(at_times)
            room -= len(taken)
            admitted += len(taken)
        while inbox and room > 0:
            msg = inbox.popleft()
            if short and not msg.headers():
                # an error-free fetched message has all three (librdkafka)
                t: str = msg.topic()  # type: ignore[assignment]
                p: int = msg.partition()  # type: ignore[assignment]
                offset: int = msg.offset()  # type: ignore[assignment]
                if p != at_partition or t != at_topic:
                    at_topic, at_partition, at_tp = t, p, TopicPartition(t, p)
                    blob = pending.get(at_tp)
                    if blob is None:
                        blob = pending[at_tp] = ([], [], [], [])
                    blob_offsets, blob_keys, blob_values, blob_times = blob
                value = msg.value()
                if check is None or check(value) is None:
                    read_to[at_tp] = offset + 1
                    if restored_done and Bookmark(t, p, offset) in restored_done:
                        restored_done.discard(Bookmark(t, p, offset))
                        continue
                    key = msg.key()
                    ts_ms: int = msg.timestamp()[1]
                    if ts_ms < 0:
                        ts_ms = 0
                    if len(blob_offsets) >= BLOB_MESSAGES:
                        put_blob(at_tp, blob_offsets, blob_keys, blob_values, blob_times)
                        blob = pending[at_tp] = ([], [], [], [])
                        blob_offsets, blob_keys, blob_values, blob_times = blob
                    blob_offsets.append(offset)
                    blob_keys.append(key)
                    blob_values.append(value)
                    blob_times.append(ts_ms)
                    if len(payload_cache) < cache_size:
                        # a plain tuple is a Bookmark's equal as a key, and made ~7x faster
                        payload_cache[(t, p, offset)] = StoredMessage(key, value, (), ts_ms)  # type: ignore[index]
                    room -= 1
                    admitted += 1
                    at = ts_ms / 1000.0 if ts_ms else now
                    if (
                        run_times
                        and at_tp == run_tp
                        and offset == run_start + len(run_times)
                        and run_priority is None
                    ):
                        run_times.append(at)
                        continue
                    if run_times:
                        flush()
                    run_tp, run_start, run_times, run_priority = at_tp, offset, [at], None
                    continue
            bookmark = bookmark_of(msg)
            tp = TopicPartition(bookmark.topic, bookmark.partition)
            read_to[tp] = bookmark.offset + 1
            if restored_done and bookmark in restored_done:
                restored_done.discard(bookmark)
                continue
            stored, doc = self.parse(msg)
            if stored is None:
                continue
            unparseable = stored.error is not None and self._dead_letter_unparseable()
            batch.put_message(name, bookmark, stored)
            if len(payload_cache) < cache_size:
                payload_cache[bookmark] = stored
            room -= 1
            admitted += 1
            headers = stored.headers
            if (
                plain_queue
                and not unparseable
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
            arrival = self.arrival(bookmark, stored, doc, now)  # unparseable: done on arrival
            engine.add([arrival], now)
            if record:
                times = array("d", (arrival.timestamp,))
                batch.put_run(name, tp, bookmark.offset, times, stored.priority, whole=True)
        if run_times:
            flush()
        for tp, blob in pending.items():
            while len(blob[0]) > BLOB_MESSAGES:  # (``_admit_columns`` fills them a fetch at once)
                put_blob(tp, *(column[:BLOB_MESSAGES] for column in blob))  # type: ignore[arg-type]
                blob = tuple(column[BLOB_MESSAGES:] for column in blob)  # type: ignore[assignment]
            if blob[0]:
                put_blob(tp, *blob)
        if self.stages is not None:
            self._time_admitted(before - len(inbox), self.stages)
        self.counters.ingested += admitted
        for tp, position in read_to.items():
            engine.mark_read(tp, position)
            batch.put_read_position(name, tp, position)
        return admitted

    def _admit_columns(
        self,
        taken: list[Message],
        values: list[bytes | None],
        now: float,
        pending: dict[
            TopicPartition, tuple[list[int], list[bytes | None], list[bytes | None], list[int]]
        ],
    ) -> Iterator[tuple[TopicPartition, int, list[float]]]:
        """``admit``'s short way for a whole fetch of plain messages (no headers, JSON checked,
        nothing restored as done): each field read for all of them at once (``map`` over the
        messages, in C), not message by message. Appends their local copies to their
        partitions' blobs in ``pending`` and fills the payload cache; yields the runs of
        consecutive offsets ``(partition, first offset, times)`` in the order they came."""
        topics = list(map(_TOPIC, taken))
        partitions = list(map(_PARTITION_OF, taken))
        offsets: list[int] = list(map(_OFFSET_OF, taken))  # type: ignore[arg-type]
        keys = list(map(_KEY, taken))
        stamps: list[int] = [ts for _kind, ts in map(_TIMESTAMP, taken)]
        if stamps and min(stamps) < 0:
            stamps = [ts if ts > 0 else 0 for ts in stamps]
        cache, cache_size = self.payload_cache, self.payload_cache_size
        i = 0
        for (topic, partition), group in groupby(zip(topics, partitions, strict=True)):
            j = i + sum(1 for _ in group)
            tp = TopicPartition(topic, partition)  # type: ignore[arg-type]
            segment = offsets[i:j]
            blob = pending.get(tp)
            if blob is None:
                blob = pending[tp] = ([], [], [], [])
            blob[0].extend(segment)
            blob[1].extend(keys[i:j])
            blob[2].extend(values[i:j])
            blob[3].extend(stamps[i:j])
            cache_payloads(
                cache,
                cache_size,
                tp.topic,
                tp.partition,
                segment,
                keys[i:j],
                values[i:j],
                stamps[i:j],
            )
            times = [ts / 1000.0 if ts else now for ts in stamps[i:j]]
            for first, end in stretches(segment):
                yield tp, segment[first], times[first:end]
            i = j

    def blob_written(self, tp: TopicPartition, last: int) -> None:
        """A blob of ``tp`` whose last offset is ``last`` goes into the store."""
        ends = self.blob_ends.get(tp)
        if ends is None:
            ends = self.blob_ends[tp] = deque()
        ends.append(last)

    def blobs_below(self, batch: StoreBatch, tp: TopicPartition, mark: int) -> None:
        """The low-water mark of ``tp`` is at ``mark``: delete the blobs it passed. Those this
        process wrote by their keys (a point delete each: range tombstones would slow every
        later seek of a read); those written before the restore in one range delete, once the
        mark reaches where they end."""
        ends = self.blob_ends.get(tp)
        if ends:
            while ends and ends[0] < mark:
                batch.delete_blob(self.name, tp, ends.popleft())
        before = self.blobs_before.get(tp)
        if before is not None and mark >= before:
            batch.delete_blobs_below(self.name, tp, before)
            del self.blobs_before[tp]

    def in_blobs(self, first: Bookmark, count: int) -> bool:
        """Whether the messages at ``first`` and the ``count - 1`` offsets after it are known
        to be kept in blobs (``blob_spans``), not in MESSAGES."""
        span = self.blob_spans.get(first.partition)
        return (
            span is not None
            and span[0] == first.topic
            and span[1] <= first.offset  # type: ignore[operator]
            and first.offset + count <= span[2]  # type: ignore[operator]
        )

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

    def document(
        self, store: Store, bookmark: Bookmark, stored: StoredMessage | None = None
    ) -> object:
        """The parsed message, for subscription filters (None when gone or unparseable);
        ``stored``: its local copy, if the caller has it."""
        docs = self._docs
        if bookmark in docs:
            return docs[bookmark]
        if stored is None:
            stored = self.stored_message(store, bookmark)
        doc = None if stored is None else self.exprs.document_of(stored)
        if len(docs) >= self.payload_cache_size:
            docs.clear()  # a bounded memo: filters re-match only on requeues
        docs[bookmark] = doc
        return doc

    def matcher(self, store: Store, expression: Expression) -> Callable[[Bookmark], bool]:
        """A subscription's content filter as the engine's predicate on bookmarks."""
        document = self.document
        if not expression.uses_record:

            def match(bookmark: Bookmark) -> bool:
                return expression.matches(document(store, bookmark))

            return match
        stored_message = self.stored_message

        def match_record(bookmark: Bookmark) -> bool:
            stored = stored_message(store, bookmark)
            if stored is None:
                return False
            record = record_of(stored, bookmark)
            return expression.matches(document(store, bookmark, stored), None, record)

        return match_record

    def stored_message(self, store: Store, bookmark: Bookmark) -> StoredMessage | None:
        """The local copy of a queued message: from the cache, else from the store."""
        stored = self.payload_cache.get(bookmark)
        if stored is None:
            stored = store.get_messages(self.name, [bookmark])[0]
        return stored

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

    def stored(self, store: Store, bookmarks: list[Bookmark]) -> list[StoredMessage | None]:
        """The stored copies of these messages in their order (None: not stored): from the
        cache, the rest in one store read."""
        out: list[StoredMessage | None] = list(map(self.payload_cache.get, bookmarks))
        # by identity: ``count(None)`` would call StoredMessage.__eq__ (Python) per message
        absent = sum(map(is_, out, repeat(None)))
        if absent == len(out):
            return store.get_messages(self.name, bookmarks)
        if absent:
            missing = [i for i, s in enumerate(out) if s is None]
            found = store.get_messages(self.name, [bookmarks[i] for i in missing])
            for i, s in zip(missing, found, strict=True):
                out[i] = s
        return out


def lookup(runtimes: Mapping[str, QueueRuntime], queue: str) -> QueueRuntime:
    """The runtime of a configured queue; ``UnknownQueue`` names the configured ones."""
    rt = runtimes.get(queue)
    if rt is None:
        raise UnknownQueue(
            f"queue {queue!r} is not configured (configured: {', '.join(sorted(runtimes))})"
        )
    return rt


def cache_payloads(
    cache: dict[Bookmark, StoredMessage],
    size: int,
    topic: str,
    partition: int,
    offsets: list[int],
    keys: list[bytes | None],
    values: list[bytes | None],
    stamps: list[int],
) -> None:
    """The first of a partition's plain messages (``offsets`` and their columns) into the
    payload ``cache``, as far as its ``size`` leaves room: by columns (``map``, in C)."""
    fits = min(len(offsets), size - len(cache))
    if fits > 0:
        bookmarks = zip(repeat(topic), repeat(partition), offsets[:fits])
        cache.update(
            zip(
                cast(Iterator[Bookmark], bookmarks),
                map(StoredMessage, keys[:fits], values[:fits], repeat(()), stamps[:fits]),
                strict=True,
            )
        )


def stretches(offsets: list[int]) -> list[tuple[int, int]]:
    """The stretches of consecutive offsets in ``offsets`` (ascending), as ``[first, end)``
    index pairs: one when there is no gap (the common case, told by its ends alone); a gap is
    a transaction marker's offset, never fetched."""
    if offsets[-1] - offsets[0] == len(offsets) - 1:
        return [(0, len(offsets))]
    cuts = [k for k in range(1, len(offsets)) if offsets[k] != offsets[k - 1] + 1]
    return list(zip([0, *cuts], [*cuts, len(offsets)], strict=True))
