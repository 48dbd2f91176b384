"""Queues over several topics, default_publish_target, and publishing to a queue's name: the
guide's ORDERS / ORDERS_ANALYTICS / ORDERS_RISK table, published with a plain Kafka producer and
consumed through ``QueueClient``; the copy to the default publish target happens exactly once,
across SIGKILLs of the coordinator too."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from layer.client import QueueClient
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, docs: list[dict[str, Any]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for doc in docs:
        p.produce(topic, json.dumps(doc).encode(), headers=[("src", topic.encode())])
    assert p.flush(10) == 0


def orders_config(sfx: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The guide's configuration, with a suffix on every name so tests do not share topics."""
    n = {k: f"{k}-{sfx}" for k in ("ORDERS", "ORDERS_ANALYTICS", "ORDERS_RISK")}
    n["ANALYTICS_DIRECT"] = f"ORDERS_ANALYTICS_DIRECT-{sfx}"
    n["RISK_DIRECT"] = f"ORDERS_RISK_DIRECT-{sfx}"
    e = {k: re.escape(v) for k, v in n.items()}
    queues = [
        {
            "name": n["ORDERS_ANALYTICS"],
            "underlying_topic": f"^{e['ORDERS']}$|^{e['ANALYTICS_DIRECT']}$",
            "default_publish_target": n["ANALYTICS_DIRECT"],
        },
        {
            "name": n["ORDERS_RISK"],
            "underlying_topic": f"^{e['ORDERS']}$|^{e['RISK_DIRECT']}$",
            "default_publish_target": n["RISK_DIRECT"],
        },
    ]
    return n, queues


def browse_ids(client: QueueClient, queue: str) -> list[str]:
    return sorted(m.json()["id"] for m in client.browse(queue))


def test_the_guides_orders_table(broker, coordinator_factory, consume_all) -> None:
    n, queues = orders_config(uuid.uuid4().hex[:8])
    c = coordinator_factory(queues, topic_refresh_interval="0.2s")
    bootstrap = broker.bootstrap_servers
    # each row of the guide's table: the topic published to -> the queues that enqueue it
    rows = {
        "ORDERS": {"ORDERS_ANALYTICS", "ORDERS_RISK"},
        "ORDERS_ANALYTICS": {"ORDERS_ANALYTICS"},  # routed to ORDERS_ANALYTICS_DIRECT
        "ORDERS_RISK": {"ORDERS_RISK"},  # routed to ORDERS_RISK_DIRECT
        "ANALYTICS_DIRECT": {"ORDERS_ANALYTICS"},
        "RISK_DIRECT": {"ORDERS_RISK"},
    }
    for row in rows:
        produce(bootstrap, n[row], [{"id": row}])
    expected = {
        queue: sorted(row for row, queues_ in rows.items() if queue in queues_)
        for queue in ("ORDERS_ANALYTICS", "ORDERS_RISK")
    }
    with QueueClient(c.address) as client:
        for queue, ids in expected.items():
            wait_until(
                lambda queue=queue, ids=ids: browse_ids(client, n[queue]) == ids,
                20,
                message=lambda queue=queue: f"{queue}: {browse_ids(client, n[queue])}",
            )
        # publishing through the API goes to the default publish target as well
        client.publish(n["ORDERS_RISK"], json.dumps({"id": "api"}).encode())
        wait_until(
            lambda: (
                browse_ids(client, n["ORDERS_RISK"]) == sorted([*expected["ORDERS_RISK"], "api"])
            ),
            10,
            message="the API publish",
        )
        assert browse_ids(client, n["ORDERS_ANALYTICS"]) == expected["ORDERS_ANALYTICS"]
        stats = {s.queue: s for s in client.stats()}
        assert stats[n["ORDERS_RISK"]].extra["routed_total"] == 1
        assert stats[n["ORDERS_ANALYTICS"]].extra["routed_total"] == 1
    # the copy in the target topic: once, with the source's headers and where it came from.
    # Read again until it shows: one loaded run (2026-11-27) read the topic to its end without
    # it, though the queue had read it from there (cause not found); the message says what was read
    read: list[Any] = []

    def copies() -> list[Any]:
        read[:] = consume_all(n["RISK_DIRECT"])
        return [m for m in read if json.loads(m.value())["id"] == "ORDERS_RISK"]

    wait_until(
        lambda: len(copies()) > 0,
        20,
        message=lambda: (
            "no copy in the target topic; read (partition, offset, id): "
            + str([(m.partition(), m.offset(), json.loads(m.value())["id"]) for m in read])
        ),
    )
    (copy,) = copies()
    headers = dict(copy.headers())
    assert headers["src"] == n["ORDERS_RISK"].encode()
    assert headers["qlayer.routed-from"] == f"{n['ORDERS_RISK']}/0/0".encode()


