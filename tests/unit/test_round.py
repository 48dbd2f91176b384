"""The round (``layer.coordinator.round``) over the in-memory store and changelog: what it
writes, commits and hands out, and what a failed commit leaves behind."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from layer.api.errors import ErrorCode
from layer.api.service import DeliverySink, OffsetRuns
from layer.codec import ChangeKind, decode, decode_key
from layer.config import QueueConfig
from layer.coordinator.counters import Counters
from layer.coordinator.deliveries import by_subscription
from layer.coordinator.health import Health
from layer.coordinator.records import DEAD_LETTER_PAYLOAD_MAX, dead_letter
from layer.coordinator.restore import Restore
from layer.coordinator.round import LATE_ROUND, ROOM_WAIT, Round, Rounds, RoundSignal
from layer.coordinator.runtime import QueueRuntime
from layer.coordinator.subscriptions import SubscriptionHandle
from layer.engine.model import AckOp, Bookmark, Delivery, Done, DoneReason, TopicPartition
from layer.exceptions import CommitUncertain, QLayerError, StateError
from layer.state.base import ENTRIES, StoreBatch, StoredMessage, _Each, _Many, _Range
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


class Bench:
    """One queue, its subscriptions and the rounds, wired as the coordinator wires them."""

    def __init__(
        self, store: MemoryStore | None = None, room_wait: float = ROOM_WAIT, **options: object
    ) -> None:
        self.clock = Clock()
        self.store = MemoryStore() if store is None else store
        self.changelog = MemoryChangelog()
        self.signal = RoundSignal()
        self.q = queue_config(**options)
        self.rt = new_runtime(self.q)
        self.runtimes: dict[str, QueueRuntime] = {self.q.name: self.rt}
        self.subs = subscriptions(self.runtimes, self.store, self.clock, self.signal)
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
            room_wait=room_wait,
        )

    async def subscribe(self, backlog: int = 10) -> tuple[SubscriptionHandle, ListSink]:
        sink = ListSink()
        handle = await self.subs.subscribe(self.q.name, backlog, _sink(sink))
        return handle, sink

    def entries(self) -> dict[Bookmark, ChangeKind]:
        return {bm: e.kind for bm, e in self.store.entries(self.q.name)}

    def restore(self) -> QueueRuntime:
        """A restart's engine, from this store alone (the changelog is what it holds)."""
        restore = Restore(
            self.store,
            source=None,  # type: ignore[arg-type]  # load reads the store only
            changelog=self.changelog,
            changelog_topic=lambda name: f"{name}-changelog",
            until_reachable=None,  # type: ignore[arg-type]
            clock=self.clock,
            progress=lambda line: None,
            health=Health(),
        )
        return restore.load(self.q)


def _sink(sink: ListSink) -> DeliverySink:
    return sink


