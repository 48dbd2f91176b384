"""``spark.queue_contents`` against a real coordinator process: at a quiet moment the view holds
exactly what ``client.browse`` lists, through publishes, leases, acks, cancels, lease timeouts,
expirations and ``target_queue_depth``; and errors that name the queue and the option."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import fastavro
import pytest

from layer.client import QueueClient
from layer.exceptions import ConfigError, UnknownQueue
from spark import queue_contents
from tests.harness import write_config
from tests.helpers import wait_until

pytestmark = [
    pytest.mark.spark,
    pytest.mark.integration,
    # PySpark's collect() leaves its result socket to the garbage collector.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

#: A message in the view or in a browse: (deliveries, cancels, value).
Seen = dict[str, tuple[int, int, bytes | None]]


def browsed(client: QueueClient, queue: str) -> Seen:
    return {m.bookmark: (m.deliveries, m.cancels, m.value) for m in client.browse(queue)}


def assert_contents_match_browse(spark: Any, client: QueueClient, queue: str, config: Path) -> Seen:
    """The view equals a browse taken just before and just after it (a quiet moment). The wait
    covers only the round in flight when it starts: a quiet queue agrees at the first try."""
    last: dict[str, Any] = {}

    def same() -> bool:
        before = browsed(client, queue)
        rows = queue_contents(spark, queue, config=config).collect()
        view = {r.bookmark: (r.deliveries, r.cancels, bytes(r.value)) for r in rows}
        # the same view read through a Kafka source format (the path format("kafka") takes)
        rows = queue_contents(spark, queue, config=config, kafka_format="qlayer_kafka").collect()
        through_kafka = {r.bookmark: (r.deliveries, r.cancels, bytes(r.value)) for r in rows}
        after = browsed(client, queue)
        last.update(before=before, view=view, after=after, through_kafka=through_kafka)
        return before == after == view == through_kafka

    def differences() -> str:
        before, view, kafka = last["before"], last["view"], last["through_kafka"]
        return (
            f"view != browse for {queue}: only in the view {sorted(set(view) - set(before))},"
            f" only in browse {sorted(set(before) - set(view))}, counts differ for"
            f" {sorted(b for b in set(view) & set(before) if view[b] != before[b])};"
            f" through kafka_format: {'the same' if kafka == view else kafka}"
        )

    wait_until(same, timeout=30, interval=0.2, message=differences)
    return dict(last["view"])


def test_queue_contents_is_what_browse_lists(
    spark, broker, coordinator_factory, names, producer_factory, topic_factory
) -> None:
    orders, jobs = names("orders"), names("jobs")
    orders_topic = topic_factory(partitions=2, prefix="orders")
    jobs_topic = topic_factory(prefix="jobs")
    coordinator = coordinator_factory(
        [
            {
                "name": orders,
                "underlying_topic": orders_topic,
                "view_topic": f"{orders}.view",
                # long enough to outlast the Spark jobs that run while messages are held: the
                # lease timeouts below are made on purpose, with extend()
                "lease_period": "120s",
                "expiration": "60s",
            },
            {
                "name": jobs,
                "underlying_topic": jobs_topic,
                "view_topic": f"{jobs}.view",
                "target_queue_depth": 5,
            },
        ]
    )
    config = coordinator.config_path
    producer = producer_factory()
    now_ms = int(time.time() * 1000)
    # 6 messages that expire about 5 s after they arrive (they are 55 s old), 30 that stay
    for i in range(6):
        doc = {"id": 100 + i, "sym": "OLD"}
        producer.produce(orders_topic, json.dumps(doc).encode(), partition=i % 2,
                         timestamp=now_ms - 55_000)  # fmt: skip
    for i in range(30):
        doc = {"id": i, "sym": "ABC"[i % 3], "qty": i}
        producer.produce(orders_topic, json.dumps(doc).encode(), partition=i % 2)
    for i in range(12):
        producer.produce(jobs_topic, json.dumps({"id": i}).encode())
    assert producer.flush(10) == 0

    with QueueClient(coordinator.address) as client:
        # publishes, then expirations
        wait_until(
            lambda: (
                client.stats(orders)[0].available == 30
                and client.stats(orders)[0].dead_lettered_total == 6
            ),
            timeout=30,
            message=lambda: f"30 available, 6 expired: {client.stats(orders)[0]}",
        )
        view = assert_contents_match_browse(spark, client, orders, config)
        assert len(view) == 30
        expired_history = _history(spark, orders, config, sym="OLD")
        assert len(expired_history) == 6 and all(signs == [1, -1] for signs in expired_history)

        # leases: 5 messages leased are out of the view
        sub = client.subscribe(orders, max_backlog=5, filter="/id < 5")
        held = [sub.next(timeout=10) for _ in range(5)]
        assert all(m is not None for m in held)
        leased = {m.bookmark for m in held if m is not None}
        view = assert_contents_match_browse(spark, client, orders, config)
        assert len(view) == 25 and not leased & set(view)

        # acks, a cancel and lease timeouts: 2 gone, 1 back with a cancel, 2 back when their
        # leases run out (extended to end in half a second)
        acked, cancelled, timed_out = held[:2], held[2], held[3:]
        sub.replace(filter="/id < 0")  # takes nothing more; keeps the leases
        for msg in acked:
            assert msg is not None
            msg.ack(wait=True)
        assert cancelled is not None
        cancelled.cancel(wait=True)
        for msg in timed_out:
            assert msg is not None
            msg.extend(0.5, wait=True)
        wait_until(
            lambda: client.stats(orders)[0].leased == 0,
            timeout=15,
            message="the leases time out",
        )
        view = assert_contents_match_browse(spark, client, orders, config)
        assert len(view) == 28
        assert not {m.bookmark for m in acked if m is not None} & set(view)
        assert view[cancelled.bookmark][:2] == (1, 1)
        assert all(view[m.bookmark][:2] == (1, 0) for m in timed_out if m is not None)
        sub.close()

        # target_queue_depth: only the 5 active messages are in the view
        wait_until(
            lambda: client.stats(jobs)[0].inactive == 7,
            timeout=15,
            message=lambda: f"7 inactive: {client.stats(jobs)[0]}",
        )
        first = assert_contents_match_browse(spark, client, jobs, config)
        assert len(first) == 5
        with client.subscribe(jobs, max_backlog=2) as worker:
            for _ in range(2):
                msg = worker.next(timeout=10)
                assert msg is not None
                msg.ack(wait=True)
        # 2 acked, whatever else was handed out came back at the close: 2 inactive ones entered
        wait_until(
            lambda: client.stats(jobs)[0].inactive == 5 and client.stats(jobs)[0].leased == 0,
            timeout=15,
            message=lambda: f"5 inactive, none leased: {client.stats(jobs)[0]}",
        )
        second = assert_contents_match_browse(spark, client, jobs, config)
        assert len(second) == 5 and second.keys() != first.keys()


def _history(spark: Any, queue: str, config: Path, sym: str) -> list[list[int]]:
    """The signs of the view records of each message with ``sym``, in order (every record)."""
    from pyspark.sql import functions as F

    from connectors.spark_kafka import VIEW_FORMAT, register_view
    from spark import view_settings

    register_view(spark)
    settings = view_settings(queue, config=config)
    rows = (
        spark.read.format(VIEW_FORMAT)
        .options(**settings.options, snapshot="false")
        .load()
        .where(F.get_json_object(F.col("value").cast("string"), "$.sym") == sym)
        .orderBy("view_offset")
        .collect()
    )
    signs: dict[str, list[int]] = {}
    for row in rows:
        signs.setdefault(row.bookmark, []).append(row.sign)
    return list(signs.values())


def test_messages_parse_with_a_schema_or_to_a_map(
    spark, coordinator_factory, names, producer_factory, topic_factory
) -> None:
    queue, topic = names("q"), topic_factory()
    coordinator = coordinator_factory(
        [
            {
                "name": queue,
                "underlying_topic": topic,
                "view_topic": f"{queue}.view",
                "on_unparseable": "deliver",  # (by default it is dead-lettered on arrival)
            }
        ]
    )
    producer = producer_factory()
    producer.produce(topic, b'{"sym": "A", "qty": 3, "px": {"bid": 1.5}}')
    producer.produce(topic, b"not json")  # queued all the same; its message is NULL
    assert producer.flush(10) == 0
    with QueueClient(coordinator.address) as client:
        wait_until(lambda: client.stats(queue)[0].available == 2, timeout=15, message="2 in")
    config = coordinator.config_path
    typed = queue_contents(
        spark, queue, config=config, schema="sym STRING, qty INT, px STRUCT<bid: DOUBLE>"
    )
    rows = sorted(typed.collect(), key=lambda r: r.offset)
    assert rows[0].message.asDict(recursive=True) == {"sym": "A", "qty": 3, "px": {"bid": 1.5}}
    assert rows[1].message is None
    mapped = sorted(queue_contents(spark, queue, config=config).collect(), key=lambda r: r.offset)
    assert mapped[0].message == {"sym": "A", "qty": "3", "px": '{"bid":1.5}'}


def test_avro_queues_parse_with_the_queue_schema(
    spark, coordinator_factory, names, producer_factory, topic_factory, tmp_path: Path
) -> None:
    schema = {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "sym", "type": "string"},
            {"name": "qty", "type": "int"},
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
    schema_file = tmp_path / "order.avsc"
    schema_file.write_text(json.dumps(schema))
    queue, topic = names("avro"), topic_factory()
    coordinator = coordinator_factory(
        [
            {
                "name": queue,
                "underlying_topic": topic,
                "view_topic": f"{queue}.view",
                "message_type": "avro",
                "avro_schema": str(schema_file),
            }
        ]
    )
    parsed = fastavro.parse_schema(schema)
    producer = producer_factory()
    for i in range(3):
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, {"sym": "AB"[i % 2], "qty": i, "note": None})
        producer.produce(topic, buffer.getvalue())
    assert producer.flush(10) == 0
    with QueueClient(coordinator.address) as client:
        wait_until(lambda: client.stats(queue)[0].available == 3, timeout=15, message="3 in")
    df = queue_contents(spark, queue, config=coordinator.config_path)
    assert df.schema["message"].dataType.simpleString() == "struct<sym:string,qty:int,note:string>"
    messages = [r.message.asDict() for r in df.orderBy("offset").collect()]
    assert messages == [{"sym": "AB"[i % 2], "qty": i, "note": None} for i in range(3)]


def test_errors_name_the_queue_and_the_option(spark, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "qlayer.toml",
        "127.0.0.1:9",
        [{"name": "plain", "underlying_topic": "plain"}],
    )
    with pytest.raises(ConfigError, match=r"queue 'plain': option 'view_topic' is not set"):
        queue_contents(spark, "plain", config=config)
    with pytest.raises(UnknownQueue, match=r"queue 'nope' is not configured in .*qlayer.toml"):
        queue_contents(spark, "nope", config=config)
    with pytest.raises(ConfigError, match=r"queue 'x': no view topic: pass config="):
        queue_contents(spark, "x")
    with pytest.raises(ConfigError, match="option 'startingOffsets' is set by the view"):
        queue_contents(
            spark, "x", view_topic="v", bootstrap_servers="b:1", options={"startingOffsets": "0"}
        )
