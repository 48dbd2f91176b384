"""A PySpark (4.x) data source that reads Kafka through confluent-kafka, in batch and streaming.

Spark's own ``kafka`` source needs a JVM connector jar; this one is a Python data source
(``pyspark.sql.datasource``) with the same columns, options and offset format, so a job switches
between the two by changing the format name::

    from connectors.spark_kafka import register

    fmt = register(spark)  # "qlayer_kafka"
    df = (spark.read.format(fmt)
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "orders")
          .load())

Options (names are case-insensitive, as in Spark):

- ``kafka.bootstrap.servers`` (required) and any other ``kafka.<librdkafka key>``, passed to
  librdkafka with the prefix stripped (``kafka.security.protocol``, ``kafka.sasl.*``,
  ``kafka.ssl.*``, ``kafka.isolation.level``, ``kafka.group.id``...).
- Exactly one of ``subscribe`` (comma-separated topics), ``subscribePattern`` (a regular
  expression that must match a whole topic name) or ``assign`` (JSON ``{"topicA":[0,1]}``).
- ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or JSON
  ``{"topicA":{"0":23,"1":-2}}`` (-2 is earliest, -1 is latest). A JSON value must name every
  partition the subscription covers. Batch defaults: earliest to latest; streaming starts at
  latest and takes no ``endingOffsets``.
- ``maxOffsetsPerTrigger`` (streaming): at most that many offsets per micro-batch, shared by
  the partitions in proportion to their lag.
- ``includeHeaders`` (default false, as Spark: the ``headers`` column exists only when true),
  ``failOnDataLoss`` (default true), ``kafkaConsumer.pollTimeoutMs`` (default 120000),
  ``groupIdPrefix``; Spark's tuning options ``minPartitions``, ``maxRecordsPerPartition`` and
  ``fetchOffset.*`` are accepted and ignored.

Offsets are Spark's JSON (``{"topic":{"partition":offset}}``), read from the broker's watermarks.
The latest offset is the high watermark a *fetch* response carries (the last stable offset under
``kafka.isolation.level=read_committed``): some brokers answer ListOffsets(latest) wrongly (see
:class:`connectors.kafka.BrokerProfile`), fetch responses are right everywhere.

Before Spark 4.2, Spark runs ``Trigger.AvailableNow`` on a Python source as a single micro-batch,
so with ``maxOffsetsPerTrigger`` each such run reads at most that many offsets (the next run goes
on from there). Every micro-batch plans with a new short-lived consumer on the driver: prefer a
processing-time trigger to Spark's default back-to-back one.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
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

from connectors.kafka import cached_high_watermark
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

FORMAT = "qlayer_kafka"

#: Spark's markers inside JSON offsets.
EARLIEST = -2
LATEST = -1

TP = tuple[str, int]
Offsets = dict[TP, int]

# A range reader asks librdkafka for this many messages per consume() call and hands Spark one
# Arrow batch per this many rows.
_CONSUME_BATCH = 5000
_ROWS_PER_ARROW_BATCH = 10_000
# Range readers stop at a known offset and never wait for new data, so the only fetch that waits
# is the last one; some brokers (Tansu) hold every fetch for the whole wait, so keep it short.
_FETCH_WAIT_MAX_MS = 10
_METADATA_TIMEOUT_S = 30.0

# fmt: off
# Options of Spark's kafka source that tune its JVM consumer and change no result.
_IGNORED_OPTIONS = frozenset({
    "minpartitions", "maxrecordsperpartition", "fetchoffset.numretries",
    "fetchoffset.retryintervalms",
})
_UNSUPPORTED_OPTIONS = frozenset({
    "startingtimestamp", "startingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy",
    "endingtimestamp", "endingoffsetsbytimestamp", "minoffsetspertrigger", "maxtriggerdelay",
})
_KNOWN_OPTIONS = (
    "kafka.bootstrap.servers", "subscribe", "subscribePattern", "assign", "startingOffsets",
    "endingOffsets", "maxOffsetsPerTrigger", "includeHeaders", "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs", "groupIdPrefix",
)
# fmt: on
# librdkafka keys the source sets itself (as Spark's source refuses the Java equivalents).
_RESERVED_KAFKA_KEYS = {
    "auto.offset.reset": "use startingOffsets to say where to start",
    "enable.auto.commit": "the source never commits offsets to Kafka",
    "enable.auto.offset.store": "the source never commits offsets to Kafka",
    "enable.partition.eof": "the source relies on end-of-partition events",
    "key.deserializer": "keys are always read as bytes",
    "value.deserializer": "values are always read as bytes",
}


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


# -- options ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which partitions to read: ``subscribe``, ``subscribePattern`` or ``assign``."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str = ""
    partitions: tuple[TP, ...] = ()

    def resolve(self, topics: Mapping[str, Sequence[int]]) -> list[TP]:
        """The partitions to read, given the broker's topic -> partition ids (sorted)."""
        if self.kind == "assign":
            missing = [tp for tp in self.partitions if tp[1] not in topics.get(tp[0], ())]
            if missing:
                raise ConfigError(f"assign names partitions that do not exist: {_names(missing)}")
            return sorted(self.partitions)
        if self.kind == "subscribe":
            absent = [topic for topic in self.topics if topic not in topics]
            if absent:
                logger.info("subscribed topics do not exist (yet) topics=%s", absent)
            chosen = [topic for topic in self.topics if topic in topics]
        else:
            regex = re.compile(self.pattern)
            # Internal topics (__consumer_offsets, __transaction_state) are never matched, as with
            # the Java consumer's exclude.internal.topics.
            chosen = [t for t in topics if not t.startswith("__") and regex.fullmatch(t)]
        return sorted((topic, p) for topic in set(chosen) for p in topics[topic])


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``startingOffsets``/``endingOffsets``: earliest, latest or a JSON map (-2/-1 inside)."""

    kind: Literal["earliest", "latest", "specific"]
    offsets: Mapping[TP, int] = field(default_factory=dict)

    def resolve(
        self,
        option: str,
        partitions: Sequence[TP],
        earliest: Mapping[TP, int],
        latest: Mapping[TP, int],
    ) -> Offsets:
        """Concrete offsets for ``partitions``; a JSON map must name exactly those."""
        if self.kind == "earliest":
            return {tp: earliest[tp] for tp in partitions}
        if self.kind == "latest":
            return {tp: latest[tp] for tp in partitions}
        if set(self.offsets) != set(partitions):
            raise ConfigError(
                f"{option} must give an offset for every partition read (-2 for earliest, -1 for"
                f" latest): missing {_names(set(partitions) - set(self.offsets)) or 'none'},"
                f" not read {_names(set(self.offsets) - set(partitions)) or 'none'}"
            )
        markers = {EARLIEST: earliest, LATEST: latest}
        return {
            tp: markers[offset][tp] if offset in markers else offset
            for tp, offset in ((tp, self.offsets[tp]) for tp in partitions)
        }

    def uses(self, marker: int) -> list[TP]:
        return [tp for tp, offset in self.offsets.items() if offset == marker]


@dataclass(frozen=True, slots=True)
class KafkaSourceOptions:
    """The options of one ``qlayer_kafka`` read, validated once (:meth:`parse`)."""

    bootstrap_servers: str
    #: librdkafka settings from the ``kafka.*`` options, prefix stripped (bootstrap excluded).
    kafka_settings: Mapping[str, str]
    subscription: Subscription
    starting_offsets: OffsetSpec | None = None
    ending_offsets: OffsetSpec | None = None
    max_offsets_per_trigger: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    group_id_prefix: str = "qlayer-kafka-source"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaSourceOptions:
        """Validate Spark's option map; ConfigError names the option and the bad value."""
        given = {key.lower(): str(value) for key, value in options.items()}
        known = {name.lower(): name for name in _KNOWN_OPTIONS}
        for key in given:
            if key in _UNSUPPORTED_OPTIONS:
                raise ConfigError(f"option {key!r} is not supported by {FORMAT}")
            if key not in known and key not in _IGNORED_OPTIONS and not key.startswith("kafka."):
                raise ConfigError(
                    f"unknown option {key!r} for {FORMAT}: expected kafka.* settings or one of"
                    f" {', '.join(_KNOWN_OPTIONS[1:])}"
                )
        bootstrap = given.get("kafka.bootstrap.servers", "").strip()
        if not bootstrap:
            raise ConfigError(f"option 'kafka.bootstrap.servers' is required by {FORMAT}")
        settings: dict[str, str] = {}
        for key, value in given.items():
            if not key.startswith("kafka.") or key == "kafka.bootstrap.servers":
                continue
            name = key[len("kafka.") :]
            if name in _RESERVED_KAFKA_KEYS:
                raise ConfigError(
                    f"option 'kafka.{name}' is not supported: {_RESERVED_KAFKA_KEYS[name]}"
                )
            settings[name] = value
        isolation = settings.get("isolation.level", "read_uncommitted")
        if isolation not in ("read_committed", "read_uncommitted"):
            raise ConfigError(
                f"option 'kafka.isolation.level' must be read_committed or read_uncommitted,"
                f" got {isolation!r}"
            )
        max_offsets = given.get("maxoffsetspertrigger")
        return cls(
            bootstrap_servers=bootstrap,
            kafka_settings=settings,
            subscription=_parse_subscription(given),
            starting_offsets=_parse_offset_spec("startingOffsets", given.get("startingoffsets")),
            ending_offsets=_parse_offset_spec("endingOffsets", given.get("endingoffsets")),
            max_offsets_per_trigger=(
                None if max_offsets is None else _positive_int("maxOffsetsPerTrigger", max_offsets)
            ),
            include_headers=_boolean("includeHeaders", given.get("includeheaders", "false")),
            fail_on_data_loss=_boolean("failOnDataLoss", given.get("failondataloss", "true")),
            poll_timeout_ms=_positive_int(
                "kafkaConsumer.pollTimeoutMs", given.get("kafkaconsumer.polltimeoutms", "120000")
            ),
            group_id_prefix=given.get("groupidprefix", "qlayer-kafka-source"),
        )

    @property
    def read_committed(self) -> bool:
        return self.kafka_settings.get("isolation.level") == "read_committed"

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """A consumer that never joins a group, never commits, and sees partition ends."""
        config: dict[str, Any] = {
            "group.id": f"{self.group_id_prefix}-{uuid.uuid4().hex}",
            "isolation.level": "read_uncommitted",  # Spark's default
            "fetch.wait.max.ms": _FETCH_WAIT_MAX_MS,
        }
        config.update(self.kafka_settings)
        config.update(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "error" if self.fail_on_data_loss else "earliest",
            }
        )
        config.update(overrides)
        return config


