"""The ``qlayer_view`` data source: a queue's view topic as typed, signed changes.

A coordinator publishes every change of a queue's live contents (what ``browse`` shows) to the
queue's ``view_topic``: Kafka key the bookmark, value an Avro ``ViewChange``
(``avro/view_change.avsc``) with ``sign`` +1 when the message entered the live contents and -1
when it left them; both carry the message. This source reads that topic with the ``qlayer_kafka``
machinery (same options, partitions and offsets) and decodes each record into columns::

    sign, queue, bookmark, topic, partition, offset, key, headers, value, priority,
    deliveries, cancels, enqueue_time, changed_at, view_partition, view_offset

``view_partition``/``view_offset`` are the record's place in the view topic (its order).

Options: those of ``qlayer_kafka`` (``kafka.bootstrap.servers``, ``subscribe``...), with these
differences: ``startingOffsets`` defaults to ``earliest`` in streaming too;
``kafka.isolation.level`` defaults to ``read_committed`` (the coordinator writes in
transactions); ``includeHeaders`` and ``maxOffsetsPerTrigger`` are refused. And one option of
its own:

- ``snapshot`` (default true): a range that starts at the beginning of a partition is read as the
  live contents at its end (per bookmark the last record, kept if it is +1) instead of every
  change. A batch read from ``earliest`` then *is* the live contents, and a stream's first
  micro-batch is the contents at its end, followed by the changes. This is also what keeps a
  read from the beginning right on a compacted topic, where a -1 may survive its +1.
  ``false``: every record, as written.

A subscribed topic that does not exist is an error (a coordinator creates its view topic when it
starts): a view of nothing would look like an empty queue.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from connectors.spark_kafka.broker import BrokerView
from connectors.spark_kafka.options import KafkaSourceOptions, boolean_option
from connectors.spark_kafka.reading import (
    ROWS_PER_ARROW_BATCH,
    KafkaInputPartition,
    as_range,
    consume_range,
    message_offset,
)
from connectors.spark_kafka.source import KafkaBatchReader, KafkaDataSource, KafkaStreamReader
from layer.exceptions import ConfigError, SerializationError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

VIEW_FORMAT = "qlayer_view"

_REFUSED_OPTIONS = {
    "includeheaders": "the headers column is always there: the message's headers",
    "maxoffsetspertrigger": "a stream's first micro-batch must read the whole topic to be the"
    " live contents",
}


def view_schema() -> StructType:
    """The columns of ``qlayer_view``."""
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField("sign", IntegerType(), False),
            StructField("queue", StringType()),
            StructField("bookmark", StringType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("key", BinaryType()),
            StructField("headers", ArrayType(header)),
            StructField("value", BinaryType()),
            StructField("priority", LongType()),
            StructField("deliveries", IntegerType()),
            StructField("cancels", IntegerType()),
            StructField("enqueue_time", TimestampType()),
            StructField("changed_at", TimestampType()),
            StructField("view_partition", IntegerType()),
            StructField("view_offset", LongType()),
        ]
    )


@dataclass(frozen=True, slots=True)
class ViewSourceOptions:
    """The options of one ``qlayer_view`` read: the Kafka ones and ``snapshot``."""

    kafka: KafkaSourceOptions
    snapshot: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ViewSourceOptions:
        given = {key.lower(): str(value) for key, value in options.items()}
        for key, why in _REFUSED_OPTIONS.items():
            if key in given:
                raise ConfigError(f"option {key!r} is not supported by {VIEW_FORMAT}: {why}")
        snapshot = boolean_option("snapshot", given.pop("snapshot", "true"))
        given.setdefault("kafka.isolation.level", "read_committed")
        given.setdefault("startingoffsets", "earliest")
        return cls(KafkaSourceOptions.parse(given, source=VIEW_FORMAT), snapshot)


class ViewInputPartition(KafkaInputPartition):
    """A range of a view topic; ``snapshot``: read it as the live contents at its end."""

    def __init__(self, topic: str, partition: int, start: int, end: int, snapshot: bool) -> None:
        super().__init__(topic, partition, start, end)
        self.snapshot = snapshot

    def __repr__(self) -> str:
        kind = "snapshot" if self.snapshot else "changes"
        return (
            f"ViewInputPartition({self.topic}/{self.partition} [{self.start}, {self.end}) {kind})"
        )


def _check_topics(options: KafkaSourceOptions) -> None:
    """A subscribed view topic must exist: reading none would look like an empty queue."""
    subscription = options.subscription
    wanted = set(subscription.topics) | {topic for topic, _p in subscription.partitions}
    if not wanted:
        return
    with BrokerView(options) as broker:
        missing = sorted(wanted - set(broker.topics()))
    if missing:
        raise ConfigError(
            f"view topic {', '.join(missing)} does not exist at {options.bootstrap_servers}: a"
            " coordinator creates it when it starts with view_topic set on the queue"
        )


def _mark(options: ViewSourceOptions, ranges: Sequence[InputPartition]) -> list[ViewInputPartition]:
    """The ranges, each marked snapshot when it starts at its partition's beginning."""
    tasks = [r for r in ranges if isinstance(r, KafkaInputPartition)]
    starts: dict[tuple[str, int], int] = {}
    if options.snapshot and tasks:
        with BrokerView(options.kafka) as broker:
            starts = broker.earliest(sorted({(t.topic, t.partition) for t in tasks}))
    return [
        ViewInputPartition(
            t.topic,
            t.partition,
            t.start,
            t.end,
            snapshot=options.snapshot and t.start <= starts[(t.topic, t.partition)],
        )
        for t in tasks
    ]


