"""Replay through a queue's name (AMPS's bookmark subscription to a queue).

The records of the queue's underlying topics from a point on, as plain publish/subscribe: a
consumer of its own (``assign``, no group, nothing committed) reads them in batches; nothing is
leased or acked and the queue's state is not touched (no changelog record, no store write, no
counter). Where each partition starts: after its bookmark for the partitions named by one, else
at the first record at or after ``since_ms``, else at its beginning. Where it ends: before the
first record at or after ``until_ms``; without ``follow``, at the end the partition had when
the replay began (the high watermark of its first fetch: ListOffsets is wrong on some brokers);
with ``follow``, never (until the client goes away), or once the wall clock is past
``until_ms`` and the partition is read to its end.

Blocking (librdkafka): ``ReplayReader.next_batch`` runs on a worker thread, one call at a time;
memory stays bounded by the batch size and librdkafka's prefetch limit set below.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaPartition

from layer.api.service import DeliveredMessage
from layer.config import QueueConfig
from layer.engine.model import Bookmark
from layer.exceptions import BrokerError, InvalidRequest

__all__ = ["BATCH", "ReplayReader", "start_points"]

log = logging.getLogger(__name__)

BATCH = 500  # records per consume call: one frame's worth, no per-record broker round trip
_PREFETCH_KB = 8 * 1024  # librdkafka's prefetch per partition (default 64 MiB)


def start_points(config: QueueConfig, since_bookmarks: Sequence[str]) -> dict[tuple[str, int], int]:
    """The first offset to replay per (topic, partition) named by a bookmark (the one after
    it); ``InvalidRequest`` for a malformed bookmark, one of another topic, or a partition
    named twice."""
    out: dict[tuple[str, int], int] = {}
    for text in since_bookmarks:
        try:
            bm = Bookmark.parse(text)
        except ValueError as exc:
            raise InvalidRequest(f"replay of queue {config.name!r}: {exc}") from None
        if not config.matches(bm.topic):
            raise InvalidRequest(
                f"replay of queue {config.name!r}: bookmark {text!r} is not of its topics "
                f"({config.underlying_topic!r})"
            )
        if (bm.topic, bm.partition) in out:
            raise InvalidRequest(
                f"replay of queue {config.name!r}: two bookmarks for {bm.topic}/{bm.partition}"
            )
        out[(bm.topic, bm.partition)] = bm.offset + 1
    return out


class ReplayReader:
    """One replay's consumer. ``open`` resolves topics and start offsets; ``next_batch`` gives
    the next records (``None`` once every partition is finished); ``close`` is idempotent and
    waits for a ``next_batch`` in progress."""

    def __init__(
        self,
        settings: Mapping[str, Any],
        config: QueueConfig,
        *,
        starts: Mapping[tuple[str, int], int],
        since_ms: int | None,
        until_ms: int | None,
        follow: bool,
        keep: Callable[[Message], tuple[bool, str | None]],
        timeout: float = 30.0,
    ) -> None:
        self._settings = {
            **settings,
            "enable.partition.eof": True,
            "queued.max.messages.kbytes": _PREFETCH_KB,
        }
        self._config = config
        self._starts = starts
        self._since_ms = since_ms
        self._until_ms = until_ms
        self._follow = follow
        self._keep = keep  # record -> (passes the filter, its payload's parse error)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self._closed = False
        # partitions still being read -> the offset they end before (None: no end)
        self._open: dict[tuple[str, int], int | None] = {}
        self._at_end: set[tuple[str, int]] = set()  # following: read to their end so far
        self._before_since: set[tuple[str, int]] = set()  # no record at or after since_ms yet
        self._ended: set[tuple[str, int]] = set()  # not following: their end is known
        self.read = 0  # records read (filtered or not)
        self.sent = 0

    def open(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                self._open_locked()
            except KafkaException as exc:
                raise BrokerError(f"replay of queue {self._config.name!r}: {exc}") from exc

    def _open_locked(self) -> None:
        config = self._config
        consumer = self._consumer = Consumer(self._settings)
        if config.topic_is_regex:
            meta = consumer.list_topics(timeout=self._timeout)
            topics = sorted(t for t in meta.topics if config.matches(t))
        else:
            meta = consumer.list_topics(config.underlying_topic, timeout=self._timeout)
            topics = [config.underlying_topic]
        partitions: list[tuple[str, int]] = []
        for topic in topics:
            tmeta = meta.topics.get(topic)
            if tmeta is None or tmeta.error is not None:
                continue  # not created yet: nothing to replay
            partitions.extend((topic, p) for p in sorted(tmeta.partitions))
        for key in self._starts:
            if key not in partitions:
                raise InvalidRequest(
                    f"replay of queue {config.name!r}: no partition {key[0]}/{key[1]}"
                )
        assigned: list[KafkaPartition] = []
        by_time = [
            KafkaPartition(t, p, self._since_ms)
            for t, p in partitions
            if (t, p) not in self._starts and self._since_ms is not None
        ]
        timed: dict[tuple[str, int], int] = {}
        if by_time:
            # a lower bound only: records before since_ms are skipped as they are read (some
            # brokers answer 0 here: Tansu has no time index)
            for tp in consumer.offsets_for_times(by_time, timeout=self._timeout):
                if tp.error is None and tp.offset >= 0:
                    timed[(tp.topic, tp.partition)] = tp.offset
                self._before_since.add((tp.topic, tp.partition))
        for t, p in partitions:
            start = self._starts.get((t, p))
            if start is None:
                start = timed.get((t, p), OFFSET_BEGINNING)
            # the end: set from the first fetch's high watermark (ListOffsets can be wrong)
            self._open[(t, p)] = None
            assigned.append(KafkaPartition(t, p, start))
        if assigned:
            consumer.assign(assigned)
        log.info(
            "queue=%s replay of %d partition(s) since=%s until=%s follow=%s",
            config.name,
            len(assigned),
            dict(self._starts) or self._since_ms,
            self._until_ms,
            self._follow,
        )

    def next_batch(self, wait: float = 0.5) -> list[DeliveredMessage] | None:
        """Up to ``BATCH`` records that pass the filter (possibly none yet), or None once every
        partition is finished (or the reader was closed)."""
        with self._lock:
            consumer = self._consumer
            if self._closed or consumer is None or not self._open:
                return None
            try:
                batch = consumer.consume(num_messages=BATCH, timeout=wait)
            except KafkaException as exc:
                raise BrokerError(f"replay of queue {self._config.name!r}: {exc}") from exc
            out: list[DeliveredMessage] = []
            until = self._until_ms
            opened = self._open
            name = self._config.name
            for msg in batch:
                err = msg.error()
                topic = cast(str, msg.topic())
                partition = cast(int, msg.partition())
                key = (topic, partition)
                if key not in opened:
                    continue  # finished: what the prefetch still brings
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if self._follow and (until is None or time.time() * 1000 < until):
                            self._at_end.add(key)
                            continue
                        self._finish(consumer, key)
                        continue
                    raise BrokerError(f"replay of queue {name!r}: {topic}/{partition}: {err}")
                offset = cast(int, msg.offset())
                end = opened[key]
                if end is None and not self._follow and key not in self._ended:
                    # the end the partition had at this first fetch: the replay stops there
                    high = consumer.get_watermark_offsets(
                        KafkaPartition(topic, partition), cached=True
                    )[1]
                    self._ended.add(key)
                    if high is not None and high > 0:
                        end = opened[key] = high
                self._at_end.discard(key)
                ts = msg.timestamp()[1]
                if (end is not None and offset >= end) or (until is not None and ts >= until):
                    self._finish(consumer, key)
                    continue
                if key in self._before_since:
                    if ts < cast(int, self._since_ms):
                        continue  # before the replay's start time
                    self._before_since.discard(key)
                self.read += 1
                value = msg.value()
                passes, error = self._keep(msg)
                if not passes:
                    continue
                headers = cast(list[tuple[str, bytes | None]], msg.headers() or [])
                out.append(
                    DeliveredMessage(
                        Bookmark(topic, partition, offset),
                        msg.key(),
                        value,
                        list(headers),
                        ts if ts > 0 else 0,
                        0,
                        0,
                        None,
                        False,
                        name,
                        error,
                    )
                )
                if end is not None and offset + 1 >= end:
                    self._finish(consumer, key)
            if self._at_end and until is not None and time.time() * 1000 >= until:
                for key in list(self._at_end):  # following, caught up, and past until
                    self._finish(consumer, key)
            self.sent += len(out)
            return out

    def _finish(self, consumer: Consumer, key: tuple[str, int]) -> None:
        del self._open[key]
        self._at_end.discard(key)
        consumer.pause([KafkaPartition(key[0], key[1])])  # fetch no more of it

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
        log.info("queue=%s replay ended: %d read, %d sent", self._config.name, self.read, self.sent)
