"""Reading one Spark task's offsets ``[start, end)`` of one Kafka partition, on an executor."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from pyspark.sql.datasource import InputPartition

from connectors.kafka import FetchWait, cached_high_watermark
from connectors.spark_kafka.options import TP, KafkaSourceOptions, Offsets
from layer.exceptions import BrokerError

if TYPE_CHECKING:
    import pyarrow as pa

# A range reader asks librdkafka for this many messages per consume() call and hands Spark one
# Arrow batch per this many rows.
CONSUME_BATCH = 5000
ROWS_PER_ARROW_BATCH = 10_000


class KafkaInputPartition(InputPartition):
    """One Spark task: offsets ``[start, end)`` of one Kafka partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"KafkaInputPartition({self.topic}/{self.partition} [{self.start}, {self.end}))"


def low_watermarks(consumer: Consumer, partitions: Sequence[TP], timeout: float) -> Offsets:
    """The low watermarks of ``partitions`` (ListOffsets(earliest) is right on every broker)."""
    result = {}
    for topic, partition in partitions:
        try:
            low, _high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
        except KafkaException as exc:
            raise BrokerError(
                f"cannot read the low watermark of {topic}/{partition}: {exc}"
            ) from exc
        result[(topic, partition)] = int(low)
    return result


def as_range(partition: InputPartition | None, source: str) -> KafkaInputPartition | None:
    """The range Spark hands ``read``; None for the empty partition Spark reads when none was
    planned (None in 4.0, ``InputPartition(None)`` in 4.2)."""
    if isinstance(partition, KafkaInputPartition):
        return partition
    if partition is None or getattr(partition, "value", None) is None:
        return None
    raise TypeError(f"{source} reads KafkaInputPartition, got {type(partition).__name__}")


def take(consumer: Consumer, limit: int, timeout: float) -> list[Message]:
    """Up to ``limit`` messages (and events): the first waited for up to ``timeout``, the rest
    only what librdkafka already holds. (``consume(limit, timeout)`` waits the whole timeout
    unless ``limit`` arrive, which the last call of a range with transaction markers never
    sees: a micro-batch paid it for every range it read.)"""
    first = consumer.poll(timeout)
    if first is None:
        return []
    if limit <= 1:
        return [first]
    return [first, *consumer.consume(num_messages=limit - 1, timeout=0)]


# The fetch wait each partition needed, per (bootstrap servers, topic, partition), for the
# reads that follow in this process (they only grow: a partition's batches never get fewer).
_LEARNED_WAIT: dict[tuple[str, str, int], int] = {}


def consume_range(
    options: KafkaSourceOptions, task: KafkaInputPartition
) -> Iterator[list[Message]]:
    """The records of ``task``, in offset order, in lists as librdkafka hands them over.

    Offsets are not contiguous: transaction markers (and compacted or aborted records) take
    offsets no record is delivered for. So the range is done when a record at or past ``end``
    arrives, when the partition's end is reached at or past ``end`` (an end-of-partition event),
    or when the consumer's position (which moves past skipped markers) reaches ``end``.
    """
    if task.start >= task.end:
        return
    config = options.consumer_config()
    # Some brokers (Tansu) answer a fetch empty when it cannot be served within the wait (their
    # fetch time grows with the partition's number of record batches): let the wait grow then,
    # and start the next read of this partition (a worker process reads many) where it ended.
    where = (options.bootstrap_servers, task.topic, task.partition)
    wait = FetchWait(int(config["fetch.wait.max.ms"]))
    learned = _LEARNED_WAIT.get(where)
    if learned is not None:
        config["fetch.wait.max.ms"] = wait.wait_ms = learned
    consumer = Consumer(config)
    timeout = options.poll_timeout_ms / 1000
    try:
        consumer.assign([TopicPartition(task.topic, task.partition, task.start)])
        next_offset = task.start
        deadline = time.monotonic() + timeout
        while next_offset < task.end:
            # Never more than the offsets left.
            wanted = min(CONSUME_BATCH, task.end - next_offset)
            messages = take(consumer, wanted, 0.1)
            before = next_offset
            records: list[Message] = []
            for message in messages:
                error = message.error()
                if error is None:
                    offset = message_offset(message)
                    if offset >= task.end:
                        next_offset = task.end
                        break
                    records.append(message)
                    next_offset = offset + 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    next_offset = max(next_offset, message_offset(message))
                else:
                    raise _read_error(task, next_offset, error)
            if not messages:
                position = consumer.position([TopicPartition(task.topic, task.partition)])[0]
                next_offset = max(next_offset, position.offset)
                wait_ms = wait.empty(time.monotonic(), lambda: True)
                if wait_ms is not None and next_offset < task.end:
                    consumer.close()
                    consumer = Consumer({**config, "fetch.wait.max.ms": wait_ms})
                    consumer.assign([TopicPartition(task.topic, task.partition, next_offset)])
                    _LEARNED_WAIT[where] = wait_ms
            else:
                wait.fetched(time.monotonic(), lambda: False)
            if records:
                yield records
            if next_offset > before:
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise BrokerError(
                    f"reading {task.topic}/{task.partition} [{task.start}, {task.end}) stalled at"
                    f" offset {next_offset} for {timeout:.0f}s (kafkaConsumer.pollTimeoutMs);"
                    f" fetched high watermark"
                    f" {cached_high_watermark(consumer, task.topic, task.partition)}"
                )
    finally:
        consumer.close()


