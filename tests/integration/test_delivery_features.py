"""AMPS expressions and the full delivery model, end to end: plain Kafka producers publish, a real
coordinator process serves, ``QueueClient`` consumes (filters, priorities, barriers, browse,
ack by filter, replace, message groups, last-value and exclusive queues, delays)."""

from __future__ import annotations

import io
import json
import time
import uuid
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer

from layer.client import QueueClient
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, docs: list[dict[str, Any]], **kw: Any) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for doc in docs:
        p.produce(topic, json.dumps(doc).encode(), **kw)
    assert p.flush(10) == 0


def drain(sub: Any, quiet: float = 0.6) -> list[Any]:
    got = []
    while (msg := sub.next(timeout=quiet)) is not None:
        got.append(msg)
    return got


def ids(messages: list[Any]) -> list[int]:
    return [m.json()["id"] for m in messages]


def wait_available(client: QueueClient, queue: str, n: int) -> None:
    wait_until(lambda: client.stats(queue)[0].available == n, 15, message=f"{n} available")


def test_priority_expression_is_the_guides_example(broker, coordinator_factory, names) -> None:
    topic, q = names("orders"), names("OrderPriority")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "priority": "/price * /qty"}])
    docs = [
        {"id": 0, "price": 10.0, "qty": 1},  # 10
        {"id": 1, "price": 2.5, "qty": 100},  # 250
        {"id": 2, "price": "n/a", "qty": 5},  # NULL: lowest
        {"id": 3, "price": 7, "qty": 10},  # 70
        {"id": 4, "price": 1, "qty": 70},  # 70, later: after id 3
    ]
    produce(broker.bootstrap_servers, topic, docs)
    with QueueClient(c.address) as client:
        wait_available(client, q, 5)
        with client.subscribe(q, max_backlog=10) as sub:
            assert ids(drain(sub)) == [1, 3, 4, 0, 2]


def test_content_filters_on_subscriptions_and_on_the_queue(
    broker, coordinator_factory, names
) -> None:
    topic, q = names("trades"), names("big")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "filter": "/qty > 10"}])
    docs = [
        {"id": 0, "symbol": "IBM", "qty": 5},  # filtered out of the queue
        {"id": 1, "symbol": "IBM", "qty": 50},
        {"id": 2, "symbol": "MSFT", "qty": 20},
        {"id": 3, "symbol": "AAPL", "qty": 30},  # matches no subscription
        {"id": 4, "symbol": "IBM", "qty": 11},
    ]
    produce(broker.bootstrap_servers, topic, docs)
    with QueueClient(c.address) as client:
        wait_available(client, q, 4)
        stats = client.stats(q)[0]
        assert stats.extra["filtered_total"] == 1
        ibm = client.subscribe(q, max_backlog=10, filter="/symbol = 'IBM'")
        msft = client.subscribe(q, max_backlog=10, filter="/symbol IN ('MSFT', 'ORCL')")
        try:
            got_ibm, got_msft = drain(ibm), drain(msft)
            assert ids(got_ibm) == [1, 4]
            assert ids(got_msft) == [2]
            for m in got_ibm + got_msft:
                m.ack()
            ibm.flush()
            msft.flush()
            # AAPL waits: still available, delivered to nobody
            assert [json.loads(m.value)["id"] for m in client.browse(q)] == [3]
        finally:
            ibm.close()
            msft.close()
        with pytest.raises(Exception, match="column"):
            client.subscribe(q, filter="/symbol = ").next(timeout=5)


