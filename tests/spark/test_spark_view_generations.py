"""Bounded view history (``layer.viewgen``) against a real coordinator process.

With ``view_snapshot_interval`` short, the coordinator begins generation after generation of the
view topic while a mixed workload runs, deleting the old ones. A batch view started after many of
them (read one snapshot plus the tail) equals ``browse``, through ``qlayer_view`` and a Kafka
source format alike; a streaming aggregate started before the first one goes on through all of
them and equals the aggregate of ``browse`` within two micro-batches of a quiet moment.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from connectors.admin import TopicAdmin
from connectors.kafka import read_watermarks
from layer.client import QueueClient
from layer.viewgen import generation_of, generations
from spark import live_aggregate, queue_contents, queue_contents_stream
from tests.helpers import wait_until
from tests.spark.support import LiveTotals
from tests.spark.test_spark_live_stream import SCHEMA, browse_totals, order, stream_totals

pytestmark = [
    pytest.mark.spark,
    pytest.mark.integration,
    # PySpark's collect() leaves its result socket to the garbage collector.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]


def view_generations(bootstrap_servers: str, view_topic: str) -> list[tuple[int, str]]:
    admin = TopicAdmin({"bootstrap.servers": bootstrap_servers})
    return generations(view_topic, admin.list_topics())


def view_ends(bootstrap_servers: str, view_topic: str) -> dict[str, int]:
    """Where a read_committed reader of each generation ends now."""
    topics = [topic for _n, topic in view_generations(bootstrap_servers, view_topic)]
    settings = {"bootstrap.servers": bootstrap_servers}
    marks = read_watermarks(settings, [(t, 0) for t in topics], isolation_level="read_committed")
    return {topic: mark.high for (topic, _p), mark in marks.items()}


def test_views_follow_the_generations_of_a_bounded_view_topic(
    spark, broker, coordinator_factory, names, topic_factory, producer_factory, tmp_path: Path
) -> None:
    queue, topic = names("orders"), topic_factory(partitions=2, prefix="orders")
    view_topic = f"{queue}.view"
    coordinator = coordinator_factory(
        [
            {
                "name": queue,
                "underlying_topic": topic,
                "view_topic": view_topic,
                "lease_period": "1s",
                # a stream keeps up within two intervals (README): a micro-batch took up to
                # 10 s at load 5-18
                "view_snapshot_interval": "5s",
            }
        ]
    )
    config = coordinator.config_path
    producer = producer_factory()
    for i in range(80):
        producer.produce(topic, json.dumps(order(i)).encode(), partition=i % 2)
    assert producer.flush(10) == 0
    # started before any new generation: it must follow them all
    changes = queue_contents_stream(spark, queue, config=config, schema=SCHEMA)
    aggregate = live_aggregate(
        changes, by="sym", sum={"value": "price * qty"}, avg={"avg_qty": "qty"}
    )
    totals = LiveTotals(aggregate, tmp_path / "checkpoint", key="sym")
    stop = threading.Event()
    published = [90]

    def publish() -> None:  # ~150 orders a second while the consumers work
        i = 90
        while not stop.is_set():
            producer.produce(topic, json.dumps(order(i)).encode(), partition=i % 2)
            producer.poll(0)
            i += 1
            time.sleep(1 / 150)
        assert producer.flush(10) == 0
        published[0] = i

    rng = random.Random(7)
    publisher = threading.Thread(target=publish, daemon=True)
    try:
        with QueueClient(coordinator.address) as client:
            wait_until(lambda: totals.batches(), timeout=90, message="no first micro-batch")
            # a micro-batch of changes before the generations begin: the stream's first ones
            # (its Python workers starting) took 10-15 s under load, past what is kept
            for i in range(80, 90):
                producer.produce(topic, json.dumps(order(i)).encode(), partition=i % 2)
            assert producer.flush(10) == 0
            wait_until(
                lambda: any(b[0] >= 1 for b in totals.batches()),
                timeout=90,
                message="no micro-batch of changes",
            )
            publisher.start()
            worker = client.subscribe(queue, max_backlog=10)

            def many_generations() -> bool:
                for _ in range(50):
                    msg = worker.next(timeout=0.01)
                    if msg is None:
                        continue
                    roll = rng.random()
                    if roll < 0.7:
                        msg.ack()
                    elif roll < 0.9:
                        msg.cancel()
                    # else: left leased until its lease times out or the worker closes
                found = view_generations(broker.bootstrap_servers, view_topic)
                return bool(found) and found[-1][0] >= 5

            wait_until(
                many_generations,
                timeout=180,
                interval=0.0,
                message=lambda: (
                    f"generations: {view_generations(broker.bootstrap_servers, view_topic)}"
                ),
            )
            stop.set()
            publisher.join(15)
            worker.close()

            def quiet() -> bool:
                stats = client.stats(queue)[0]
                done = stats.acked_total + stats.dead_lettered_total
                return stats.leased == 0 and stats.available + done == published[0]

            wait_until(quiet, timeout=30, message=lambda: f"quiet: {client.stats(queue)[0]}")
            present = view_generations(broker.bootstrap_servers, view_topic)
            # the old generations are gone: the current one and the two before it remain
            assert len(present) <= 3 and present[0][0] >= 3, present

            def stable() -> dict[str, int] | None:
                first = view_ends(broker.bootstrap_servers, view_topic)
                time.sleep(0.3)
                return first if view_ends(broker.bootstrap_servers, view_topic) == first else None

            ends = wait_until(stable, timeout=15, message="the view topic keeps growing")
            quiet_at = time.time()
            expected = browse_totals(client, queue)
            listed = {m.bookmark: m.value for m in client.browse(queue)}
            assert len(listed) > 20

            newest = max(ends, key=lambda t: generation_of(view_topic, t) or 0)

            def read_to_ends(offsets: dict[str, Any]) -> bool:
                # a stream stops naming the generations older than the newest it read from
                return newest in offsets and all(
                    offsets[t]["0"] >= end for t, end in ends.items() if t in offsets
                )

            def caught_up() -> tuple[int, float, dict[str, Any]] | None:
                return next((b for b in totals.batches() if read_to_ends(b[2])), None)

            batch_id, _started, _ends = wait_until(
                caught_up, timeout=90, message=lambda: f"not read to {ends}: {totals.batches()}"
            )
            after_quiet = [b for b in totals.batches() if b[1] >= quiet_at and b[0] <= batch_id]
            assert len(after_quiet) <= 2, after_quiet
            assert stream_totals(totals.after[batch_id]) == expected

            # a batch view started now reads one snapshot and the tail: it equals browse
            for kafka_format in (None, "qlayer_kafka"):
                rows = queue_contents(
                    spark, queue, config=config, kafka_format=kafka_format
                ).collect()
                assert {r.bookmark: bytes(r.value) for r in rows} == listed, kafka_format
    finally:
        stop.set()
        totals.stop()
