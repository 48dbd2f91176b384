"""The counters of ``qlayer stats`` are integers and survive a SIGKILL: with the state directory
kept, and rebuilt from the changelog alone (the state directory wiped)."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from layer.client import QueueClient
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

COUNTED = (
    "ingested_total",
    "delivered_total",
    "acked_total",
    "cancelled_total",
    "dead_lettered.consumer_expire_total",
)


def _figures(client: QueueClient, queue: str) -> dict[str, int]:
    (s,) = client.stats(queue)
    figures = {
        "delivered_total": s.delivered_total,
        "acked_total": s.acked_total,
        "dead_lettered_total": s.dead_lettered_total,
        **{k: v for k, v in s.extra.items() if k.endswith("_total") and k != "rounds_total"},
    }
    for name, value in figures.items():
        assert type(value) is int, f"{name} is {value!r}, not an integer"
    return figures  # type: ignore[return-value]


def test_counters_survive_sigkill_and_a_lost_state_directory(
    broker, coordinator_factory, names
) -> None:
    topic, q = names("counted"), names("counted")
    c = coordinator_factory(
        [{"name": q, "underlying_topic": topic, "dead_letter_topic": names("counted-dlq")}]
    )
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
    for i in range(30):
        p.produce(topic, json.dumps({"i": i}).encode())
    assert p.flush(10) == 0
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 30, 30, message="30 available")
        with client.subscribe(q, max_backlog=5) as sub:
            for n in range(20):
                msg = sub.next(timeout=10)
                assert msg is not None
                if n % 4 == 0:
                    msg.expire(wait=True)
                elif n % 4 == 1:
                    msg.cancel(wait=True)
                else:
                    msg.ack(wait=True)
            sub.flush()
        before = _figures(client, q)
    assert before["acked_total"] >= 10 and before["ingested_total"] == 30
    assert before["dead_lettered.consumer_expire_total"] == 5 and before["cancelled_total"] >= 5

    for wipe in (False, True):
        c.kill()
        if wipe:
            c.wipe_state()  # rebuilt from the changelog alone
        c.start()
        with QueueClient(c.address) as client:
            after = _figures(client, q)
        for name in COUNTED:
            assert after[name] >= before[name], (wipe, name, before, after)
        assert after["dead_lettered_total"] >= before["dead_lettered_total"]
        before = after