def test_barrier_waits_for_earlier_acks_and_goes_to_every_subscriber(
    broker, coordinator_factory, names
) -> None:
    topic, q = names("jobs"), names("jobs")
    c = coordinator_factory(
        [{"name": q, "underlying_topic": topic, "barrier": "/type = 'end-of-day'"}]
    )
    docs = [{"id": i, "type": "job"} for i in range(3)]
    docs.append({"id": 3, "type": "end-of-day"})
    docs += [{"id": i, "type": "job"} for i in (4, 5)]
    with QueueClient(c.address) as client:
        a = client.subscribe(q, max_backlog=5)
        b = client.subscribe(q, max_backlog=5, filter="/id >= 3")  # sees no job before it
        try:
            wait_until(lambda: client.stats(q)[0].subscriptions == 2, 10, message="2 subs")
            produce(broker.bootstrap_servers, topic, docs)
            first = drain(a)
            assert ids(first) == [0, 1, 2]
            assert drain(b) == []  # 4 and 5 wait behind the barrier
            assert client.stats(q)[0].extra["held"] == 3
            browsed = client.browse(q)
            assert [(m.json()["id"], m.barrier) for m in browsed] == [
                (3, True),
                (4, False),
                (5, False),
            ]
            first[0].ack()
            first[1].ack()
            a.flush()
            assert drain(a, quiet=0.8) == []  # one job before the barrier is still unacked
            first[2].ack()
            a.flush()
            got_a, got_b = drain(a), drain(b)
            barrier_a = [m for m in got_a if m.barrier]
            barrier_b = [m for m in got_b if m.barrier]
            assert ids(barrier_a) == [3] and ids(barrier_b) == [3]
            assert got_a[0].barrier and got_b[0].barrier  # the barrier comes first
            assert sorted(ids(got_a[1:]) + ids(got_b[1:])) == [4, 5]
            barrier_a[0].ack()  # a no-op: a barrier needs no ack
            stats = client.stats(q)[0]
            assert stats.extra["held"] == 0 and stats.dead_lettered_total == 0
        finally:
            a.close()
            b.close()


def test_barriers_reach_subscriptions_whose_backlog_is_0_or_filled_elsewhere(
    broker, coordinator_factory, names
) -> None:
    """The guide: "subscribers that request max_backlog=0 or which use a regular expression
    topic and have their backlog filled by messages from other topics will still receive the
    barrier message"."""
    sfx = uuid.uuid4().hex[:8]
    eod, other = f"eod-{sfx}", f"other-{sfx}"
    c = coordinator_factory(
        [
            {"name": eod, "underlying_topic": eod, "barrier": "/type = 'end-of-day'"},
            {"name": other, "underlying_topic": other},
        ]
    )
    with QueueClient(c.address) as client:
        zero = client.subscribe(eod, max_backlog=0)
        both = client.subscribe(f"^.*-{sfx}$", max_backlog=1)  # a regex of queue names: both
        try:
            wait_until(lambda: client.stats(eod)[0].subscriptions == 2, 10, message="2 subs")
            produce(broker.bootstrap_servers, other, [{"id": 0, "type": "job"}])
            (filler,) = drain(both)
            assert filler.queue == other  # its backlog of 1 is full now
            produce(broker.bootstrap_servers, eod, [{"id": 1, "type": "end-of-day"}])
            produce(broker.bootstrap_servers, eod, [{"id": 2, "type": "job"}])
            got_zero, got_both = drain(zero), drain(both)
            assert [(m.json()["id"], m.barrier) for m in got_zero] == [(1, True)]
            assert [(m.json()["id"], m.barrier) for m in got_both] == [(1, True)]
            assert client.stats(eod)[0].available == 1  # 2 waits: nobody has room
            filler.ack(wait=True)
            assert ids(drain(both)) == [2]
            assert drain(zero) == []  # a backlog of 0 never takes a message
        finally:
            zero.close()
            both.close()


