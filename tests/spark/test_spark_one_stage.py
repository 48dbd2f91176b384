"""A streaming ``live_aggregate`` with one state partition runs as one stage, and takes over the
checkpoint of the two-stage plan it replaced.

With ``spark.sql.shuffle.partitions`` = 1 the changes are coalesced into one partition before
the aggregate, so Spark plans no shuffle (each micro-batch is one Spark stage, not two). The
state store it keeps is the one the two-stage plan kept (same operator, keys and values), so a
query started from an older checkpoint goes on from it: checked here against a real
coordinator, the aggregate against ``browse``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import spark.aggregates as aggregates
from layer.client import QueueClient
from spark import live_aggregate, queue_contents_stream
from tests.helpers import wait_until
from tests.spark.support import LiveTotals

pytestmark = [
    pytest.mark.spark,
    pytest.mark.integration,
    # PySpark's collect() leaves its result socket to the garbage collector.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

SCHEMA = "id INT, sym STRING, qty INT"
SYMBOLS = ("ACME", "INIT", "TECH")


@pytest.fixture
def one_state_partition(spark: Any) -> Iterator[Any]:
    """The session with ``spark.sql.shuffle.partitions`` = 1 for the test."""
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        yield spark
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


def browse_counts(client: QueueClient, queue: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for message in client.browse(queue):
        sym = message.json()["sym"]
        counts[sym] = counts.get(sym, 0) + 1
    return counts


def streamed_counts(totals: LiveTotals) -> dict[str, int]:
    return {sym: int(row["count"]) for sym, row in totals.now().items() if row["count"]}


def plan_of(totals: LiveTotals, capsys: pytest.CaptureFixture[str]) -> str:
    """The physical plan of the query's last micro-batch (``explain()`` prints it)."""
    capsys.readouterr()
    totals.query.explain()
    return capsys.readouterr().out


def test_one_state_partition_runs_one_stage_and_continues_an_older_checkpoint(
    one_state_partition, coordinator_factory, names, topic_factory, producer_factory,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    spark = one_state_partition
    queue, topic = names("orders"), topic_factory(partitions=2, prefix="orders")
    coordinator = coordinator_factory(
        [{"name": queue, "underlying_topic": topic, "view_topic": f"{queue}.view"}]
    )
    producer = producer_factory()
    checkpoint = tmp_path / "checkpoint"

    def publish(first: int, count: int) -> None:
        for i in range(first, first + count):
            doc = {"id": i, "sym": SYMBOLS[i % 3], "qty": 1 + i % 5}
            producer.produce(topic, json.dumps(doc).encode(), partition=i % 2)
        assert producer.flush(10) == 0

    def start() -> LiveTotals:
        changes = queue_contents_stream(spark, queue, config=coordinator.config_path, schema=SCHEMA)
        return LiveTotals(live_aggregate(changes, by="sym"), checkpoint, key="sym")

    def agrees(totals: LiveTotals, client: QueueClient) -> bool:
        expected = browse_counts(client, queue)
        return bool(expected) and streamed_counts(totals) == expected

    with QueueClient(coordinator.address) as client:
        # the plan before this change: a shuffle, two stages
        with monkeypatch.context() as patch:
            patch.setattr(aggregates, "_single_state_partition", lambda _changes: False)
            older = start()
        try:
            publish(0, 30)
            wait_until(lambda: agrees(older, client), timeout=60, message="older plan: browse")
            assert "Exchange" in plan_of(older, capsys)
        finally:
            older.stop()

        # the same checkpoint, one stage: it goes on from the older state
        publish(30, 30)
        with client.subscribe(queue, max_backlog=20) as sub:
            for _ in range(20):
                msg = sub.next(timeout=10)
                assert msg is not None
                msg.ack()
        newer = start()
        try:
            wait_until(
                lambda: agrees(newer, client) and sum(streamed_counts(newer).values()) == 40,
                timeout=60,
                message=lambda: f"{streamed_counts(newer)} != {browse_counts(client, queue)}",
            )
            plan = plan_of(newer, capsys)
            assert "Exchange" not in plan and "StateStoreSave" in plan, plan
            publish(60, 9)
            wait_until(
                lambda: agrees(newer, client) and sum(streamed_counts(newer).values()) == 49,
                timeout=60,
                message=lambda: f"{streamed_counts(newer)} != {browse_counts(client, queue)}",
            )
        finally:
            newer.stop()
