"""The ``qlayer_kafka`` data source: its schema, batch reader and streaming reader."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer
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

from connectors.spark_kafka.broker import BrokerView, metadata_consumer
from connectors.spark_kafka.options import (
    EARLIEST,
    FORMAT,
    LATEST,
    TP,
    KafkaSourceOptions,
    Offsets,
    OffsetSpec,
    offsets_from_json,
    offsets_to_json,
    partition_names,
    rate_limit,
)
from connectors.spark_kafka.reading import KafkaInputPartition, as_range, read_range
from layer.exceptions import BrokerError, ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

try:  # Spark 4.2 runs Trigger.AvailableNow in several batches only for readers with this mixin
    from pyspark.sql.streaming.datasource import (
        SupportsTriggerAvailableNow as _AvailableNowMixin,
    )
except ImportError:  # Spark 4.0/4.1: Trigger.AvailableNow reads everything in one batch

    class _AvailableNowMixin:  # type: ignore[no-redef]
        """Placeholder for the Spark 4.2 mixin."""


logger = logging.getLogger(__name__)


def kafka_schema(include_headers: bool) -> StructType:
    """The columns of Spark's kafka source (``headers`` only with ``includeHeaders``)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


# -- batch -----------------------------------------------------------------------------------


class KafkaBatchReader(DataSourceReader):
    """``spark.read``: one input partition per Kafka partition with records to read."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self._options = options

    def partitions(self) -> list[InputPartition]:
        options = self._options
        starting = options.starting_offsets or OffsetSpec("earliest")
        ending = options.ending_offsets or OffsetSpec("latest")
        with BrokerView(options) as broker:
            partitions = broker.partitions()
            latest = broker.latest(partitions)
            start = broker.resolve(starting, "startingOffsets", partitions, latest)
            end = broker.resolve(ending, "endingOffsets", partitions, latest)
        ranges: list[InputPartition] = []
        for tp in partitions:
            if start[tp] > end[tp]:
                raise ConfigError(
                    f"startingOffsets {start[tp]} is after endingOffsets {end[tp]} for"
                    f" {tp[0]}/{tp[1]}"
                )
            if end[tp] > latest[tp]:
                raise ConfigError(
                    f"endingOffsets asks for {tp[0]}/{tp[1]} up to offset {end[tp]}, but it ends"
                    f" at {latest[tp]}"
                )
            if start[tp] < end[tp]:
                ranges.append(KafkaInputPartition(tp[0], tp[1], start[tp], end[tp]))
        logger.info("kafka batch planned partitions=%s ranges=%s", len(partitions), len(ranges))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self._options, as_range(partition, FORMAT))


# -- streaming -------------------------------------------------------------------------------


class KafkaStreamReader(DataSourceStreamReader, _AvailableNowMixin):
    """``spark.readStream``: micro-batches between Spark JSON offsets.

    Spark 4.2 passes each batch's start to ``latestOffset(start, limit)``. Spark 4.0 calls
    ``latestOffset()`` without it, so to apply ``maxOffsetsPerTrigger`` the reader remembers the
    last offsets it returned or was given: the initial ones, the ends of planned batches
    (``partitions``, which Spark also calls with ``start == end`` when a query restarts from its
    checkpoint) and committed ones.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self._options = options
        self._initial: Offsets | None = None
        self._position: Offsets | None = None
        self._available_now: Offsets | None = None
        self._latest_seen: Offsets | None = None
        # Made on first use, on the driver, and kept until stop(): Spark asks for the latest
        # offsets before every micro-batch, and a new consumer each time cost a connection and
        # a metadata round trip. (Spark builds another reader to read on the executors: this
        # one is never pickled.)
        self._lister: Consumer | None = None

    def _broker(self) -> BrokerView:
        """The broker, its topics listed through the stream's long-lived consumer."""
        if self._lister is None:
            self._lister = metadata_consumer(self._options)
        return BrokerView(self._options, self._lister)

    def stop(self) -> None:
        """Spark: the query stopped."""
        if self._lister is not None:
            self._lister.close()
            self._lister = None

    def initialOffset(self) -> dict:
        return offsets_to_json(self._initial_offsets())

    def _initial_offsets(self) -> Offsets:
        # Spark 4.0 asks for the first batch's end (latestOffset) before its start
        # (initialOffset): both must see the same start, so it is computed once.
        if self._initial is None:
            starting = self._options.starting_offsets or OffsetSpec("latest")
            with self._broker() as broker:
                partitions = broker.partitions()
                self._initial = broker.resolve(starting, "startingOffsets", partitions)
            logger.info("kafka stream initial offsets=%s", offsets_to_json(self._initial))
        if self._position is None:
            self._position = self._initial
        return self._initial

    def latestOffset(self, *args: Any) -> dict:
        """Spark 4.0: ``latestOffset()``; Spark 4.2: ``latestOffset(start, limit)``."""
        with self._broker() as broker:
            return self._latest(broker, *args)

    def _latest(self, broker: BrokerView, *args: Any) -> dict:
        """``latestOffset`` asking ``broker``."""
        if len(args) == 2:
            start: Offsets | None = offsets_from_json(args[0])
            max_rows = getattr(args[1], "max_rows", None)  # ReadMaxRows; ReadAllAvailable: none
        elif not args:
            max_rows = self._options.max_offsets_per_trigger
            start = self._position
            if start is None and max_rows is not None:
                start = self._initial_offsets()
        else:
            raise TypeError(f"latestOffset() takes no argument or (start, limit), got {len(args)}")
        if self._available_now is not None:
            latest = dict(self._available_now)
        else:
            latest = self._ends(broker, broker.partitions(self._options.subscription))
            self._latest_seen = latest
        end = latest
        if max_rows is not None and start is not None:
            begin = {tp: start[tp] for tp in latest if tp in start}
            new = [tp for tp in latest if tp not in start]
            begin.update(broker.earliest(new))
            end = rate_limit(int(max_rows), begin, latest)
        self._position = end
        return offsets_to_json(end)

    def _ends(self, broker: BrokerView, partitions: Sequence[TP]) -> Offsets:
        """Where ``partitions`` end now (for the next micro-batch)."""
        return broker.latest(partitions)

    def getDefaultReadLimit(self) -> Any:
        """Spark 4.2: ``maxOffsetsPerTrigger`` as the engine's read limit."""
        from pyspark.sql.streaming.datasource import (  # type: ignore[import-not-found]
            ReadAllAvailable,
            ReadMaxRows,
        )

        limit = self._options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """Spark 4.2: Trigger.AvailableNow reads up to the offsets available now, no further."""
        with self._broker() as broker:
            self._available_now = broker.latest(broker.partitions())

    def reportLatestOffset(self) -> dict | None:
        """Spark 4.2: the latest offsets seen, for the query's progress reports."""
        return None if self._latest_seen is None else offsets_to_json(self._latest_seen)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, until = offsets_from_json(start), offsets_from_json(end)
        self._position = until
        if begin == until:
            return []
        gone = sorted(tp for tp in begin if tp not in until)
        if gone:
            self._data_loss(f"partitions {partition_names(gone)} are gone")
        new = [tp for tp in until if tp not in begin]
        if new:
            # A partition or topic that appeared after the last batch is read from its start.
            with self._broker() as broker:
                begin.update(broker.earliest(new))
            logger.info("kafka stream new partitions=%s", partition_names(new))
        ranges: list[InputPartition] = []
        for tp, stop in sorted(until.items()):
            if begin[tp] > stop:
                self._data_loss(f"{tp[0]}/{tp[1]} went back from offset {begin[tp]} to {stop}")
            elif begin[tp] < stop:
                ranges.append(KafkaInputPartition(tp[0], tp[1], begin[tp], stop))
        return ranges

    def _data_loss(self, what: str) -> None:
        message = f"{what}: some data may have been missed (failOnDataLoss=false to go on)"
        if self._options.fail_on_data_loss:
            raise BrokerError(message)
        logger.warning("kafka stream data loss: %s", message)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self._options, as_range(partition, FORMAT))

    def commit(self, end: dict) -> None:
        # Nothing is committed to Kafka: the checkpoint holds the offsets (as Spark's source).
        if self._position is None:
            self._position = offsets_from_json(end)


