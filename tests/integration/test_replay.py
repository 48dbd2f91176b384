"""Replay through the queue's name (AMPS's bookmark subscription to a queue): the underlying
topics from a bookmark or a time, as plain publish/subscribe, with a filter and an end; the
queue's state untouched; the server's reader stops when the client goes away."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from layer.client import AsyncQueueClient, QueueClient
from layer.exceptions import InvalidRequest, UnknownQueue
from tests.harness import qlayer
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def _produce(bootstrap: str, topic: str, docs: list[Any], timestamp_ms: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for doc in docs:
        value = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        if timestamp_ms:
            p.produce(topic, value, timestamp=timestamp_ms)
        else:
            p.produce(topic, value)
    assert p.flush(10) == 0


def _state(client: QueueClient, q: str) -> tuple[Any, ...]:
    """What replay must not change: the queue's figures (rounds and fetch timing aside)."""
    (s,) = client.stats(q)
    extra = {
        k: v
        for k, v in s.extra.items()
        if k.endswith("_total") and k != "rounds_total" or k in ("delayed", "held", "unread")
    }
    return (s.available, s.leased, s.delivered_total, s.acked_total, s.dead_lettered_total, extra)


def test_replay_since_bookmark_time_and_filter_leaves_the_queue_alone(
    broker, coordinator_factory, names
) -> None:
    topic, q, dlq = names("rp"), names("rp"), names("rp-dlq")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "dead_letter_topic": dlq}])
    old = int(time.time() * 1000) - 3_600_000  # an hour ago
    _produce(broker.bootstrap_servers, topic, [{"i": i, "qty": i * 10} for i in range(5)], old)
    _produce(broker.bootstrap_servers, topic, [{"i": i, "qty": i * 10} for i in range(5, 10)])
    _produce(broker.bootstrap_servers, topic, [b"{not json"])  # dead-lettered on arrival
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 10, 30, message="10 queued")
        with client.subscribe(q, max_backlog=3) as sub:  # 3 acked, the queue otherwise kept
            for _ in range(3):
                msg = sub.next(timeout=10)
                assert msg is not None
                msg.ack(wait=True)
        # settled: the leases the closed subscription still held are returned *and* counted
        # (the engine returns them at once; the next round records and counts them)
        wait_until(
            lambda: (
                (s := client.stats(q)[0]).leased == 0
                and s.delivered_total == s.acked_total + s.extra["disconnect_returns_total"]
            ),
            30,
            message="leases returned and counted",
        )
        before = _state(client, q)

        everything = list(client.replay(q))
        assert [m.bookmark for m in everything] == [f"{topic}/0/{o}" for o in range(11)]
        assert [m.parse_error is None for m in everything] == [True] * 10 + [False]
        assert everything[10].value == b"{not json"
        assert all(m.deliveries == 0 for m in everything)

        after_bookmark = list(client.replay(q, since=f"{topic}/0/6"))  # after it
        assert [m.json()["i"] for m in after_bookmark[:3]] == [7, 8, 9]
        assert len(after_bookmark) == 4

        recent = list(client.replay(q, since=time.time() - 600))  # not the hour-old ones
        assert [m.bookmark for m in recent][0] == f"{topic}/0/5" and len(recent) == 6

        until = list(client.replay(q, until=time.time() - 600))
        assert [m.json()["i"] for m in until] == [0, 1, 2, 3, 4]

        big = list(client.replay(q, filter="/qty >= 70"))  # the unparseable never matches
        assert [m.json()["i"] for m in big] == [7, 8, 9]

        assert _state(client, q) == before  # no lease, ack, counter or dead letter changed

        with pytest.raises(InvalidRequest, match="not of its topics"):
            list(client.replay(q, since="other/0/1"))
        with pytest.raises(InvalidRequest):
            list(client.replay(q, filter="/qty >>> 1"))
        with pytest.raises(UnknownQueue):
            list(client.replay("no-such-queue"))

    r = qlayer("replay", q, "--since", f"{topic}/0/8", "--server", c.address)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["bookmark"] for d in lines] == [f"{topic}/0/9", f"{topic}/0/10"]
    assert json.loads(lines[0]["value"]) == {"i": 9, "qty": 90}
    assert lines[0]["parse_error"] is None and lines[1]["parse_error"].startswith("unparseable")
    r = qlayer("replay", q, "--since", "10m", "--filter", "/i = 5", "--server", c.address)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["bookmark"] for line in r.stdout.splitlines()] == [f"{topic}/0/5"]
    r = qlayer("replay", q, "--since", "yesterday-ish", "--server", c.address)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    assert "--since" in r.stderr


def test_replay_follows_new_records_and_stops_when_the_client_goes_away(
    broker, coordinator_factory, names
) -> None:
    topic, q = names("rpf"), names("rpf")
    c = coordinator_factory([{"name": q, "underlying_topic": topic}])
    _produce(broker.bootstrap_servers, topic, [{"i": 0}])

    async def follow() -> list[str]:
        got: list[str] = []
        async with AsyncQueueClient(c.address) as client:
            stream = client.replay(q, follow=True)
            async for m in stream:
                got.append(m.bookmark)
                if len(got) == 1:  # caught up: what is published now arrives too
                    await asyncio.to_thread(
                        _produce, broker.bootstrap_servers, topic, [{"i": 1}, {"i": 2}]
                    )
                if len(got) == 3:
                    break  # the client goes away mid-stream
            await stream.aclose()
        return got

    assert asyncio.run(asyncio.wait_for(follow(), 60)) == [f"{topic}/0/{o}" for o in range(3)]
    # the server closed that replay's consumer (its log line says so), and serves on
    wait_until(
        lambda: "replay ended: 3 read, 3 sent" in c.log_tail(200),
        30,
        message=lambda: f"the replay's end logged:\n{c.log_tail(20)}",
    )
    with QueueClient(c.address) as client:
        assert [m.bookmark for m in client.replay(q, since=f"{topic}/0/1")] == [f"{topic}/0/2"]
        assert client.stats(q)[0].delivered_total == 0


def test_replay_filters_on_the_kafka_record(broker, coordinator_factory, names) -> None:
    """A replay's filter reads the record's key and headers, also on a bytes queue."""
    topic, q = names("rph"), names("rph")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "message_type": "bytes"}])
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 2})
    p.produce(topic, b"a", key=b"k1", headers=[("region", b"emea")], partition=0)
    p.produce(topic, b"b", key=b"k2", headers=[("region", b"apac")], partition=0)
    p.produce(topic, b"c", key=b"k3", partition=0)
    assert p.flush(10) == 0
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 3, 30, message="3 queued")
        assert [m.value for m in client.replay(q, filter="HEADER('region') = 'emea'")] == [b"a"]
        assert [m.value for m in client.replay(q, filter="KEY() IN ('k2', 'k3')")] == [b"b", b"c"]
        with pytest.raises(InvalidRequest, match="field paths"):
            list(client.replay(q, filter="/qty > 1"))