def test_expressions_read_avro_messages_with_the_queues_schema(
    broker, coordinator_factory, names, tmp_path
) -> None:
    """An avro queue: the queue filter, the priority and a subscription filter read the
    schemaless Avro payloads with ``avro_schema``; one that does not decode is dead-lettered."""
    schema = {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "int"},
            {"name": "sym", "type": "string"},
            {"name": "price", "type": "double"},
            {"name": "qty", "type": {"type": "array", "items": "int"}},
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
    schema_file = tmp_path / "order.avsc"
    schema_file.write_text(json.dumps(schema))
    topic, q, dlq = names("avro"), names("avro"), names("avro-dlq")
    c = coordinator_factory(
        [
            {
                "name": q,
                "underlying_topic": topic,
                "message_type": "avro",
                "avro_schema": str(schema_file),
                "filter": "/sym IN ('IBM', 'MSFT') AND /note IS NULL",
                "priority": "/price * /qty[0]",
                "dead_letter_topic": dlq,
                "on_unparseable": "deliver",  # (the default dead-letters it on arrival)
            }
        ]
    )
    parsed = fastavro.parse_schema(schema)
    orders = [
        (0, "IBM", 10.0, [1], None),  # priority 10
        (1, "IBM", 2.0, [100], None),  # 200
        (2, "AAPL", 99.0, [9], None),  # filtered out of the queue
        (3, "MSFT", 5.0, [3], None),  # 15
        (4, "IBM", 1.0, [1], "hold"),  # filtered out: a note
    ]
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
    for i, sym, price, qty, note in orders:
        buffer = io.BytesIO()
        record = {"id": i, "sym": sym, "price": price, "qty": qty, "note": note}
        fastavro.schemaless_writer(buffer, parsed, record)
        producer.produce(topic, buffer.getvalue())
    producer.produce(topic, b"\xff\xff not avro")  # enters, to be dead-lettered
    assert producer.flush(10) == 0

    def decoded(msg: Any) -> dict[str, Any]:
        return fastavro.schemaless_reader(io.BytesIO(msg.data), parsed, None)

    with QueueClient(c.address) as client:
        wait_available(client, q, 4)
        stats = client.stats(q)[0]
        assert stats.extra["filtered_total"] == 2 and stats.extra["unparseable_total"] == 1
        with client.subscribe(q, max_backlog=10, filter="/sym = 'IBM'") as ibm:
            got = drain(ibm)
            # highest priority first; the unparseable one matches no filter: it waits
            assert [decoded(m)["id"] for m in got] == [1, 0]
            for m in got:
                m.ack()
            ibm.flush()
        with client.subscribe(q, max_backlog=10) as rest:
            got = drain(rest)
            assert [decoded(m)["id"] for m in got[:1]] == [3]
            assert len(got) == 2 and got[1].data == b"\xff\xff not avro"
            assert got[0].parse_error is None
            assert (got[1].parse_error or "").startswith("unparseable avro: ")
            got[0].ack()
            got[1].expire()
            rest.flush()
        assert client.stats(q)[0].dead_lettered_total == 1


def test_ack_where_acks_only_the_active_part_under_target_queue_depth(
    broker, coordinator_factory, names
) -> None:
    """The guide: "A sow_delete that uses a filter will only apply to the messages in the queue
    that are currently deliverable. As messages are acknowledged from the queue, AMPS will add
    messages to the active part of the queue until [it] once again reaches the
    TargetQueueDepth"."""
    topic, q = names("jobs"), names("jobs")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "target_queue_depth": 3}])
    produce(broker.bootstrap_servers, topic, [{"id": i, "k": 1} for i in range(7)])
    with QueueClient(c.address) as client:
        wait_until(
            lambda: (client.stats(q)[0].available, client.stats(q)[0].inactive) == (3, 4),
            15,
            message=lambda: f"3 active, 4 inactive: {client.stats(q)[0]}",
        )
        assert ids(client.browse(q)) == [0, 1, 2]
        result = client.ack_where(q, "/k = 1")
        assert (result.acked, result.skipped) == (3, 0)  # the inactive ones matched too
        wait_until(lambda: ids(client.browse(q)) == [3, 4, 5], 15, message="the next 3 active")
        assert client.stats(q)[0].inactive == 1
        assert client.ack_where(q, "/k = 1").acked == 3
        wait_until(lambda: ids(client.browse(q)) == [6], 15, message="the last one active")
        assert client.stats(q)[0].acked_total == 6


