"""Unparseable messages dead-lettered on arrival while the coordinator is SIGKILLed, again and
again, shortly after they were published (between their admission and the commit of their done
record, some of the time), once with the state directory wiped. Nothing is lost and nothing is
doubled: every unparseable message has exactly one dead letter as the queue lists them (reason
``unparseable``, its parse error), none is ever queued, and every good one is queued once.

A letter is written in the changelog transaction of its done record. A transaction cut by the
kill is redone after the restart; Tansu shows the records of aborted transactions to
read_committed consumers (BROKER-NOTES), so the raw topic may hold a second copy there, which the
queue's dead-letter listing passes over by original bookmark. On Kafka the copy is invisible."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from layer.client import QueueClient
from layer.codec import decode
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

BURSTS = 6
PER_BURST = 60
BAD_EVERY = 6  # one message in six does not parse


def _publish(bootstrap: str, topic: str, burst: int) -> list[tuple[bool, bytes]]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    sent = []
    for i in range(PER_BURST):
        good = i % BAD_EVERY != 3
        value = json.dumps({"b": burst, "i": i}).encode() if good else b'{"b": %d, i: }' % burst
        producer.produce(topic, value)
        sent.append((good, value))
    assert producer.flush(10) == 0
    return sent


def test_sigkill_never_loses_nor_doubles_an_unparseable_dead_letter(
    broker: Any, coordinator_factory: Any, names: Any, consume_all: Any
) -> None:
    topic, q, dlq = names("upk"), names("upk"), names("upk-dlq")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "dead_letter_topic": dlq}])
    rng = random.Random(15)
    values: list[tuple[bool, bytes]] = []
    for burst in range(BURSTS):
        values.extend(_publish(broker.bootstrap_servers, topic, burst))
        good_so_far = sum(good for good, _ in values)
        if burst % 2:
            # after the burst is in: its done records committed (or being committed)
            with QueueClient(c.address or "", timeout=10) as client:
                wait_until(
                    lambda n=good_so_far: client.stats(q)[0].available == n,
                    30,
                    message=lambda b=burst: f"burst {b} admitted: {client.stats(q)[0]}",
                )
        else:
            # while it is being read, admitted and committed: a fault injected at a random time
            threading.Event().wait(rng.uniform(0.0, 0.3))
        if rng.random() < 0.7:
            c.kill()
        else:
            c.stop()
        if burst == BURSTS - 2:
            c.wipe_state()  # rebuilt from the changelog alone
        c.start()
    bad_values = [v for good, v in values if not good]
    good_count = len(values) - len(bad_values)
    bad_offsets = {f"{topic}/0/{o}" for o, (good, _) in enumerate(values) if not good}
    with QueueClient(c.address or "", timeout=10) as client:
        wait_until(
            lambda: (
                len(client.dead_letters(q)) == len(bad_values)
                and client.stats(q)[0].available == good_count
            ),
            60,
            message=lambda: (
                f"{len(client.dead_letters(q))} letters of {len(bad_values)}, {client.stats(q)[0]}"
            ),
        )
        letters = client.dead_letters(q)
        queued = client.browse(q)
    assert Counter(letter.original for letter in letters) == Counter(bad_offsets)
    assert {letter.reason for letter in letters} == {"unparseable"}
    assert all((letter.detail or "").startswith("unparseable json: ") for letter in letters)
    assert all(letter.deliveries == 0 for letter in letters)
    assert len(queued) == good_count and len({m.bookmark for m in queued}) == good_count
    assert not {m.bookmark for m in queued} & bad_offsets  # none queued, ever
    assert all(m.parse_error is None for m in queued)
    # the raw topic: at least one letter each (a kill-cut transaction's copy may show on Tansu)
    raw = Counter(decode("dead_letter", m.value())["bookmark"] for m in consume_all(dlq))
    assert set(raw) == bad_offsets
    print(
        f"\n{len(values)} messages, {len(bad_values)} unparseable, {BURSTS} kills/stops: "
        f"one dead letter each as listed; raw topic copies beyond one: "
        f"{sum(raw.values()) - len(raw)}"
    )