def read_range(
    options: KafkaSourceOptions, task: KafkaInputPartition | None
) -> Iterator[pa.RecordBatch]:
    """The records of ``task`` as Arrow batches with the kafka source's columns."""
    if task is None or task.start >= task.end:
        return
    import pyarrow as pa  # on the executors only; the driver never builds batches

    batch = _ArrowBatch(task.topic, task.partition, options.include_headers)
    for records in consume_range(options, task):
        for message in records:
            batch.add(message)
        if len(batch) >= ROWS_PER_ARROW_BATCH:
            yield batch.flush(pa)
    if len(batch):
        yield batch.flush(pa)


def _read_error(task: KafkaInputPartition, offset: int, error: KafkaError) -> BrokerError:
    if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        return BrokerError(
            f"offset {offset} of {task.topic}/{task.partition} is no longer on the broker: some"
            f" data may have been lost (set failOnDataLoss=false to skip it): {error}"
        )
    return BrokerError(f"reading {task.topic}/{task.partition} at offset {offset}: {error}")


def message_offset(message: Message) -> int:
    offset = message.offset()
    return -1 if offset is None else int(offset)


# Kafka's TimestampType ids (Spark's timestampType column) by confluent-kafka's constants.
_TIMESTAMP_TYPES = {0: -1, 1: 0, 2: 1}  # not available, create time, log append time


class _ArrowBatch:
    """Columns of the records read so far, turned into one ``pyarrow.RecordBatch`` at a time."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self._topic = topic
        self._partition = partition
        self._include_headers = include_headers
        self._clear()

    def _clear(self) -> None:
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._offsets: list[int] = []
        self._timestamps: list[int] = []
        self._timestamp_types: list[int] = []
        self._headers: list[list[tuple[str, bytes | None]] | None] = []

    def __len__(self) -> int:
        return len(self._offsets)

    def add(self, message: Message) -> None:
        self._keys.append(message.key())
        self._values.append(message.value())
        self._offsets.append(message_offset(message))
        kind, millis = message.timestamp()
        self._timestamps.append(millis * 1000)
        self._timestamp_types.append(_TIMESTAMP_TYPES.get(kind, -1))
        if self._include_headers:
            # Spark gives null, not an empty array, for a record without headers.
            self._headers.append(cast(list[tuple[str, bytes | None]], message.headers()) or None)

    def flush(self, pa: Any) -> pa.RecordBatch:
        rows = len(self._offsets)
        columns = [
            pa.array(self._keys, pa.binary()),
            pa.array(self._values, pa.binary()),
            pa.array([self._topic] * rows, pa.string()),
            pa.array([self._partition] * rows, pa.int32()),
            pa.array(self._offsets, pa.int64()),
            pa.array(self._timestamps, pa.timestamp("us", tz="UTC")),
            pa.array(self._timestamp_types, pa.int32()),
        ]
        names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
        if self._include_headers:
            header = pa.struct([("key", pa.string()), ("value", pa.binary())])
            columns.append(pa.array(self._headers, pa.list_(pa.field("element", header))))
            names.append("headers")
        self._clear()
        return pa.RecordBatch.from_arrays(columns, names=names)
