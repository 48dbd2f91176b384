"""The Kafka record's fields in the Spark views: a queue whose expressions read headers
(``HEADER('name')``) shapes what the view holds, and the view's ``key`` / ``headers`` /
``topic`` / ``partition`` columns give Spark SQL what ``KEY()``, ``HEADER()``, ``TOPIC()`` and
``PARTITION()`` give an expression (the README's Spark section shows the equivalents)."""

from __future__ import annotations

from typing import Any

import pytest

from layer.client import QueueClient
from spark import queue_contents
from tests.helpers import wait_until

pytestmark = [
    pytest.mark.spark,
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]


def test_views_carry_the_record_fields_that_expressions_read(
    spark: Any, coordinator_factory, names, producer_factory, topic_factory
) -> None:
    q = names("jobs")
    topic = topic_factory(prefix="jobs")
    coordinator = coordinator_factory(
        [
            {
                "name": q,
                "underlying_topic": topic,
                "view_topic": f"{q}.view",
                "message_type": "bytes",
                "filter": "HEADER('region') IS NOT NULL",
                "priority": "HEADER('urgency')",
            }
        ]
    )
    producer = producer_factory()
    producer.produce(topic, b"a", key=b"k1", headers=[("region", b"emea"), ("urgency", b"2")])
    producer.produce(topic, b"b", key=b"k2", headers=[("region", b"apac"), ("urgency", b"7")])
    producer.produce(topic, b"c", key=b"k3")  # no region: the queue's filter leaves it out
    assert producer.flush(10) == 0
    with QueueClient(coordinator.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 2, 30, message="2 queued")
        assert [m.value for m in client.browse(q)] == [b"b", b"a"]  # urgency 7 first

        def rows() -> set[tuple[Any, ...]]:
            frame = queue_contents(spark, q, config=coordinator.config_path)
            return {
                (r.k, bytes(r.region), r.priority, r.topic == topic, r.partition)
                for r in frame.selectExpr(
                    "CAST(key AS STRING) AS k",  # KEY()
                    "filter(headers, h -> h.key = 'region')[0].value AS region",  # HEADER()
                    "priority",
                    "topic",  # TOPIC()
                    "partition",  # PARTITION()
                ).collect()
            }

        expected = {("k1", b"emea", 2, True, 0), ("k2", b"apac", 7, True, 0)}
        wait_until(lambda: rows() == expected, 30, message=lambda: f"view rows {rows()}")
