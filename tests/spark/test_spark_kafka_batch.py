"""Batch reads through the qlayer_kafka data source against the session's broker."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from connectors.spark_kafka import kafka_schema

pytestmark = [
    pytest.mark.spark,
    # PySpark's collect() leaves its result socket to the garbage collector.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

BASE_MS = 1_700_000_000_000
# A stalled range read fails within this, instead of Spark's two minutes.
POLL_TIMEOUT_MS = "15000"

SPARK_KAFKA_DTYPES = [
    ("key", "binary"),
    ("value", "binary"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("timestamp", "timestamp"),
    ("timestampType", "int"),
]


def _rows(df: Any) -> list[tuple[Any, ...]]:
    """Rows as plain Python values (timestamps in epoch ms, last), by partition and offset."""
    columns = [c for c in df.columns if c != "timestamp"]
    rows = df.selectExpr(*columns, "unix_millis(timestamp) AS ts").collect()

    def plain(value: Any) -> Any:
        if isinstance(value, bytearray):
            return bytes(value)
        if isinstance(value, list):
            return [tuple(plain(v) for v in header) for header in value]
        return value

    result = [tuple(plain(row[c]) for c in [*columns, "ts"]) for row in rows]
    partition, offset = columns.index("partition"), columns.index("offset")
    return sorted(result, key=lambda r: (r[partition], r[offset]))


def _offsets(df: Any) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for row in df.select("partition", "offset").collect():
        found.setdefault(row.partition, []).append(row.offset)
    return {partition: sorted(offsets) for partition, offsets in sorted(found.items())}


def test_batch_read_gives_every_record_with_the_kafka_source_columns(
    read_kafka, topic_factory, producer_factory
) -> None:
    topic = topic_factory(partitions=3)
    producer = producer_factory()
    expected = []
    next_offset = [0, 0, 0]
    for i in range(12):
        partition = i % 3
        key = None if i == 4 else b"key-%d" % (i // 2)  # repeated keys, and one null key
        value = None if i == 7 else b"value-%d" % i  # a tombstone
        headers = [("h", b"1"), ("h", b"2"), ("empty", None)] if i % 2 == 0 else None
        producer.produce(
            topic,
            key=key,
            value=value,
            partition=partition,
            timestamp=BASE_MS + i,
            headers=headers,
        )
        expected.append(
            (key, value, topic, partition, next_offset[partition], 0, headers, BASE_MS + i)
        )
        next_offset[partition] += 1
    assert producer.flush(10) == 0

    with_headers = read_kafka(subscribe=topic, includeHeaders="true")
    assert with_headers.schema == kafka_schema(include_headers=True)
    assert with_headers.dtypes == [
        *SPARK_KAFKA_DTYPES,
        ("headers", "array<struct<key:string,value:binary>>"),
    ]
    assert _rows(with_headers) == sorted(expected, key=lambda r: (r[3], r[4]))

    # As Spark's source: without includeHeaders there is no headers column.
    plain = read_kafka(subscribe=topic)
    assert plain.dtypes == SPARK_KAFKA_DTYPES
    assert _rows(plain) == sorted(
        [(k, v, t, p, o, tt, ts) for k, v, t, p, o, tt, _h, ts in expected],
        key=lambda r: (r[3], r[4]),
    )


def test_batch_offsets_as_json_and_as_earliest_latest(
    read_kafka, topic_factory, producer_factory
) -> None:
    topic = topic_factory(partitions=2)
    producer = producer_factory()
    for i in range(20):
        producer.produce(topic, value=b"%d" % i, partition=i % 2)
    assert producer.flush(10) == 0

    ranged = read_kafka(
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 3, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": 7, "1": -1}}),
    )
    assert _offsets(ranged) == {0: [3, 4, 5, 6], 1: list(range(10))}

    everything = read_kafka(subscribe=topic, startingOffsets="earliest", endingOffsets="latest")
    assert _offsets(everything) == {0: list(range(10)), 1: list(range(10))}

    nothing = read_kafka(
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 10, "1": 10}}),
        endingOffsets="latest",
    )
    assert nothing.count() == 0


def test_subscribe_pattern_reads_the_topics_it_matches(
    read_kafka, topic_factory, producer_factory
) -> None:
    prefix = f"pattern{uuid.uuid4().hex[:8]}"
    matching = [topic_factory(prefix=prefix), topic_factory(partitions=2, prefix=prefix)]
    other = topic_factory(prefix=f"{prefix}x")  # prefix + "x-...": not matched by "prefix-.*"
    producer = producer_factory()
    for topic in [*matching, other]:
        for i in range(3):
            producer.produce(topic, value=b"%d" % i)
    assert producer.flush(10) == 0

    df = read_kafka(subscribePattern=f"{prefix}-.*")
    counts = {row.topic: row["count"] for row in df.groupBy("topic").count().collect()}
    assert counts == {matching[0]: 3, matching[1]: 3}


def test_assign_reads_only_the_given_partitions(
    read_kafka, topic_factory, producer_factory
) -> None:
    topic = topic_factory(partitions=3)
    producer = producer_factory()
    for i in range(9):
        producer.produce(topic, value=b"%d" % i, partition=i % 3)
    assert producer.flush(10) == 0

    df = read_kafka(assign=json.dumps({topic: [0, 2]}))
    assert _offsets(df) == {0: [0, 1, 2], 2: [0, 1, 2]}


def test_transaction_markers_leave_gaps_and_never_stall_a_read(
    read_kafka, topic_factory, producer_factory
) -> None:
    topic = topic_factory(partitions=2)
    producer = producer_factory(transactional_id=f"tx-{uuid.uuid4().hex}")
    producer.init_transactions(10)
    for round_ in range(3):
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic, value=b"%d-%d" % (round_, i), partition=0)
        producer.produce(topic, value=b"%d" % round_, partition=1)
        producer.commit_transaction(10)
    # Partition 0: three records then a commit marker, three times (offsets 3, 7 and 11 are
    # markers); partition 1: record, marker, three times. Every range ends on a marker.
    committed = {0: [0, 1, 2, 4, 5, 6, 8, 9, 10], 1: [0, 2, 4]}
    options = {"subscribe": topic, "kafkaConsumer.pollTimeoutMs": POLL_TIMEOUT_MS}

    started = time.monotonic()
    assert _offsets(read_kafka(**options)) == committed
    assert _offsets(read_kafka(**options, **{"kafka.isolation.level": "read_committed"})) == (
        committed
    )
    # A range that ends on a marker in the middle of the partition.
    middle = read_kafka(**options, endingOffsets=json.dumps({topic: {"0": 8, "1": 4}}))
    assert _offsets(middle) == {0: [0, 1, 2, 4, 5, 6], 1: [0, 2]}

    # An open transaction: read_committed stops at the last stable offset, without waiting.
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    producer.flush(10)
    try:
        committed_only = read_kafka(**options, **{"kafka.isolation.level": "read_committed"})
        assert _offsets(committed_only) == committed
        uncommitted = _offsets(read_kafka(**options))
        assert uncommitted == {0: [*committed[0], 12], 1: committed[1]}
    finally:
        producer.abort_transaction(10)
    # Fifteen seconds per stalled range; these six reads take a few seconds when none stalls.
    assert time.monotonic() - started < 60
