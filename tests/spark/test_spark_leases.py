"""``spark.queue_leases`` against a real coordinator process with two consumers holding leases:
the view lists exactly the messages each subscription holds, with its holder and when the lease
began; acks, cancels, lease timeouts and a consumer that leaves take them out."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from layer.client import QueueClient
from spark import queue_contents, queue_leases
from tests.helpers import wait_until

pytestmark = [
    pytest.mark.spark,
    pytest.mark.integration,
    # PySpark's collect() leaves its result socket to the garbage collector.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]


def leases_now(spark: Any, queue: str, config: Any) -> dict[str, tuple[str, float]]:
    """bookmark -> (holder, leased_at as epoch seconds)."""
    rows = queue_leases(spark, queue, config=config, schema="id INT").collect()
    return {r.bookmark: (r.lease_holder, r.leased_at.timestamp()) for r in rows}


def test_queue_leases_shows_who_holds_what(
    spark, coordinator_factory, names, producer_factory, topic_factory
) -> None:
    queue = names("orders")
    topic = topic_factory(partitions=2, prefix="orders")
    coordinator = coordinator_factory(
        [
            {
                "name": queue,
                "underlying_topic": topic,
                "view_topic": f"{queue}.view",
                # outlasts the Spark jobs; the timeouts below are made with extend()
                "lease_period": "120s",
            }
        ]
    )
    config = coordinator.config_path
    producer = producer_factory()
    for i in range(20):
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=i % 2)
    assert producer.flush(10) == 0

    with QueueClient(coordinator.address) as client:
        wait_until(lambda: client.stats(queue)[0].available == 20, 30, message="20 available")
        assert leases_now(spark, queue, config) == {}
        before = time.time()
        alice = client.subscribe(queue, max_backlog=3, filter="/id < 10")
        bob = client.subscribe(queue, max_backlog=4, filter="/id >= 10")
        held_a = [alice.next(timeout=10) for _ in range(3)]
        held_b = [bob.next(timeout=10) for _ in range(4)]
        assert all(m is not None for m in held_a + held_b)
        alice.replace(filter="/id < 0")  # takes nothing more; keeps its leases
        bob.replace(filter="/id < 0")
        expected = {m.bookmark: alice.id for m in held_a if m is not None}
        expected |= {m.bookmark: bob.id for m in held_b if m is not None}

        seen: dict[str, Any] = {}

        def matches() -> bool:
            seen["leases"] = leases_now(spark, queue, config)
            return {bm: holder for bm, (holder, _at) in seen["leases"].items()} == expected

        wait_until(matches, 30, interval=0.2, message=lambda: f"{seen} != {expected}")
        assert all(before - 1 <= at <= time.time() + 1 for _h, at in seen["leases"].values())
        # a leased message is not in the contents, and the contents hold the other 13
        contents = {r.bookmark for r in queue_contents(spark, queue, config=config).collect()}
        assert len(contents) == 13 and not contents & set(expected)
        # per consumer: how many, the oldest
        per_holder = {
            r.lease_holder: r.leases
            for r in queue_leases(spark, queue, config=config)
            .groupBy("lease_holder")
            .count()
            .withColumnRenamed("count", "leases")
            .collect()
        }
        assert per_holder == {alice.id: 3, bob.id: 4}
        leased_at = {bm: at for bm, (_h, at) in seen["leases"].items()}

        # an ack, a cancel, a lease timeout: out of the leases
        first, second, third = held_b[0], held_b[1], held_b[2]
        assert first is not None and second is not None and third is not None
        first.ack(wait=True)
        second.cancel(wait=True)
        third.extend(0.3, wait=True)
        for msg in (first, second, third):
            expected.pop(msg.bookmark)
        wait_until(matches, 30, interval=0.2, message=lambda: f"{seen} != {expected}")
        assert {bm: at for bm, (_h, at) in seen["leases"].items()} == {
            bm: leased_at[bm] for bm in expected
        }

        # a consumer that goes away gives its leases back; the other keeps its own
        alice.close()
        for msg in held_a:
            assert msg is not None
            expected.pop(msg.bookmark)
        wait_until(matches, 30, interval=0.2, message=lambda: f"{seen} != {expected}")
        assert set(expected.values()) == {bob.id}
        bob.close()