# -- reading ---------------------------------------------------------------------------------

VIEW_CHANGE = "view_change"


class _Decoder:
    """View records to rows in ``view_schema()``'s column order (without the last two), with
    ``layer.codec`` (which reads every version of the schema). Measured: fastavro decodes a
    record in about 8 µs here; a hand-written reader saved only a quarter to a third of that."""

    def __init__(self) -> None:
        from layer.codec import default_codec

        self._codec = default_codec()
        self._version = self._codec.version(VIEW_CHANGE)

    def row(self, data: bytes) -> tuple[Any, ...]:
        change = self._codec.decode(VIEW_CHANGE, data)
        topic, partition, offset = change["topic"], change["partition"], change["offset"]
        return (
            change["sign"],
            change["queue"],
            f"{topic}/{partition}/{offset}",
            topic,
            partition,
            offset,
            change["key"],
            change["headers"],
            change["value"],
            change["priority"],
            change["deliveries"],
            change["cancels"],
            change["timestamp_ms"] * 1000,
            change["at_ms"] * 1000,
        )

    def sign(self, data: bytes | None) -> int:
        """A record's sign without decoding it: ``sign`` is the record's first field, so after
        the format byte +1 is the zig-zag varint 0x02 and -1 is 0x01. A null value (a
        tombstone) takes the bookmark out."""
        if data is None:
            return -1
        if len(data) > 1 and data[0] == self._version and data[1] in (1, 2):
            return 1 if data[1] == 2 else -1
        return int(self._codec.decode(VIEW_CHANGE, data)["sign"])


