"""``qlayer dead-letters``: a queue's dead letters decoded (reason, detail, counts, original
bookmark, payload), filtered and limited, as a table and as JSON lines; redriven ones marked."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from layer.client import QueueClient
from tests.harness import qlayer
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def test_dead_letters_are_listed_decoded(broker, coordinator_factory, names) -> None:
    topic, q, dlq = names("dl"), names("dl"), names("dl-dlq")
    plain = names("plain")
    c = coordinator_factory(
        [
            {"name": q, "underlying_topic": topic, "dead_letter_topic": dlq, "max_cancels": 1},
            {"name": plain, "underlying_topic": names("plain-t")},
        ]
    )
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
    for i in range(4):
        p.produce(topic, json.dumps({"id": i, "sym": "AB"[i % 2]}).encode(), key=f"k{i}".encode())
    p.produce(topic, b"not json {")  # unparseable: dead-lettered on arrival, its letter says why
    assert p.flush(10) == 0
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 4, 30, message="4 available")
        with client.subscribe(q, max_backlog=5) as sub:
            for _ in range(4):
                msg = sub.next(timeout=10)
                assert msg is not None
                if msg.json()["id"] < 2:
                    msg.expire(wait=True)  # consumer_expire
                else:
                    msg.cancel(wait=True)  # max_cancels = 1: dead-lettered at once
        wait_until(lambda: len(client.dead_letters(q)) == 5, 30, message="5 dead letters listed")
        assert client.redrive(q, filter="/id = 0").moved == 1

    r = qlayer("dead-letters", q, "--json", "--server", c.address)
    assert r.returncode == 0, r.stderr
    letters = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(letters) == 5
    by_id = {}
    for d in letters:
        assert d["bookmark"].startswith(f"{dlq}/") and d["original"].startswith(f"{topic}/")
        assert d["dead_lettered_at_ms"] > 0
        if d["payload"] == "not json {":
            assert d["reason"] == "unparseable" and d["deliveries"] == 0
            assert d["detail"].startswith("unparseable json: ")  # why it did not parse
        else:
            assert d["deliveries"] >= 1
            by_id[json.loads(d["payload"])["id"]] = d
    assert {i: d["reason"] for i, d in by_id.items()} == {
        0: "consumer_expire", 1: "consumer_expire", 2: "max_cancels", 3: "max_cancels"
    }  # fmt: skip
    assert by_id[2]["cancels"] == 1 and by_id[2]["key"] == "k2"
    assert [i for i, d in by_id.items() if d["redriven"]] == [0]

    r = qlayer("dead-letters", q, "--filter", "/sym = 'B'", "--limit", "1", "--server", c.address)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:2] == ["LETTER", "REASON"] and len(lines) == 2
    assert '"id": 1' in lines[1] and "consumer_expire" in lines[1]

    # a queue without a dead-letter topic: one clear line, exit code not 0
    r = qlayer("dead-letters", plain, "--server", c.address)
    assert r.returncode != 0 and "dead_letter_topic" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
