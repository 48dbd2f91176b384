"""A cluster rides out a Kafka outage (issue 12): the broker paused (SIGSTOP) for longer than
the group's session, while consumers that follow their queue's owner ack and a producer
publishes. Every member's session runs out in the broker meanwhile; when it wakes, the members
rejoin and between them serve every queue again; no member exits (none was fenced by a real
successor: a member fenced still exits, ``tests/fault/test_cluster_fencing.py``); every
published message is acked, and none whose ack was confirmed is leased again.

The cluster has a Tansu broker of its own (pausing it must not disturb other tests).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Message, Producer

from layer.client import QueueClient
from layer.coordinator.membership import partition_of
from tests.fault.proxied_broker import Tansu
from tests.fault.test_broker_outage import _read_topic
from tests.harness import CoordinatorProcess, start_cluster_members
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

LEASE = 4.0
SOAK = os.environ.get("QLAYER_SOAK") == "1"
# the session is 2 s on Tansu: every member is evicted meanwhile. Past 60 s (the changelog's
# transaction timeout) a round's writer may fail too (on Tansu the commit waited out 75 and
# 130 s pauses instead, measured): a member replaces it once no other member claimed its
# queues (tests/unit/test_outage.py). The 130 s pause runs in ``make soak`` only: where the
# writer is replaced, a read_committed restore of its changelog once got neither records nor
# the end of the partition for 30 s, as if Tansu had left the failed writer's transaction
# open for good (seen once, 2026-12-07; the cause is not proven: see README, Kafka outages)
PAUSES = [12.0, 130.0] if SOAK else [12.0]
RATE = 40  # messages published a second
BATCH = 10  # a consumer's backlog, and the acks it waits for at once


@dataclass
class Consumer:
    """Consumes one queue through any member (the client follows the owner), acking what it
    gets and waiting for the answers a batch at a time; records when each bookmark was leased
    (the coordinator's lease deadline less the lease period) and when its ack was confirmed."""

    target: str
    queue: str
    leased: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    confirmed: dict[str, float] = field(default_factory=dict)
    # acks a move left unconfirmed: done, or delivered again (then confirmed)
    uncertain: set[str] = field(default_factory=set)
    refused: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with (
            QueueClient(self.target, timeout=30) as client,
            client.subscribe(self.queue, max_backlog=BATCH) as sub,
        ):
            pending: list[str] = []
            while not self.stop.is_set():
                msg = sub.next(timeout=0.2)
                if msg is not None:
                    if msg.lease_deadline is not None:
                        self.leased[msg.bookmark].append(msg.lease_deadline - LEASE)
                    pending.append(msg.bookmark)
                    try:
                        msg.ack()
                    except Exception:  # the stream ended (a move): it comes again
                        self.uncertain.update(pending)
                        pending = []
                        continue
                if pending and (msg is None or len(pending) >= BATCH):
                    lost = False
                    while not self.stop.is_set():
                        try:
                            sub.flush(timeout=10)  # Kafka away: the answers wait for it
                            break
                        except TimeoutError:
                            continue
                        except Exception:  # LeaseLost: a move left some unconfirmed
                            lost = True
                            break
                    failed = {f.bookmark for f in sub.ack_failures}
                    sub.ack_failures.clear()
                    now = time.time()
                    for b in pending:
                        if lost:
                            self.uncertain.add(b)  # acked or not: which is not said
                        elif b in failed:
                            self.refused += 1  # refused: it comes again
                        else:
                            self.confirmed.setdefault(b, now)
                    pending = []


@dataclass
class Publisher:
    """Publishes numbered messages straight to Kafka, ~RATE a second, and keeps the keys of
    those whose delivery the broker confirmed."""

    bootstrap: str
    topic: str
    confirmed: set[bytes] = field(default_factory=set)
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})

        def delivered(err: object, msg: Message) -> None:
            if err is None:
                self.confirmed.add(msg.key() or b"")

        while not self.stop.is_set():
            key = str(self.sent).encode()
            producer.produce(self.topic, key=key, value=key, on_delivery=delivered)
            self.sent += 1
            producer.poll(1 / RATE)
        assert producer.flush(120) == 0, "published messages not delivered after the outage"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Tansu]:
    tansu = Tansu(tmp_path / "tansu.log")
    yield tansu
    tansu.stop()


