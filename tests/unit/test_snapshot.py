"""Changelog format 2 without a broker: run records, snapshots and their confirmations, and a
restore from the last usable snapshot plus the tail (``layer.state.recovery.replay``, the same
code a Kafka restore runs) agreeing with the store the rounds kept."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest

from layer.api.frames import Ack
from layer.codec import (
    CHANGELOG_VALUE,
    ChangelogKey,
    decode,
    decode_key,
    encode_change,
    encode_key,
    encode_run,
)
from layer.coordinator.round import Rounds, RoundSignal
from layer.coordinator.runtime import QueueRuntime
from layer.coordinator.snapshots import Snapshots
from layer.engine.model import AckOp, Bookmark, Done, DoneReason, Leased, LowWater, TopicPartition
from layer.exceptions import RecoveryError
from layer.state import snapshot as snap
from layer.state.base import KeyValueStore, StoreBatch
from layer.state.memory import MemoryStore
from layer.state.recovery import replay
from tests.unit.ports import (
    TOPIC,
    Clock,
    ListSink,
    MemoryChangelog,
    fetch,
    new_runtime,
    queue_config,
    subscriptions,
)

CL = "q-changelog"


def state(store: KeyValueStore, queue: str = "q") -> tuple[dict[Any, bytes], dict[Any, int]]:
    """What a restore must rebuild: the low-water marks and the entries at or above them."""
    lows = {
        tp: pos.low_water for tp, pos in store.positions(queue).items() if pos.low_water is not None
    }
    entries = {
        bm: value
        for bm, value in store.entry_values(queue)
        if bm.offset >= lows.get(TopicPartition(bm.topic, bm.partition), 0)
    }
    return entries, lows


# -- codec -----------------------------------------------------------------------------------


def test_runs_of_joins_consecutive_offsets_with_equal_values() -> None:
    entries = [(1, b"a"), (2, b"a"), (3, b"b"), (5, b"b"), (6, b"b"), (7, b"a")]
    assert snap.runs_of(entries) == [(1, 2, b"a"), (3, 1, b"b"), (5, 2, b"b"), (7, 1, b"a")]
    assert snap.runs_of([]) == []
    assert list(snap.expand(snap.runs_of(entries))) == entries


def test_a_run_key_round_trips_and_one_message_is_a_run_of_one() -> None:
    bm = Bookmark("t", 3, 1000)
    assert decode_key(encode_run("q", bm, 250)) == ChangelogKey("q", "t", 3, 1000, 250)
    key, _value = encode_change("q", Done(bm, DoneReason.ACKED, 1, 0, 5.0))
    assert key == encode_run("q", bm, 1) == encode_key(ChangelogKey("q", "t", 3, 1000))


def test_a_snapshot_of_the_store_round_trips_in_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snap, "PART_RUNS", 2)
    store = MemoryStore()
    batch = StoreBatch()
    tp = TopicPartition("t", 0)
    values = {}
    for offset in range(3, 12):
        change = (
            Done(Bookmark("t", 0, offset), DoneReason.ACKED, 1, 0, 5.0)
            if offset % 4
            else Leased(Bookmark("t", 0, offset), "s", 9.0, 1, 0)
        )
        values[offset] = encode_change("q", change, at_ms=7)[1]
        batch.put_entry_value("q", Bookmark("t", 0, offset), values[offset])
    batch.put_low_water("q", tp, 5)  # 3 and 4 are below it: not in the snapshot
    batch.put_entry_value("q~redrive", Bookmark("dlq", 0, 0), values[5])
    store.write(batch)

    records, parts_of, runs = snap.build_snapshot(store, CL, ["q", "q~redrive"], "s1", 99)
    assert parts_of == {("q", tp): 2, ("q~redrive", TopicPartition("dlq", 0)): 1}
    assert runs == 4  # t/0: 5-7 done, 8 leased, 9-11 done; dlq/0: 0
    decoded = [(decode_key(k), snap.decode_part(v)) for _t, k, v in records if v is not None]
    parts = [p for k, p in decoded if k.queue == "q"]
    assert [k.snapshot_part for k, _p in decoded if k.queue == "q"] == [0, 1]
    assert [p.part for p in parts] == [0, 1] and {p.parts for p in parts} == {2}
    assert parts[0].siblings == (("q", tp), ("q~redrive", TopicPartition("dlq", 0)))
    assert parts[1].siblings == ()
    assert {p.low_water for p in parts} == {5}
    expanded = dict(snap.expand(r for p in parts for r in p.runs))
    assert expanded == {o: v for o, v in values.items() if o >= 5}
    [(_t, key, value)] = snap.confirm_records(CL, "s1", {("q", tp): 3}, 100)
    assert decode_key(key).offset == -2 and snap.decode_confirm(value) == ("s1", 3)


# -- restore from records --------------------------------------------------------------------


def _records(*transactions: list[tuple[str, bytes, bytes | None]]) -> list[Any]:
    return [(key, value) for tx in transactions for _t, key, value in tx]


def _changes(*changes: Any) -> list[tuple[str, bytes, bytes | None]]:
    return [(CL, *encode_change("q", c, at_ms=1)) for c in changes]


def test_a_run_record_restores_each_of_its_messages_and_respects_the_low_water_mark() -> None:
    _k, value = encode_change("q", Done(Bookmark("t", 0, 0), DoneReason.ACKED, 1, 0, 1.0))
    assert value is not None
    records = [
        (encode_run("q", Bookmark("t", 0, 10), 20), value),
        *_records(_changes(LowWater(TopicPartition("t", 0), 25))),
    ]
    store = MemoryStore()
    assert replay(store, CL, records, from_snapshot=True) == 2
    entries, lows = state(store)
    assert lows == {TopicPartition("t", 0): 25}
    assert sorted(bm.offset for bm in entries) == list(range(25, 30))
    assert {decode(CHANGELOG_VALUE, v)["kind"] for v in entries.values()} == {"DONE"}


def test_a_format_1_changelog_still_restores() -> None:
    """Keys of format 1 (no count) as today's coordinators wrote them."""
    from layer.codec import default_codec

    codec = default_codec()

    def v1(offset: int) -> bytes:
        obj = {"queue": "q", "topic": "t", "partition": 0, "offset": offset}
        return codec.encode_version("changelog_key", 1, obj)

    leased = encode_change("q", Leased(Bookmark("t", 0, 4), "s", 9.0, 2, 1), at_ms=1)[1]
    position = encode_change("q", LowWater(TopicPartition("t", 0), 3), at_ms=1)[1]
    records = [(v1(1), leased), (v1(4), leased), (v1(-1), position), (v1(9), None)]
    store = MemoryStore()
    assert replay(store, CL, records, from_snapshot=True) == 4
    entries, lows = state(store)
    assert lows == {TopicPartition("t", 0): 3}
    assert entries == {Bookmark("t", 0, 4): leased}


