"""What a streaming view keeps between micro-batches to stay fresh, against a real broker:
the driver's ``EndFollower`` (where the view-topic partitions end, read_committed) and a
worker's tail that reads the next micro-batch's range of the view topic forward."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from connectors.spark_kafka import follow as following
from connectors.spark_kafka.ends import EndFollower
from connectors.spark_kafka.options import KafkaSourceOptions
from connectors.spark_kafka.reading import message_offset

pytestmark = pytest.mark.integration


def _until(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.02)


def _options(broker: Any, topic: str) -> KafkaSourceOptions:
    return KafkaSourceOptions.parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap_servers,
            "subscribe": topic,
            "kafka.isolation.level": "read_committed",
        }
    )


def test_the_end_follower_gives_the_last_stable_offset_of_what_it_follows(
    broker, topic_factory, producer_factory
) -> None:
    first, second = topic_factory(prefix="ends"), topic_factory(prefix="ends")
    producer = producer_factory(transactional_id=f"tx-{uuid.uuid4().hex}")
    producer.init_transactions(10)

    def commit(topic: str, n: int) -> None:
        producer.begin_transaction()
        for i in range(n):
            producer.produce(topic, f"m{i}".encode(), partition=0)
        producer.commit_transaction(10)

    commit(first, 3)  # offsets 0-2, the commit marker at 3
    follower = EndFollower(_options(broker, first).consumer_config(), timeout=20.0)
    try:
        assert follower.ends([(first, 0)]) == {(first, 0): 4}
        # a transaction not yet committed is not past the end under read_committed
        producer.begin_transaction()
        producer.produce(first, b"pending", partition=0)
        producer.flush(10)
        watch = time.monotonic() + 0.5  # fetch responses keep coming: none may move it
        while time.monotonic() < watch:
            assert follower.ends([(first, 0)]) == {(first, 0): 4}
        producer.commit_transaction(10)  # offset 4, its marker at 5
        _until(lambda: follower.ends([(first, 0)]) == {(first, 0): 6}, "the end moved to 6")
        # another partition: followed from then on, both ends right
        commit(second, 2)
        both = follower.ends([(first, 0), (second, 0)])
        assert both == {(first, 0): 6, (second, 0): 3}
        assert follower.earliest([(first, 0), (second, 0)]) == {(first, 0): 0, (second, 0): 0}
        # one dropped: the follower no longer asks about it
        assert follower.ends([(second, 0)]) == {(second, 0): 3}
        assert follower.earliest([(first, 0)]) is None
        assert follower.ends([]) == {}
    finally:
        follower.close()


def test_a_tail_reads_a_stream_s_view_ranges_forward(
    broker, topic_factory, producer_factory, monkeypatch
) -> None:
    monkeypatch.setattr(following, "_TAILS", {})
    view, newer = topic_factory(prefix="view"), topic_factory(prefix="view")
    producer = producer_factory(transactional_id=f"tx-{uuid.uuid4().hex}")
    producer.init_transactions(10)
    for i in range(4):  # a record and a commit marker each: records at 0, 2, 4, 6
        producer.begin_transaction()
        producer.produce(view, f"r{i}".encode(), partition=0)
        producer.commit_transaction(10)
    kafka = _options(broker, view)
    try:
        first = following.span(kafka, view, 0, 0, 3)
        assert [(message_offset(m), m.value()) for m in first or []] == [(0, b"r0"), (2, b"r1")]
        tail = next(iter(following._TAILS.values()))
        # the next micro-batch starts where the last ended: the same consumer goes on
        second = following.span(kafka, view, 0, 3, 8)
        assert [(message_offset(m), m.value()) for m in second or []] == [(4, b"r2"), (6, b"r3")]
        assert list(following._TAILS.values()) == [tail]
        # a range behind the tail: a new one, from there
        again = following.span(kafka, view, 0, 2, 5)
        assert [m.value() for m in again or []] == [b"r1", b"r2"]
        assert list(following._TAILS.values()) != [tail]
        # too long a range for a tail to hold: the caller reads it itself
        assert following.span(kafka, view, 0, 0, following.SPAN_LIMIT + 1) is None
        # a newer generation of the same view topic: the older one's tail is closed
        producer.begin_transaction()
        producer.produce(newer, b"n0", partition=0)
        producer.commit_transaction(10)
        moved = following.span(kafka, newer, 0, 0, 2, lambda topic: topic in (view, newer))
        assert [m.value() for m in moved or []] == [b"n0"]
        assert [key[1] for key in following._TAILS] == [newer]
    finally:
        following.close()
    assert following._TAILS == {}


def test_a_generation_a_stream_finished_can_be_deleted_under_it(
    broker, topic_factory, topic_admin, producer_factory, monkeypatch
) -> None:
    """librdkafka crashes the process when a topic is deleted under a consumer assigned to it:
    the follower drops a finished generation (``retain``) and a worker closes its tail of one
    after the last range (``keep=False``), so the coordinator may delete it at once."""
    monkeypatch.setattr(following, "_TAILS", {})
    older, newer = topic_factory(prefix="view"), topic_factory(prefix="view")
    producer = producer_factory()
    for topic in (older, newer):
        producer.produce(topic, b"r", partition=0)
    assert producer.flush(10) == 0
    kafka = _options(broker, older)
    follower = EndFollower(kafka.consumer_config(), timeout=20.0)
    try:
        assert follower.ends([(older, 0), (newer, 0)]) == {(older, 0): 1, (newer, 0): 1}
        follower.retain([(newer, 0)])
        assert follower.earliest([(older, 0)]) is None
        last = following.span(kafka, older, 0, 0, 1, keep=False)
        assert [m.value() for m in last or []] == [b"r"]
        assert following._TAILS == {}
        topic_admin.delete_topics([older])
        producer.produce(newer, b"s", partition=0)
        assert producer.flush(10) == 0
        _until(lambda: follower.ends([(newer, 0)]) == {(newer, 0): 2}, "the end moved to 2")
        watch = time.monotonic() + 1.0  # librdkafka learns of the deletion in the background
        while time.monotonic() < watch:
            assert follower.ends([(newer, 0)]) == {(newer, 0): 2}
    finally:
        follower.close()
        following.close()
