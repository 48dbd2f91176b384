"""Spark views of a partitioned queue (issue 12) over two real coordinator processes: each
member writes the view topics of the shards it serves (``<view_topic>.shard-<i>``, each with
its own generations), and ``queue_contents``, ``queue_leases`` and a running
``queue_contents_stream`` of the queue equal ``browse`` of the whole queue and the leases held,
before and after a member is SIGKILLed and its shards move to the other one (and read through
a Kafka source format, at the end)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from connectors.admin import TopicAdmin
from layer.client import PartitionedSubscription, QueueClient
from layer.shards import shard_name, shard_view_topic
from layer.viewgen import generations
from spark import live_aggregate, queue_contents, queue_contents_stream, queue_leases
from tests.harness import serving
from tests.helpers import wait_until
from tests.spark.support import LiveTotals

pytestmark = [
    pytest.mark.spark,
    pytest.mark.integration,
    # PySpark's collect() leaves its result socket to the garbage collector.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

# seven shards on seven consecutive control partitions of twelve: each member of two, holding
# six partitions, serves at least one of them
SHARDS = 7
SCHEMA = "id INT, kind STRING"
KINDS = ("a", "b")


def contents(spark: Any, q: str, config: Path) -> dict[str, str]:
    """bookmark -> the queue (shard) whose round put it in the view."""
    rows = queue_contents(spark, q, config=config, schema=SCHEMA).select("bookmark").collect()
    found = {r.bookmark for r in rows}
    assert len(found) == len(rows), "a message listed twice"
    return {bm: shard_name(q, int(bm.split("/")[-2])) for bm in found}


def leases(spark: Any, q: str, config: Path) -> dict[str, str]:
    """bookmark -> its lease holder."""
    rows = queue_leases(spark, q, config=config, schema=SCHEMA).collect()
    return {r.bookmark: r.lease_holder for r in rows}


def browse_counts(client: QueueClient, q: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for message in client.browse(q):
        kind = message.json()["kind"]
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def newest_generations(admin: TopicAdmin, view_topic: str) -> list[int]:
    """The newest generation of each shard's view topic on the broker."""
    topics = admin.list_topics()
    return [
        max((n for n, _t in generations(shard_view_topic(view_topic, i), topics)), default=-1)
        for i in range(SHARDS)
    ]


