"""Reading a queue's underlying topics: one reader thread per queue, batches handed to the loop.

Each queue tracks its topics independently (many queues may share a topic), so each has its own
consumer. The coordinator owns partition assignment itself (``assign()``, no consumer group):
positions come from the queue's own state, never from group offsets.

Flow control: the reader stops fetching while the loop holds ``max_buffered`` unprocessed
messages, so a queue with a target depth, or a slow loop, never makes memory grow.

Fetch wait: the broker profile's ``fetch.wait.max.ms`` is short on Tansu (it is the floor of every
delivery's latency there), but Tansu's fetch time grows with the number of record batches in the
partition, and when the wait runs out first the fetch comes back empty. Measured on Tansu 0.6.0:
40,000 one-message batches (a producer with ``linger.ms=0``) are unreadable at 10 ms and read in
2 s at 50 ms; at 150,000 nothing comes back at 50 ms, and everything in 1.5 s at 500 ms, from any
offset. So the reader lets the wait grow while fetches come back empty although a partition lags
behind its high watermark (``FetchWait``), and steps back once caught up. On Kafka a fetch
answers as soon as data is there, and this never triggers.

Kafka away: the consumer keeps its positions and librdkafka reconnects by itself, so a reader
only reports transport errors (``on_trouble``, to the coordinator's Kafka watch) and carries on;
a failed metadata refresh is tried again with backoff. Only an error that is not Kafka's
(``error``) ends the reader.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition

from connectors.kafka import FetchWait, read_watermarks
from layer.engine.model import Bookmark, TopicPartition
from layer.exceptions import BrokerError

log = logging.getLogger(__name__)

# Consumer error events that mean "the broker is not answering now": librdkafka retries them.
_TRANSPORT_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._MSG_TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
    }
)


def bookmark_of(msg: Message) -> Bookmark:
    """A fetched (error-free) message's bookmark; librdkafka fills all three for those."""
    return Bookmark(msg.topic(), msg.partition(), msg.offset())  # type: ignore[arg-type]


_ERROR = Message.error
_TOPIC = Message.topic
_PARTITION = Message.partition
_OFFSET = Message.offset


def last_offsets(msgs: list[Message]) -> dict[TopicPartition, int]:
    """The last offset of each partition among error-free fetched ``msgs`` (in offset order per
    partition, as a consumer hands them over). Per batch: the three fields are read by mapping
    their C methods over the batch and reduced by a dict, last value winning; a Python object
    is made per partition only."""
    if not msgs:
        return {}
    last = dict(
        zip(
            zip(map(_TOPIC, msgs), map(_PARTITION, msgs), strict=True),
            map(_OFFSET, msgs),
            strict=True,
        )
    )
    # an error-free fetched message has all three (librdkafka)
    return {
        TopicPartition(cast(str, t), cast(int, p)): cast(int, offset)
        for (t, p), offset in last.items()
    }


@dataclass(frozen=True, slots=True)
class PartitionStarted:
    """A partition the queue has never tracked starts at ``offset`` (start_from resolved)."""

    partition: TopicPartition
    offset: int


@dataclass(slots=True)
class Fetched:
    """One fetch: messages in offset order per partition, plus per-partition high watermarks."""

    messages: list[Message]
    high_watermarks: dict[TopicPartition, int]
    started: list[PartitionStarted]
    at: float = 0.0  # wall clock when the reader had it (latency stages)


