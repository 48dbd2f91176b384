"""The coordinator SIGKILLed while messages flow to several consumer processes.

Checked from the consumers' own logs (every delivery, every confirmed ack) against what was
published:
- at-least-once: every message is acked; nothing is dead-lettered; a message whose ack was
  confirmed is never delivered again; a message's delivery count only grows across deliveries
  (the lease is durable before the message is handed out).
- at-most-once: no message is ever delivered twice.
- both again with the state directory wiped before a restart (rebuilt from the changelog alone).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.harness import CoordinatorProcess, start_worker, worker_events, write_config
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

MESSAGES = 10_000
WORKERS = 3
KILLS = 3


def _publish(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
    for i in range(n):
        producer.produce(topic, key=str(i).encode(), value=json.dumps({"i": i, "pad": "x" * 100}))
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(30) == 0


def _run(
    tmp_path: Path, bootstrap: str, semantics: str, wipe_on: set[int]
) -> tuple[list[dict], list[float], str]:
    topic = f"fault-{uuid.uuid4().hex[:8]}"
    dlq = f"{topic}.dlq"
    queue = f"q-{uuid.uuid4().hex[:8]}"
    cfg = write_config(
        tmp_path / "qlayer.toml",
        bootstrap,
        [
            {
                "name": queue,
                "underlying_topic": topic,
                "semantics": semantics,
                "lease_period": "20s",
                "max_per_subscription_backlog": 50,
                "dead_letter_topic": dlq,
            }
        ],
        coordinator={"id": f"c-{uuid.uuid4().hex[:8]}"},
    )
    coord = CoordinatorProcess(cfg, tmp_path / "state", tmp_path / "coordinator.log")
    addr_file = tmp_path / "addr"
    stop_file = tmp_path / "stop"
    addr_file.write_text(coord.start())
    _publish(bootstrap, topic, MESSAGES)

    workers = [
        start_worker(addr_file, queue, tmp_path / f"worker-{i}.jsonl", stop_file, f"w{i}")
        for i in range(WORKERS)
    ]
    kills: list[float] = []
    try:
        for k in range(KILLS):
            # let a slice of the work flow, then kill in the middle of it
            target = (k + 1) * MESSAGES // (KILLS + 2)
            wait_until(
                lambda target=target: (
                    sum(1 for e in worker_events(tmp_path) if e["ev"] == "got") >= target
                ),
                120,
                message=f"{target} deliveries before kill {k + 1}",
            )
            addr_file.write_text("")
            coord.kill()
            kills.append(time.time())
            if k in wipe_on:
                coord.wipe_state()
            addr_file.write_text(coord.start())

        def finished() -> bool:
            evs = worker_events(tmp_path)
            if semantics == "at-least-once":
                if len({e["b"] for e in evs if e["ev"] == "sent"}) < MESSAGES:
                    return False
                return _queue_empty(coord.address, queue)
            # at-most-once: what was handed out when a kill struck is gone by design; done when
            # the queue is empty and deliveries have stopped
            if not _queue_empty(coord.address, queue):
                return False
            gots = [e for e in evs if e["ev"] == "got"]
            return len(gots) > MESSAGES // 2 and time.time() - gots[-1]["t"] > 1.0

        wait_until(finished, 240, message="all messages processed after the kills")
    finally:
        stop_file.write_text("stop")
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
        coord.stop()

    dlq_count = _count_topic(bootstrap, dlq)
    return worker_events(tmp_path), kills, f"dead letters={dlq_count}"


def _queue_empty(address: str | None, queue: str) -> bool:
    from layer.client import QueueClient

    with QueueClient(address) as client:
        s = client.stats(queue)[0]
    return s.available == 0 and s.leased == 0 and s.inactive == 0


def _count_topic(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "count",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    n = 0
    idle_until = time.monotonic() + 2
    while time.monotonic() < idle_until:
        msgs = [m for m in c.consume(500, 0.2) if m.error() is None]
        if msgs:
            n += len(msgs)
            idle_until = time.monotonic() + 1
    c.close()
    return n


def _check_at_least_once(events: list[dict], dlq: str) -> None:
    acked_at: dict[str, float] = {}
    sent: set[str] = set()
    deliveries: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in events:
        if e["ev"] == "got":
            deliveries[e["b"]].append((e["t"], e["n"]))
        elif e["ev"] == "sent":
            sent.add(e["b"])
        elif e["ev"] == "acked":
            acked_at.setdefault(e["b"], e["t"])
    # every message was processed and acked by a consumer, and the queue is empty (checked
    # before the coordinator stopped): an ack the coordinator did not make durable would have
    # brought its message back
    assert len(deliveries) == MESSAGES, f"{MESSAGES - len(deliveries)} messages never delivered"
    assert len(sent) == MESSAGES, f"{MESSAGES - len(sent)} messages never acked"
    assert len(acked_at) >= MESSAGES - KILLS * WORKERS * 10, "too few confirmed acks"
    assert dlq == "dead letters=0", dlq
    # nothing whose ack was confirmed is delivered again afterwards
    redelivered_after_ack = [
        b for b, ds in deliveries.items() if b in acked_at and any(t > acked_at[b] for t, _ in ds)
    ]
    assert not redelivered_after_ack, (
        f"delivered after a confirmed ack: {redelivered_after_ack[:5]}"
    )
    # delivery counts survive restarts: each delivery of a message reports a higher count
    shrinking = [
        b
        for b, ds in deliveries.items()
        if any(n2 <= n1 for (_, n1), (_, n2) in zip(ds, ds[1:], strict=False))
    ]
    assert not shrinking, (
        f"delivery counts went backwards: {[(b, deliveries[b]) for b in shrinking[:3]]}"
    )


def _check_at_most_once(events: list[dict]) -> None:
    seen: dict[str, int] = defaultdict(int)
    for e in events:
        if e["ev"] == "got":
            seen[e["b"]] += 1
    twice = [b for b, n in seen.items() if n > 1]
    assert not twice, f"{len(twice)} messages delivered twice, e.g. {twice[:5]}"
    # a kill loses at most what was being handed out: the workers' backlogs and one round
    assert len(seen) >= MESSAGES - KILLS * WORKERS * 50, f"only {len(seen)} delivered"


@pytest.mark.parametrize("wipe", [False, True], ids=["state-kept", "state-wiped"])
def test_at_least_once_survives_sigkill(tmp_path: Path, broker, wipe: bool) -> None:
    events, kills, dlq = _run(
        tmp_path, broker.bootstrap_servers, "at-least-once", {1} if wipe else set()
    )
    assert len(kills) == KILLS
    _check_at_least_once(events, dlq)
    redelivered = sum(1 for e in events if e["ev"] == "got" and e["n"] > 1)
    print(
        f"at-least-once wipe={wipe}: {len(events)} events,"
        f" {redelivered} redeliveries, {KILLS} kills"
    )


@pytest.mark.parametrize("wipe", [False, True], ids=["state-kept", "state-wiped"])
def test_at_most_once_never_redelivers(tmp_path: Path, broker, wipe: bool) -> None:
    events, kills, _ = _run(
        tmp_path, broker.bootstrap_servers, "at-most-once", {1} if wipe else set()
    )
    assert len(kills) == KILLS
    _check_at_most_once(events)