@pytest.mark.parametrize("pause", PAUSES, ids=lambda p: f"{p:g}s")
def test_a_cluster_rides_out_a_broker_paused_past_its_session(
    tmp_path: Path, broker: Tansu, pause: float
) -> None:
    suffix = uuid.uuid4().hex[:8]
    cluster, topic = f"cluster-{suffix}", f"outage-{suffix}"
    queues: list[str] = []
    i = 0
    while len(queues) < 4:  # over distinct control partitions: likely on both members
        name = f"q{i}-{suffix}"
        if partition_of(name) not in {partition_of(q) for q in queues}:
            queues.append(name)
        i += 1
    tables = [{"name": q, "underlying_topic": topic, "lease_period": f"{LEASE:g}s"} for q in queues]
    members = start_cluster_members(tmp_path, broker.bootstrap, cluster, tables)
    target = ",".join(str(m.address) for m in members)
    publisher = Publisher(broker.bootstrap, topic)
    consumers = [Consumer(target, q) for q in queues]
    threads = [threading.Thread(target=c.run, daemon=True) for c in consumers]
    pub_thread = threading.Thread(target=publisher.run, daemon=True)
    try:
        with QueueClient(target, timeout=30) as client:

            def owners() -> dict[str, str | None]:
                return {q.queue: q.member for q in client.cluster().queues if q.queue in queues}

            wait_until(
                lambda: all(owners().values()) and len(owners()) == len(queues),
                timeout=60,
                message=lambda: f"queues not all owned: {client.cluster()}",
            )
            pub_thread.start()
            for t in threads:
                t.start()
            wait_until(
                lambda: all(len(c.confirmed) >= 50 for c in consumers),
                timeout=90,
                message="consumers acking before the outage",
            )
            before = owners()
            broker.pause()
            paused = time.monotonic()
            while time.monotonic() - paused < pause:
                for m in members:
                    assert m.running, f"a member exited in the outage:\n{m.log_tail()}"
                time.sleep(0.5)  # the pace of the check, not a wait for a condition
            broker.resume()
            healed = time.time()
            sent_at_heal = publisher.sent
            # every queue served again, by a member still running
            wait_until(
                lambda: all(owners().values()) and _serving(client, queues),
                timeout=120,
                message=lambda: "\n".join(f"--- {m.log_path}\n{m.log_tail(30)}" for m in members),
            )
            served = time.time() - healed
            after = owners()
            acking = wait_until(
                lambda: (
                    all(any(t > healed for t in c.confirmed.values()) for c in consumers)
                    and time.time()
                ),
                timeout=120,
                message="no confirmed ack after the outage on some queue",
            )
            wait_until(lambda: len(publisher.confirmed) >= sent_at_heal, 120)
            publisher.stop.set()
            pub_thread.join(150)
            expected = set(_read_topic(broker.bootstrap, topic))
            wait_until(
                lambda: all(expected <= set(c.confirmed) | c.uncertain for c in consumers),
                timeout=180,
                interval=0.5,
                message=lambda: (
                    "published never acked: "
                    + ", ".join(f"{c.queue}: {len(expected - set(c.confirmed))}" for c in consumers)
                ),
            )
            for m in members:
                assert m.running, f"a member exited:\n{m.log_tail()}"
    finally:
        publisher.stop.set()
        for c in consumers:
            c.stop.set()
        for t in threads:
            t.join(30)
        for m in members:
            m.stop()
    # nothing whose ack was confirmed leased again
    for c in consumers:
        again = [
            (b, c.leased[b], t) for b, t in c.confirmed.items() if any(x > t for x in c.leased[b])
        ]
        assert not again, f"{c.queue}: leased again after a confirmed ack: {again[:3]}"
    logs = [m.log_path.read_text() for m in members]
    print(
        f"\nbroker paused {pause:g} s: every queue served {served:.1f} s after the broker's"
        f" return, acked on every queue {acking - healed:.1f} s after;"
        f" owners before {before}, after {after};"
        f" {len(expected)} published, each acked on each of {len(queues)} queues;"
        f" fences: {sum(text.count('fencing the last owner') for text in logs)},"
        f" acks refused: {sum(c.refused for c in consumers)}, left unconfirmed by a move:"
        f" {sum(len(c.uncertain) for c in consumers)}; writers replaced:"
        f" {sum(text.count('changelog writer replaced and confirmed') for text in logs)}"
    )


