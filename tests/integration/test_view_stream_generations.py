"""A ``qlayer_view`` stream going on into a new generation of its view topic, against a real
broker (the reader's methods called as Spark calls them, no Spark session): the coordinator
creates the new generation's topic before it writes the snapshot into it, so a micro-batch
planned in between names the new generation at offset 0. The next one must still read it past
its snapshot, which only repeats what the stream has counted already; read as a snapshot, every
message live at that moment would be counted twice (and those that left in it never leave)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from connectors.admin import TopicSpec
from connectors.spark_kafka import follow as following
from connectors.spark_kafka.view import (
    ViewInputPartition,
    ViewSourceOptions,
    ViewStreamReader,
    read_view_range,
)
from layer.engine.model import Bookmark, ViewChange, ViewChanges
from layer.viewcodec import encode_round
from layer.viewgen import SNAPSHOT_HEADER, SNAPSHOT_MARK, generation_topic

pytestmark = pytest.mark.integration


def test_a_stream_goes_on_past_the_snapshot_of_a_generation_it_first_saw_empty(
    broker, topic_admin, topic_factory, producer_factory, monkeypatch
) -> None:
    monkeypatch.setattr(following, "_CACHE", following.MessageCache())
    monkeypatch.setattr(following, "_TAILS", {})
    underlying = topic_factory(prefix="orders")
    view_topic = topic_factory(prefix="orders-view")
    producer = producer_factory()
    for i in range(3):
        producer.produce(underlying, f"m{i}".encode(), partition=0)
    assert producer.flush(10) == 0
    m0, m1, m2 = (Bookmark(underlying, 0, offset) for offset in range(3))

    def write(topic: str, changes: list[tuple[Bookmark, int]], snapshot: bool = False) -> None:
        value = encode_round("q", ViewChanges.of(ViewChange(b, s, 0, 0) for b, s in changes), 1)
        headers = [(SNAPSHOT_HEADER, SNAPSHOT_MARK)] if snapshot else None
        producer.produce(topic, value, key=b"q", partition=0, headers=headers)
        assert producer.flush(10) == 0  # one batch a record: end offsets are exact

    reader = ViewStreamReader(
        ViewSourceOptions.parse(
            {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": view_topic}
        )
    )

    def batch(start: dict, end: dict) -> tuple[list[ViewInputPartition], list[tuple[int, Any]]]:
        tasks = list(reader.partitions(start, end))
        rows: list[tuple[int, Any]] = []
        for task in tasks:
            for arrow in read_view_range(reader._view, task):
                table = pa.Table.from_batches([arrow]).to_pylist()
                rows.extend((row["sign"], row["value"]) for row in table)
        return tasks, rows

    write(view_topic, [(m0, 1), (m1, 1)])
    start = reader.initialOffset()
    first = reader.latestOffset()
    _tasks, rows = batch(start, first)
    assert sorted(rows) == [(1, b"m0"), (1, b"m1")]

    # the coordinator made generation 1 and has not written its snapshot yet
    g1 = generation_topic(view_topic, 1)
    topic_admin.ensure_topics([TopicSpec(g1, partitions=1, config={})])
    try:
        second = reader.latestOffset()
        assert second[g1] == {"0": 0}, second
        tasks, rows = batch(first, second)
        assert rows == []
        # its snapshot (m0, m1 live), then a round: m2 entered, m0 left
        write(g1, [(m0, 1), (m1, 1)], snapshot=True)
        write(g1, [(m2, 1), (m0, -1)])
        third = reader.latestOffset()
        tasks, rows = batch(second, third)
        assert rows == [(1, b"m2"), (-1, b"m0")]
        assert [t.topic for t in tasks] == [g1]
        assert all(t.continuation and not t.snapshot for t in tasks), tasks
    finally:
        # as Spark stops a query: no consumer stays on a topic being deleted (librdkafka
        # crashed on Tansu when one was deleted under it)
        reader.stop()
        following.close()
        topic_admin.delete_topics([g1])
