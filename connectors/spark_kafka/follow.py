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

The same tails read a stream's ranges of the view topic itself (``span``): each micro-batch's
range starts where the last one ended, so the tail is there already (a new consumer per
micro-batch cost 80-500 ms under load). A tail no task used for ``TAIL_IDLE_S`` is closed, and a
view generation's once the stream's last range of it is read (or when a task reads a newer
one): the coordinator deletes old generations, and librdkafka crashes the process on Tansu when
a topic is deleted under an assigned consumer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from connectors.kafka import FetchWait, cached_high_watermark
from connectors.spark_kafka import reading
from connectors.spark_kafka.options import KafkaSourceOptions
from connectors.spark_kafka.reading import CONSUME_BATCH, message_offset, take
from layer.engine.model import Bookmark

__all__ = ["CACHE_MESSAGES", "MessageCache", "Tail", "close", "follow", "remember", "span"]

#: messages a worker process keeps (about 40 MB at 200-byte messages)
CACHE_MESSAGES = 100_000
#: a tail is moved (a new assignment) rather than read forward past a gap of more offsets
TAIL_GAP = 50_000
#: a tail that makes no progress this long is dropped (its offsets are fetched by offset)
TAIL_TIMEOUT_S = 10.0
#: what librdkafka may hold fetched ahead, per tail (kB)
TAIL_QUEUE_KB = 16_384
#: a tail no task used this long is closed
TAIL_IDLE_S = 60.0
#: a range of more offsets is not read by a tail (it would hold the whole range in memory)
SPAN_LIMIT = 10_000


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
        self._config = {
            **config,
            "queued.max.messages.kbytes": TAIL_QUEUE_KB,
            "enable.partition.eof": True,
        }
        # Tansu answers a fetch empty when it cannot serve it within the wait, and its fetch
        # time grows with the partition's record batches: at 1,000 one-message batches a
        # second a tail at 10 ms made no progress after ~25,000 of them (follow() then waited
        # out TAIL_TIMEOUT_S, 16-24 s, where a fetch by offset at the grown wait took 0.4 s).
        # So the wait grows as consume_range's does, from what this process learned already.
        self._where = (str(config.get("bootstrap.servers")), topic, partition)
        self._wait = FetchWait(int(self._config.get("fetch.wait.max.ms", 500)))
        learned = reading._LEARNED_WAIT.get(self._where)
        if learned is not None:
            self._config["fetch.wait.max.ms"] = self._wait.wait_ms = learned
        self._consumer = Consumer(self._config)
        self._consumer.assign([TopicPartition(topic, partition, start)])
        self.low = start  # offsets below it are not held any more
        self._next = start  # the next offset the consumer hands over
        self._ahead: dict[int, Message] = {}  # handed over past what was asked for
        self.used = time.monotonic()

    def close(self) -> None:
        self._consumer.close()

    def read(self, offsets: list[int], timeout: float) -> dict[int, Message]:
        """The messages at ``offsets`` (sorted, none below ``low``), reading forward to the
        last of them; the ones not on the broker (deleted, aborted) are missing."""
        wanted = set(offsets)
        return self._read_to(offsets[-1] + 1, timeout, wanted.__contains__)

    def span(self, start: int, end: int, timeout: float) -> list[Message]:
        """The records of offsets ``[start, end)`` (``start`` not below ``low``), in order."""
        found = self._read_to(end, timeout, lambda offset: offset >= start)
        return [found[offset] for offset in sorted(found)]

    def _read_to(
        self, stop: int, timeout: float, wanted: Callable[[int], bool]
    ) -> dict[int, Message]:
        """Read forward until the next offset is ``stop`` or past it: the messages below
        ``stop`` that are ``wanted`` (read now or ahead before); those past it kept ahead."""
        self.used = time.monotonic()
        ahead = self._ahead
        found = {o: m for o, m in ahead.items() if o < stop and wanted(o)}
        deadline = time.monotonic() + timeout
        while self._next < stop:
            messages = take(self._consumer, CONSUME_BATCH, 0.05)
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
                if offset >= stop:
                    ahead[offset] = message
                elif wanted(offset):
                    found[offset] = message
                self._next, moved = max(self._next, offset + 1), True
            if not messages:
                # transaction markers take offsets no record is handed over for
                position = self._consumer.position([TopicPartition(self.topic, self.partition)])
                if position and position[0].offset > self._next:
                    self._next, moved = position[0].offset, True
                elif (wait_ms := self._wait.empty(time.monotonic(), self._lagging)) is not None:
                    self._refetch(wait_ms)
            else:
                self._wait.fetched(time.monotonic(), lambda: False)  # never steps back
            if moved:
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise TimeoutError(
                    f"following {self.topic}/{self.partition}: no progress at offset"
                    f" {self._next} for {timeout:.0f}s"
                )
        self.low = stop
        for offset in [o for o in ahead if o < stop]:
            del ahead[offset]
        return found

    def _lagging(self) -> bool:
        """Whether the broker holds records past the tail's position (its fetches came back
        empty behind the high watermark, not at the partition's end)."""
        high = cached_high_watermark(self._consumer, self.topic, self.partition)
        return high is None or high > self._next

    def _refetch(self, wait_ms: int) -> None:
        """Go on from the next offset with a consumer whose fetches wait ``wait_ms``."""
        self._consumer.close()
        self._config["fetch.wait.max.ms"] = wait_ms
        reading._LEARNED_WAIT[self._where] = wait_ms
        self._consumer = Consumer(self._config)
        self._consumer.assign([TopicPartition(self.topic, self.partition, self._next)])


