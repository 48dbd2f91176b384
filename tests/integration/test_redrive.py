"""Dead-letter redrive: dead letters go back into their queue as new messages, with fresh
delivery counts, each at most once ever (across restarts, with the state wiped too), through the
client and ``qlayer redrive``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import Producer

from layer.client import QueueClient
from tests.harness import qlayer
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, docs: list[dict[str, Any]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for doc in docs:
        p.produce(topic, json.dumps(doc).encode(), headers=[("trace", b"t1")])
    assert p.flush(10) == 0


def test_redrive_moves_each_dead_letter_back_once(
    broker, coordinator_factory, names, consume_all
) -> None:
    topic, q, dlq = names("orders"), names("orders"), names("orders-dlq")
    other, plain = names("other"), names("plain")
    c = coordinator_factory(
        [
            {"name": q, "underlying_topic": topic, "dead_letter_topic": dlq, "max_deliveries": 2},
            # a second queue dead-letters into the same topic: its letters are not ours
            {"name": other, "underlying_topic": names("other-t"), "dead_letter_topic": dlq},
            {"name": plain, "underlying_topic": names("plain-t")},
        ]
    )
    produce(broker.bootstrap_servers, topic, [{"id": i, "sym": "AB"[i % 2]} for i in range(6)])
    with QueueClient(c.address) as client:
        with client.subscribe(q, max_backlog=10) as sub:
            for _ in range(6):
                msg = sub.next(timeout=10)
                assert msg is not None
                msg.expire()  # dead-lettered with reason consumer_expire
            sub.flush()
        wait_until(lambda: len(consume_all(dlq, timeout=2)) == 6, 15, message="6 dead letters")
        assert client.stats(q)[0].available == 0

        first = client.redrive(q, filter="/sym = 'A'")
        assert (first.moved, first.already, first.unmatched) == (3, 0, 3)
        wait_until(lambda: client.stats(q)[0].available == 3, 15, message="3 back")
        back = client.browse(q)
        assert sorted(m.json()["id"] for m in back) == [0, 2, 4]
        for m in back:
            assert m.deliveries == 0 and m.cancels == 0  # fresh counts
            headers = dict(m.headers)
            assert headers["trace"] == b"t1"
            assert headers["qlayer.redriven-from"].decode().startswith(f"{topic}/0/")

        second = client.redrive(q, limit=2)
        assert (second.moved, second.already) == (2, 3)
        third = client.redrive(q)
        assert (third.moved, third.already, third.unmatched) == (1, 5, 0)
        wait_until(lambda: client.stats(q)[0].available == 6, 15, message="all 6 back")
        # a redriven message that fails again is dead-lettered again, and can come back again
        with client.subscribe(q, max_backlog=1, filter="/id = 1") as sub:
            msg = sub.next(timeout=10)
            assert msg is not None and msg.json()["id"] == 1
            msg.expire(wait=True)
        wait_until(lambda: len(consume_all(dlq, timeout=2)) == 7, 15, message="7 dead letters")

    # the moves are in the changelog: a restart with the state wiped redrives nothing twice
    c.kill()
    c.wipe_state()
    c.start()
    r = qlayer("redrive", q, "--server", c.address)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "moved 1, already redriven 6, unmatched 0"
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 6, 15, message="6 in the queue")
        ids = sorted(m.json()["id"] for m in client.browse(q))
        assert ids == [0, 1, 2, 3, 4, 5]
        again = client.redrive(q)
        assert (again.moved, again.already) == (0, 7)
        with pytest.raises(Exception, match="no dead_letter_topic"):
            client.redrive(plain)
    bad = qlayer("redrive", names("missing"), "--server", c.address)
    assert bad.returncode != 0 and "not configured" in bad.stderr