def read_view_range(
    options: ViewSourceOptions, task: KafkaInputPartition | None
) -> Iterator[pa.RecordBatch]:
    """The changes of ``task`` (its live contents at the end if it is a snapshot range)."""
    if task is None or task.start >= task.end:
        return
    import pyarrow as pa  # on the executors only

    decoder = _Decoder()
    keep: dict[bytes | None, int] | None = None
    if isinstance(task, ViewInputPartition) and task.snapshot:
        # Pass 1 finds each bookmark's last record and keeps those that are +1; pass 2 reads
        # the range again and decodes only those. Memory: one entry per live message.
        keep = {}
        for records in consume_range(options.kafka, task):
            for message in records:
                if decoder.sign(message.value()) > 0:
                    keep[message.key()] = message_offset(message)
                else:
                    keep.pop(message.key(), None)
        if not keep:
            return
    rows: list[tuple[Any, ...]] = []
    view_partition = task.partition
    for records in consume_range(options.kafka, task):
        for message in records:
            value = message.value()
            if value is None:
                continue  # a tombstone carries no message: nothing to add or take away
            offset = message_offset(message)
            if keep is not None and keep.get(message.key()) != offset:
                continue
            try:
                row = decoder.row(value)
            except SerializationError as exc:
                raise SerializationError(
                    f"view record {task.topic}/{task.partition}/{offset}: {exc}"
                ) from exc
            rows.append((*row, view_partition, offset))
        if len(rows) >= ROWS_PER_ARROW_BATCH:
            yield _record_batch(pa, rows)
            rows = []
    if rows:
        yield _record_batch(pa, rows)


def _arrow_types(pa: Any) -> list[Any]:
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    micros = pa.timestamp("us", tz="UTC")
    return [
        pa.int32(),  # sign
        pa.string(),  # queue
        pa.string(),  # bookmark
        pa.string(),  # topic
        pa.int32(),  # partition
        pa.int64(),  # offset
        pa.binary(),  # key
        pa.list_(header),  # headers
        pa.binary(),  # value
        pa.int64(),  # priority
        pa.int32(),  # deliveries
        pa.int32(),  # cancels
        micros,  # enqueue_time
        micros,  # changed_at
        pa.int32(),  # view_partition
        pa.int64(),  # view_offset
    ]


_COLUMNS = [field.name for field in view_schema().fields]


def _record_batch(pa: Any, rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    columns = zip(*rows, strict=True)
    arrays = [
        pa.array(column, kind) for column, kind in zip(columns, _arrow_types(pa), strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, names=_COLUMNS)


# -- readers and the source ------------------------------------------------------------------


class ViewBatchReader(KafkaBatchReader):
    """``spark.read``: one input partition per view-topic partition with records to read."""

    def __init__(self, options: ViewSourceOptions) -> None:
        super().__init__(options.kafka)
        self._view = options

    def partitions(self) -> list[InputPartition]:
        _check_topics(self._view.kafka)
        return list(_mark(self._view, super().partitions()))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_view_range(self._view, as_range(partition, VIEW_FORMAT))


class ViewStreamReader(KafkaStreamReader):
    """``spark.readStream``: the live contents first (with ``snapshot``), then every change."""

    def __init__(self, options: ViewSourceOptions) -> None:
        super().__init__(options.kafka)
        self._view = options
        self._checked = False

    def initialOffset(self) -> dict:
        if not self._checked:
            _check_topics(self._view.kafka)
            self._checked = True
        return super().initialOffset()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return _mark(self._view, super().partitions(start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_view_range(self._view, as_range(partition, VIEW_FORMAT))


class ViewDataSource(KafkaDataSource):
    """The ``qlayer_view`` format: a queue's view topic as decoded, signed changes."""

    def __init__(self, options: dict[str, str]) -> None:
        # not KafkaDataSource.__init__: it would parse the options as qlayer_kafka's
        DataSource.__init__(self, options)
        self._view = ViewSourceOptions.parse(options)
        self._parsed = self._view.kafka

    @classmethod
    def name(cls) -> str:
        return VIEW_FORMAT

    def schema(self) -> StructType:
        return view_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        super().reader(schema)  # the checks of the options against a batch read
        return ViewBatchReader(self._view)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        super().streamReader(schema)
        return ViewStreamReader(self._view)


def register_view(spark: SparkSession) -> str:
    """Register the ``qlayer_view`` data source with ``spark``; return the format name."""
    spark.dataSource.register(ViewDataSource)
    return VIEW_FORMAT