def _parse_subscription(given: Mapping[str, str]) -> Subscription:
    chosen = [name for name in ("subscribe", "subscribepattern", "assign") if name in given]
    if len(chosen) != 1:
        raise ConfigError(
            "exactly one of the options 'subscribe', 'subscribePattern' or 'assign' is needed,"
            f" got {len(chosen)}" + (f" ({', '.join(chosen)})" if chosen else "")
        )
    value = given[chosen[0]]
    if chosen[0] == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise ConfigError(f"option 'subscribe' names no topic: {value!r}")
        return Subscription("subscribe", topics=topics)
    if chosen[0] == "subscribepattern":
        if not value.strip():
            raise ConfigError("option 'subscribePattern' is empty")
        try:
            re.compile(value)
        except re.error as exc:
            raise ConfigError(
                f"option 'subscribePattern' is not a valid regex {value!r}: {exc}"
            ) from exc
        return Subscription("subscribePattern", pattern=value)
    example = '{"topicA":[0,1],"topicB":[0]}'
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(ps, list)
        and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in ps)
        for ps in parsed.values()
    ):
        raise ConfigError(f"option 'assign' must be JSON like {example}, got {value!r}")
    partitions = tuple(sorted({(str(t), p) for t, ps in parsed.items() for p in ps}))
    if not partitions:
        raise ConfigError(f"option 'assign' names no partition: {value!r}")
    return Subscription("assign", partitions=partitions)


