"""The qlayer_view data source over view records written here with a plain producer.

The records follow ``avro/view_round.avsc``, as a coordinator writes them (one change per round
here, so that each change has a view offset of its own), and the messages they name are in an
underlying topic written here too; the tests against a real coordinator are in
test_spark_views.py and test_spark_live_stream.py.
"""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from connectors.spark_kafka import (
    VIEW_FORMAT,
    ViewDataSource,
    ViewInputPartition,
    register_view,
    view_schema,
)
from connectors.spark_kafka import follow as following
from layer.engine.model import Bookmark, ViewChange, ViewChanges
from layer.exceptions import ConfigError
from layer.viewcodec import encode_round
from spark import live_aggregate, spark_type_of
from tests.helpers import wait_until

pytestmark = [
    pytest.mark.spark,
    # PySpark's collect() leaves its result socket to the garbage collector.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

BASE_MS = 1_700_000_000_000
# The messages of the underlying topic, by offset: (sym, qty, headers)
MESSAGES: list[tuple[str, int, list[tuple[str, bytes | None]]]] = [
    ("A", 5, [("h", b"1"), ("h", None)]),
    ("B", 3, []),
    ("A", 2, []),
    ("B", 4, []),
    ("C", 1, []),
    ("C", 2, []),
]


def change(
    sign: int, offset: int, *, deliveries: int = 0, cancels: int = 0, priority: int | None = None
) -> tuple[int, int, int, int, int | None]:
    """A change of the message at ``offset`` of the underlying topic."""
    return sign, offset, deliveries, cancels, priority


@pytest.fixture
def view_topic(topic_factory, producer_factory) -> Any:
    """``(view topic, write, underlying topic)``: new topics, the messages written to the
    underlying one, and ``write([change(...), ...])``, a round per change, to the view."""
    topic, under = topic_factory(prefix="view"), topic_factory(prefix="orders")
    producer = producer_factory()
    for offset, (sym, qty, headers) in enumerate(MESSAGES):
        value = json.dumps({"sym": sym, "qty": qty}).encode()
        producer.produce(under, value, b"k%d" % offset, headers=headers, timestamp=BASE_MS + offset)
    assert producer.flush(10) == 0

    def record(spec: tuple[int, int, int, int, int | None]) -> tuple[bytes, bytes]:
        sign, offset, deliveries, cancels, priority = spec
        changed = ViewChange(Bookmark(under, 0, offset), sign, deliveries, cancels, priority)
        return b"orders", encode_round(
            "orders", ViewChanges.of([changed]), BASE_MS + 10_000 + offset
        )

    def write(changes: list[tuple[int, int, int, int, int | None]]) -> None:
        for spec in changes:
            key, value = record(spec)
            producer.produce(topic, key=key, value=value)
        assert producer.flush(10) == 0

    write.record = record  # type: ignore[attr-defined]
    return topic, write, under


def _read(spark: Any, kafka_options: dict[str, str], topic: str, **options: str) -> Any:
    register_view(spark)
    return (
        spark.read.format(VIEW_FORMAT).options(**kafka_options, subscribe=topic, **options).load()
    )


# A history: 0 in, 1 in and out, 2 in, out (leased) and back (cancelled, 1 cancel), 3 in and
# out for good, 4 in; the live contents are 0, 2 and 4.
HISTORY = [
    change(1, 0, priority=7),
    change(1, 1),
    change(1, 2),
    change(-1, 1, deliveries=1),
    change(1, 3),
    change(-1, 2, deliveries=1),
    change(1, 2, deliveries=1, cancels=1),
    change(-1, 3, deliveries=1),
    change(1, 4),
]


def test_a_batch_read_is_the_last_record_of_each_bookmark_that_is_in(
    spark, kafka_options, view_topic
) -> None:
    topic, write, under = view_topic
    write(HISTORY)
    df = _read(spark, kafka_options, topic)
    assert df.schema == view_schema()
    rows = {r.bookmark: r for r in df.collect()}
    assert sorted(rows) == [f"{under}/0/0", f"{under}/0/2", f"{under}/0/4"]
    first = rows[f"{under}/0/0"]
    assert first.asDict() | {"headers": None, "enqueue_time": None, "changed_at": None} == {
        "sign": 1,
        "queue": "orders",
        "bookmark": f"{under}/0/0",
        "topic": under,
        "partition": 0,
        "offset": 0,
        "key": bytearray(b"k0"),
        "headers": None,
        "value": bytearray(b'{"sym": "A", "qty": 5}'),
        "priority": 7,
        "deliveries": 0,
        "cancels": 0,
        "enqueue_time": None,
        "changed_at": None,
        "view_partition": 0,
        "view_offset": 0,
        "lease_holder": None,  # a change of the live contents, not of the leases
        "leased_at": None,
    }
    assert [(h.key, h.value) for h in first.headers] == [("h", bytearray(b"1")), ("h", None)]
    times = df.where("offset = 0").selectExpr(
        "unix_millis(enqueue_time) AS enq", "unix_millis(changed_at) AS at"
    )
    assert times.first().asDict() == {"enq": BASE_MS, "at": BASE_MS + 10_000}
    # the cancelled one comes back with its counts; its view offset is its latest record
    assert (rows[f"{under}/0/2"].deliveries, rows[f"{under}/0/2"].cancels) == (1, 1)
    assert rows[f"{under}/0/2"].view_offset == 6


def test_snapshot_false_gives_every_change_and_ending_offsets_give_the_past(
    spark, kafka_options, view_topic
) -> None:
    topic, write, _under = view_topic
    write(HISTORY)
    changes = _read(spark, kafka_options, topic, snapshot="false").orderBy("view_offset")
    assert [(r.sign, r.offset) for r in changes.collect()] == [
        (1, 0), (1, 1), (1, 2), (-1, 1), (1, 3), (-1, 2), (1, 2), (-1, 3), (1, 4),
    ]  # fmt: skip
    # the signed sum per bookmark is the snapshot, at points of the history
    for end in (0, 4, 6, 8):
        past = _read(spark, kafka_options, topic, endingOffsets=json.dumps({topic: {"0": end}}))
        summed = (
            changes.where(f"view_offset < {end}")
            .groupBy("bookmark")
            .agg(F.sum("sign").alias("n"))
            .where("n > 0")
        )
        assert sorted(r.bookmark for r in past.collect()) == sorted(
            r.bookmark for r in summed.collect()
        ), end
        assert all(r.n == 1 for r in summed.collect())


def test_the_queue_option_reads_that_queues_rounds_only(
    spark, kafka_options, view_topic, producer_factory
) -> None:
    """A view topic shared by two queues: ``queue`` keeps one queue's rounds."""
    topic, write, under = view_topic
    write(HISTORY)
    other = encode_round(
        "other", ViewChanges.of([ViewChange(Bookmark(under, 0, 5), 1, 3, 0)]), BASE_MS
    )
    producer = producer_factory()
    producer.produce(topic, key=b"other", value=other)
    assert producer.flush(10) == 0
    mine = _read(spark, kafka_options, topic, queue="orders").collect()
    assert sorted(r.offset for r in mine) == [0, 2, 4]
    every = _read(spark, kafka_options, topic).collect()
    assert sorted((r.queue, r.offset) for r in every) == [
        ("orders", 0), ("orders", 2), ("orders", 4), ("other", 5),
    ]  # fmt: skip


def test_records_of_an_open_transaction_are_not_read(
    spark, kafka_options, view_topic, producer_factory
) -> None:
    topic, write, _under = view_topic
    write(HISTORY[:3])
    transactional = producer_factory(transactional_id=f"tx-{uuid.uuid4().hex}")
    transactional.init_transactions(10)
    transactional.begin_transaction()
    key, value = write.record(change(-1, 0, deliveries=1))
    transactional.produce(topic, key=key, value=value)
    assert transactional.flush(10) == 0
    try:
        assert sorted(r.offset for r in _read(spark, kafka_options, topic).collect()) == [0, 1, 2]
    finally:
        transactional.commit_transaction(10)
    assert sorted(r.offset for r in _read(spark, kafka_options, topic).collect()) == [1, 2]


def test_a_stream_starts_with_the_live_contents_then_follows_the_changes(
    spark, kafka_options, view_topic, checkpoint_dir: Path
) -> None:
    topic, write, _under = view_topic
    write(HISTORY)
    register_view(spark)
    batches: list[list[tuple[int, int]]] = []
    stream = spark.readStream.format(VIEW_FORMAT).options(**kafka_options, subscribe=topic).load()

    def record(df: Any, batch_id: int) -> None:
        batches.append(sorted((r.sign, r.offset) for r in df.collect()))

    parsed = stream.withColumn(
        "message", F.from_json(F.col("value").cast("string"), "sym STRING, qty INT")
    )
    query = (
        stream.writeStream.foreachBatch(record)
        .option("checkpointLocation", str(checkpoint_dir / "changes"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    table = f"totals_{uuid.uuid4().hex}"
    aggregate = (  # complete mode; update mode is in test_spark_live_stream.py
        live_aggregate(parsed, by="sym", sum={"qty": "qty"}, avg={"avg_qty": "qty"})
        .writeStream.outputMode("complete")
        .format("memory")
        .queryName(table)
        .option("checkpointLocation", str(checkpoint_dir / "totals"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def totals() -> dict[str, tuple[int, int, float | None]]:
        rows = spark.sql(f"SELECT * FROM {table}").collect()
        return {r.sym: (r["count"], r.qty, r.avg_qty) for r in rows}

    try:
        wait_until(lambda: batches, timeout=60, message="no first micro-batch")
        assert batches[0] == [(1, 0), (1, 2), (1, 4)]  # the contents: each live message once
        write([change(-1, 0, deliveries=1), change(1, 5)])
        wait_until(lambda: len(batches) >= 2, timeout=60, message="no second micro-batch")
        assert batches[1] == [(-1, 0), (1, 5)]  # then the changes, as written
        # B left before the stream started, so it never was a group
        expected = {"A": (1, 2, 2.0), "C": (2, 3, 1.5)}
        wait_until(lambda: totals() == expected, timeout=60, message=lambda: f"{totals()}")
        write([change(-1, 2, deliveries=2, cancels=1)])
        # an emptied group stays in complete mode, with a count of 0 and no average
        expected = {"A": (0, 0, None), "C": (2, 3, 1.5)}
        wait_until(lambda: totals() == expected, timeout=60, message=lambda: f"{totals()}")
    finally:
        query.stop()
        aggregate.stop()


def test_an_empty_first_micro_batch_readies_the_worker_and_changes_follow_as_written(
    kafka_options, view_topic
) -> None:
    """A stream started on an empty view topic still plans a read for its first micro-batch:
    an empty range, which has Spark start the data source's Python worker, and the worker
    open its tail of the view partition, before the first change. The ranges after it are
    changes as written, even one that starts at the partition's beginning (not a snapshot,
    which would drop a message that came and went within it)."""
    topic, write, _under = view_topic
    reader = ViewDataSource({**kafka_options, "subscribe": topic}).streamReader(view_schema())
    try:
        start = reader.initialOffset()
        end = reader.latestOffset()
        [warm] = reader.partitions(start, end)
        assert isinstance(warm, ViewInputPartition)
        assert (warm.topic, warm.start, warm.end, warm.snapshot, warm.stream) == (
            topic, 0, 0, False, True,
        )  # fmt: skip
        assert list(reader.read(warm)) == []
        assert any(key[1:] == (topic, 0) for key in following._TAILS)  # the tail is open
        assert reader.partitions(end, end) == []  # once readied, nothing to read is nothing

        write([change(1, 1), change(-1, 1, deliveries=1), change(1, 4)])
        later = reader.latestOffset()
        [changes] = reader.partitions(end, later)
        assert (changes.start, changes.snapshot) == (0, False)
        rows = [row for batch in reader.read(changes) for row in batch.to_pylist()]
        assert [(r["sign"], r["offset"], r["deliveries"]) for r in rows] == [
            (1, 1, 0), (-1, 1, 1), (1, 4, 0),
        ]  # fmt: skip
        assert rows[2]["value"] == json.dumps({"sym": "C", "qty": 1}).encode()
    finally:
        reader.stop()
        following.close()


def test_a_stream_started_on_an_empty_view_shows_the_changes_that_follow(
    spark, kafka_options, view_topic, checkpoint_dir: Path
) -> None:
    topic, write, _under = view_topic
    register_view(spark)
    batches: list[list[tuple[int, int]]] = []
    stream = spark.readStream.format(VIEW_FORMAT).options(**kafka_options, subscribe=topic).load()

    def record(df: Any, batch_id: int) -> None:
        batches.append(sorted((r.sign, r.offset) for r in df.collect()))

    query = (
        stream.writeStream.foreachBatch(record)
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: batches, timeout=60, message="no first micro-batch")
        assert batches[0] == []  # the warm-up read: no rows
        write([change(1, 0), change(1, 1), change(-1, 1, deliveries=1)])

        def shown() -> list[tuple[int, int]]:
            return sorted(row for batch in batches[1:] for row in batch)

        wait_until(lambda: len(shown()) >= 3, timeout=60, message=lambda: f"{batches}")
        assert shown() == [(-1, 1), (1, 0), (1, 1)]
    finally:
        query.stop()


def test_options_that_do_not_fit_a_view_are_refused(spark, kafka_options) -> None:
    for option, value in (("includeHeaders", "true"), ("maxOffsetsPerTrigger", "10")):
        with pytest.raises(ConfigError, match=option.lower()):
            ViewDataSource({**kafka_options, "subscribe": "v", option: value})
    with pytest.raises(ConfigError, match="snapshot"):
        ViewDataSource({**kafka_options, "subscribe": "v", "snapshot": "maybe"})
    missing = f"no-such-view-{uuid.uuid4().hex}"
    with pytest.raises(Exception, match=f"view topic {missing} does not exist"):
        _read(spark, kafka_options, missing).collect()


def test_view_source_and_ranges_survive_pickling(kafka_options) -> None:
    source = ViewDataSource({**kafka_options, "subscribe": "v"})
    schema = source.schema()
    for reader in (source, source.reader(schema), source.streamReader(schema)):
        assert type(pickle.loads(pickle.dumps(reader))) is type(reader)
    task = ViewInputPartition("v", 0, 10, 20, snapshot=True)
    assert vars(pickle.loads(pickle.dumps(task))) == vars(task)


def test_avro_schemas_map_to_spark_types() -> None:
    import fastavro

    parsed = fastavro.parse_schema(
        {
            "type": "record",
            "name": "Order",
            "fields": [
                {"name": "id", "type": "long"},
                {"name": "symbol", "type": "string"},
                {"name": "qty", "type": ["null", "int"]},
                {"name": "tags", "type": {"type": "array", "items": "string"}},
                {"name": "side", "type": {"type": "enum", "name": "Side", "symbols": ["B", "S"]}},
                {"name": "odd", "type": ["int", "string"]},
            ],
        }
    )
    spark_type, convert = spark_type_of(parsed)
    assert spark_type.simpleString() == (
        "struct<id:bigint,symbol:string,qty:int,tags:array<string>,side:string,odd:string>"
    )
    assert convert({"id": 1, "symbol": "X", "qty": None, "tags": ["a"], "side": "B", "odd": 3}) == {
        "id": 1,
        "symbol": "X",
        "qty": None,
        "tags": ["a"],
        "side": "B",
        "odd": "3",
    }