def test_a_malformed_snapshot_is_a_recovery_error_not_skipped() -> None:
    key = encode_key(ChangelogKey("q", "t", 0, -3))
    confirm = encode_key(ChangelogKey("q", "t", 0, -2))
    with pytest.raises(RecoveryError, match="cannot be"):
        replay(MemoryStore(), CL, [(key, b"\x01garbage"), (confirm, b"\x01x")], from_snapshot=True)


# -- rounds write snapshots; a restore from snapshot + tail agrees with them -----------------


class Bench:
    def __init__(self, every: int, interval: float = 0.0) -> None:
        self.clock = Clock()
        self.store = MemoryStore()
        self.changelog = MemoryChangelog()
        self.signal = RoundSignal()
        self.q = queue_config()
        self.rt: QueueRuntime = new_runtime(self.q)
        self.runtimes = {self.q.name: self.rt}
        self.subs = subscriptions(self.runtimes, self.store, self.clock, self.signal)
        self.snapshots = Snapshots(self.store, every=every, interval=interval, clock=self.clock)
        self.next_offset = 0
        self.rounds = Rounds(
            self.runtimes,
            self.store,
            self.changelog,
            self.signal,
            clock=self.clock,
            before_dispatch=self.subs.apply_backlogs,
            readers=list,
            commit_interval=0.0,
            interrupt=threading.Event(),
            snapshots=self.snapshots,
        )

    def records(self, transactions: int | None = None) -> list[tuple[bytes, bytes | None]]:
        txs = self.changelog.transactions[:transactions]
        return [(key, value) for tx in txs for _t, key, value in tx.records]