def _parse_offset_spec(option: str, value: str | None) -> OffsetSpec | None:
    if value is None:
        return None
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec("earliest" if text.lower() == "earliest" else "latest")
    example = '{"topicA":{"0":23,"1":-2}}'
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    offsets: dict[TP, int] = {}
    if isinstance(parsed, dict):
        for topic, by_partition in parsed.items():
            if not isinstance(by_partition, dict):
                parsed = None
                break
            for partition, offset in by_partition.items():
                if (
                    not str(partition).isdigit()
                    or isinstance(offset, bool)
                    or not isinstance(offset, int)
                    or offset < EARLIEST
                ):
                    raise ConfigError(
                        f"option {option!r}: bad offset {offset!r} for partition {partition!r}"
                        f" of topic {topic!r} (offsets are >= 0, -2 for earliest, -1 for latest)"
                        f" in {value!r}"
                    )
                offsets[(str(topic), int(partition))] = offset
    if not isinstance(parsed, dict) or not offsets:
        raise ConfigError(
            f"option {option!r} must be 'earliest', 'latest' or JSON like {example}, got {value!r}"
        )
    return OffsetSpec("specific", offsets)


def _positive_int(option: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if number <= 0:
        raise ConfigError(f"option {option!r} must be a positive integer, got {value!r}")
    return number


def _boolean(option: str, value: str) -> bool:
    if value.strip().lower() not in ("true", "false"):
        raise ConfigError(f"option {option!r} must be true or false, got {value!r}")
    return value.strip().lower() == "true"


def _names(partitions: Iterator[TP] | Sequence[TP] | set[TP]) -> str:
    return ", ".join(f"{t}/{p}" for t, p in sorted(partitions))


# -- offsets as Spark stores them ------------------------------------------------------------


def offsets_to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """``{(t, p): o}`` -> Spark's ``{"t": {"p": o}}``, in a fixed order (Spark compares text)."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def offsets_from_json(offsets: Mapping[str, Any]) -> Offsets:
    """Spark's ``{"t": {"p": o}}`` -> ``{(t, p): o}``."""
    return {
        (topic, int(partition)): int(offset)
        for topic, by_partition in offsets.items()
        for partition, offset in by_partition.items()
    }


def rate_limit(limit: int, start: Mapping[TP, int], until: Mapping[TP, int]) -> Offsets:
    """Cap the offsets read between ``start`` and ``until`` at about ``limit``, as Spark does.

    Each partition with a lag gets ``limit * lag / total lag`` offsets (rounded down, or up to 1
    when below 1, so small partitions are never starved: the sum may pass ``limit`` by at most the
    number of partitions). Partitions missing from ``start`` must be given from their earliest.
    """
    sizes = {tp: end - start[tp] for tp, end in until.items() if end - start[tp] > 0}
    total = sum(sizes.values())
    if total < 1:
        return dict(until)
    limited = dict(until)
    for tp, size in sizes.items():
        share = limit * size / total
        taken = math.ceil(share) if share < 1 else math.floor(share)
        limited[tp] = min(until[tp], start[tp] + taken)
    return limited


# -- the driver's view of the broker ---------------------------------------------------------


class _BrokerView:
    """A short-lived consumer on the driver: topic metadata and watermarks (never data)."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self._options = options
        self._stats: dict[str, Any] = {}
        overrides: dict[str, Any] = {"enable.partition.eof": False, "max.partition.fetch.bytes": 1}
        if options.read_committed:
            # The last stable offset is in no API of confluent-kafka but the statistics.
            overrides.update({"statistics.interval.ms": 20, "stats_cb": self._on_stats})
        try:
            self._consumer = Consumer(options.consumer_config(**overrides))
        except KafkaException as exc:
            raise ConfigError(f"the kafka.* options are refused by librdkafka: {exc}") from exc

    def _on_stats(self, payload: str) -> None:
        self._stats = json.loads(payload)

    def __enter__(self) -> _BrokerView:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._consumer.close()

    def topics(self) -> dict[str, list[int]]:
        try:
            metadata = self._consumer.list_topics(timeout=_METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise BrokerError(
                f"cannot list the topics at {self._options.bootstrap_servers}: {exc}"
            ) from exc
        return {
            name: sorted(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None
        }

    def partitions(self) -> list[TP]:
        return self._options.subscription.resolve(self.topics())

    def resolve(
        self,
        spec: OffsetSpec,
        option: str,
        partitions: Sequence[TP],
        latest: Mapping[TP, int] | None = None,
    ) -> Offsets:
        """``spec`` for ``partitions``, asking the broker only for the watermarks it needs."""
        wants_earliest = spec.kind == "earliest" or bool(spec.uses(EARLIEST))
        wants_latest = spec.kind == "latest" or bool(spec.uses(LATEST))
        earliest = self.earliest(partitions) if wants_earliest else {}
        if wants_latest and latest is None:
            latest = self.latest(partitions)
        return spec.resolve(option, partitions, earliest, latest or {})

    def earliest(self, partitions: Sequence[TP]) -> Offsets:
        """Low watermarks (ListOffsets(earliest) is right on every broker)."""
        result = {}
        for topic, partition in partitions:
            try:
                low, _high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=_METADATA_TIMEOUT_S
                )
            except KafkaException as exc:
                raise BrokerError(
                    f"cannot read the low watermark of {topic}/{partition}: {exc}"
                ) from exc
            result[(topic, partition)] = int(low)
        return result

    def latest(self, partitions: Sequence[TP]) -> Offsets:
        """High watermarks (last stable offsets under read_committed) from fetch responses.

        The consumer starts where ListOffsets(latest) points (a lower bound: exact on Kafka,
        the last batch's base offset + 1 on Tansu), fetches at most one batch per partition and
        reads the watermark the response carried, as ``connectors.kafka.read_high_watermarks``.
        """
        if not partitions:
            return {}
        self._stats = {}
        self._consumer.assign([TopicPartition(t, p, OFFSET_END) for t, p in partitions])
        deadline = time.monotonic() + _METADATA_TIMEOUT_S
        try:
            while True:
                found = self._fetched_ends(partitions)
                if len(found) == len(partitions):
                    return found
                if time.monotonic() > deadline:
                    missing = [tp for tp in partitions if tp not in found]
                    raise BrokerError(
                        f"no fetch response within {_METADATA_TIMEOUT_S:.0f}s for {_names(missing)}"
                    )
                for message in self._consumer.consume(num_messages=len(partitions), timeout=0.02):
                    error = message.error()
                    if error is not None and not error.retriable():
                        raise BrokerError(f"cannot fetch from {message.topic()}: {error}")
        finally:
            self._consumer.unassign()

    def _fetched_ends(self, partitions: Sequence[TP]) -> Offsets:
        found = {}
        if self._options.read_committed:
            reported = self._stats.get("topics", {})
            for topic, partition in partitions:
                entry = reported.get(topic, {}).get("partitions", {}).get(str(partition), {})
                stable = entry.get("ls_offset", -1)
                if stable >= 0:
                    found[(topic, partition)] = int(stable)
        else:
            for topic, partition in partitions:
                high = cached_high_watermark(self._consumer, topic, partition)
                if high is not None:
                    found[(topic, partition)] = high
        return found


# -- reading one range -----------------------------------------------------------------------


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


def read_range(
    options: KafkaSourceOptions, task: KafkaInputPartition | None
) -> Iterator[pa.RecordBatch]:
    """The records of ``task`` as Arrow batches, read with one assigned consumer.

    Offsets are not contiguous: transaction markers (and compacted or aborted records) take
    offsets no record is delivered for. So the range is done when a record at or past ``end``
    arrives, when the partition's end is reached at or past ``end`` (an end-of-partition event),
    or when the consumer's position (which moves past skipped markers) reaches ``end``.
    """
    if task is None or task.start >= task.end:
        return
    import pyarrow as pa  # on the executors only; the driver never builds batches

    tp = TopicPartition(task.topic, task.partition, task.start)
    consumer = Consumer(options.consumer_config())
    batch = _ArrowBatch(task.topic, task.partition, options.include_headers)
    timeout = options.poll_timeout_ms / 1000
    try:
        consumer.assign([tp])
        next_offset = task.start
        deadline = time.monotonic() + timeout
        while next_offset < task.end:
            # Never more than the offsets left: consume() returns early only on a full batch.
            wanted = min(_CONSUME_BATCH, task.end - next_offset)
            messages = consumer.consume(num_messages=wanted, timeout=0.1)
            before = next_offset
            for message in messages:
                error = message.error()
                if error is None:
                    offset = _offset(message)
                    if offset >= task.end:
                        next_offset = task.end
                        break
                    batch.add(message)
                    next_offset = offset + 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    next_offset = max(next_offset, _offset(message))
                else:
                    raise _read_error(options, task, next_offset, error)
            if not messages:
                position = consumer.position([TopicPartition(task.topic, task.partition)])[0]
                next_offset = max(next_offset, position.offset)
            if len(batch) >= _ROWS_PER_ARROW_BATCH:
                yield batch.flush(pa)
            if next_offset > before:
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise BrokerError(
                    f"reading {task.topic}/{task.partition} [{task.start}, {task.end}) stalled at"
                    f" offset {next_offset} for {timeout:.0f}s (kafkaConsumer.pollTimeoutMs);"
                    f" fetched high watermark"
                    f" {cached_high_watermark(consumer, task.topic, task.partition)}"
                )
        if len(batch):
            yield batch.flush(pa)
    finally:
        consumer.close()


def _read_error(
    options: KafkaSourceOptions, task: KafkaInputPartition, offset: int, error: KafkaError
) -> BrokerError:
    if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        return BrokerError(
            f"offset {offset} of {task.topic}/{task.partition} is no longer on the broker: some"
            f" data may have been lost (set failOnDataLoss=false to skip it): {error}"
        )
    return BrokerError(f"reading {task.topic}/{task.partition} at offset {offset}: {error}")


def _offset(message: Message) -> int:
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
        self._offsets.append(_offset(message))
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
            columns.append(pa.array(self._headers, pa.list_(header)))
            names.append("headers")
        self._clear()
        return pa.RecordBatch.from_arrays(columns, names=names)


# -- batch -----------------------------------------------------------------------------------


class KafkaBatchReader(DataSourceReader):
    """``spark.read``: one input partition per Kafka partition with records to read."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self._options = options

    def partitions(self) -> list[InputPartition]:
        options = self._options
        starting = options.starting_offsets or OffsetSpec("earliest")
        ending = options.ending_offsets or OffsetSpec("latest")
        with _BrokerView(options) as broker:
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
        return read_range(self._options, _as_range(partition))


def _as_range(partition: InputPartition | None) -> KafkaInputPartition | None:
    if isinstance(partition, KafkaInputPartition):
        return partition
    # With no partition planned, Spark reads one anyway: None (4.0) or InputPartition(None) (4.2).
    if partition is None or getattr(partition, "value", None) is None:
        return None
    raise TypeError(f"{FORMAT} reads KafkaInputPartition, got {type(partition).__name__}")


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

    def initialOffset(self) -> dict:
        return offsets_to_json(self._initial_offsets())

    def _initial_offsets(self) -> Offsets:
        # Spark 4.0 asks for the first batch's end (latestOffset) before its start
        # (initialOffset): both must see the same start, so it is computed once.
        if self._initial is None:
            starting = self._options.starting_offsets or OffsetSpec("latest")
            with _BrokerView(self._options) as broker:
                partitions = broker.partitions()
                self._initial = broker.resolve(starting, "startingOffsets", partitions)
            logger.info("kafka stream initial offsets=%s", offsets_to_json(self._initial))
        if self._position is None:
            self._position = self._initial
        return self._initial

    def latestOffset(self, *args: Any) -> dict:
        """Spark 4.0: ``latestOffset()``; Spark 4.2: ``latestOffset(start, limit)``."""
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
        with _BrokerView(self._options) as broker:
            if self._available_now is not None:
                latest = dict(self._available_now)
            else:
                latest = broker.latest(broker.partitions())
                self._latest_seen = latest
            end = latest
            if max_rows is not None and start is not None:
                begin = {tp: start[tp] for tp in latest if tp in start}
                new = [tp for tp in latest if tp not in start]
                begin.update(broker.earliest(new))
                end = rate_limit(int(max_rows), begin, latest)
        self._position = end
        return offsets_to_json(end)

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
        with _BrokerView(self._options) as broker:
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
            self._data_loss(f"partitions {_names(gone)} are gone")
        new = [tp for tp in until if tp not in begin]
        if new:
            # A partition or topic that appeared after the last batch is read from its start.
            with _BrokerView(self._options) as broker:
                begin.update(broker.earliest(new))
            logger.info("kafka stream new partitions=%s", _names(new))
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
        return read_range(self._options, _as_range(partition))

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
                f"{FORMAT} has a fixed schema ({expected.simpleString()}); got"
                f" {schema.simpleString()}"
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        starting, ending = self._parsed.starting_offsets, self._parsed.ending_offsets
        if starting is not None and (starting.kind == "latest" or starting.uses(LATEST)):
            raise ConfigError(
                "option 'startingOffsets' cannot be latest (-1) for batch queries"
                + (f": {_names(starting.uses(LATEST))}" if starting.kind == "specific" else "")
            )
        if ending is not None and (ending.kind == "earliest" or ending.uses(EARLIEST)):
            raise ConfigError(
                "option 'endingOffsets' cannot be earliest (-2) for batch queries"
                + (f": {_names(ending.uses(EARLIEST))}" if ending.kind == "specific" else "")
            )
        if self._parsed.max_offsets_per_trigger is not None:
            logger.info("maxOffsetsPerTrigger is ignored by batch queries")
        return KafkaBatchReader(self._parsed)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        if self._parsed.ending_offsets is not None:
            raise ConfigError("option 'endingOffsets' is not valid in streaming queries")
        return KafkaStreamReader(self._parsed)


def register(spark: SparkSession) -> str:
    """Register the ``qlayer_kafka`` data source with ``spark``; return the format name."""
    spark.dataSource.register(KafkaDataSource)
    return FORMAT


__all__ = [
    "EARLIEST",
    "FORMAT",
    "KafkaBatchReader",
    "KafkaDataSource",
    "KafkaInputPartition",
    "KafkaSourceOptions",
    "KafkaStreamReader",
    "LATEST",
    "OffsetSpec",
    "Subscription",
    "kafka_schema",
    "offsets_from_json",
    "offsets_to_json",
    "rate_limit",
    "read_range",
    "register",
]
