"""The Qpid and Solace queue types end to end: a plain Kafka producer publishes to Tansu, a real
coordinator process serves, ``QueueClient`` consumes. Sorted queues (``sort_key``), the last
value queue (``last_value``), per-message TTL (``ttl``) and DMQ eligibility (``dead_letter_if``),
and sort order and TTLs across a SIGKILL."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from layer.client import QueueClient
from tests.helpers import wait_until
from tests.integration.test_metrics import metric, scrape

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, docs: list[dict[str, Any]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for doc in docs:
        p.produce(topic, json.dumps(doc).encode(), partition=0)
    assert p.flush(10) == 0


def take(sub: Any, n: int, timeout: float = 15.0) -> list[Any]:
    """Exactly ``n`` messages (each waited for with a deadline)."""
    got = []
    for _ in range(n):
        msg = sub.next(timeout=timeout)
        assert msg is not None, f"got {len(got)} of {n} messages"
        got.append(msg)
    return got


def ids(messages: list[Any]) -> list[int]:
    return [m.json()["id"] for m in messages]


def wait_available(client: QueueClient, queue: str, n: int) -> None:
    wait_until(lambda: client.stats(queue)[0].available == n, 20, message=f"{n} available")


def test_a_sorted_queue_delivers_by_its_sort_key(broker, coordinator_factory, names) -> None:
    topic, q = names("quotes"), names("sorted")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "sort_key": "/symbol"}])
    docs = [
        {"id": 0, "symbol": "MSFT"},
        {"id": 1},  # no sort key: last
        {"id": 2, "symbol": "AAPL"},
        {"id": 3, "symbol": 7},  # not a string (Qpid: the property must be a String): last
        {"id": 4, "symbol": "IBM"},
        {"id": 5, "symbol": "AAPL"},  # equal to id 2, younger: after it
    ]
    produce(broker.bootstrap_servers, topic, docs)
    with QueueClient(c.address) as client:
        wait_available(client, q, 6)
        assert [json.loads(m.value)["id"] for m in client.browse(q)] == [2, 5, 4, 0, 1, 3]
        with client.subscribe(q, max_backlog=1) as sub:
            first = take(sub, 1)
            assert ids(first) == [2]
            first[0].cancel(wait=True)  # returned: back to its sorted place, first again
            again = take(sub, 1)
            assert ids(again) == [2]
            again[0].ack(wait=True)
            got = []
            for _ in range(5):
                (msg,) = take(sub, 1)
                got.append(msg.json()["id"])
                msg.ack(wait=True)
            assert got == [5, 4, 0, 1, 3]
        # a subscription filter on a sorted queue: sorted among what it matches
        produce(
            broker.bootstrap_servers,
            topic,
            [{"id": 6, "symbol": "b", "n": 1}, {"id": 7, "symbol": "a", "n": 2}, {"id": 8, "n": 1}],
        )
        wait_available(client, q, 3)
        with client.subscribe(q, max_backlog=5, filter="/n = 1") as sub:
            assert ids(take(sub, 2)) == [6, 8]


def test_a_last_value_queue_keeps_only_the_newest_message(
    broker, coordinator_factory, names
) -> None:
    topic, q = names("pub1"), names("last")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "last_value": True}])
    produce(broker.bootstrap_servers, topic, [{"id": i, "symbol": f"S{i}"} for i in range(3)])
    with QueueClient(c.address) as client:
        wait_until(
            lambda: client.stats(q)[0].extra["conflated_total"] == 2, 20, message="2 replaced"
        )
        assert [json.loads(m.value)["id"] for m in client.browse(q)] == [2]
        stats = client.stats(q)[0]
        assert stats.available == 1 and stats.dead_lettered_total == 0
        with client.subscribe(q, max_backlog=1) as sub:
            (held,) = take(sub, 1)
            assert held.json()["id"] == 2
            # newer messages arrive while 2 is leased (the backlog of 1 keeps them waiting): 2
            # stays with its consumer until acked, and of the newer ones only the newest waits
            produce(broker.bootstrap_servers, topic, [{"id": 3}, {"id": 4}])
            wait_until(
                lambda: client.stats(q)[0].extra["conflated_total"] == 3, 20, message="3 replaced"
            )
            assert [json.loads(m.value)["id"] for m in client.browse(q)] == [4]
            held.ack(wait=True)
            (newest,) = take(sub, 1)
            assert newest.json()["id"] == 4
            newest.ack(wait=True)
        wait_until(lambda: client.stats(q)[0].acked_total == 2, 20, message="2 acked")
        assert client.stats(q)[0].available == 0


def test_a_message_expires_at_its_own_ttl_capped_by_the_queue_expiration(
    broker, coordinator_factory, names
) -> None:
    topic, q, dlq = names("ttl"), names("ttl"), names("ttl-dlq")
    c = coordinator_factory(
        [
            {
                "name": q,
                "underlying_topic": topic,
                "ttl": "/ttl_ms / 1000",
                "expiration": "30s",
                "dead_letter_topic": dlq,
            }
        ]
    )
    docs = [
        {"id": 0, "ttl_ms": 1500},  # its own TTL: 1.5 s
        {"id": 1},  # no TTL of its own: the queue's 30 s
        {"id": 2, "ttl_ms": 3_600_000},  # an hour, capped at the queue's 30 s
        {"id": 3, "ttl_ms": 0},  # 0: no TTL of its own (Solace: never expires)
    ]
    produced = time.time()
    produce(broker.bootstrap_servers, topic, docs)
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].dead_lettered_total == 1, 20, message="expired")
        assert time.time() - produced >= 1.5
        (letter,) = client.dead_letters(q)
        assert letter.reason == "expiration" and json.loads(letter.payload or b"")["id"] == 0
        assert sorted(json.loads(m.value)["id"] for m in client.browse(q)) == [1, 2, 3]


def test_dead_letter_if_decides_between_dead_letter_and_discard(
    broker, coordinator_factory, names
) -> None:
    topic, q, dlq = names("dmq"), names("dmq"), names("dmq-dlq")
    c = coordinator_factory(
        [
            {
                "name": q,
                "underlying_topic": topic,
                "max_deliveries": 1,
                "dead_letter_if": "/dmq_eligible = true",
                "dead_letter_topic": dlq,
            }
        ],
        http="127.0.0.1:0",
    )
    http_address = c.http_address
    assert http_address is not None
    docs = [
        {"id": 0, "dmq_eligible": True},
        {"id": 1, "dmq_eligible": False},
        {"id": 2},  # NULL: not eligible (Solace: eligible only when flagged)
        {"id": 3, "dmq_eligible": False},
    ]
    produce(broker.bootstrap_servers, topic, docs)
    with QueueClient(c.address) as client:
        with client.subscribe(q, max_backlog=5) as sub:
            got = take(sub, 4)
            for msg in got[:3]:  # each reaches max_deliveries = 1
                msg.cancel(wait=True)
            # a consumer's expire is its own decision, not a limit or a TTL: dead-lettered
            got[3].expire(wait=True)
        wait_until(lambda: client.stats(q)[0].extra["discarded_total"] == 2, 20, message="2 gone")
        wait_until(lambda: client.stats(q)[0].dead_lettered_total == 2, 20, message="2 dead")
        assert client.stats(q)[0].available == 0
        letters = {json.loads(d.payload or b"")["id"]: d.reason for d in client.dead_letters(q)}
        assert letters == {0: "max_deliveries", 3: "consumer_expire"}
        s = scrape(http_address)
        assert metric(s, "qlayer_queue_discarded_total", queue=q) == 2
        assert metric(s, "qlayer_queue_dead_lettered_total", queue=q, reason="max_deliveries") == 1


@pytest.mark.parametrize("wipe", [False, True], ids=["state-kept", "from-changelog"])
def test_sort_order_ttls_and_the_last_value_survive_a_sigkill(
    broker, coordinator_factory, names, wipe: bool
) -> None:
    topic, q, dlq = names("st"), names("st"), names("st-dlq")
    lv_topic, lv = names("lv"), names("lv")
    c = coordinator_factory(
        [
            {
                "name": q,
                "underlying_topic": topic,
                "sort_key": "/s",
                "ttl": "/ttl",
                "dead_letter_topic": dlq,
            },
            {"name": lv, "underlying_topic": lv_topic, "last_value": True},
        ]
    )
    docs = [
        {"id": 0, "s": "c"},
        {"id": 1, "s": "a"},
        {"id": 2, "s": "b", "ttl": 15},  # expires 15 s after it was produced, across the kill
        {"id": 3},
        {"id": 4, "s": "a"},
    ]
    produced = time.time()
    produce(broker.bootstrap_servers, topic, docs)
    produce(broker.bootstrap_servers, lv_topic, [{"id": i} for i in range(3)])
    with QueueClient(c.address) as client:
        wait_available(client, q, 5)
        wait_until(lambda: client.stats(lv)[0].extra["conflated_total"] == 2, 20, message="lv")
        with client.subscribe(q, max_backlog=1) as sub:
            (first,) = take(sub, 1)
            assert first.json()["id"] == 1
            first.cancel(wait=True)  # durable: returned, it keeps its sorted place
        assert time.time() - produced < 15, "too slow to see the TTL cross the kill"
        assert client.stats(q)[0].dead_lettered_total == 0
    c.kill()
    if wipe:
        c.wipe_state()
    c.start()
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].dead_lettered_total == 1, 40, message="expired")
        assert time.time() - produced >= 15
        (letter,) = client.dead_letters(q)
        assert letter.reason == "expiration" and json.loads(letter.payload or b"")["id"] == 2
        assert [json.loads(m.value)["id"] for m in client.browse(q)] == [1, 4, 0, 3]
        with client.subscribe(q, max_backlog=1) as sub:
            got = []
            for _ in range(4):
                (msg,) = take(sub, 1)
                got.append(msg.json()["id"])
                msg.ack(wait=True)
        assert got == [1, 4, 0, 3]
        # the last value queue: still only the newest, its count of replaced ones kept
        wait_available(client, lv, 1)
        assert [json.loads(m.value)["id"] for m in client.browse(lv)] == [2]
        assert client.stats(lv)[0].extra["conflated_total"] == 2


def test_the_queue_types_read_kafka_headers(broker, coordinator_factory, names) -> None:
    """sort_key, ttl and dead_letter_if over the record's headers (HEADER('name')), as a JMS
    producer sets them, on a bytes queue: no payload fields at all."""
    topic, q, dlq = names("hdr"), names("hdr"), names("hdr-dlq")
    sorted_topic, sorted_q = names("hdr-sorted"), names("hdr-sorted")
    c = coordinator_factory(
        [
            {
                "name": q,
                "underlying_topic": topic,
                "message_type": "bytes",
                "ttl": "HEADER('ttl_s')",
                "max_deliveries": 1,
                "dead_letter_if": "HEADER('dmq') = 'true'",
                "dead_letter_topic": dlq,
            },
            {
                "name": sorted_q,
                "underlying_topic": sorted_topic,
                "message_type": "bytes",
                "sort_key": "HEADER('sym')",
            },
        ]
    )
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
    p.produce(topic, b"short-lived", partition=0, headers=[("ttl_s", b"1"), ("dmq", b"true")])
    p.produce(topic, b"kept", partition=0)
    p.produce(topic, b"limited", partition=0, headers=[("dmq", b"false")])
    for sym in (b"MSFT", b"AAPL", b"IBM"):
        p.produce(sorted_topic, sym.lower(), partition=0, headers=[("sym", sym)])
    assert p.flush(10) == 0
    with QueueClient(c.address) as client:
        # the header's TTL of 1 s: dead-lettered (dmq = true), the others stay
        wait_until(lambda: client.stats(q)[0].dead_lettered_total == 1, 20, message="expired")
        (letter,) = client.dead_letters(q)
        assert letter.reason == "expiration" and letter.payload == b"short-lived"
        with client.subscribe(q, max_backlog=5) as sub:
            got = {m.data: m for m in take(sub, 2)}
            got[b"limited"].cancel(wait=True)  # max_deliveries = 1, dmq = false: discarded
            got[b"kept"].ack(wait=True)
        wait_until(lambda: client.stats(q)[0].extra["discarded_total"] == 1, 20, message="gone")
        assert client.stats(q)[0].dead_lettered_total == 1
        wait_available(client, sorted_q, 3)
        assert [m.value for m in client.browse(sorted_q)] == [b"aapl", b"ibm", b"msft"]