@pytest.mark.parametrize("wipe", [False, True], ids=["state-kept", "from-changelog"])
def test_publishes_to_the_queue_name_are_copied_exactly_once_across_sigkills(
    broker, coordinator_factory, names, consume_all, wipe: bool
) -> None:
    q, target = names("jobs"), names("jobs-direct")
    c = coordinator_factory(
        [
            {
                "name": q,
                "underlying_topic": f"^{re.escape(target)}$",
                "default_publish_target": target,
            }
        ]
    )
    bootstrap = broker.bootstrap_servers
    total = 0
    for round_ in range(3):
        produce(bootstrap, q, [{"id": f"{round_}-{i}"} for i in range(3000)])
        total += 3000
        # kill while the copying is (likely) still going on, then restart
        before = total - 3000
        wait_until(
            lambda before=before: len(consume_all(target, timeout=2)) > before, 20, message="copy"
        )
        c.kill()
        if wipe:
            c.wipe_state()
        c.start()
    with QueueClient(c.address) as client:
        wait_until(
            lambda: client.stats(q)[0].available == total,
            30,
            message=lambda: f"{client.stats(q)[0]}",
        )
    copies = Counter(json.loads(m.value())["id"] for m in consume_all(target))
    assert len(copies) == total
    duplicated = {k: v for k, v in copies.items() if v > 1}
    assert not duplicated, f"copied more than once: {duplicated}"


def test_a_subscription_to_a_regex_of_queue_names_shares_one_backlog(
    broker, coordinator_factory, names
) -> None:
    sfx = uuid.uuid4().hex[:8]
    fast, slow, other, shared = (f"{n}-{sfx}" for n in ("work-fast", "work-slow", "other", "t"))
    c = coordinator_factory(
        [
            {"name": fast, "underlying_topic": fast, "max_per_subscription_backlog": 3},
            {"name": slow, "underlying_topic": slow, "max_per_subscription_backlog": 5},
            {"name": other, "underlying_topic": other},
        ]
    )
    bootstrap = broker.bootstrap_servers
    for topic in (fast, slow, other):
        produce(bootstrap, topic, [{"id": f"{topic}-{i}"} for i in range(10)])
    pattern = f"^work-.*-{sfx}$"
    with QueueClient(c.address) as client:
        for q in (fast, slow, other):
            wait_until(lambda q=q: client.stats(q)[0].available == 10, 15, message=q)
        with client.subscribe(pattern, max_backlog=10) as sub:
            # the backlog is the smallest cap of the matched queues, over all of them
            got = [sub.next(timeout=10) for _ in range(3)]
            assert all(m is not None for m in got)
            assert sub.next(timeout=1.0) is None
            assert {m.queue for m in got} <= {fast, slow}
            stats = {s.queue: s for s in client.stats()}
            assert stats[fast].leased + stats[slow].leased == 3
            assert stats[other].leased == 0 and stats[other].subscriptions == 0
            got[0].ack(wait=True)
            more = sub.next(timeout=10)
            assert more is not None and more.queue in (fast, slow)
            assert sub.next(timeout=1.0) is None
            # replace: a smaller backlog, one queue; leases elsewhere stay until acked
            sub.replace(f"^{re.escape(slow)}$", max_backlog=1)
            for m in [*got[1:], more]:
                m.ack()
            sub.flush()
            taken = []
            while (m := sub.next(timeout=1.5)) is not None:
                assert m.queue == slow
                taken.append(m)
                m.ack()
            sub.flush()
            assert len(taken) == 10 - sum(1 for m in [*got, more] if m.queue == slow)
        with pytest.raises(Exception, match="matches no configured queue"):
            client.subscribe(f"^nothing-{sfx}", max_backlog=1).next(timeout=5)

    # two queues over one topic: the same bookmark comes from each; each ack finds its queue
    a, b = names("a"), names("b")
    c2 = coordinator_factory(
        [{"name": a, "underlying_topic": shared}, {"name": b, "underlying_topic": shared}]
    )
    produce(bootstrap, shared, [{"id": "only"}])
    with QueueClient(c2.address) as client:
        with client.subscribe(f"^({re.escape(a)}|{re.escape(b)})$", max_backlog=5) as sub:
            first, second = sub.next(timeout=10), sub.next(timeout=10)
            assert first is not None and second is not None
            assert first.bookmark == second.bookmark
            assert {first.queue, second.queue} == {a, b}
            first.ack(wait=True)
            second.ack(wait=True)
        stats = {s.queue: s for s in client.stats()}
        assert stats[a].acked_total == stats[b].acked_total == 1
        assert stats[a].available == stats[b].available == 0