def test_browse_is_read_only_and_ack_where_acks_what_matches(
    broker, coordinator_factory, names
) -> None:
    topic, q = names("orders"), names("orders")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "leasing": "strict"}])
    produce(
        broker.bootstrap_servers,
        topic,
        [{"id": i, "side": "buy" if i % 2 else "sell"} for i in range(6)],
    )
    with QueueClient(c.address) as client:
        wait_available(client, q, 6)
        assert [json.loads(m.value)["id"] for m in client.browse(q)] == [0, 1, 2, 3, 4, 5]
        assert len(client.browse(q, limit=2)) == 2
        assert client.stats(q)[0].leased == 0  # browse leased nothing
        with client.subscribe(q, max_backlog=1) as sub:
            held = sub.next(timeout=10)
            assert held is not None and held.json()["id"] == 0
            browsed = [json.loads(m.value)["id"] for m in client.browse(q)]
            assert browsed == [1, 2, 3, 4, 5]  # the leased one is not in the view
            assert [
                json.loads(m.value)["id"] for m in client.browse(q, filter="/side = 'buy'")
            ] == [1, 3, 5]
            result = client.ack_where(q, "/side = 'sell'")  # 0 is leased: skipped (strict)
            assert (result.acked, result.skipped) == (2, 1)
            assert [json.loads(m.value)["id"] for m in client.browse(q)] == [1, 3, 5]
            held.ack()


def test_replace_changes_the_filter_and_keeps_the_lease(broker, coordinator_factory, names) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([{"name": q, "underlying_topic": topic}])
    produce(
        broker.bootstrap_servers,
        topic,
        [{"id": i, "kind": "a" if i < 2 else "b"} for i in range(4)],
    )
    with QueueClient(c.address) as client:
        wait_available(client, q, 4)
        with client.subscribe(q, max_backlog=2, filter="/kind = 'a'") as sub:
            first = drain(sub)
            assert ids(first) == [0, 1]
            assert sub.replace(filter="/kind = 'b'", max_backlog=1) == 1
            assert client.stats(q)[0].leased == 2  # leases kept across the replace
            assert drain(sub) == []  # 2 outstanding, backlog 1
            first[0].ack()
            first[1].ack()
            sub.flush()
            assert ids(drain(sub)) == [2]
            with pytest.raises(Exception, match="column"):
                sub.replace(filter="/kind = = 'c'")
            assert sub.filter == "/kind = 'b'"  # a failed replace changes nothing


def test_groups_last_value_and_exclusive_queues(broker, coordinator_factory, names) -> None:
    t1, t2, t3 = names("g"), names("lv"), names("ex")
    groups, lvq, excl = names("groups"), names("prices"), names("exclusive")
    c = coordinator_factory(
        [
            {"name": groups, "underlying_topic": t1, "group_key": "/customer"},
            {"name": lvq, "underlying_topic": t2, "conflate_key": "/symbol"},
            {"name": excl, "underlying_topic": t3, "exclusive": True},
        ]
    )
    with QueueClient(c.address) as client:
        # message groups: one consumer per customer at a time, other customers not blocked
        a = client.subscribe(groups, max_backlog=10)
        b = client.subscribe(groups, max_backlog=10)
        try:
            wait_until(lambda: client.stats(groups)[0].subscriptions == 2, 10, message="subs")
            docs = [{"id": i, "customer": "c1" if i % 3 else "c2"} for i in range(9)]
            produce(broker.bootstrap_servers, t1, docs)
            got_a, got_b = drain(a), drain(b)
            for got in (got_a, got_b):
                customers = {m.json()["customer"] for m in got}
                assert len(customers) <= 1, "a group was split between consumers"
                assert ids(got) == sorted(ids(got))
            assert len(got_a) + len(got_b) == 9
        finally:
            a.close()
            b.close()
        # last-value: a newer price replaces the older available one
        produce(
            broker.bootstrap_servers,
            t2,
            [
                {"id": 0, "symbol": "IBM", "px": 1},
                {"id": 1, "symbol": "MSFT", "px": 2},
                {"id": 2, "symbol": "IBM", "px": 3},
            ],
        )
        wait_until(lambda: client.stats(lvq)[0].available == 2, 15, message="2 prices")
        assert [json.loads(m.value)["id"] for m in client.browse(lvq)] == [1, 2]
        assert client.stats(lvq)[0].dead_lettered_total == 0
        # exclusive: the first subscriber gets everything; the standby takes over on close
        active = client.subscribe(excl, max_backlog=10)
        standby = client.subscribe(excl, max_backlog=10)
        wait_until(lambda: client.stats(excl)[0].subscriptions == 2, 10, message="subs")
        produce(broker.bootstrap_servers, t3, [{"id": i} for i in range(4)])
        got = drain(active)
        assert ids(got) == [0, 1, 2, 3] and drain(standby, quiet=0.3) == []
        got[0].ack()
        active.flush()
        active.close()
        assert ids(drain(standby)) == [1, 2, 3]
        standby.close()


