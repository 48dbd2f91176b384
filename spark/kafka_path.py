"""A queue's view read through any Kafka source format, not only ``qlayer_view``.

``queue_contents(..., kafka_format="kafka")`` reads the view topic with Spark's own Kafka
connector where it is on the classpath (``"qlayer_kafka"``, the Python source of this project
with the same columns and options, anywhere): Spark stages then expand each ``ViewRound`` into
its changes, keep the last change per bookmark (batch), and fetch the changed messages from the
underlying topics on the executors. The rows are those of ``qlayer_view``, so everything built on
them is the same.

Differences from ``qlayer_view``: a stream's first micro-batch holds every change of the view
topic's generations (``layer.viewgen``; whose signed sums are the live contents), not the
contents reduced per bookmark; and the option ``queue`` is applied as a filter on the record key
(the queue's name, or one of its shards' for a partitioned queue).
Every generation of the view topic is read (``subscribePattern``), in order; the snapshots of the
generations newer than the oldest one there only repeat what comes before them, so they are
left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from connectors.spark_kafka.broker import BrokerView
from connectors.spark_kafka.options import KafkaSourceOptions
from connectors.spark_kafka.view import (
    Placed,
    ViewSourceOptions,
    spark_priority,
    view_batch,
    view_columns,
    view_schema,
)
from layer.config.model import SHARD_MARK
from layer.engine.model import Bookmark, ViewChange
from layer.viewcodec import decode_round
from layer.viewgen import SNAPSHOT_HEADER, SNAPSHOT_MARK, generations

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

#: the columns of one expanded change, before its message is fetched
EXPANDED = (
    "sign INT, queue STRING, topic STRING, partition INT, offset BIGINT, deliveries INT,"
    " cancels INT, priority BIGINT, at_ms BIGINT, view_partition INT, view_offset BIGINT,"
    " seq INT, generation INT"
)


def read_changes(
    spark: SparkSession,
    kafka_format: str,
    queue: str,
    options: Mapping[str, str],
    *,
    stream: bool,
    snapshot: bool,
) -> DataFrame:
    """The view topic's changes of ``queue`` as ``qlayer_view`` rows, read with
    ``kafka_format``; ``snapshot``: the last change per bookmark, if +1 (batch only)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    given = {k: v for k, v in options.items() if k.lower() not in ("queue", "snapshot")}
    given.setdefault("kafka.isolation.level", "read_committed")  # the coordinator's transactions
    fetch = ViewSourceOptions.parse({**given, "queue": queue}).kafka
    # one view topic, or a partitioned queue's shards' (each with its generations)
    view_topics = [t.strip() for t in given.pop("subscribe").split(",") if t.strip()]
    with BrokerView(fetch) as broker:
        topics = broker.topics()
    oldest = F.lit(0)
    family = F.when(F.col("topic").isin(view_topics), F.col("topic")).otherwise(
        F.regexp_replace("topic", r"\.g[0-9]+$", "")
    )
    for view_topic in view_topics:
        present = generations(view_topic, topics)
        if present:
            oldest = F.when(family == view_topic, F.lit(present[0][0])).otherwise(oldest)
    given["subscribePattern"] = (
        "(" + "|".join(re.escape(t) for t in view_topics) + r")(\.g[1-9][0-9]*)?"
    )
    reader = spark.readStream if stream else spark.read
    generation = F.when(F.col("topic").isin(view_topics), F.lit(0)).otherwise(
        F.regexp_extract("topic", r"\.g([0-9]+)$", 1).cast("int")
    )
    snapshot_record = F.exists(
        "headers", lambda h: (h.key == SNAPSHOT_HEADER) & (h.value == F.lit(SNAPSHOT_MARK))
    )
    # a record without headers has NULL ones: not a snapshot record (NULL would drop it)
    repeated = (generation > oldest) & F.coalesce(snapshot_record, F.lit(False))
    # the queue's rounds, and a partitioned queue's shards' (``orders#3``)
    key = F.col("key").cast("string")
    shard = queue + SHARD_MARK
    mine = (key == F.lit(queue)) | (
        key.startswith(shard) & F.substring(key, len(shard) + 1, 1 << 20).rlike("^[0-9]+$")
    )
    records = (
        reader.format(kafka_format)
        .options(**given, startingOffsets="earliest", includeHeaders="true")
        .load()
        .where(mine & ~repeated)
        .select("value", "partition", "offset", generation.alias("generation"))
    )
    changes = records.mapInArrow(_expand, EXPANDED)
    if snapshot:
        last = Window.partitionBy("topic", "partition", "offset").orderBy(
            F.desc("generation"), F.desc("view_partition"), F.desc("view_offset"), F.desc("seq")
        )
        changes = (
            changes.withColumn("_n", F.row_number().over(last))
            .where("_n = 1 AND sign > 0")
            .drop("_n")
        )
    return changes.mapInArrow(_fetcher(fetch), view_schema())


def _expand(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """View records (value, partition, offset) to their changes, in ``EXPANDED`` columns."""
    import pyarrow as pa

    names = [part.split()[0] for part in EXPANDED.split(",")]
    for batch in batches:
        rows: list[tuple[Any, ...]] = []
        for value, view_partition, view_offset, generation in zip(
            batch.column("value").to_pylist(),
            batch.column("partition").to_pylist(),
            batch.column("offset").to_pylist(),
            batch.column("generation").to_pylist(),
            strict=True,
        ):
            if not value:
                continue
            round_ = decode_round(value)
            for seq, change in enumerate(round_.changes):
                bm = change.bookmark
                priority = spark_priority(change.priority)
                rows.append(
                    (change.sign, round_.queue, bm.topic, bm.partition, bm.offset,
                     change.deliveries, change.cancels, priority, round_.at_ms,
                     view_partition, view_offset, seq, generation)
                )  # fmt: skip
        if rows:
            columns = list(zip(*rows, strict=True))
            i32, i64, text = pa.int32(), pa.int64(), pa.string()
            types = [i32, text, text, i32, i64, i32, i32, i64, i64, i32, i64, i32, i32]
            arrays = [pa.array(c, t) for c, t in zip(columns, types, strict=True)]
            yield pa.RecordBatch.from_arrays(arrays, names=names)


def _fetcher(
    kafka: KafkaSourceOptions,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Expanded changes to ``qlayer_view`` rows, their messages fetched from the brokers."""

    def fetch(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            placed: list[Placed] = [
                (
                    ViewChange(
                        Bookmark(r["topic"], r["partition"], r["offset"]),
                        r["sign"],
                        r["deliveries"],
                        r["cancels"],
                        r["priority"],
                    ),
                    r["queue"],
                    r["at_ms"],
                    r["view_partition"],
                    r["view_offset"],
                )  # fmt: skip
                for r in batch.to_pylist()
            ]
            if placed:
                yield view_batch(pa, view_columns(kafka, placed))

    return fetch
