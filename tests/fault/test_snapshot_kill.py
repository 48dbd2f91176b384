"""The coordinator SIGKILLed in the middle of a snapshot: the next one restores from the previous
snapshot plus the tail, with its state directory wiped, and agrees with the state before.

A dedicated broker (``proxied_broker.Tansu``) is paused (SIGSTOP) right after a change that
follows a confirmed snapshot; the next snapshot falls due by time (``snapshot_interval``) while
the broker is paused, so its transaction cannot commit; the coordinator logs it and is then
SIGKILLed. (Measured: nothing of that transaction reaches the broker, the producer waits on its
first transactional request.) What a kill after the records reached the log leaves, a snapshot
in an aborted transaction (visible on Tansu) that would undo every ack, is added by the test.
The restarted coordinator, its state directory wiped, must pass over both.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaPartition

from layer.client import QueueClient
from layer.codec import (
    CHANGELOG_SNAPSHOT,
    CONFIRM_OFFSET,
    SNAPSHOT_OFFSET,
    ChangelogKey,
    decode_key,
    encode,
    encode_key,
)
from layer.state import snapshot as snap
from layer.state.memory import MemoryStore
from layer.state.recovery import replay
from tests.fault.proxied_broker import Tansu
from tests.harness import CoordinatorProcess, write_config
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

MESSAGES = 600
ACKED = 250
SNAPSHOT = re.compile(r"snapshot queue=(\S+) id=([0-9a-f]+)")


def _changelog(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of the changelog, those of open or aborted transactions too."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_uncommitted",
        }
    )
    records: list[tuple[bytes | None, bytes | None]] = []
    try:
        c.assign([KafkaPartition(topic, 0, OFFSET_BEGINNING)])
        done = [False]

        def more() -> bool:
            for m in c.consume(1000, 0.5):
                if m.error() is not None:
                    done[0] |= m.error().code() == KafkaError._PARTITION_EOF
                    continue
                records.append((m.key(), m.value()))
            return done[0]

        wait_until(more, 60, message="the changelog was not read to its end")
    finally:
        c.close()
    return records


def _snapshots(log: str, queue: str) -> list[str]:
    return [sid for q, sid in SNAPSHOT.findall(log) if q == queue]


def test_sigkill_mid_snapshot_restores_from_the_previous_snapshot_and_the_tail(
    tmp_path: Path,
) -> None:
    broker = Tansu(tmp_path / "tansu.log")
    coord: CoordinatorProcess | None = None
    try:
        bootstrap = broker.bootstrap
        topic, queue, cid = "snap-in", "snapq", f"c-{uuid.uuid4().hex[:6]}"
        changelog = f"qlayer.changelog.{cid}.{queue}"
        cfg = write_config(
            tmp_path / "qlayer.toml",
            bootstrap,
            [{"name": queue, "underlying_topic": topic, "lease_period": "30s"}],
            coordinator={"id": cid, "snapshot_every": 0, "snapshot_interval": "2s"},
        )
        coord = CoordinatorProcess(cfg, tmp_path / "state", tmp_path / "coordinator.log")
        address = coord.start()
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for i in range(MESSAGES):
            producer.produce(topic, key=str(i).encode(), value=json.dumps({"i": i}).encode())
        assert producer.flush(30) == 0

        with QueueClient(address) as client:
            wait_until(lambda: client.stats(queue)[0].available == MESSAGES, 60, message="ingest")
            # acks in two sessions, out of order within each: runs, done records above the
            # low-water mark, returned leases
            for _session in range(2):
                with client.subscribe(queue, max_backlog=200) as sub:
                    got = [sub.next(timeout=30) for _ in range(ACKED // 2 + 20)]
                    assert all(m is not None for m in got)
                    keep = got[: ACKED // 2]
                    for m in keep[::2] + keep[1::2]:
                        assert m is not None
                        m.ack()
                    sub.flush(timeout=30)
            expected = MESSAGES - 2 * (ACKED // 2)
            wait_until(lambda: client.stats(queue)[0].available == expected, 30)
            before = sorted(m.bookmark for m in client.browse(queue, limit=MESSAGES))
            assert len(before) == expected

            # Right after a snapshot, one more change (committed): the next snapshot falls due
            # 2 s after that one, and the broker is paused well before.
            available = {m.bookmark: m.json()["i"] for m in client.browse(queue, limit=MESSAGES)}

            def ack_one() -> None:
                # acked where it lies, durable on return: no lease, no returned lease after
                bookmark = before.pop()
                assert client.ack_where(queue, f"/i = {available[bookmark]}").acked == 1

            def count() -> int:
                return len(_snapshots(coord.log_path.read_text(), queue))

            for _attempt in range(5):
                ack_one()  # a change: a snapshot falls due
                seen = count()
                wait_until(
                    lambda seen=seen: count() > seen, 30, message="no snapshot after a change"
                )
                n = count()
                ack_one()
                if count() == n:  # no snapshot since this change: the next one is pending
                    break
            else:
                raise AssertionError("a snapshot came right after every change")
            last = _snapshots(coord.log_path.read_text(), queue)[-1]

        broker.pause()
        try:
            wait_until(
                lambda: _snapshots(coord.log_path.read_text(), queue)[-1] != last,
                30,
                message="no snapshot taken while the broker was paused",
            )
            in_flight = _snapshots(coord.log_path.read_text(), queue)[-1]
            coord.kill()
        finally:
            broker.resume()

        # What a coordinator killed after its snapshot reached the log but before the commit
        # leaves (the kill above stopped it earlier: the paused broker never got the records):
        # a snapshot in an aborted transaction, here one that would bring every acked message
        # back. Tansu shows aborted records to read_committed readers; restore must not use it.
        lie = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"lie-{cid}"})
        lie.init_transactions(30)
        lie.begin_transaction()
        lie.produce(
            changelog,
            encode(
                CHANGELOG_SNAPSHOT,
                {
                    "id": "0" * 16,
                    "part": 0,
                    "parts": 1,
                    "low_water": 0,
                    "at_ms": 1,
                    "siblings": [{"queue": queue, "topic": topic, "partition": 0}],
                    "firsts": [],
                    "counts": [],
                    "values": [],
                },
            ),
            encode_key(ChangelogKey(queue, topic, 0, SNAPSHOT_OFFSET)),
        )
        assert lie.flush(30) == 0
        lie.abort_transaction(30)

        records = _changelog(bootstrap, changelog)
        confirms = {
            snap.decode_confirm(v)[0]
            for k, v in records
            if k is not None and v is not None and decode_key(k).offset == CONFIRM_OFFSET
        }
        assert in_flight not in confirms  # the kill came before its transaction committed
        landed = [
            k
            for k, v in records
            if k is not None
            and v is not None
            and decode_key(k).is_snapshot
            and snap.decode_part(v).id == in_flight
        ]
        print(f"in-flight snapshot records in the log: {len(landed)}")
        assert any(  # the aborted one is there for restore to pass over
            k is not None
            and v is not None
            and decode_key(k).is_snapshot
            and snap.decode_part(v).id == "0" * 16
            for k, v in records
        )
        # the state a restore from snapshot + tail rebuilds equals a full replay's
        from_snapshot, full = MemoryStore(), MemoryStore()
        applied = replay(from_snapshot, changelog, records, from_snapshot=True)
        replay(full, changelog, records, from_snapshot=False)
        assert applied < len(records)
        assert list(from_snapshot.entry_values(queue)) == list(full.entry_values(queue))
        assert from_snapshot.positions(queue) == full.positions(queue)

        # the restarted coordinator, its state directory wiped, serves the state before
        shutil.rmtree(coord.state_dir)
        address = coord.start()
        with QueueClient(address) as client:
            wait_until(
                lambda: client.stats(queue)[0].available == len(before),
                60,
                message="not every message available again",
            )
            after = sorted(m.bookmark for m in client.browse(queue, limit=MESSAGES))
        assert after == before
        log = coord.log_path.read_text()
        assert "changelog restore started at snapshots" in log.split("--- start 2 ---")[1]
    finally:
        if coord is not None:
            coord.kill()
        broker.stop()