# -- the data source -------------------------------------------------------------------------


class KafkaDataSource(DataSource):
    """The ``qlayer_kafka`` format: Spark's kafka source, read through confluent-kafka."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._parsed = KafkaSourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return kafka_schema(self._parsed.include_headers)

    def _check_schema(self, schema: StructType) -> None:
        expected = self.schema()
        if [(f.name, f.dataType) for f in schema.fields] != [
            (f.name, f.dataType) for f in expected.fields
        ]:
            raise ConfigError(
                f"{self.name()} has a fixed schema ({expected.simpleString()}); got"
                f" {schema.simpleString()}"
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        starting, ending = self._parsed.starting_offsets, self._parsed.ending_offsets
        if starting is not None and (starting.kind == "latest" or starting.uses(LATEST)):
            raise ConfigError(
                "option 'startingOffsets' cannot be latest (-1) for batch queries"
                + (
                    f": {partition_names(starting.uses(LATEST))}"
                    if starting.kind == "specific"
                    else ""
                )
            )
        if ending is not None and (ending.kind == "earliest" or ending.uses(EARLIEST)):
            raise ConfigError(
                "option 'endingOffsets' cannot be earliest (-2) for batch queries"
                + (
                    f": {partition_names(ending.uses(EARLIEST))}"
                    if ending.kind == "specific"
                    else ""
                )
            )
        if self._parsed.max_offsets_per_trigger is not None:
            logger.info("maxOffsetsPerTrigger is ignored by batch queries")
        return KafkaBatchReader(self._parsed)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        if self._parsed.ending_offsets is not None:
            raise ConfigError("option 'endingOffsets' is not valid in streaming queries")
        return KafkaStreamReader(self._parsed)


# The Python data sources registered through register_once, per session: registering one again
# makes Spark log a WARN ("replaced a previously registered data source").
_REGISTERED = "_qlayer_data_sources"


def register_once(spark: SparkSession, source: type[DataSource]) -> str:
    """Register the data source class ``source`` with ``spark`` unless it was already (through
    this function); return its format name."""
    name = source.name()
    done: set[str] | None = getattr(spark, _REGISTERED, None)
    if done is None:
        done = set()
        setattr(spark, _REGISTERED, done)
    if name not in done:
        spark.dataSource.register(source)
        done.add(name)
    return name


def register(spark: SparkSession) -> str:
    """Register the ``qlayer_kafka`` data source with ``spark`` (once); return the format name."""
    return register_once(spark, KafkaDataSource)
