"""A queue's live contents as Spark DataFrames, read from the queue's view topic.

The coordinator publishes every change of what ``browse`` shows to the queue's ``view_topic``
(``[[queue]] view_topic = "orders.view"``): +1 when a message becomes available (published,
returned by a cancel or a lease timeout, let in under ``target_queue_depth``), -1 when it stops
being available (leased, delayed, acked, expired, dead-lettered). These views read that topic
with the ``qlayer_view`` data source (``connectors.spark_kafka.view``): they never lease and never
touch the coordinator. The topic is read by one Spark task per view-topic partition (one, as
the coordinator creates it); what is built on the rows scales with the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from connectors.spark_kafka.view import VIEW_FORMAT
from layer.exceptions import ConfigError
from spark.kafka_path import read_changes
from spark.messages import SchemaLike, with_message
from spark.session import prepare
from spark.settings import ConfigLike, ViewSettings, view_settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The columns of ``queue_contents``; ``queue_contents_stream`` adds ``sign`` in front.
CONTENT_COLUMNS = (
    "bookmark",
    "topic",
    "partition",
    "offset",
    "key",
    "headers",
    "value",
    "message",
    "priority",
    "deliveries",
    "cancels",
    "enqueue_time",
    "changed_at",
)

#: The columns of ``queue_leases``.
LEASE_COLUMNS = (
    "lease_holder",
    "leased_at",
    "bookmark",
    "topic",
    "partition",
    "offset",
    "key",
    "headers",
    "value",
    "message",
    "deliveries",
    "cancels",
    "enqueue_time",
)

# Options the views set themselves: the whole topic, read as the live contents and then changes,
# of this queue only.
_FIXED = ("startingoffsets", "snapshot", "queue", "leases")


def queue_contents(
    spark: SparkSession,
    queue: str,
    *,
    config: ConfigLike = None,
    bootstrap_servers: str | None = None,
    view_topic: str | None = None,
    schema: SchemaLike = None,
    options: Mapping[str, str] | None = None,
    kafka_format: str | None = None,
) -> DataFrame:
    """The messages available in ``queue`` now (what ``client.browse(queue)`` lists), one row
    each: ``bookmark, topic, partition, offset, key, headers, value, message, priority,
    deliveries, cancels, enqueue_time, changed_at`` (when it last became available).

    ``config`` is the coordinator's config file (or a loaded ``layer.config.Config``): it names
    the queue's ``view_topic``, the bootstrap servers, security settings and the message type.
    Without it, pass ``view_topic`` and ``bootstrap_servers`` (or ``$QLAYER_BOOTSTRAP_SERVERS``).
    ``schema`` types ``message`` (a ``StructType`` or DDL string; see :mod:`spark.messages`).
    ``options`` are more ``qlayer_view`` options, such as ``endingOffsets`` (the contents as of
    that offset of the view topic) or ``kafka.*`` settings.

    ``kafka_format`` reads the view topic with that Kafka source instead of ``qlayer_view``:
    ``"kafka"`` where Spark's own connector is on the classpath, or ``"qlayer_kafka"``
    (see :mod:`spark.kafka_path`).

    The DataFrame is a plan: each action reads the view topic again, to its end at that moment.
    """
    settings = _settings(queue, config, bootstrap_servers, view_topic, options)
    if kafka_format is not None:
        frame = read_changes(
            spark, _kafka(spark, kafka_format), queue, settings.options, stream=False,
            snapshot=True,
        )  # fmt: skip
        return _with_message(frame, settings, schema).select(*CONTENT_COLUMNS)
    # a snapshot is read by as many tasks as the session runs at once (each fetches a share)
    splits = settings.options.get("splits") or str(spark.sparkContext.defaultParallelism)
    options = {k: v for k, v in settings.options.items() if k != "splits"}
    frame = (
        spark.read.format(_register(spark))
        .options(**options, startingOffsets="earliest", snapshot="true", queue=queue)
        .option("splits", splits)
        .load()
    )
    return _with_message(frame, settings, schema).select(*CONTENT_COLUMNS)


def queue_leases(
    spark: SparkSession,
    queue: str,
    *,
    config: ConfigLike = None,
    bootstrap_servers: str | None = None,
    view_topic: str | None = None,
    schema: SchemaLike = None,
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """The messages of ``queue`` leased now, one row each: ``lease_holder`` (the subscription
    holding it), ``leased_at`` (when its lease began), then the message's columns as in
    :func:`queue_contents` (``deliveries`` counts this delivery). Which consumer holds how
    much, and since when::

        queue_leases(spark, "orders", config="qlayer.toml").groupBy("lease_holder").agg(
            F.count("*").alias("leases"), F.min("leased_at").alias("oldest"))

    Arguments as for :func:`queue_contents`. A lease the coordinator restored at a restart
    under another holder (or whose start it no longer knew) shows the restart's time.
    """
    settings = _settings(queue, config, bootstrap_servers, view_topic, options)
    frame = (
        spark.read.format(_register(spark))
        .options(**settings.options, startingOffsets="earliest", snapshot="true", queue=queue)
        .option("leases", "true")
        .load()
    )
    return _with_message(frame, settings, schema).select(*LEASE_COLUMNS)


def queue_contents_stream(
    spark: SparkSession,
    queue: str,
    *,
    config: ConfigLike = None,
    bootstrap_servers: str | None = None,
    view_topic: str | None = None,
    schema: SchemaLike = None,
    options: Mapping[str, str] | None = None,
    kafka_format: str | None = None,
) -> DataFrame:
    """A streaming DataFrame of the changes of ``queue``'s live contents: ``sign`` then the
    columns of :func:`queue_contents`. The first micro-batch holds the contents at its start
    (each message once, ``sign`` +1); then every change follows, +1 when a message becomes
    available and -1 when it stops being available. So ``sum(sign * f(message))`` grouped by
    anything is an aggregate of the live contents in every micro-batch: see
    :func:`spark.aggregates.live_aggregate`. Arguments as for :func:`queue_contents`; with
    ``kafka_format`` the first micro-batch holds every change since the view topic began (the
    same sums) rather than each live message once.
    """
    settings = _settings(queue, config, bootstrap_servers, view_topic, options)
    if kafka_format is not None:
        frame = read_changes(
            spark, _kafka(spark, kafka_format), queue, settings.options, stream=True,
            snapshot=False,
        )  # fmt: skip
        return _with_message(frame, settings, schema).select("sign", *CONTENT_COLUMNS)
    frame = (
        spark.readStream.format(_register(spark))
        .options(**settings.options, startingOffsets="earliest", snapshot="true", queue=queue)
        .load()
    )
    return _with_message(frame, settings, schema).select("sign", *CONTENT_COLUMNS)


def _settings(
    queue: str,
    config: ConfigLike,
    bootstrap_servers: str | None,
    view_topic: str | None,
    options: Mapping[str, str] | None,
) -> ViewSettings:
    for key in options or {}:
        if key.lower() in _FIXED:
            raise ConfigError(
                f"queue {queue!r}: option {key!r} is set by the view itself (it reads the whole"
                " view topic as the live contents)"
            )
    return view_settings(
        queue,
        config=config,
        bootstrap_servers=bootstrap_servers,
        view_topic=view_topic,
        options=options,
    )


def _with_message(frame: DataFrame, settings: ViewSettings, schema: SchemaLike) -> DataFrame:
    where = f"queue {settings.queue!r}"
    return with_message(frame, settings.message_type, schema, settings.avro_schema, where)


def _kafka(spark: SparkSession, kafka_format: str) -> str:
    """``kafka_format``, with the session prepared (``qlayer_kafka`` registered)."""
    prepare(spark)
    return kafka_format


def _register(spark: SparkSession) -> str:
    """``qlayer_view``, with the session prepared: its Python workers, its data sources."""
    prepare(spark)
    return VIEW_FORMAT
