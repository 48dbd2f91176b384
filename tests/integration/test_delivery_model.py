"""Fairness, backlog caps and start positions, end to end through a coordinator process."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from layer.client import QueueClient
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, n: int, start: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(start, start + n):
        p.produce(topic, json.dumps({"i": i}).encode())
    assert p.flush(10) == 0


def drain(sub: Any, quiet: float = 0.5) -> list[Any]:
    """Everything the subscription receives until it is quiet for ``quiet`` seconds (no acks)."""
    got = []
    while (msg := sub.next(timeout=quiet)) is not None:
        got.append(msg)
    return got


@pytest.mark.parametrize(
    ("fairness", "expected"),
    [("fast", [10, 2, 0]), ("round-robin", [4, 4, 4]), ("proportional", [4, 4, 4])],
)
def test_fairness_spreads_messages(
    broker, coordinator_factory, names, fairness: str, expected: list[int]
) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "fairness": fairness}])
    with QueueClient(c.address) as client:
        subs = [client.subscribe(q, max_backlog=10) for _ in range(3)]
        try:
            wait_until(lambda: client.stats(q)[0].subscriptions == 3, 10, message="3 subscribers")
            produce(broker.bootstrap_servers, topic, 12)
            counts = [len(drain(s)) for s in subs]
            assert counts == expected
        finally:
            for s in subs:
                s.close()


def test_backlog_is_capped_by_the_queue(broker, coordinator_factory, names) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory(
        [{"name": q, "underlying_topic": topic, "max_per_subscription_backlog": 3}]
    )
    produce(broker.bootstrap_servers, topic, 10)
    with QueueClient(c.address) as client:
        with client.subscribe(q, max_backlog=100) as sub:
            assert sub.backlog == 3
            first = drain(sub)
            assert len(first) == 3  # no more until something is acked
            first[0].ack()
            assert len(drain(sub)) == 1
        with client.subscribe(q) as one:
            assert one.backlog == 1  # the default max_backlog is 1


def test_start_from_latest_skips_what_was_there(
    broker, coordinator_factory, names, topic_factory
) -> None:
    topic, q = topic_factory(), names("q")
    produce(broker.bootstrap_servers, topic, 3)  # before the queue exists
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "start_from": "latest"}])
    with QueueClient(c.address) as client, client.subscribe(q, max_backlog=100) as sub:
        got: list[Any] = []
        i = 100
        deadline = time.monotonic() + 20
        while not got:
            assert time.monotonic() < deadline, "nothing published after the start arrived"
            produce(broker.bootstrap_servers, topic, 1, start=i)
            i += 1
            got = drain(sub, quiet=0.2)
        assert [m.json()["i"] for m in got if m.json()["i"] < 100] == []
        assert all(m.offset >= 3 for m in got)
