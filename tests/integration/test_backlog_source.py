"""The takeover's backlog read (``layer.coordinator.restore.KafkaSource.backlog``) against a
real broker: skipped when every partition is at its end, read as before otherwise."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer

from layer.coordinator.restore import AT_END_MAX_PARTITIONS, KafkaSource, at_end
from layer.engine.model import TopicPartition


def _published(producer: Producer, topic: str, counts: dict[int, int]) -> None:
    """One message a batch: Tansu's high watermark is its last batch's first offset plus one
    (``at_end`` then says the end too early, and the live reader reads the rest)."""
    for partition, n in counts.items():
        for i in range(n):
            producer.produce(topic, b"m%d" % i, partition=partition)
            assert producer.flush(10) == 0


def test_at_end_only_when_every_partition_is_read_to_its_end(
    topic_factory: Callable[..., str],
    producer_factory: Callable[..., Producer],
    kafka_settings: dict[str, Any],
) -> None:
    topic = topic_factory(partitions=2)
    _published(producer_factory(), topic, {0: 5, 1: 3})
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    consumer = Consumer({**kafka_settings, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        assert at_end(consumer, {p0: 5, p1: 3})
        assert at_end(consumer, {p0: 7, p1: 3})  # a start past the end (low-water mark)
        assert not at_end(consumer, {p0: 5, p1: 2})  # one message left on p1
        assert not at_end(consumer, {p0: 0, p1: 3})
        empty = topic_factory(partitions=AT_END_MAX_PARTITIONS + 1)
        every = {TopicPartition(empty, p): 0 for p in range(AT_END_MAX_PARTITIONS + 1)}
        assert at_end(consumer, dict(list(every.items())[:AT_END_MAX_PARTITIONS]))
        assert not at_end(consumer, every)  # too many to ask: read as before
    finally:
        consumer.close()


def test_the_backlog_is_what_is_left_and_nothing_at_the_end(
    topic_factory: Callable[..., str],
    producer_factory: Callable[..., Producer],
    kafka_settings: dict[str, Any],
) -> None:
    topic = topic_factory(partitions=2)
    _published(producer_factory(), topic, {0: 5, 1: 3})
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    source = KafkaSource(kafka_settings)

    def read(starts: dict[TopicPartition, int]) -> dict[TopicPartition, list[int]]:
        got: dict[TopicPartition, list[int]] = {}
        for fetched in source.backlog(starts):
            for m in fetched.messages:
                tp = TopicPartition(str(m.topic()), int(m.partition() or 0))
                got.setdefault(tp, []).append(int(m.offset() or 0))
        return got

    assert read({p0: 5, p1: 3}) == {}
    assert read({p0: 5, p1: 1}) == {p1: [1, 2]}
    assert read({p0: 2, p1: 3}) == {p0: [2, 3, 4]}