class IngestReader:
    """Reads the underlying topics of one queue in a thread; ``on_batch`` runs in that thread."""

    def __init__(
        self,
        queue: str,
        consumer_settings: dict[str, object],
        topic: str,
        topic_is_regex: bool,
        positions: dict[TopicPartition, int],
        start_from: str,
        on_batch: Callable[[Fetched], None],
        buffered: Callable[[], int],
        max_buffered: int = 20_000,
        batch_size: int = 2_000,
        refresh_interval: float = 5.0,
        on_trouble: Callable[[str], None] | None = None,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> None:
        self._queue = queue
        # a shard of a partitioned queue (layer.shards) reads one partition of its topic,
        # of the ``partitions`` its queue expects
        self._partition = partition
        self._partitions = partitions
        self._told_extra = False
        self._settings = dict(consumer_settings)
        self._topic = topic
        self._pattern = re.compile(topic) if topic_is_regex else None
        self._positions = dict(positions)
        self._start_from = start_from
        self._on_batch = on_batch
        self._buffered = buffered
        self._max_buffered = max_buffered
        self._batch_size = batch_size
        self._refresh_interval = refresh_interval
        self._on_trouble = on_trouble or (lambda reason: None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ingest-{queue}", daemon=True)
        self._assigned: set[TopicPartition] = set()
        self._next: dict[TopicPartition, int] = {}  # the next offset to read, per partition
        self._wait = FetchWait(int(cast(int, self._settings.get("fetch.wait.max.ms", 500))))
        self._started: list[PartitionStarted] = []  # resolved at assignment, not reported yet
        self.error: BaseException | None = None

    @property
    def fetch_wait_ms(self) -> int:
        """The fetch wait in force (the profile's, unless fetches came back empty: FetchWait)."""
        return self._wait.wait_ms

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _matching_partitions(self, consumer: Consumer) -> list[TopicPartition]:
        if self._pattern is None:
            md = consumer.list_topics(self._topic, timeout=10)
            topics = {self._topic: md.topics.get(self._topic)}
        else:
            md = consumer.list_topics(timeout=10)
            topics = {
                name: meta
                for name, meta in md.topics.items()
                if not name.startswith("__") and self._pattern.fullmatch(name)
            }
        found: list[TopicPartition] = []
        for name, meta in topics.items():
            if meta is None or meta.error is not None:
                continue
            found.extend(TopicPartition(name, p) for p in meta.partitions)
        if self._partition is None:
            return found
        if self._partitions is not None and not self._told_extra:
            extra = sorted(tp.partition for tp in found if tp.partition >= self._partitions)
            if extra and self._partition == 0:  # one shard says so
                self._told_extra = True
                log.error(
                    "queue=%s topic %s has partitions %s beyond the queue's partitions = %d:"
                    " their messages are not served",
                    self._queue,
                    self._topic,
                    extra,
                    self._partitions,
                )
        return [tp for tp in found if tp.partition == self._partition]

    def _refresh_assignment(self, consumer: Consumer) -> None:
        new = [tp for tp in self._matching_partitions(consumer) if tp not in self._assigned]
        if not new:
            return
        # "latest" is the high watermark from a fetch response: ListOffsets(latest), which
        # OFFSET_END would use, is wrong on some brokers (Tansu: the last batch's base offset + 1)
        fresh = [tp for tp in new if tp not in self._positions]
        latest: dict[tuple[str, int], int] = {}
        if fresh and self._start_from == "latest":
            marks = read_watermarks(self._settings, [(t.topic, t.partition) for t in fresh])
            latest = {tp: m.high for tp, m in marks.items()}
        assign = []
        for tp in sorted(new):
            if tp in self._positions:
                offset = self._positions[tp]
            elif self._start_from == "latest":
                offset = latest[(tp.topic, tp.partition)]
                self._started.append(PartitionStarted(tp, offset))
            else:
                # From the beginning, Kafka's first offset is 0 unless retention removed the
                # head; a partition that starts later simply has a gap below its first message.
                offset = OFFSET_BEGINNING
                self._started.append(PartitionStarted(tp, 0))
            assign.append(KafkaTopicPartition(tp.topic, tp.partition, offset))
            self._assigned.add(tp)
            self._next[tp] = max(offset, 0)
        consumer.incremental_assign(assign)
        log.info(
            "queue=%s assigned partitions=%s",
            self._queue,
            [f"{a.topic}/{a.partition}" for a in assign],
        )

    def _lag(self, consumer: Consumer) -> dict[TopicPartition, int]:
        """How far each assigned partition is behind its high watermark (librdkafka's cached
        one: fetch responses carry it even when they bring no records), from the consumer's
        position where it has one: it moves past transaction markers, which are never
        delivered, so a topic written in transactions does not look behind when it is not."""
        assigned = sorted(self._assigned)
        positions = consumer.position(
            [KafkaTopicPartition(tp.topic, tp.partition) for tp in assigned]
        )
        lag = {}
        for tp, position in zip(assigned, positions, strict=True):
            _low, high = consumer.get_watermark_offsets(
                KafkaTopicPartition(tp.topic, tp.partition), cached=True
            )
            at = max(self._next.get(tp, 0), position.offset)
            lag[tp] = high - at if high >= 0 else 0
        return lag

    def _lagging(self, consumer: Consumer) -> bool:
        return any(n > 0 for n in self._lag(consumer).values())

    def _caught_up(self, consumer: Consumer) -> bool:
        return not self._lagging(consumer)

    def _reopen(self, consumer: Consumer, wait_ms: int) -> Consumer:
        """A consumer with ``fetch.wait.max.ms = wait_ms``, at the positions read so far."""
        lag = sum(self._lag(consumer).values())
        consumer.close()
        self._settings["fetch.wait.max.ms"] = wait_ms
        fresh = Consumer(self._settings)
        fresh.assign(
            [KafkaTopicPartition(tp.topic, tp.partition, self._next[tp]) for tp in self._assigned]
        )
        log.info("queue=%s fetch.wait.max.ms=%d (lag %d)", self._queue, wait_ms, lag)
        return fresh

    def _refresh(self, consumer: Consumer) -> bool:
        """``_refresh_assignment``; False (reported, to be tried again) when Kafka failed it."""
        try:
            self._refresh_assignment(consumer)
        except (KafkaException, BrokerError) as exc:
            self._on_trouble(f"queue={self._queue} topic metadata: {exc}")
            return False
        return True

    def take(self, consumer: Consumer, msgs: list[Message]) -> list[Message]:
        """One fetch handed over (``on_batch``), with the partitions started since the last and
        the high watermarks of the partitions it read; its error-free messages returned.

        Per batch, not per message: the errors are read by mapping ``Message.error`` over the
        fetch (one without any, the common case, is handed over whole), and the last offset of
        each partition comes from ``last_offsets``."""
        # any(): a KafkaError is true; comparing one with None (list.count) raises
        errors = list(map(_ERROR, msgs))
        good = self._sort_errors(msgs, errors) if any(errors) else msgs
        started, self._started = self._started, []
        if not good and not started:
            return good
        hw: dict[TopicPartition, int] = {}
        for tp, last in last_offsets(good).items():
            self._next[tp] = max(self._next.get(tp, 0), last + 1)
            _low, high = consumer.get_watermark_offsets(
                KafkaTopicPartition(tp.topic, tp.partition), cached=True
            )
            if high >= 0:
                hw[tp] = high
        self._on_batch(Fetched(good, hw, started, time.time()))
        return good

    def _sort_errors(self, msgs: list[Message], errors: list[KafkaError | None]) -> list[Message]:
        """The error-free messages of a fetch; the errors reported (end of partition: none)."""
        good: list[Message] = []
        for m, err in zip(msgs, errors, strict=True):
            if err is None:
                good.append(m)
            elif err.code() == KafkaError._PARTITION_EOF:
                continue
            elif err.code() in _TRANSPORT_CODES or err.retriable():
                self._on_trouble(f"queue={self._queue} fetch: {err}")
            else:
                log.warning("queue=%s fetch error: %s", self._queue, err)
        return good

    def _run(self) -> None:
        consumer = Consumer(self._settings)
        try:
            next_refresh = 0.0
            retry = 0.2  # the wait after a failed refresh, doubled up to the refresh interval
            paused = False
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_refresh:
                    if self._refresh(consumer):
                        retry = 0.2
                        next_refresh = now + self._refresh_interval
                    else:
                        next_refresh = now + retry
                        retry = min(retry * 2, self._refresh_interval)
                    if not self._assigned:
                        self._stop.wait(0.05)
                        continue
                if self._buffered() >= self._max_buffered:
                    if not paused and self._assigned:
                        consumer.pause(consumer.assignment())
                        paused = True
                        self._wait.reset()
                    self._stop.wait(0.005)
                    # keep the consumer's session and fetch state alive while paused
                    consumer.poll(0)
                    continue
                if paused:
                    consumer.resume(consumer.assignment())
                    paused = False
                # A batch consume waits its whole timeout unless the batch fills, which at a
                # light load would add the timeout to every delivery: wait for the first
                # message only, then take what is already fetched without waiting.
                msgs = consumer.consume(self._batch_size, 0)
                if not msgs:
                    first = consumer.poll(0.05)
                    if first is None:
                        wait_ms = self._wait.empty(
                            time.monotonic(), partial(self._lagging, consumer)
                        )
                        if wait_ms is not None:
                            consumer = self._reopen(consumer, wait_ms)
                        continue
                    msgs = [first, *consumer.consume(self._batch_size - 1, 0)]
                good = self.take(consumer, msgs)
                if good:
                    wait_ms = self._wait.fetched(
                        time.monotonic(), partial(self._caught_up, consumer)
                    )
                    if wait_ms is not None:
                        consumer = self._reopen(consumer, wait_ms)
        except BaseException as exc:  # reported to the loop, which fails the coordinator
            self.error = exc
            log.exception("queue=%s ingest reader failed", self._queue)
        finally:
            consumer.close()