@pytest.mark.timeout(600)  # two members, a kill and a stream on a loaded 2-core machine
def test_views_of_a_partitioned_queue_merge_its_shards_through_a_member_kill(
    spark: Any,
    coordinator_factory: Any,
    names: Callable[[str], str],
    topic_factory: Any,
    producer_factory: Any,
    topic_admin: TopicAdmin,
    tmp_path: Path,
) -> None:
    cluster, q = names("cluster"), names("orders")
    topic = topic_factory(partitions=SHARDS, prefix="orders")
    view_topic = f"{q}.view"
    table = {
        "name": q,
        "underlying_topic": topic,
        "distribution": "partitioned",
        "partitions": SHARDS,
        "view_topic": view_topic,
        "view_snapshot_interval": "1s",  # generations roll during the test
        "lease_period": "120s",  # outlasts the Spark jobs
    }
    procs = [coordinator_factory([table], cluster=cluster)]
    procs.append(coordinator_factory([], cluster=cluster))
    config = procs[0].config_path
    shards = [shard_name(q, i) for i in range(SHARDS)]
    addresses = [str(p.address) for p in procs]
    producer = producer_factory()
    sent = [0]

    def publish(per_partition: int) -> None:
        for _ in range(per_partition * SHARDS):
            i = sent[0]
            doc = {"id": i, "kind": KINDS[i % 2]}
            producer.produce(topic, json.dumps(doc).encode(), partition=i % SHARDS)
            sent[0] += 1
        assert producer.flush(10) == 0

    def owners(client: QueueClient, on: set[str]) -> dict[str, str] | None:
        """The shards' owners once they are the members ``on`` (each owning some) and serve."""
        found = {o.queue: o.address for o in client.cluster().queues if o.queue in shards}
        ready = len(found) == SHARDS and set(found.values()) == on
        return found if ready and serving(client, shards) else None

    with QueueClient(addresses) as client:
        wait_until(
            lambda: owners(client, set(addresses)), 90, message=lambda: f"{client.cluster()}"
        )
        publish(6)
        wait_until(lambda: client.stats(q)[0].available == sent[0], 60, message="all queued")
        changes = queue_contents_stream(spark, q, config=config, schema=SCHEMA)
        totals = LiveTotals(live_aggregate(changes, by="kind"), tmp_path / "checkpoint", "kind")
        try:

            def streamed() -> dict[str, int]:
                return {k: row["count"] for k, row in totals.now().items() if row["count"]}

            # two leases on every shard (a stream per shard, max_backlog each), one acked on
            # each: available ones are left on every shard (acks taken as they came could all
            # fall on one shard and empty it: seen once)
            sub = client.subscribe(q, max_backlog=2)
            assert isinstance(sub, PartitionedSubscription)
            held: dict[str, str] = {}
            acked_on: set[str] = set()  # the shards' streams with a message acked
            acked = 0
            deadline_s = 90.0
            wait_until(lambda: len(sub.shards) == SHARDS, 30)

            def take() -> bool:
                nonlocal acked
                msg = sub.next(timeout=1)
                if msg is not None and msg._subscription.id not in acked_on:
                    msg.ack(wait=True, timeout=60)
                    acked_on.add(msg._subscription.id)
                    acked += 1
                elif msg is not None:
                    held[msg.bookmark] = msg._subscription.id
                return len(held) == 2 * SHARDS and acked == SHARDS

            wait_until(take, deadline_s, interval=0, message=lambda: f"held {len(held)}")
            expected = {m.bookmark for m in client.browse(q)}
            assert len(expected) == sent[0] - acked - len(held)
            seen: dict[str, Any] = {}

            def agree() -> bool:
                seen["contents"] = contents(spark, q, config)
                seen["leases"] = leases(spark, q, config)
                seen["stream"] = streamed()
                return (
                    set(seen["contents"]) == expected
                    and seen["leases"] == held
                    and seen["stream"] == browse_counts(client, q)
                )

            wait_until(agree, 60, interval=0.5, message=lambda: f"{seen} != {expected}, {held}")
            assert {queue for queue in seen["contents"].values()} == set(shards)
            before = newest_generations(topic_admin, view_topic)

            # the member without the config file is killed: its shards move to the other one,
            # which restores them, returns the dead member's leases and corrects their views
            procs[1].kill()
            sub.close()  # its shards on the member left return their leases too
            wait_until(
                lambda: owners(client, {addresses[0]}), 90, message=lambda: f"{client.cluster()}"
            )

            # every shard's view goes on into newer generations, whoever writes it now
            def rolled() -> bool:
                publish(1)
                now = newest_generations(topic_admin, view_topic)
                seen["generations"] = (before, now)
                return all(n > b for n, b in zip(now, before, strict=True))

            wait_until(rolled, 90, interval=0.5, message=lambda: f"generations {seen}")
            wait_until(
                lambda: client.stats(q)[0].available == sent[0] - acked,
                60,
                message=lambda: f"{client.stats(q)[0]}, sent {sent[0]}, acked {acked}",
            )
            expected = {m.bookmark for m in client.browse(q)}
            assert len(expected) == sent[0] - acked
            held = {}
            wait_until(agree, 90, interval=0.5, message=lambda: f"{seen} != {expected}, {{}}")
            # read through a Kafka source format too (what format("kafka") would take)
            through_kafka = queue_contents(spark, q, config=config, kafka_format="qlayer_kafka")
            assert {r.bookmark for r in through_kafka.select("bookmark").collect()} == expected
            print(f"generations of the shards' view topics: {seen['generations']}")
        finally:
            totals.stop()
