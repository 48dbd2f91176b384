"""Expressions over the Kafka record (KEY(), HEADER('name'), TIMESTAMP(), TOPIC(), PARTITION())
and Qpid's priority queues and LVQ, end to end: plain producers of two Kafka clients
(confluent-kafka and the pure-Python kafka-python) set keys, headers and timestamps on a real
broker; a real coordinator process serves; ``QueueClient`` consumes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaProducer

from layer.client import QueueClient
from layer.exceptions import InvalidRequest
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

Headers = list[tuple[str, bytes]]


def produce_confluent(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, Headers]], **kw: Any
) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value, headers in records:
        p.produce(topic, value, key=key, headers=headers, **kw)
    assert p.flush(10) == 0


def produce_kafka_python(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, Headers]]
) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        for key, value, headers in records:
            producer.send(topic, value=value, key=key, headers=headers)
        producer.flush(timeout=10)
    finally:
        producer.close(timeout=10)


def doc(i: int, **fields: Any) -> bytes:
    return json.dumps({"id": i, **fields}).encode()


def drain(sub: Any, quiet: float = 0.6) -> list[Any]:
    got = []
    while (msg := sub.next(timeout=quiet)) is not None:
        got.append(msg)
    return got


def ids(messages: list[Any]) -> list[int]:
    return [m.json()["id"] for m in messages]


def wait_available(client: QueueClient, queue: str, n: int) -> None:
    wait_until(lambda: client.stats(queue)[0].available == n, 20, message=f"{n} available")


def test_qpid_priorities_from_the_jms_priority_header(broker, coordinator_factory, names) -> None:
    """``priorities = 2`` (0-4 lower, 5-9 higher, absent = 4) on a JSON queue fed by
    confluent-kafka, ``priorities = 10`` on a bytes queue fed by kafka-python."""
    t_two, t_ten = names("jms2"), names("jms10")
    two, ten = names("two"), names("ten")
    c = coordinator_factory(
        [
            {"name": two, "underlying_topic": t_two, "priorities": 2},
            {"name": ten, "underlying_topic": t_ten, "priorities": 10, "message_type": "bytes"},
        ]
    )
    jms = [b"3", b"9", b"0", b"5", None, b"7", b"not-a-number"]

    def records() -> list[tuple[bytes | None, bytes, Headers]]:
        return [
            (None, doc(i), [] if p is None else [("JMSPriority", p)]) for i, p in enumerate(jms)
        ]

    produce_confluent(broker.bootstrap_servers, t_two, records())
    produce_kafka_python(broker.bootstrap_servers, t_ten, records())
    with QueueClient(c.address) as client:
        wait_available(client, two, 7)
        wait_available(client, ten, 7)
        # two levels: the higher (9, 5, 7) in arrival order, then the lower (3, 0, absent = 4,
        # unreadable = 4) in arrival order
        assert ids(client.browse(two)) == [1, 3, 5, 0, 2, 4, 6]
        assert ids(client.browse(ten)) == [1, 5, 3, 4, 6, 0, 2]
    # restored with the state wiped, from the changelog and the topics: the same order (the
    # headers are read again)
    c.kill()
    c.wipe_state()
    c.start()
    with QueueClient(c.address) as client:
        wait_available(client, two, 7)
        wait_available(client, ten, 7)
        assert ids(client.browse(two)) == [1, 3, 5, 0, 2, 4, 6]
        # ten levels: by JMS priority, absent and unreadable ones as 4, oldest first among equals
        with client.subscribe(ten, max_backlog=10) as sub:
            assert ids(drain(sub)) == [1, 5, 3, 4, 6, 0, 2]


def test_qpid_lvq_conflates_on_the_qpid_lvq_key_header(broker, coordinator_factory, names) -> None:
    topic, q = names("prices"), names("lvq")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "lvq": "qpid"}])
    produce_kafka_python(
        broker.bootstrap_servers,
        topic,
        [
            (None, doc(0, px=10), [("qpid.LVQ_key", b"IBM")]),
            (None, doc(1, px=20), [("qpid.LVQ_key", b"MSFT")]),
            (None, doc(2, px=11), [("qpid.LVQ_key", b"IBM")]),
            (None, doc(3, px=1), []),  # no key: delivered as normal, never replaced
            (None, doc(4, px=2), []),
            (None, doc(5, px=12), [("qpid.LVQ_key", b"IBM")]),
        ],
    )
    with QueueClient(c.address) as client:
        wait_until(lambda: sorted(ids(client.browse(q))) == [1, 3, 4, 5], 20, message="conflated")
    # killed and restored from its local state: the queued messages get their keys back from
    # their stored headers, so a newer IBM still replaces the restored one
    c.kill()
    c.start()
    produce_kafka_python(
        broker.bootstrap_servers, topic, [(None, doc(6, px=13), [("qpid.LVQ_key", b"IBM")])]
    )
    with QueueClient(c.address) as client:
        wait_until(lambda: sorted(ids(client.browse(q))) == [1, 3, 4, 6], 20, message="restarted")
        with client.subscribe(q, max_backlog=10) as sub:
            assert sorted(ids(drain(sub))) == [1, 3, 4, 6]


def test_record_fields_in_every_kind_of_expression(broker, coordinator_factory, names) -> None:
    """Queue filter, group_key, barrier, subscription filters, browse, ack-where and the
    dead-letter filters, over keys, headers, timestamps, topics and partitions."""
    topic, q = names("events"), names("events")
    dlq = names("events-dlq")
    c = coordinator_factory(
        [
            {
                "name": q,
                "underlying_topic": topic,
                "message_type": "bytes",
                "filter": f"HEADER('region') IS NOT NULL AND TOPIC() = '{topic}'",
                "group_key": "KEY()",
                "barrier": "HEADER('kind') = 'eod'",
                "dead_letter_topic": dlq,
            }
        ]
    )
    base_ms = 1_700_000_000_000
    records: list[tuple[bytes | None, bytes, Headers]] = [
        (b"c1", doc(0), [("region", b"emea"), ("tier", b"7")]),
        (b"c2", doc(1), [("region", b"apac"), ("tier", b"2")]),
        (b"c1", doc(2), []),  # no region: left out by the queue's filter
        (b"c3", doc(3), [("region", b"emea"), ("tag", b"a"), ("tag", b"b")]),
        (None, doc(4), [("region", b"amer"), ("tier", b"9")]),
    ]
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
    for i, (key, value, headers) in enumerate(records):
        p.produce(topic, value, key=key, headers=headers, partition=0, timestamp=base_ms + i * 1000)
    assert p.flush(10) == 0
    with QueueClient(c.address) as client:
        wait_available(client, q, 4)
        assert client.stats(q)[0].extra["filtered_total"] == 1
        # browse: headers compared as numbers, timestamps in seconds, partitions
        assert ids(client.browse(q, filter="HEADER('tier') > 5")) == [0, 4]
        assert ids(client.browse(q, filter=f"TIMESTAMP() >= {base_ms / 1000 + 3}")) == [3, 4]
        assert ids(client.browse(q, filter="PARTITION() = 0 AND KEY() IS NULL")) == [4]
        assert ids(client.browse(q, filter="HEADER('tag') IS NOT NULL")) == [3]  # a list
        # a subscription filter on the key and a header
        with client.subscribe(
            q, max_backlog=10, filter="KEY() = 'c1' OR HEADER('region') = 'apac'"
        ) as sub:
            got = drain(sub)
            assert ids(got) == [0, 1]
            for m in got:
                m.cancel()
            sub.flush()
        # ack-where on a header, expire (dead-letter) on the key
        assert client.ack_where(q, "HEADER('region') = 'apac'").acked == 1
        assert client.ack_where(q, "KEY() = 'c3'", expire=True).acked == 1
        wait_available(client, q, 2)
        tagged = "HEADER('tag') IS NOT NULL AND KEY() = 'c3'"
        wait_until(lambda: len(client.dead_letters(q, filter=tagged)) == 1, 20, message="letter")
        letters = client.dead_letters(q, filter=tagged)
        assert [json.loads(letter.payload)["id"] for letter in letters] == [3]
        assert client.dead_letters(q, filter="KEY() = 'c1'") == []
        moved = client.redrive(q, filter=f"TOPIC() = '{topic}' AND PARTITION() = 0")
        assert (moved.moved, moved.unmatched) == (1, 0)
        wait_available(client, q, 3)
        # a bad HEADER is the caller's mistake, named in one line
        with pytest.raises(
            InvalidRequest, match="HEADER takes the header's name as a string literal"
        ):
            client.browse(q, filter="HEADER(KEY()) = 'x'")
