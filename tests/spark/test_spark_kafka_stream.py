"""Streaming reads through the qlayer_kafka data source: checkpoints, rate limits, new topics."""

from __future__ import annotations

import pickle
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from connectors.spark_kafka import (
    KafkaDataSource,
    KafkaInputPartition,
    KafkaSourceOptions,
    KafkaStreamReader,
)
from tests.helpers import wait_until
from tests.spark.support import await_query

pytestmark = [
    pytest.mark.spark,
    # PySpark's collect() leaves its result socket to the garbage collector.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

POLL_TIMEOUT_MS = "15000"


def _stream(spark: Any, kafka_options: dict[str, str], **options: str) -> Any:
    return (
        spark.readStream.format("qlayer_kafka")
        .options(**kafka_options, **{"kafkaConsumer.pollTimeoutMs": POLL_TIMEOUT_MS}, **options)
        .load()
    )


def test_restart_from_checkpoint_reads_every_offset_exactly_once(
    spark, kafka_options, topic_factory, producer_factory, consume_all, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=3)
    producer = producer_factory()
    transactional = producer_factory(transactional_id=f"tx-{uuid.uuid4().hex}")
    transactional.init_transactions(10)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_available_now() -> None:
        query = (
            _stream(spark, kafka_options, subscribe=topic, startingOffsets="earliest")
            .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        await_query(query)

    def written() -> Counter[tuple[int, int]]:
        rows = spark.read.parquet(str(output)).select("partition", "offset").collect()
        return Counter((row.partition, row.offset) for row in rows)

    def in_topic() -> Counter[tuple[int, int]]:
        return Counter((m.partition(), m.offset()) for m in consume_all(topic))

    for i in range(90):
        producer.produce(topic, value=b"first-%d" % i, partition=i % 3)
    assert producer.flush(10) == 0
    run_available_now()
    assert written() == in_topic()
    assert sum(written().values()) == 90

    # More records, some in transactions (their markers make gaps), then a restart.
    for i in range(40):
        producer.produce(topic, value=b"second-%d" % i, partition=i % 3)
    assert producer.flush(10) == 0
    for round_ in range(2):
        transactional.begin_transaction()
        for i in range(5):
            transactional.produce(topic, value=b"tx-%d-%d" % (round_, i), partition=i % 3)
        transactional.commit_transaction(10)
    run_available_now()
    counts = written()
    assert counts == in_topic()  # every offset of the topic, each once
    assert sum(counts.values()) == 90 + 40 + 10

    # A restart with nothing new adds nothing.
    run_available_now()
    assert written() == counts


def test_max_offsets_per_trigger_bounds_each_micro_batch_in_proportion_to_lag(
    spark, kafka_options, topic_factory, producer_factory, checkpoint_dir: Path
) -> None:
    topic = topic_factory(partitions=2)
    producer = producer_factory()
    for i in range(200):
        producer.produce(topic, value=b"%d" % i, partition=0 if i % 4 else 1)  # 150 and 50
    assert producer.flush(10) == 0
    batches: list[dict[int, int]] = []

    def record(df: Any, batch_id: int) -> None:
        batches.append(
            {row.partition: row["count"] for row in df.groupBy("partition").count().collect()}
        )

    query = (
        _stream(
            spark,
            kafka_options,
            subscribe=topic,
            startingOffsets="earliest",
            maxOffsetsPerTrigger="40",
        )
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_until(
            lambda: sum(sum(b.values()) for b in batches) >= 200,
            timeout=90,
            message=lambda: f"micro-batches so far: {batches}",
        )
    finally:
        query.stop()
    sizes = [sum(b.values()) for b in batches if b]
    assert sum(sizes) == 200
    assert max(sizes) <= 40
    assert len(sizes) >= 5
    # Lag 150 against 50: Spark's proportional split gives 30 and 10 offsets.
    assert batches[0] == {0: 30, 1: 10}


def test_subscribe_pattern_starts_new_topics_at_earliest(
    spark, kafka_options, topic_factory, producer_factory, checkpoint_dir: Path
) -> None:
    prefix = f"grow{uuid.uuid4().hex[:8]}"
    first = topic_factory(prefix=prefix)
    producer = producer_factory()
    for i in range(5):
        producer.produce(first, value=b"before-%d" % i)
    assert producer.flush(10) == 0
    table = f"pattern_{uuid.uuid4().hex}"

    query = (
        _stream(spark, kafka_options, subscribePattern=f"{prefix}-.*")  # starts at latest
        .selectExpr("topic", "CAST(value AS STRING) AS value")
        .writeStream.format("memory")
        .queryName(table)
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: query.lastProgress is not None, timeout=60, message="no micro-batch ran")
        for i in range(3):
            producer.produce(first, value=b"after-%d" % i)
        second = topic_factory(partitions=2, prefix=prefix)  # appears while the query runs
        for i in range(4):
            producer.produce(second, value=b"new-%d" % i, partition=i % 2)
        assert producer.flush(10) == 0

        def seen() -> list[tuple[str, str]]:
            return sorted((r.topic, r.value) for r in spark.sql(f"SELECT * FROM {table}").collect())

        wait_until(lambda: len(seen()) >= 7, timeout=60, message=lambda: f"seen {seen()}")
    finally:
        query.stop()
    assert seen() == sorted(
        [(first, f"after-{i}") for i in range(3)] + [(second, f"new-{i}") for i in range(4)]
    )


def test_a_failed_micro_batch_is_replayed_with_the_same_offsets_after_a_restart(
    spark, kafka_options, topic_factory, producer_factory, consume_all, checkpoint_dir: Path
) -> None:
    topic = topic_factory(partitions=2)
    producer = producer_factory()
    for i in range(120):
        producer.produce(topic, value=b"%d" % i, partition=i % 2)
    assert producer.flush(10) == 0
    seen: list[tuple[int, list[tuple[int, int]]]] = []
    fail_once = {2}

    def record(df: Any, batch_id: int) -> None:
        rows = df.select("partition", "offset").collect()
        seen.append((batch_id, sorted((row.partition, row.offset) for row in rows)))
        if batch_id in fail_once:
            fail_once.discard(batch_id)
            raise RuntimeError(f"the sink fails batch {batch_id}")

    def start() -> Any:
        return (
            _stream(
                spark,
                kafka_options,
                subscribe=topic,
                startingOffsets="earliest",
                maxOffsetsPerTrigger="30",
            )
            .writeStream.foreachBatch(record)
            .option("checkpointLocation", str(checkpoint_dir))
            .trigger(processingTime="100 milliseconds")
            .start()
        )

    failing = start()
    with pytest.raises(Exception, match="the sink fails batch 2"):
        failing.awaitTermination(60)
    restarted = start()  # batch 2 was planned, never committed: it runs again
    try:
        wait_until(
            lambda: sum(len(offsets) for _b, offsets in seen) >= 120 + 30,
            timeout=60,
            message=lambda: f"batches so far: {[(b, len(o)) for b, o in seen]}",
        )
    finally:
        restarted.stop()

    runs_of_batch_2 = [offsets for batch_id, offsets in seen if batch_id == 2]
    assert len(runs_of_batch_2) == 2
    assert runs_of_batch_2[0] == runs_of_batch_2[1]  # the same offsets, replayed
    last_run = {batch_id: offsets for batch_id, offsets in seen}  # later runs win
    covered = Counter(tp for offsets in last_run.values() for tp in offsets)
    assert covered == Counter((m.partition(), m.offset()) for m in consume_all(topic))
    assert all(len(offsets) <= 30 for offsets in last_run.values())


@dataclass(frozen=True)
class _ReadMaxRows:
    """Stands for Spark 4.2's ``pyspark.sql.streaming.datasource.ReadMaxRows``."""

    max_rows: int


class _ReadAllAvailable:
    """Stands for Spark 4.2's ``ReadAllAvailable``."""


def test_stream_reader_takes_spark_4_0_and_4_2_calls(
    kafka_options, topic_factory, producer_factory
) -> None:
    topic = topic_factory(partitions=2)
    producer = producer_factory()
    for i in range(40):
        producer.produce(topic, value=b"%d" % i, partition=0 if i % 4 else 1)  # 30 and 10
    assert producer.flush(10) == 0
    options = KafkaSourceOptions.parse(
        {**kafka_options, "subscribe": topic, "startingOffsets": "earliest"}
    )
    start = {topic: {"0": 0, "1": 0}}

    # Spark 4.2: latestOffset(start, limit), the limit from the engine.
    reader = KafkaStreamReader(options)
    assert reader.initialOffset() == start
    assert reader.latestOffset(start, _ReadMaxRows(8)) == {topic: {"0": 6, "1": 2}}
    assert reader.latestOffset({topic: {"0": 6, "1": 2}}, _ReadAllAvailable()) == {
        topic: {"0": 30, "1": 10}
    }
    # Trigger.AvailableNow: what arrives after prepareForTriggerAvailableNow is left for later.
    reader.prepareForTriggerAvailableNow()
    producer.produce(topic, value=b"late", partition=0)
    assert producer.flush(10) == 0
    assert reader.latestOffset(start, _ReadAllAvailable()) == {topic: {"0": 30, "1": 10}}
    assert reader.reportLatestOffset() == {topic: {"0": 30, "1": 10}}

    # Spark 4.0: latestOffset() before initialOffset(), maxOffsetsPerTrigger from the options.
    limited_options = KafkaSourceOptions.parse(
        {
            **kafka_options,
            "subscribe": topic,
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": "20",
        }
    )
    limited = KafkaStreamReader(limited_options)
    # lag 31 and 10: 20 * 31/41 = 15.1 and 20 * 10/41 = 4.9, rounded down
    assert limited.latestOffset() == {topic: {"0": 15, "1": 4}}
    assert limited.initialOffset() == start
    # on from there: lag 16 and 6, so 14.5 and 5.5
    assert limited.latestOffset() == {topic: {"0": 29, "1": 9}}
    # A restart from a checkpoint: Spark hands over the last planned offsets first.
    restarted = KafkaStreamReader(limited_options)
    assert restarted.partitions({topic: {"0": 3, "1": 1}}, {topic: {"0": 3, "1": 1}}) == []
    assert restarted.latestOffset() == {topic: {"0": 18, "1": 5}}  # lag 28 and 9 from (3, 1)
    ranges = restarted.partitions({topic: {"0": 3, "1": 1}}, {topic: {"0": 18, "1": 5}})
    assert [(r.topic, r.partition, r.start, r.end) for r in ranges] == [
        (topic, 0, 3, 18),
        (topic, 1, 1, 5),
    ]


def test_sources_and_readers_survive_pickling(kafka_options) -> None:
    source = KafkaDataSource({**kafka_options, "subscribe": "t", "includeHeaders": "true"})
    schema = source.schema()
    for reader in (source, source.reader(schema), source.streamReader(schema)):
        copy = pickle.loads(pickle.dumps(reader))
        assert type(copy) is type(reader)
    task = KafkaInputPartition("t", 3, 10, 20)
    assert vars(pickle.loads(pickle.dumps(task))) == vars(task)


def test_available_now_with_max_offsets_per_trigger(
    spark, kafka_options, topic_factory, producer_factory, checkpoint_dir: Path
) -> None:
    topic = topic_factory(partitions=2)
    producer = producer_factory()
    for i in range(100):
        producer.produce(topic, value=b"%d" % i, partition=i % 2)
    assert producer.flush(10) == 0
    sizes: list[int] = []
    query = (
        _stream(
            spark,
            kafka_options,
            subscribe=topic,
            startingOffsets="earliest",
            maxOffsetsPerTrigger="30",
        )
        .writeStream.foreachBatch(lambda df, _batch_id: sizes.append(df.count()))
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query)
    if tuple(int(part) for part in spark.version.split(".")[:2]) >= (4, 2):
        assert sizes == [30, 30, 30, 10]  # everything, in batches of maxOffsetsPerTrigger
    else:
        # Before 4.2 Spark runs AvailableNow on a Python source as one batch: a run reads at
        # most maxOffsetsPerTrigger offsets, the next run goes on from there.
        assert sizes == [30]