async def _traffic(b: Bench, rng: random.Random, rounds: int) -> list[Any]:
    """Random traffic: fetches, leases, acks (some out of order), cancels. Returns the state
    of the store after each round."""
    sink = ListSink()
    handle = await b.subs.subscribe(b.q.name, 40, sink)  # type: ignore[arg-type]
    states = []
    for _ in range(rounds):
        n = rng.randrange(0, 30)
        fetch(b.rt, [b"{}"] * n, first=b.next_offset)
        b.next_offset += n
        held = [m.bookmark for m in sink.messages]
        sink.messages.clear()
        rng.shuffle(held)
        if held:
            cut = rng.randrange(len(held) + 1)
            acks, cancels = held[:cut], held[cut:][:3]
            if acks:  # as the wire carries them: runs of offsets per partition
                asyncio.ensure_future(handle.ack(AckOp.ACK, Ack.of(0, AckOp.ACK, acks).offsets))
            if cancels:
                asyncio.ensure_future(
                    handle.ack(AckOp.CANCEL, Ack.of(0, AckOp.CANCEL, cancels).offsets)
                )
            await asyncio.sleep(0)
        b.clock.now += 0.5
        await b.rounds.one()
        states.append((len(b.changelog.transactions), state(b.store)))
    return states


@pytest.mark.parametrize("seed", range(6))
def test_restore_from_snapshot_and_tail_agrees_with_the_store(seed: int) -> None:
    async def scenario() -> None:
        b = Bench(every=25)
        rng = random.Random(seed)
        states = await _traffic(b, rng, 60)
        assert b.snapshots.taken >= 3
        records = b.records()
        runs = [decode_key(k) for k, v in records if v is not None and decode_key(k).offset >= 0]
        assert any(k.length > 1 for k in runs)  # the rounds wrote runs

        fresh = MemoryStore()
        applied = replay(fresh, CL, records, from_snapshot=True)
        assert state(fresh) == states[-1][1]
        assert applied < len(records)  # not the whole history: from a snapshot

        full = MemoryStore()
        assert replay(full, CL, records, from_snapshot=False) == len(records)
        assert state(full) == states[-1][1]

        # Cut the changelog after every transaction, as a SIGKILL would (a snapshot whose
        # confirmation never came is then the last one): each cut restores to the state that
        # transaction committed.
        after = dict(states)  # transactions so far -> the store after the round
        for n in range(1, len(b.changelog.transactions) + 1):
            store = MemoryStore()
            replay(store, CL, b.records(n), from_snapshot=True)
            assert state(store) == after[n], n

    asyncio.run(scenario())