def test_delayed_delivery_cancel_with_delay_and_backoff(broker, coordinator_factory, names) -> None:
    topic, q, t2, slow = names("t"), names("q"), names("t2"), names("slow")
    backoff = {"initial": "1s", "multiplier": 2, "max": "10s"}
    c = coordinator_factory(
        [
            {"name": q, "underlying_topic": topic},
            {
                "name": slow,
                "underlying_topic": t2,
                "lease_period": 1.0,
                "redelivery_backoff": backoff,
            },
        ]
    )
    later = time.time() + 2.0
    header = [("deliver_after", f"{later:.3f}".encode())]
    produce(broker.bootstrap_servers, topic, [{"id": 0}], headers=header)
    produce(broker.bootstrap_servers, topic, [{"id": 1}])
    with QueueClient(c.address) as client, client.subscribe(q, max_backlog=5) as sub:
        first = sub.next(timeout=10)
        assert first is not None and first.json()["id"] == 1  # 0 is not due yet
        assert client.stats(q)[0].extra["delayed"] == 1
        assert sub.next(timeout=max(0.1, later - time.time() - 0.3)) is None
        second = sub.next(timeout=10)
        assert second is not None and second.json()["id"] == 0
        assert time.time() >= later - 0.05
        second.ack()
        cancelled_at = time.time()
        first.cancel(delay=1.5)
        again = sub.next(timeout=10)
        assert again is not None and again.json()["id"] == 1 and again.cancels == 1
        assert time.time() - cancelled_at >= 1.4
        again.ack()
    produce(broker.bootstrap_servers, t2, [{"id": 2}])
    with QueueClient(c.address) as client, client.subscribe(slow, max_backlog=5) as sub:
        got = sub.next(timeout=10)
        assert got is not None and got.deliveries == 1
        # not acked: the lease (1 s) times out, then the backoff after one delivery (1 s)
        leased_at = time.time()
        back = sub.next(timeout=10)
        assert back is not None and back.deliveries == 2
        assert time.time() - leased_at >= 1.8
        leased_at = time.time()
        back = sub.next(timeout=10)  # then 1 s lease + 2 s backoff
        assert back is not None and back.deliveries == 3
        assert time.time() - leased_at >= 2.8
        back.ack()


@pytest.mark.parametrize("wipe", [False, True], ids=["state-kept", "from-changelog"])
def test_delays_groups_and_barriers_survive_a_sigkill(
    broker, coordinator_factory, names, wipe: bool
) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory(
        [{"name": q, "underlying_topic": topic, "group_key": "/g", "barrier": "/end = true"}]
    )
    docs = [{"id": 0, "g": "x"}, {"id": 1, "g": "y"}, {"id": 2, "end": True}, {"id": 3, "g": "x"}]
    produce(broker.bootstrap_servers, topic, docs)
    with QueueClient(c.address) as client, client.subscribe(q, max_backlog=5) as sub:
        got = drain(sub)
        assert ids(got) == [0, 1]
        got[0].ack()
        got[1].cancel(delay=30.0)  # durable: must not come back early after a restart
        sub.flush()
    c.kill()
    if wipe:
        c.wipe_state()
    c.start()
    with QueueClient(c.address) as client, client.subscribe(q, max_backlog=5) as sub:
        wait_until(lambda: client.stats(q)[0].extra["delayed"] == 1, 20, message="delayed")
        stats = client.stats(q)[0]
        assert stats.extra["held"] == 2  # the barrier and what follows it
        assert drain(sub, quiet=1.0) == []  # 1 is delayed 30 s; the barrier waits for it
