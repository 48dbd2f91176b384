"""``connectors.spark_kafka.follow`` against a real broker: what a streaming view's worker keeps
between micro-batches gives exactly the messages at the bookmarks asked for; what it cannot
serve (older than its tail, not cached) it hands back to be fetched by offset."""

from __future__ import annotations

import pytest

from connectors.spark_kafka import follow as following
from connectors.spark_kafka.options import KafkaSourceOptions
from connectors.spark_kafka.view import fetch_messages
from layer.engine.model import Bookmark

pytestmark = pytest.mark.integration


def test_follow_reads_forward_caches_and_hands_back_the_rest(
    broker, topic_factory, producer_factory, monkeypatch
) -> None:
    monkeypatch.setattr(following, "_CACHE", following.MessageCache(limit=5))
    monkeypatch.setattr(following, "_TAILS", {})
    topic = topic_factory(partitions=2, prefix="follow")
    producer = producer_factory()
    for i in range(40):
        producer.produce(topic, f"m{i}".encode(), key=str(i).encode(), partition=i % 2)
    assert producer.flush(10) == 0
    kafka = KafkaSourceOptions.parse(
        {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": topic}
    )

    def values(found):
        return {bm: m.value() for bm, m in found.items()}

    # partition 0 holds m0, m2, ...: offset o is m(2o); partition 1 offset o is m(2o + 1)
    first = [Bookmark(topic, 0, o) for o in (3, 5, 6)] + [Bookmark(topic, 1, 2)]
    found, rest = following.follow(kafka, first)
    assert rest == []
    assert values(found) == {
        Bookmark(topic, 0, 3): b"m6",
        Bookmark(topic, 0, 5): b"m10",
        Bookmark(topic, 0, 6): b"m12",
        Bookmark(topic, 1, 2): b"m5",
    }
    # forward again: the tails go on; asked again: from the cache (5 kept, the oldest dropped)
    again = [Bookmark(topic, 0, 10), Bookmark(topic, 0, 11), Bookmark(topic, 0, 6)]
    found, rest = following.follow(kafka, again)
    assert rest == [] and values(found) == {
        Bookmark(topic, 0, 10): b"m20",
        Bookmark(topic, 0, 11): b"m22",
        Bookmark(topic, 0, 6): b"m12",
    }
    assert len(following._CACHE) == 5
    assert following._CACHE.get(Bookmark(topic, 0, 3)) is None  # the oldest, dropped
    # behind the tail and not cached: handed back, and the fetch by offset finds it
    found, rest = following.follow(kafka, [Bookmark(topic, 0, 3), Bookmark(topic, 0, 12)])
    assert values(found) == {Bookmark(topic, 0, 12): b"m24"}
    assert rest == [Bookmark(topic, 0, 3)]
    fetched = fetch_messages(kafka, rest)
    following.remember(fetched)
    assert following._CACHE.get(Bookmark(topic, 0, 3)).value() == b"m6"
    # past the end of the partition (not written yet): the tail gives up after its timeout
    # and the offset is handed back
    monkeypatch.setattr(following, "TAIL_TIMEOUT_S", 1.0)
    found, rest = following.follow(kafka, [Bookmark(topic, 1, 25)])
    assert (found, rest) == ({}, [Bookmark(topic, 1, 25)])


def test_a_tail_starts_at_the_fetch_wait_the_process_learned_and_reads_on(
    broker, topic_factory, producer_factory, monkeypatch
) -> None:
    """A partition whose fetches needed a longer wait (Tansu's fetch time grows with its
    batches) is followed at that wait, not at the default 10 ms that made no progress."""
    from connectors.spark_kafka import reading

    monkeypatch.setattr(following, "_CACHE", following.MessageCache())
    monkeypatch.setattr(following, "_TAILS", {})
    topic = topic_factory(partitions=1, prefix="follow-wait")
    producer = producer_factory()
    for i in range(10):
        producer.produce(topic, f"m{i}".encode(), partition=0)
    assert producer.flush(10) == 0
    kafka = KafkaSourceOptions.parse(
        {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": topic}
    )
    where = (broker.bootstrap_servers, topic, 0)
    monkeypatch.setitem(reading._LEARNED_WAIT, where, 50)
    found, rest = following.follow(kafka, [Bookmark(topic, 0, 2), Bookmark(topic, 0, 7)])
    assert rest == []
    assert {bm.offset: m.value() for bm, m in found.items()} == {2: b"m2", 7: b"m7"}
    (tail,) = following._TAILS.values()
    assert tail._config["fetch.wait.max.ms"] == 50
    # a wait that grows is remembered for the next reads of the partition, and the tail goes
    # on from where it was
    tail._refetch(250)
    assert reading._LEARNED_WAIT[where] == 250
    found, rest = following.follow(kafka, [Bookmark(topic, 0, 9)])
    assert rest == [] and found[Bookmark(topic, 0, 9)].value() == b"m9"