def test_a_snapshot_without_its_confirmation_is_never_used() -> None:
    """A snapshot committed (or aborted, on a broker that shows aborted records) but never
    confirmed: a restore passes over it, even when it is wrong."""

    async def scenario() -> None:
        b = Bench(every=10)
        states = await _traffic(b, random.Random(3), 20)
        records = b.records()
        # a last snapshot that lies: the partition empty, no low-water mark; never confirmed
        lie, _parts, _runs = snap.build_snapshot(MemoryStore(), CL, ["q"], "lie", 1)
        assert lie == []  # an empty store has nothing to snapshot: make one by hand
        from layer.codec import encode

        key = encode_key(ChangelogKey("q", TOPIC, 0, -3))
        value = encode(
            "changelog_snapshot",
            {
                "id": "lie",
                "part": 0,
                "parts": 1,
                "low_water": 0,
                "at_ms": 1,
                "siblings": [{"queue": "q", "topic": TOPIC, "partition": 0}],
                "firsts": [],
                "counts": [],
                "values": [],
            },
        )
        store = MemoryStore()
        replay(store, CL, [*records, (key, value)], from_snapshot=True)
        assert state(store) == states[-1][1]
        # confirmed, the same snapshot would be used (so the test above could fail)
        confirm = snap.confirm_records(CL, "lie", {("q", TopicPartition(TOPIC, 0)): 1}, 2)
        store = MemoryStore()
        replay(store, CL, [*records, (key, value), confirm[0][1:]], from_snapshot=True)
        assert state(store) != states[-1][1]

    asyncio.run(scenario())


def test_snapshots_are_due_by_count_and_by_time_and_confirmed_in_the_next_round() -> None:
    async def scenario() -> None:
        b = Bench(every=0, interval=5.0)
        await _traffic(b, random.Random(1), 9)  # 4.5 s: not yet
        assert b.snapshots.taken == 0
        await _traffic(b, random.Random(2), 2)
        assert b.snapshots.taken == 1
        before = len(b.changelog.transactions)
        await b.rounds.one()  # nothing else to say: it commits for the confirmation alone
        assert len(b.changelog.transactions) == before + 1
        marks = [
            decode_key(k)
            for tx in b.changelog.transactions
            for _t, k, _v in tx.records
            if decode_key(k).offset < -1 and decode_key(k).queue == "q"  # not its companions
        ]
        assert [k.offset for k in marks] == [-3, -2]  # the snapshot, then its confirmation
        tx_of = [
            i
            for i, tx in enumerate(b.changelog.transactions)
            for _t, k, _v in tx.records
            if decode_key(k).offset < -1 and decode_key(k).queue == "q"  # not its companions
        ]
        assert tx_of[1] == tx_of[0] + 1

    asyncio.run(scenario())


def test_a_queue_is_snapshotted_with_its_redrive_marks_and_route_positions() -> None:
    """Companion states live in the queue's changelog under other names: a restore that starts
    at the snapshot must not lose them."""
    store = MemoryStore()
    batch = StoreBatch()
    done = encode_change("q", Done(Bookmark("t", 0, 3), DoneReason.ACKED, 1, 0, 1.0))[1]
    assert done is not None
    batch.put_entry_value("q", Bookmark("t", 0, 3), done)
    batch.put_entry_value("q~redrive", Bookmark("dlq", 0, 7), done)
    batch.put_low_water("q~route", TopicPartition("q", 0), 42)
    store.write(batch)
    old = [(CL, *encode_change("q~route", LowWater(TopicPartition("q", 0), 42), at_ms=1))]
    snapshots = Snapshots(store, every=1, interval=0.0, clock=Clock())
    records: list[Any] = [
        (CL, *encode_change("q", Done(Bookmark("t", 0, 4), DoneReason.ACKED, 1, 0, 1.0)))
    ]
    snapshots.add("q", CL, records, 0, 5)
    snapshots.committed()
    confirms: list[Any] = []
    snapshots.add("q", CL, confirms, 0, 6)
    assert len(confirms) == 3  # q, q~redrive, q~route
    fresh = MemoryStore()
    log = _records(old, records, confirms)
    assert replay(fresh, CL, log, from_snapshot=True) < len(log)
    assert fresh.positions("q~route")[TopicPartition("q", 0)].low_water == 42
    assert [bm for bm, _v in fresh.entry_values("q~redrive")] == [Bookmark("dlq", 0, 7)]
    assert [bm.offset for bm, _v in fresh.entry_values("q")] == [3, 4]