def bookmarks(n: int) -> list[Bookmark]:
    return [Bookmark(TOPIC, 0, i) for i in range(n)]


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_a_round_leases_commits_once_and_hands_out_after_the_store_write() -> None:
    async def scenario() -> None:
        b = Bench()
        _, sink = await b.subscribe()
        fetch(b.rt, [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}'])
        await b.rounds.one()

        [tx] = b.changelog.transactions  # one transaction for the whole round
        kinds = [value["kind"] for key, value in tx.changes() if value and not key.is_position]
        assert kinds == ["LEASED"] * 3
        assert b.entries() == dict.fromkeys(bookmarks(3), ChangeKind.LEASED)
        assert b.store.changelog_offset("q-changelog", 0) == len(tx.records)
        assert [m.bookmark for m in sink.messages] == bookmarks(3)
        first = sink.messages[0]
        assert (first.key, first.value, first.headers) == (b"k0", b'{"n": 0}', [("h", b"v")])
        assert first.lease_deadline_ms == int((b.clock.now + b.q.lease_period) * 1000)
        assert first.deliveries == 1
        assert b.rt.counters.delivered == 3
        assert b.rounds.count == 1

    run(scenario())


def test_a_round_with_nothing_to_say_commits_nothing() -> None:
    async def scenario() -> None:
        b = Bench()
        await b.rounds.one()
        await b.rounds.one()
        assert b.changelog.transactions == []
        assert b.rounds.count == 2

    run(scenario())


def test_an_ack_is_answered_once_its_done_record_is_committed() -> None:
    async def scenario() -> None:
        b = Bench()
        handle, sink = await b.subscribe()
        fetch(b.rt, [b'{"n": 0}', b'{"n": 1}'])
        await b.rounds.one()
        second = Bookmark(TOPIC, 0, 1)  # above the low-water mark: its done record stays
        ack = asyncio.ensure_future(handle.ack(AckOp.ACK, [OffsetRuns("orders", 0, [1, 1])]))
        await asyncio.sleep(0)  # the ack is taken and waits on the next commit
        assert not ack.done()
        assert b.entries()[second] is ChangeKind.LEASED
        await b.rounds.one()
        assert await ack == []
        assert b.entries()[second] is ChangeKind.DONE
        assert b.store.get_messages("q", [second]) == [None]  # the local copy is deleted
        assert b.rt.counters.acked == 1

    run(scenario())


def test_the_counters_ride_in_the_transaction_of_the_acks_they_count() -> None:
    async def scenario() -> None:
        b = Bench()
        handle, _ = await b.subscribe()
        fetch(b.rt, [b'{"n": 0}', b'{"n": 1}'])
        await b.rounds.one()
        ack = asyncio.ensure_future(handle.ack(AckOp.ACK, [OffsetRuns("orders", 0, [0, 1])]))
        await asyncio.sleep(0)
        await b.rounds.one()
        assert await ack == []
        first, second = b.changelog.transactions  # one transaction per round, no more

        def counters(tx: Any) -> dict[str, int]:
            return {
                key.topic: value["low_water"]
                for key, value in tx.changes()
                if key.queue == "q~counters" and value is not None
            }

        assert counters(first) == {"ingested": 2, "delivered": 2}
        assert counters(second) == {"acked": 2}  # only what changed, with the acks
        assert Counters.load(b.store, "q").values() == b.rt.counters.values()

    run(scenario())


def test_an_expired_message_is_dead_lettered_with_its_done_record() -> None:
    async def scenario() -> None:
        b = Bench(dead_letter_topic="orders-dlq")
        handle, _ = await b.subscribe()
        fetch(b.rt, [b'{"n": 0}'])
        await b.rounds.one()
        ack = asyncio.ensure_future(handle.ack(AckOp.EXPIRE, [OffsetRuns("orders", 0, [0, 0])]))
        await asyncio.sleep(0)
        await b.rounds.one()
        assert await ack == []

        tx = b.changelog.transactions[-1]
        kinds = {v["kind"] for k, v in tx.changes() if v is not None and not k.is_position}
        assert "DONE" in kinds
        [(topic, key, envelope, headers)] = tx.extra  # in the same transaction
        assert (topic, key) == ("orders-dlq", b"orders/0/0")
        assert headers is not None and ("qlayer.reason", b"consumer_expire") in headers
        assert envelope is not None
        letter = decode("dead_letter", envelope)
        assert letter["reason"] == "consumer_expire"
        assert (letter["payload"], letter["key"], letter["deliveries"]) == (b'{"n": 0}', b"k0", 1)
        assert b.rt.counters.dead_lettered == 1

    run(scenario())


def test_an_unparseable_message_is_dead_lettered_on_arrival_with_its_done_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        b = Bench(dead_letter_topic="orders-dlq")
        _, sink = await b.subscribe()
        fetch(b.rt, [b'{"n": 0}', b'{"n": 1,', b"[", b'{"n": 3}'])
        await b.rounds.one()
        tx = b.changelog.transactions[-1]
        done = [k for k, v in tx.changes() if v is not None and v["kind"] == "DONE"]
        assert [k.offset for k in done] == [1, 2]
        letters = [decode("dead_letter", envelope or b"") for _, _, envelope, _ in tx.extra]
        assert [x["offset"] for x in letters] == [1, 2]  # in the same transaction
        assert {x["reason"] for x in letters} == {"unparseable"}
        assert all(x["detail"].startswith("unparseable json: ") for x in letters)
        assert [m.bookmark.offset for m in sink.messages] == [0, 3]  # never delivered
        assert b.rt.counters.unparseable == 2
        assert b.rt.counters.dead_lettered_by == {"unparseable": 2}
        assert b.store.get_messages("q", [Bookmark(TOPIC, 0, 1)]) == [None]  # local copy gone

    with caplog.at_level("WARNING", logger="layer.coordinator.runtime"):
        run(scenario())
    # logged, at most one line per 10 s per queue
    lines = [r.getMessage() for r in caplog.records if "unparseable" in r.getMessage()]
    assert len(lines) == 1 and "dead-lettered unparseable json message orders/0/1" in lines[0]


def test_a_failed_commit_leaves_the_store_as_the_changelog_says() -> None:
    async def scenario() -> None:
        b = Bench()
        handle, sink = await b.subscribe()
        fetch(b.rt, [b'{"n": 0}', b'{"n": 1}'])
        await b.rounds.one()
        before = b.entries()
        offset = b.store.changelog_offset("q-changelog", 0)
        delivered = len(sink.messages)

        b.changelog.fail = StateError("the broker went away")
        ack = asyncio.ensure_future(handle.ack(AckOp.ACK, [OffsetRuns("orders", 0, [0, 0])]))
        fetch(b.rt, [b'{"n": 2}'], first=2)  # leased in the failing round
        await asyncio.sleep(0)
        run_task = asyncio.ensure_future(b.rounds.run())
        with pytest.raises(StateError):
            await run_task
        assert isinstance(b.rounds.failed, StateError)
        with pytest.raises(CommitUncertain, match="while committing"):
            await ack  # its commit was under way: never answered as durable, nor as refused

        assert b.entries() == before  # no done record, no lease of the new message
        assert b.store.changelog_offset("q-changelog", 0) == offset
        assert len(sink.messages) == delivered  # nothing of the round handed out
        # what a restart sees: the acked message is still queued (its lease returned), the
        # newly read one too (its copy and read position were written at admission)
        engine = b.restore().engine
        assert sorted(engine.available()) == bookmarks(3)
        assert engine.counts(Bookmark(TOPIC, 0, 0)) == (1, 0)
        assert engine.counts(Bookmark(TOPIC, 0, 2)) == (0, 0)

    run(scenario())


def test_a_late_commit_starts_the_leases_it_hands_out_again() -> None:
    async def scenario() -> None:
        b = Bench(lease_period=30.0)
        _, sink = await b.subscribe()
        fetch(b.rt, [b'{"n": 0}'])

        def slow() -> None:
            b.clock.now += LATE_ROUND + 5

        b.changelog.during = slow
        start = b.clock.now
        await b.rounds.one()
        [message] = sink.messages
        assert message.lease_deadline_ms == int((start + LATE_ROUND + 5 + 30.0) * 1000)

    run(scenario())


def test_the_signal_answers_only_waiters_sealed_before_the_commit() -> None:
    async def scenario() -> None:
        signal = RoundSignal()
        early = signal.next_commit()
        signal.seal()
        late = signal.next_commit()
        signal.answer()
        assert early.done() and not late.done()
        signal.fail(QLayerError("failed"))
        assert isinstance(late.exception(), QLayerError)

    run(scenario())


def test_waiters_whose_commit_was_under_way_are_told_its_outcome_is_unknown() -> None:
    async def scenario() -> None:
        signal = RoundSignal()
        committing = signal.next_commit()
        signal.seal()
        waiting = signal.next_commit()
        signal.fail(QLayerError("failed; retry"), CommitUncertain("may be durable"))
        assert isinstance(committing.exception(), CommitUncertain)
        error = waiting.exception()  # never sent: surely not durable
        assert isinstance(error, QLayerError) and not isinstance(error, CommitUncertain)

    run(scenario())


@pytest.fixture
def stored() -> Iterator[StoredMessage]:
    yield StoredMessage(key=b"k", value=b"x" * (DEAD_LETTER_PAYLOAD_MAX + 10), headers=())


def test_a_dead_letter_too_big_for_the_producer_is_cut_and_says_so(
    stored: StoredMessage,
) -> None:
    done = Done(Bookmark(TOPIC, 0, 7), DoneReason.MAX_DELIVERIES, 3, 0, 1_700_000_000.0)
    topic, key, value, _ = dead_letter("q", "dlq", done, stored)
    assert value is not None
    letter = decode("dead_letter", value)
    assert (topic, key) == ("dlq", b"orders/0/7")
    assert len(letter["payload"]) == DEAD_LETTER_PAYLOAD_MAX
    assert "payload cut from 900010" in letter["detail"]
    assert letter["reason"] == "max_deliveries"


def test_a_delivery_without_a_stored_copy_is_never_handed_out() -> None:
    rt = new_runtime(queue_config())
    there = Bookmark(TOPIC, 0, 1)
    deliveries = [
        Delivery("s", Bookmark(TOPIC, 0, 0), 1, 0, None),
        Delivery("s", there, 1, 0, None),
    ]
    stored = StoredMessage(key=None, value=b"{}", headers=())
    [(sub, messages)] = by_subscription(rt.name, deliveries, [None, stored])
    assert sub == "s" and [m.bookmark for m in messages] == [there]


def test_a_removed_queues_last_changes_are_one_commit() -> None:
    async def scenario() -> None:
        b = Bench()
        handle, _ = await b.subscribe()
        fetch(b.rt, [b'{"n": 0}'])
        await b.rounds.one()
        b.subs.close(handle._state)  # its lease returns: a change no round will drain
        last = Round(b.store, b.changelog, b.clock)
        last.record(b.rt, b.rt.engine.drain())
        sending = last.send()
        assert sending is not None
        last.apply(await sending)
        assert b.entries() == {Bookmark(TOPIC, 0, 0): ChangeKind.RETURNED}
        assert len(b.changelog.transactions) == 2

    run(scenario())


def test_messages_the_low_water_mark_passes_get_one_tombstone_for_their_run() -> None:
    async def scenario() -> None:
        b = Bench()
        handle, _ = await b.subscribe(backlog=10)
        fetch(b.rt, [b'{"n": %d}' % n for n in range(10)])
        await b.rounds.one()
        ack = asyncio.ensure_future(handle.ack(AckOp.ACK, [OffsetRuns(TOPIC, 0, [0, 3, 5, 9])]))
        await asyncio.sleep(0)
        await b.rounds.one()
        assert await ack == []
        ack = asyncio.ensure_future(handle.ack(AckOp.ACK, [OffsetRuns(TOPIC, 0, [4, 4])]))
        await asyncio.sleep(0)
        await b.rounds.one()
        assert await ack == []
        # 0..3 are forgotten with the first acks, 4..9 once 4 is acked: a tombstone each run
        tombstones = [
            (decode_key(key).offset, decode_key(key).length)
            for tx in b.changelog.transactions
            for _topic, key, value in tx.records
            if value is None
        ]
        assert tombstones == [(0, 4), (4, 6)]
        assert b.entries() == {}
        # a restore applies a run's tombstone to every offset of it (positions left out here:
        # a low-water mark would drop the entries below it anyway)
        records = [
            (key, value)
            for tx in b.changelog.transactions
            for _topic, key, value in tx.records
            if decode_key(key).offset >= 0
        ]
        replayed = MemoryStore()
        replay(replayed, "q-changelog", records, from_snapshot=False)
        assert dict(replayed.entries("q")) == {}
        replayed = MemoryStore()
        replay(replayed, "q-changelog", records[:-1], from_snapshot=False)  # 4..9 not forgotten
        assert [bm.offset for bm, _ in replayed.entries("q")] == [4, 5, 6, 7, 8, 9]

    run(scenario())


def test_an_ack_after_a_replace_reaches_the_queue_that_still_holds_the_lease() -> None:
    """Two queues on one topic: after a replace from q to r, q holds the leases (draining);
    an ack of them, as offset runs, is refused by r (nobody holds them there) and accepted
    by q; what neither queue accepts comes back with r's answer."""

    async def scenario() -> None:
        b = Bench()
        r = new_runtime(QueueConfig(name="r", underlying_topic=TOPIC))
        b.runtimes["r"] = r
        handle, sink = await b.subscribe(backlog=2)
        fetch(b.rt, [b'{"n": 0}', b'{"n": 1}'])
        fetch(r, [b'{"n": 0}', b'{"n": 1}'])
        await b.rounds.one()
        assert [m.bookmark.offset for m in sink.messages] == [0, 1]
        await handle.replace("r", 0, None)  # backlog 0: r hands out nothing
        ack = asyncio.ensure_future(handle.ack(AckOp.ACK, [OffsetRuns(TOPIC, 0, [0, 2])]))
        await asyncio.sleep(0)
        await b.rounds.one()
        [failure] = await ack
        assert failure.bookmark == f"{TOPIC}/0/2"
        assert failure.error is ErrorCode.UNKNOWN_BOOKMARK
        assert b.rt.counters.acked == 2
        assert b.rt.engine.held_by(handle.id) == 0
        assert r.engine.stats(b.clock.now).available == 2  # r's copies were not touched

    run(scenario())


def test_a_failure_found_outside_a_round_fails_the_rounds_and_their_waiters() -> None:
    async def scenario() -> None:
        b = Bench()
        handle, sink = await b.subscribe()
        fetch(b.rt, [b'{"n": 0}'])
        run_task = asyncio.ensure_future(b.rounds.run())
        while not sink.messages:  # the loop runs rounds
            await asyncio.sleep(0.01)
        ack = asyncio.ensure_future(handle.ack(AckOp.ACK, [OffsetRuns("orders", 0, [0, 0])]))
        fenced = StateError("changelog writer fenced during a handover")
        b.rounds.fail(fenced)  # e.g. the handover's commit found the writer fenced
        with pytest.raises(StateError, match="handover"):
            await asyncio.wait_for(run_task, 5)
        assert b.rounds.failed is fenced
        with pytest.raises(QLayerError, match="retry"):
            await ack  # a failed coordinator answers nothing as durable
        assert b.entries()[Bookmark(TOPIC, 0, 0)] != ChangeKind.DONE

    run(scenario())


class _WriteLog(MemoryStore):
    """A memory store that keeps every batch it writes."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[StoreBatch] = []

    def write(self, batch: StoreBatch) -> None:
        self.batches.append(batch)
        super().write(batch)


def _entry_puts(batch: StoreBatch) -> list[bytes]:
    """The keys a batch puts into the entries."""
    keys: list[bytes] = []
    for cf, key, value in batch.ops:
        if cf != ENTRIES or value is None or isinstance(value, _Range):
            continue
        if isinstance(value, _Many):
            keys.extend(value.keys)
        elif isinstance(value, _Each):
            keys.extend(value.keys if value.value is not None else [])
        else:
            keys.append(key)
    return keys


def test_entries_a_tombstone_of_the_same_round_deletes_are_not_put_first() -> None:
    """Acks the low-water mark passes at once: their done entries would be put and deleted
    in one batch, so only the deletes are written; the store ends as it would have."""

    async def scenario() -> None:
        store = _WriteLog()
        b = Bench(store)
        handle, _ = await b.subscribe(backlog=10)
        fetch(b.rt, [b'{"n": %d}' % n for n in range(10)])
        await b.rounds.one()
        assert b.entries() == dict.fromkeys(bookmarks(10), ChangeKind.LEASED)
        ack = asyncio.ensure_future(handle.ack(AckOp.ACK, [OffsetRuns(TOPIC, 0, [0, 5, 8, 9])]))
        await asyncio.sleep(0)
        store.batches.clear()
        await b.rounds.one()
        assert await ack == []
        # 0..5 are forgotten in the round that acks them; 8 and 9 stay above the mark
        puts = [key for batch in store.batches for key in _entry_puts(batch)]
        assert len(puts) == 2
        assert b.entries() == {
            Bookmark(TOPIC, 0, 6): ChangeKind.LEASED,
            Bookmark(TOPIC, 0, 7): ChangeKind.LEASED,
            Bookmark(TOPIC, 0, 8): ChangeKind.DONE,
            Bookmark(TOPIC, 0, 9): ChangeKind.DONE,
        }
        # the changelog still says each of them: done records, then the run's tombstone
        [tx] = b.changelog.transactions[1:]
        done = [key.offset for key, value in tx.changes() if value and value["kind"] == "DONE"]
        assert done == [0, 1, 2, 3, 4, 5, 8, 9]

    run(scenario())


def test_leases_to_subscriptions_in_turn_each_carry_their_holder() -> None:
    """Two subscriptions take turns, so no two leases of a round form a run: each record is
    its own, its value (shared by the leases with the same fields) names its holder."""

    async def scenario() -> None:
        b = Bench()
        first, sink_a = await b.subscribe(backlog=3)
        second, sink_b = await b.subscribe(backlog=3)
        fetch(b.rt, [b'{"n": %d}' % n for n in range(6)])
        await b.rounds.one()
        [tx] = b.changelog.transactions
        holders = {
            key.offset: value["holder"]
            for key, value in tx.changes()
            if value and value["kind"] == "LEASED"
        }
        assert holders == {
            **{m.bookmark.offset: first.id for m in sink_a.messages},
            **{m.bookmark.offset: second.id for m in sink_b.messages},
        }
        assert len(set(holders.values())) == 2
        assert len(sink_a.messages) == len(sink_b.messages) == 3
        # the store mirrors the record of each message
        stored = dict(b.store.entry_values("q"))
        for _topic, key, value in tx.records:
            ck = decode_key(key)
            if ck.offset >= 0 and value is not None:
                for i in range(ck.length):
                    assert stored[Bookmark(TOPIC, 0, ck.offset + i)] == value

    run(scenario())


async def _turns(n: int = 50) -> None:
    """Let the event loop run ``n`` times round (no time passes for the rounds' bounds)."""
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_round_that_leaves_no_room_is_followed_once_its_deliveries_are_acked() -> None:
    """The next round waits for the acks that give the room back, not for the next wake: a
    slot freed by an ack is leased again in the first round after it. What is fetched
    meanwhile is admitted."""

    async def scenario() -> None:
        b = Bench(room_wait=60.0)
        handle, sink = await b.subscribe(backlog=2)
        fetch(b.rt, [b'{"n": %d}' % n for n in range(4)])
        run_task = asyncio.ensure_future(b.rounds.run())
        while b.rounds.count < 1:
            await asyncio.sleep(0)
        assert [m.bookmark.offset for m in sink.messages] == [0, 1]  # its backlog's worth

        fetch(b.rt, [b'{"n": 4}'], first=4)
        b.signal.wake()  # work, but none that room would let a round lease
        first = asyncio.ensure_future(handle.ack(AckOp.ACK, [OffsetRuns("orders", 0, [0, 0])]))
        await _turns()
        assert b.rounds.count == 1  # one slot back of the two the round leased: still waiting
        assert not first.done()
        assert not b.rt.inbox  # the fetch is admitted meanwhile
        assert Bookmark(TOPIC, 0, 4) in b.rt.engine.available()

        second = asyncio.ensure_future(handle.ack(AckOp.ACK, [OffsetRuns("orders", 0, [1, 1])]))
        await asyncio.wait_for(_count(b, 2), 5)
        assert await first == [] and await second == []  # their done records committed
        assert [m.bookmark.offset for m in sink.messages] == [0, 1, 2, 3]  # the room, leased
        b.rounds.stop()
        await asyncio.wait_for(run_task, 5)

    run(scenario())


def test_the_wait_for_room_ends_after_room_wait() -> None:
    async def scenario() -> None:
        b = Bench(room_wait=0.001)
        handle, sink = await b.subscribe(backlog=1)
        fetch(b.rt, [b'{"n": 0}', b'{"n": 1}'])
        run_task = asyncio.ensure_future(b.rounds.run())
        while b.rounds.count < 1:
            await asyncio.sleep(0)
        b.signal.wake()  # no ack comes: the next round runs once the wait is over
        await asyncio.wait_for(_count(b, 2), 5)
        assert len(sink.messages) == 1
        b.rounds.stop()
        await asyncio.wait_for(run_task, 5)

    run(scenario())


def test_a_round_that_leaves_room_is_followed_at_the_next_wake() -> None:
    async def scenario() -> None:
        b = Bench(room_wait=60.0)
        _, sink = await b.subscribe(backlog=3)
        fetch(b.rt, [b'{"n": 0}', b'{"n": 1}'])
        run_task = asyncio.ensure_future(b.rounds.run())
        while b.rounds.count < 1:
            await asyncio.sleep(0)
        fetch(b.rt, [b'{"n": 2}'], first=2)
        b.signal.wake()
        await asyncio.wait_for(_count(b, 2), 5)
        assert len(sink.messages) == 3
        b.rounds.stop()
        await asyncio.wait_for(run_task, 5)

    run(scenario())


async def _count(b: Bench, rounds: int) -> None:
    while b.rounds.count < rounds:
        await asyncio.sleep(0.001)


def test_the_wait_for_room_waits_for_the_rounds_own_deliveries() -> None:
    """Acks of an earlier round's deliveries that came during the commit are room the round
    did not lease: the next one waits for the acks of this round's deliveries on top of them,
    or two rounds would take turns, each with half the backlog."""

    async def scenario() -> None:
        b = Bench(room_wait=60.0)
        first, sink_a = await b.subscribe(backlog=1)
        second, sink_b = await b.subscribe(backlog=1)
        fetch(b.rt, [b'{"n": %d}' % n for n in range(5)])
        await b.rounds.one()  # one message to each: no room left
        [a0] = [m.bookmark.offset for m in sink_a.messages]
        [b0] = [m.bookmark.offset for m in sink_b.messages]
        acked = asyncio.ensure_future(first.ack(AckOp.ACK, [OffsetRuns("orders", 0, [a0, a0])]))
        await asyncio.sleep(0)

        def second_acks() -> None:  # its ack comes while the next round commits
            tp = TopicPartition(TOPIC, 0)
            b.rt.engine.ack_runs(second.id, tp, [b0, b0], AckOp.ACK, b.clock())
            b.changelog.during = None

        b.changelog.during = second_acks
        await b.rounds.one()  # leases the first one's slot only
        assert await acked == []
        assert len(sink_a.messages) == 2 and len(sink_b.messages) == 1
        run_task = asyncio.ensure_future(b.rounds.run())
        b.signal.wake()
        await _turns()
        assert b.rounds.count == 2  # the second's room is there, the first's is not back yet

        a1 = sink_a.messages[1].bookmark.offset
        await first.ack(AckOp.ACK, [OffsetRuns("orders", 0, [a1, a1])])
        assert b.rounds.count == 3
        assert (len(sink_a.messages), len(sink_b.messages)) == (3, 2)  # both slots leased
        b.rounds.stop()
        await asyncio.wait_for(run_task, 5)

    run(scenario())
