"""Unparseable messages on typed queues (issue 15): dead-lettered on arrival (the default,
reason ``unparseable``, the parse error as detail) or delivered with ``parse_error``; publish
through the API and the CLI refuses a payload that does not parse, naming the error."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from layer.client import QueueClient
from layer.exceptions import InvalidRequest
from tests.harness import qlayer
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for value in values:
        p.produce(topic, value)
    assert p.flush(10) == 0


def _take(sub: Any, n: int, timeout: float = 15) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"got {len(got)} of {n} messages"
        msg = sub.next(timeout=left)
        if msg is not None:
            got.append(msg)
    return got


def test_an_unparseable_message_is_dead_lettered_on_arrival_with_its_error(
    broker, coordinator_factory, names
) -> None:
    topic, q, dlq = names("up"), names("up"), names("up-dlq")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "dead_letter_topic": dlq}])
    _produce(broker.bootstrap_servers, topic, [b'{"id": 1}', b'{"id": 2, qty: }', b'{"id": 3}'])
    with QueueClient(c.address) as client:
        wait_until(
            lambda: client.stats(q)[0].dead_lettered_total == 1, 30, message="one dead letter"
        )
        (s,) = client.stats(q)
        assert s.available == 2 and s.extra["unparseable_total"] == 1
        assert s.extra["dead_lettered.unparseable_total"] == 1
        with client.subscribe(q, max_backlog=10) as sub:
            got = _take(sub, 2)
            assert [m.json()["id"] for m in got] == [1, 3]  # the bad one never reaches it
            assert all(m.parse_error is None for m in got)
            for m in got:
                m.ack()
            sub.flush(timeout=10)
            assert sub.next(timeout=0.5) is None
        wait_until(lambda: len(client.dead_letters(q)) == 1, 30, message="the letter listed")
        (letter,) = client.dead_letters(q)
    assert letter.reason == "unparseable" and letter.payload == b'{"id": 2, qty: }'
    assert letter.deliveries == 0 and letter.original == f"{topic}/0/1"
    assert letter.detail is not None and letter.detail.startswith("unparseable json: ")
    assert "column" in letter.detail  # where it stopped parsing


def test_the_backlog_read_at_start_judges_json_as_the_live_path(
    broker, topic_factory, coordinator_factory, names
) -> None:
    """Messages published while the coordinator was stopped are read in bulk at its restart
    (``Backlog``, for the partitions its state knows): a malformed one and one nested deeper
    than the standard parser goes (valid JSON to orjson) are dead-lettered on arrival there
    too, never delivered."""
    topic, q, dlq = topic_factory(partitions=1, prefix="upb"), names("upb"), names("upb-dlq")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "dead_letter_topic": dlq}])
    _produce(broker.bootstrap_servers, topic, [b'{"id": 0}'])
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 1, 30, message="the partition known")
    assert c.stop() == 0
    nested = b"[" * 1000 + b"]" * 1000
    _produce(broker.bootstrap_servers, topic, [b'{"id": 1}', b'{"id": 2, qty: }', nested])
    c.start()
    assert "backlog" in c.log_path.read_text(), "the restart read no backlog"
    with QueueClient(c.address) as client:
        wait_until(
            lambda: client.stats(q)[0].dead_lettered_total == 2, 30, message="two dead letters"
        )
        (s,) = client.stats(q)
        assert s.available == 2 and s.extra["unparseable_total"] == 2, s
        with client.subscribe(q, max_backlog=10) as sub:
            assert [m.json()["id"] for m in _take(sub, 2)] == [0, 1]
        wait_until(lambda: len(client.dead_letters(q)) == 2, 30, message="the letters listed")
        letters = {d.original: d for d in client.dead_letters(q)}
    assert set(letters) == {f"{topic}/0/2", f"{topic}/0/3"}
    assert all(d.reason == "unparseable" for d in letters.values())


def test_deliver_policy_hands_it_out_with_parse_error(broker, coordinator_factory, names) -> None:
    topic, q = names("upd"), names("upd")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "on_unparseable": "deliver"}])
    _produce(broker.bootstrap_servers, topic, [b'{"id": 1}', b"{not json"])
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 2, 30, message="both queued")
        browsed = client.browse(q)
        assert [b.parse_error is None for b in browsed] == [True, False]
        with client.subscribe(q, max_backlog=10) as sub:
            got = _take(sub, 2)
            assert got[0].parse_error is None
            assert got[1].data == b"{not json"
            assert got[1].parse_error.startswith("unparseable json: ")
            for m in got:
                m.ack()
            sub.flush(timeout=10)
        (s,) = client.stats(q)
        assert s.extra["unparseable_total"] == 1 and s.dead_lettered_total == 0
    # the CLI's consume shows it too
    _produce(broker.bootstrap_servers, topic, [b"[1, 2"])
    r = qlayer("consume", q, "--count", "1", "--timeout", "20", "--server", c.address)
    assert r.returncode == 0, r.stderr
    line = json.loads(r.stdout)
    assert line["data"] == "[1, 2" and line["parse_error"].startswith("unparseable json: ")


def test_publish_refuses_a_payload_that_does_not_parse(broker, coordinator_factory, names) -> None:
    topic, q = names("pub"), names("pub")
    raw = names("raw")
    c = coordinator_factory(
        [
            {"name": q, "underlying_topic": topic},
            {"name": raw, "underlying_topic": names("raw-t"), "message_type": "bytes"},
        ]
    )
    with QueueClient(c.address) as client:
        with pytest.raises(InvalidRequest) as refused:
            client.publish(q, b'{"id": 1, qty: }')
        text = str(refused.value)
        assert q in text and "json" in text and "column 11" in text
        client.publish(q, b'{"id": 2}')  # the queue still takes good ones
        client.publish(raw, b"{anything goes")  # bytes queues never parse
        wait_until(lambda: client.stats(q)[0].available == 1, 30, message="only the good one")
        assert client.stats(q)[0].extra["unparseable_total"] == 0

    r = qlayer("publish", q, '{"id": 1, qty: }', "--server", c.address)
    assert r.returncode != 0 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert q in line and "json" in line and "line 1 column 11" in line

    # a batch on stdin: the bad lines named by number, the good ones published
    r = qlayer("publish", q, "-", "--server", c.address, stdin='{"id": 3}\n{oops\n{"id": 4}\n[1,\n')
    assert r.returncode != 0
    assert len(r.stdout.splitlines()) == 2  # two bookmarks
    errors = r.stderr.strip().splitlines()
    assert [e.split(":")[1].strip() for e in errors[:2]] == ["line 2", "line 4"]
    assert "2 line(s) refused" in errors[-1]
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 3, 30, message="3 good ones")
