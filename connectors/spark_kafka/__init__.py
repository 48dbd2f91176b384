"""PySpark (4.x) data sources that read Kafka through confluent-kafka, in batch and streaming.

``qlayer_kafka`` is Spark's ``kafka`` source in Python; ``qlayer_view`` (:mod:`.view`, registered
by :func:`register_view`) builds on it to read a queue's view topic as decoded, signed changes.
Modules: ``options`` (parsing, Spark's JSON offsets), ``broker`` (the driver's metadata and
watermarks), ``reading`` (one task's offset range), ``source`` (the readers), ``view``.

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

from typing import TYPE_CHECKING

from layer._lazy import lazy_exports

if TYPE_CHECKING:
    from connectors.spark_kafka.options import (
        EARLIEST,
        FORMAT,
        LATEST,
        KafkaSourceOptions,
        OffsetSpec,
        Subscription,
        offsets_from_json,
        offsets_to_json,
        rate_limit,
    )
    from connectors.spark_kafka.reading import KafkaInputPartition, consume_range, read_range
    from connectors.spark_kafka.source import (
        KafkaBatchReader,
        KafkaDataSource,
        KafkaStreamReader,
        kafka_schema,
        register,
        register_once,
    )
    from connectors.spark_kafka.view import (
        VIEW_FORMAT,
        ViewDataSource,
        ViewInputPartition,
        ViewSourceOptions,
        register_view,
        view_schema,
    )
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "connectors.spark_kafka.options": (
                "EARLIEST",
                "FORMAT",
                "LATEST",
                "KafkaSourceOptions",
                "OffsetSpec",
                "Subscription",
                "offsets_from_json",
                "offsets_to_json",
                "rate_limit",
            ),
            "connectors.spark_kafka.reading": (
                "KafkaInputPartition",
                "consume_range",
                "read_range",
            ),
            "connectors.spark_kafka.source": (
                "KafkaBatchReader",
                "KafkaDataSource",
                "KafkaStreamReader",
                "kafka_schema",
                "register",
                "register_once",
            ),
            "connectors.spark_kafka.view": (
                "VIEW_FORMAT",
                "ViewDataSource",
                "ViewInputPartition",
                "ViewSourceOptions",
                "register_view",
                "view_schema",
            ),
        },
    )

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
    "VIEW_FORMAT",
    "ViewDataSource",
    "ViewInputPartition",
    "ViewSourceOptions",
    "consume_range",
    "kafka_schema",
    "offsets_from_json",
    "offsets_to_json",
    "rate_limit",
    "read_range",
    "register",
    "register_once",
    "register_view",
    "view_schema",
]