_CACHE = MessageCache()
_TAILS: dict[tuple[Any, ...], Tail] = {}


def _config_key(config: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, str(v)) for k, v in config.items() if k != "group.id"))


def _drop(key: tuple[Any, ...]) -> None:
    tail = _TAILS.pop(key, None)
    if tail is not None:
        tail.close()


def _drop_idle(now: float) -> None:
    """Close the tails no task used for ``TAIL_IDLE_S`` (a stream that stopped): they fetch
    for nothing, and one must not stay on a view generation the coordinator deletes."""
    for key in [key for key, tail in _TAILS.items() if now - tail.used > TAIL_IDLE_S]:
        _drop(key)


def span(
    kafka: KafkaSourceOptions,
    topic: str,
    partition: int,
    start: int,
    end: int,
    related: Callable[[str], bool] = lambda _topic: False,
    keep: bool = True,
) -> list[Message] | None:
    """The records of offsets ``[start, end)`` of a (view-topic) partition, in order, read
    forward by this process's tail of it (a stream's next micro-batch starts where the last
    ended, so the tail is there already); None when that is not possible (the caller reads the
    range by a consumer of its own). The tails of ``related`` topics (the other generations
    of the same view topic) are closed first: a stream does not go back to an older one. With
    ``keep`` false the tail is closed once the range is read (the stream's last range of an old
    generation, which the coordinator may delete)."""
    if end - start > SPAN_LIMIT:
        return None
    config = kafka.consumer_config()
    key = _config_key(config)
    _drop_idle(time.monotonic())
    for other in [k for k in _TAILS if k[0] == key and k[1] != topic and related(k[1])]:
        _drop(other)
    tail_key = (key, topic, partition)
    tail = _TAILS.get(tail_key)
    if tail is not None and not tail.low <= start <= tail.low + TAIL_GAP:
        _drop(tail_key)
        tail = None
    try:
        if tail is None:
            tail = _TAILS[tail_key] = Tail(config, topic, partition, start)
        records = tail.span(start, end, min(kafka.poll_timeout_ms / 1000, TAIL_TIMEOUT_S))
    except (KafkaException, TimeoutError):
        _drop(tail_key)
        return None
    if not keep:
        _drop(tail_key)
    return records


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
    _drop_idle(time.monotonic())
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


def close() -> None:
    """Close this process's tails (a process that ends closes them anyway)."""
    for key in list(_TAILS):
        _drop(key)


def remember(messages: dict[Bookmark, Message]) -> None:
    """Messages fetched by offset, for the micro-batches that follow."""
    for bm, message in messages.items():
        _CACHE.put(bm, message)