def _serving(client: QueueClient, queues: list[str]) -> bool:
    try:
        for q in queues:
            client.stats(q)
    except Exception:
        return False
    return True


def test_a_member_back_after_its_successor_is_waited_for_not_fenced(
    tmp_path: Path, broker: Tansu
) -> None:
    # Both members' connections to Kafka stall past their sessions; the first gets through
    # again before the other, is given the other's control partitions and claims them. The
    # other, back later, releases them once the last changes of their queues are durable: the
    # successor waits for that release rather than fence it (one writer serves all a member's
    # queues: fenced, it would stop). Seen in a full run with the broker paused 130 s.
    suffix = uuid.uuid4().hex[:8]
    cluster, topic = f"cluster-{suffix}", f"late-{suffix}"
    queues = [f"q{i}-{suffix}" for i in range(4)]
    tables = [{"name": q, "underlying_topic": topic, "lease_period": f"{LEASE:g}s"} for q in queues]
    members = start_cluster_members(tmp_path, broker.bootstrap, cluster, tables)
    first, late = members
    assert late.proc is not None

    def said(member: CoordinatorProcess, text: str) -> int:
        return member.log_path.read_text(errors="replace").count(text)

    try:
        wait_until(  # the late one claimed control partitions of its own
            lambda: said(late, "cluster: serving control partitions") >= 1,
            timeout=60,
            message=lambda: f"the second member serves nothing:\n{late.log_tail()}",
        )
        broker.proxy.stall()
        wait_until(  # each saw its session lost, and Kafka away (an outage: not a stop)
            lambda: all(said(m, "] lost") and said(m, "Kafka is unreachable") for m in members),
            timeout=60,
            message=lambda: "\n".join(m.log_tail(20) for m in members),
        )
        assigned = said(first, "control partitions assigned")
        broker.proxy.hold([late.proc.pid])
        broker.proxy.heal()
        # the first one back is given the late one's partitions and claims them
        wait_until(
            lambda: (
                said(first, "control partitions assigned") > assigned
                and (said(first, "to release control partition") or said(first, "fencing the last"))
            ),
            timeout=60,
            message=lambda: f"the first member took nothing over:\n{first.log_tail(30)}",
        )
        broker.proxy.release()
        wait_until(
            lambda: said(late, "released (lost by this member)") >= 1 or not late.running,
            timeout=60,
            message=lambda: f"the late member released nothing:\n{late.log_tail(30)}",
        )
        with QueueClient(",".join(str(m.address) for m in members), timeout=30) as client:
            wait_until(
                lambda: _serving(client, queues) or not late.running,
                timeout=120,
                message=lambda: "\n".join(m.log_tail(30) for m in members),
            )
        for m in members:
            assert m.running, f"a member exited:\n{m.log_tail()}"
        assert said(first, "fencing the last owner") == 0, first.log_tail(40)
    finally:
        broker.proxy.release()
        for m in members:
            m.stop()
