"""What a streaming view's Python worker keeps between micro-batches: the messages it fetched,
and a consumer per underlying partition that follows the partition's tail.

A micro-batch of a stream (``qlayer_view``) holds the changes of the last fraction of a second:
+1 for messages that just arrived (near the end of their partitions), -1 for messages that left
(most of which entered a micro-batch or two before). Fetching each batch's messages by offset
through new consumers cost most of a micro-batch on a busy broker (a Tansu fetch waits, and its
time grows with the partition's batches). Spark reuses its Python workers
(``spark.python.worker.reuse``, on by default), so a worker keeps, per process:

- ``MessageCache``: the messages it read, by bookmark (a Kafka record never changes, so a copy
  is exact), the oldest dropped beyond ``CACHE_MESSAGES``: a -1 finds its message there;
- ``Tail``: a consumer per partition, assigned once and read forward: librdkafka fetches ahead
  in the background, so a +1 of a message just published is usually in memory already.

Anything else (a message older than the tail's position and no longer cached, a tail that
fails) is fetched by offset as before (``connectors.spark_kafka.view.fetch_messages``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from connectors.spark_kafka.options import KafkaSourceOptions
from connectors.spark_kafka.reading import CONSUME_BATCH, message_offset
from layer.engine.model import Bookmark

__all__ = ["CACHE_MESSAGES", "MessageCache", "Tail", "follow"]

#: messages a worker process keeps (about 40 MB at 200-byte messages)
CACHE_MESSAGES = 100_000
#: a tail is moved (a new assignment) rather than read forward past a gap of more offsets
TAIL_GAP = 50_000
#: a tail that makes no progress this long is dropped (its offsets are fetched by offset)
TAIL_TIMEOUT_S = 10.0
#: what librdkafka may hold fetched ahead, per tail (kB)
TAIL_QUEUE_KB = 16_384


class MessageCache:
    """Messages by bookmark, the oldest dropped beyond ``limit``."""

    def __init__(self, limit: int = CACHE_MESSAGES) -> None:
        self._limit = limit
        self._messages: dict[Bookmark, Message] = {}

    def get(self, bookmark: Bookmark) -> Message | None:
        return self._messages.get(bookmark)

    def put(self, bookmark: Bookmark, message: Message) -> None:
        messages = self._messages
        if bookmark in messages:
            return
        messages[bookmark] = message
        if len(messages) > self._limit:
            del messages[next(iter(messages))]

    def __len__(self) -> int:
        return len(self._messages)


class Tail:
    """A consumer of one partition, read forward only (see the module docstring)."""

    def __init__(self, config: dict[str, Any], topic: str, partition: int, start: int) -> None:
        self.topic, self.partition = topic, partition
        self._consumer = Consumer(
            {**config, "queued.max.messages.kbytes": TAIL_QUEUE_KB, "enable.partition.eof": True}
        )
        self._consumer.assign([TopicPartition(topic, partition, start)])
        self.low = start  # offsets below it are not held any more
        self._next = start  # the next offset the consumer hands over
        self._ahead: dict[int, Message] = {}  # handed over past what was asked for

    def close(self) -> None:
        self._consumer.close()

    def read(self, offsets: list[int], timeout: float) -> dict[int, Message]:
        """The messages at ``offsets`` (sorted, none below ``low``), reading forward to the
        last of them; the ones not on the broker (deleted, aborted) are missing."""
        wanted = set(offsets)
        last = offsets[-1]
        ahead = self._ahead
        found = {o: ahead[o] for o in offsets if o in ahead}
        deadline = time.monotonic() + timeout
        while self._next <= last:
            messages = self._consumer.consume(num_messages=CONSUME_BATCH, timeout=0.05)
            moved = False
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        end = message_offset(message)
                        if end > self._next:
                            self._next, moved = end, True
                        continue
                    raise KafkaException(error)
                offset = message_offset(message)
                if offset in wanted:
                    found[offset] = message
                elif offset > last:
                    ahead[offset] = message
                self._next, moved = max(self._next, offset + 1), True
            if not messages:
                # transaction markers take offsets no record is handed over for
                position = self._consumer.position([TopicPartition(self.topic, self.partition)])
                if position and position[0].offset > self._next:
                    self._next, moved = position[0].offset, True
            if moved:
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise TimeoutError(
                    f"following {self.topic}/{self.partition}: no progress at offset"
                    f" {self._next} for {timeout:.0f}s"
                )
        self.low = last + 1
        for offset in [o for o in ahead if o < self.low]:
            del ahead[offset]
        return found


_CACHE = MessageCache()
_TAILS: dict[tuple[Any, ...], Tail] = {}


def _config_key(config: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, str(v)) for k, v in config.items() if k != "group.id"))


def follow(
    kafka: KafkaSourceOptions, bookmarks: Iterable[Bookmark]
) -> tuple[dict[Bookmark, Message], list[Bookmark]]:
    """The messages of ``bookmarks`` this process has cached or its tails can read forward, and
    the bookmarks it could not serve (to fetch by offset; their messages are cached by
    ``remember``)."""
    found: dict[Bookmark, Message] = {}
    by_partition: dict[tuple[str, int], list[int]] = {}
    for bm in bookmarks:
        message = _CACHE.get(bm)
        if message is not None:
            found[bm] = message
        else:
            by_partition.setdefault((bm.topic, bm.partition), []).append(bm.offset)
    rest: list[Bookmark] = []
    if not by_partition:
        return found, rest
    config = kafka.consumer_config()
    key = _config_key(config)
    timeout = min(kafka.poll_timeout_ms / 1000, TAIL_TIMEOUT_S)
    for (topic, partition), offsets in sorted(by_partition.items()):
        offsets.sort()
        tail_key = (key, topic, partition)
        tail = _TAILS.get(tail_key)
        if tail is not None:
            older = [o for o in offsets if o < tail.low]  # by offset; the tail stays
            rest.extend(Bookmark(topic, partition, o) for o in older)
            offsets = offsets[len(older) :]
            if not offsets:
                continue
            if offsets[0] > tail.low + TAIL_GAP:  # far ahead: start again there
                del _TAILS[tail_key]
                tail.close()
                tail = None
        try:
            if tail is None:
                tail = _TAILS[tail_key] = Tail(config, topic, partition, offsets[0])
            read = tail.read(offsets, timeout)
        except (KafkaException, TimeoutError):
            dropped = _TAILS.pop(tail_key, None)
            if dropped is not None:
                dropped.close()
            rest.extend(Bookmark(topic, partition, o) for o in offsets)
            continue
        for offset in offsets:
            message = read.get(offset)
            bm = Bookmark(topic, partition, offset)
            if message is None:
                rest.append(bm)  # not on the broker any more: the fetch by offset says so
            else:
                _CACHE.put(bm, message)
                found[bm] = message
    return found, rest


def remember(messages: dict[Bookmark, Message]) -> None:
    """Messages fetched by offset, for the micro-batches that follow."""
    for bm, message in messages.items():
        _CACHE.put(bm, message)
