"""The changelog against a real broker: transactional writes, restore, fencing, dead letters."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from connectors.kafka import read_watermarks
from layer.codec import (
    CHANGELOG_VALUE,
    DEAD_LETTER,
    decode,
    decode_change,
    encode,
    encode_change,
)
from layer.engine.model import (
    Bookmark,
    Change,
    Done,
    DoneReason,
    Forget,
    Leased,
    LowWater,
    Returned,
    ReturnReason,
    TopicPartition,
)
from layer.exceptions import RecoveryError, StateError
from layer.state import (
    ChangelogWriter,
    EntryState,
    MemoryStore,
    RocksDBStore,
    StoreBatch,
    restore,
)
from layer.state.base import KeyValueStore

pytestmark = pytest.mark.integration

Records = list[tuple[str, bytes, bytes | None]]


@pytest.fixture
def writer_factory(kafka_settings: Mapping[str, Any]) -> Iterator[Callable[[str], ChangelogWriter]]:
    writers: list[ChangelogWriter] = []

    def make(transactional_id: str) -> ChangelogWriter:
        writers.append(ChangelogWriter(kafka_settings, transactional_id))
        return writers[-1]

    yield make
    for writer in writers:
        writer.close()


@pytest.fixture
def rocks(tmp_path: Path) -> Iterator[RocksDBStore]:
    store = RocksDBStore(tmp_path / "state")
    yield store
    store.close()


def random_changes(
    rng: random.Random, n: int, partitions: int = 3, low: dict[int, int] | None = None
) -> list[Change]:
    """Plausible changes: nothing below a partition's low-water mark but Forgets.

    ``low`` carries the low-water marks from one call to the next (for one queue).
    """
    low = low if low is not None else {}
    for p in range(partitions):
        low.setdefault(p, 0)
    changes: list[Change] = []
    for _ in range(n):
        p = rng.randrange(partitions)
        roll = rng.random()
        if roll < 0.05:
            low[p] += rng.randrange(1, 6)
            changes.append(LowWater(TopicPartition("under", p), low[p]))
            continue
        if roll < 0.12:
            changes.append(Forget(Bookmark("under", p, rng.randrange(0, low[p] + 1))))
            continue
        bm = Bookmark("under", p, low[p] + rng.randrange(0, 40))
        d, c = rng.randrange(1, 5), rng.randrange(0, 3)
        if roll < 0.5:
            changes.append(Leased(bm, f"sub-{rng.randrange(3)}", 100.0 + rng.random(), d, c))
        elif roll < 0.75:
            changes.append(Returned(bm, rng.choice(list(ReturnReason)), d, c))
        else:
            changes.append(Done(bm, rng.choice(list(DoneReason)), d, c, 50.0))
    return changes


def to_records(topic: str, queue: str, changes: Sequence[Change]) -> Records:
    return [(topic, *encode_change(queue, change, at_ms=i)) for i, change in enumerate(changes)]


class Expected:
    """The changelog reduced the obvious way: last value wins per key, low water drops below."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[Bookmark, EntryState]] = {}
        self.low: dict[str, dict[TopicPartition, int]] = {}

    def apply(self, records: Records) -> None:
        for _topic, key, value in records:
            ck, cv = decode_change(key, value)
            entries = self.entries.setdefault(ck.queue, {})
            if ck.is_position:
                assert cv is not None
                lw = self.low.setdefault(ck.queue, {})[ck.topic_partition] = cv["low_water"]
                for bm in [bm for bm in entries if bm[:2] == ck.topic_partition and bm.offset < lw]:
                    del entries[bm]
            elif cv is None:
                entries.pop(ck.bookmark, None)
            else:
                entries[ck.bookmark] = EntryState.from_value(cv)

    def check(self, store: KeyValueStore) -> None:
        for queue, entries in self.entries.items():
            assert dict(store.entries(queue)) == entries, queue
            low = {tp: pos.low_water for tp, pos in store.positions(queue).items()}
            assert low == self.low.get(queue, {}), queue


class History:
    """Random changes of queue ``q`` committed to a changelog (``commit``), and what a restore
    of them must give (``expected``)."""

    def __init__(self, writer: ChangelogWriter, topic: str, seed: int, partitions: int) -> None:
        self.writer, self.topic, self.partitions = writer, topic, partitions
        self.rng = random.Random(seed)
        self.low: dict[int, int] = {}
        self.expected = Expected()

    def changes(self, n: int) -> Records:
        """``n`` more changes, as records (not committed)."""
        changes = random_changes(self.rng, n, partitions=self.partitions, low=self.low)
        return to_records(self.topic, "q", changes)

    def commit(self, n: int) -> dict[tuple[str, int], int]:
        """``n`` more changes, committed in one transaction: its last offset per partition."""
        records = self.changes(n)
        written = self.writer.commit(records)
        self.expected.apply(records)
        return written


def test_restore_rebuilds_what_the_writer_committed(
    writer_factory: Callable[[str], ChangelogWriter],
    topic_factory: Callable[..., str],
    kafka_settings: dict[str, Any],
    rocks: RocksDBStore,
) -> None:
    topic = topic_factory(partitions=3, config={"cleanup.policy": "compact"})
    writer = writer_factory(f"tx-{topic}")
    rng = random.Random(7)
    expected = Expected()
    last: dict[tuple[str, int], int] = {}
    lows: dict[str, dict[int, int]] = {"orders": {}, "orders-2": {}}
    for queue in ("orders", "orders-2", "orders"):
        records = to_records(topic, queue, random_changes(rng, 700, low=lows[queue]))
        offsets = writer.commit(records)
        assert set(offsets) <= {(topic, p) for p in range(3)}
        last.update(offsets)
        expected.apply(records)

    calls: list[tuple[int, int]] = []
    result = restore(rocks, kafka_settings, topic, "orders", lambda d, t: calls.append((d, t)))

    assert result.records_applied == 2100
    expected.check(rocks)
    assert rocks.queues() == {"orders", "orders-2"}
    for (t, p), offset in last.items():
        assert rocks.changelog_offset(t, p) == offset + 1
    assert calls and calls[-1] == (2100, 2100)
    assert all(done <= total for done, total in calls)


def test_restore_twice_is_idempotent_and_resumes_from_the_stored_offset(
    writer_factory: Callable[[str], ChangelogWriter],
    topic_factory: Callable[..., str],
    kafka_settings: dict[str, Any],
    rocks: RocksDBStore,
) -> None:
    topic = topic_factory(partitions=2)
    writer = writer_factory(f"tx-{topic}")
    history = History(writer, topic, seed=11, partitions=2)
    expected = history.expected
    history.commit(500)

    assert restore(rocks, kafka_settings, topic, "q").records_applied == 500
    expected.check(rocks)
    assert restore(rocks, kafka_settings, topic, "q").records_applied == 0
    expected.check(rocks)

    more = history.changes(37)
    writer.commit(more[:20])
    writer.commit(more[20:])
    expected.apply(more)
    assert restore(rocks, kafka_settings, topic, "q").records_applied == 37
    expected.check(rocks)

    # A fresh store starts from the beginning and reaches the same state.
    fresh = MemoryStore()
    assert restore(fresh, kafka_settings, topic, "q").records_applied == 537
    expected.check(fresh)


def test_a_restore_reads_nothing_when_listoffsets_says_the_changelog_did_not_move(
    writer_factory: Callable[[str], ChangelogWriter],
    topic_factory: Callable[..., str],
    kafka_settings: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A queue that never had a message has an empty changelog, and a stored offset may be its
    end: the restore asks ListOffsets and does not read (a fetch wait, 0.1-0.3 s on Tansu, of
    every start). Short of the end by one offset (the commit marker) it reads, as it must."""
    caplog.set_level(logging.INFO, logger="layer.state.recovery")
    topic = topic_factory(partitions=2)
    store = MemoryStore()
    assert restore(store, kafka_settings, topic, "q").records_applied == 0
    assert "changelog restore: nothing to read" in caplog.text
    assert store.changelog_offsets() == {}

    history = History(writer_factory(f"tx-{topic}"), topic, seed=3, partitions=2)
    expected = history.expected
    written = history.commit(60)
    caplog.clear()
    assert restore(store, kafka_settings, topic, "q").records_applied == 60
    assert "nothing to read" not in caplog.text
    expected.check(store)
    ends = read_watermarks(
        kafka_settings, [(topic, 0), (topic, 1)], isolation_level="read_committed"
    )
    for (t, p), last in written.items():
        assert store.changelog_offset(t, p) == last + 1 == ends[(t, p)].high - 1  # the marker

    # at the end of each partition that has records (the others are empty): nothing to read
    batch = StoreBatch()
    for t, p in written:
        batch.set_changelog_offset(t, p, ends[(t, p)].high)
    store.write(batch)
    caplog.clear()
    assert restore(store, kafka_settings, topic, "q").records_applied == 0
    assert "changelog restore: nothing to read" in caplog.text

    # and what is committed after that end is read
    history.commit(25)
    assert restore(store, kafka_settings, topic, "q").records_applied == 25
    expected.check(store)


def test_a_restore_reads_what_was_committed_before_a_transaction_still_open(
    writer_factory: Callable[[str], ChangelogWriter],
    topic_factory: Callable[..., str],
    producer_factory: Callable[..., Producer],
    kafka_settings: dict[str, Any],
) -> None:
    """A changelog's owner commits all the time, so a restore (a standby's copy, a takeover)
    often meets a transaction still open at the end. What was committed before it is read all
    the same, into an empty store and from a stored offset: on Tansu, ListOffsets under
    read_committed answers 0 while a transaction is open, which once made the restore take a
    changelog of committed records for an empty one."""
    topic = topic_factory(partitions=1)
    history = History(writer_factory(f"tx-{topic}"), topic, seed=5, partitions=1)
    expected = history.expected
    history.commit(30)
    stored = MemoryStore()
    assert restore(stored, kafka_settings, topic, "q").records_applied == 30
    history.commit(12)
    open_tx = producer_factory(transactional_id=f"open-{topic}")
    open_tx.init_transactions(10)
    open_tx.begin_transaction()
    open_tx.produce(topic, b"never committed", key=b"k")
    assert open_tx.flush(10) == 0
    try:
        empty = MemoryStore()
        assert restore(empty, kafka_settings, topic, "q").records_applied == 42
        expected.check(empty)
        assert restore(stored, kafka_settings, topic, "q").records_applied == 12
        expected.check(stored)
    finally:
        open_tx.abort_transaction(10)


def test_records_of_aborted_transactions_are_never_applied(
    writer_factory: Callable[[str], ChangelogWriter],
    topic_factory: Callable[..., str],
    kafka_settings: dict[str, Any],
    consume_all: Callable[..., list[Any]],
    rocks: RocksDBStore,
    broker: Any,
    request: pytest.FixtureRequest,
) -> None:
    if not broker.profile.read_committed_hides_aborted:
        request.applymarker(
            pytest.mark.xfail(
                strict=True,
                reason="this broker's fetch responses list no aborted transactions, so"
                " read_committed consumers receive aborted records (BrokerProfile)",
            )
        )
    topic, dlq = topic_factory(partitions=2), topic_factory(partitions=1)
    bm = Bookmark("under", 0, 1)
    committed = to_records(topic, "q", [Leased(bm, "sub-1", 10.0, 1, 0)])
    writer = writer_factory(f"tx-{topic}")
    writer.commit(committed)

    # An aborted transaction of another producer, with records flushed to both partitions.
    raw = Producer({**kafka_settings, "transactional.id": f"raw-{topic}"})
    raw.init_transactions(30)
    raw.begin_transaction()
    aborted = [
        Done(bm, DoneReason.ACKED, 1, 0, 11.0),
        Leased(Bookmark("under", 1, 9), "x", 1.0, 1, 0),
    ]
    for topic_, key, value in to_records(topic, "q", aborted):
        raw.produce(topic_, value, key, partition=0)
        raw.produce(topic_, value, key, partition=1)
    raw.flush(30)
    raw.abort_transaction(30)
    raw.close()

    # A writer transaction that fails after its records were sent (an oversized dead letter is
    # refused last) is aborted: neither its changelog records nor its dead letters appear.
    small = ChangelogWriter({**kafka_settings, "message.max.bytes": 10_000}, f"tx2-{topic}")
    try:
        first = to_records(topic, "q", [Forget(bm)])
        with pytest.raises(StateError):
            small.commit(
                first,
                extra=[(dlq, b"lost", b"letter", None), (dlq, None, b"x" * 50_000, None)],
            )
        # The writer is still usable after an abort.
        later = to_records(topic, "q", [Returned(bm, ReturnReason.CANCEL, 1, 1)])
        small.commit(later, extra=[(dlq, b"kept", b"letter", None)])
    finally:
        small.close()

    assert [m.key() for m in consume_all(dlq)] == [b"kept"]
    result = restore(rocks, kafka_settings, topic, "q")
    expected = Expected()
    expected.apply(committed + later)
    expected.check(rocks)
    assert result.records_applied == 2


def test_a_failed_bulk_record_fails_the_commit_without_a_report_of_its_own(
    topic_factory: Callable[..., str],
    kafka_settings: dict[str, Any],
    consume_all: Callable[..., list[Any]],
) -> None:
    topic, side = topic_factory(partitions=1), topic_factory(partitions=1)
    writer = ChangelogWriter({**kafka_settings, "message.max.bytes": 10_000}, f"tx-{topic}")
    try:
        records = to_records(topic, "q", [Forget(Bookmark("under", 0, 1))])
        with pytest.raises(StateError):
            writer.commit(
                records, bulk=[(side, b"ok", b"v", None), (side, None, b"x" * 50_000, None)]
            )
        writer.commit(records, bulk=[(side, b"kept", b"v", None)])
    finally:
        writer.close()
    assert [m.key() for m in consume_all(side)] == [b"kept"]


def test_a_new_writer_with_the_same_id_fences_the_old_one(
    writer_factory: Callable[[str], ChangelogWriter],
    topic_factory: Callable[..., str],
    kafka_settings: dict[str, Any],
    rocks: RocksDBStore,
) -> None:
    topic = topic_factory(partitions=1)
    tx_id = f"tx-{topic}"
    old = writer_factory(tx_id)
    first = to_records(topic, "q", [Leased(Bookmark("under", 0, 0), "old", 1.0, 1, 0)])
    old.commit(first)

    new = writer_factory(tx_id)
    zombie = to_records(topic, "q", [Done(Bookmark("under", 0, 0), DoneReason.ACKED, 1, 0, 2.0)])
    with pytest.raises(StateError, match="fenced|fatal"):
        old.commit(zombie)
    with pytest.raises(StateError, match="unusable"):
        old.commit(zombie)

    second = to_records(topic, "q", [Returned(Bookmark("under", 0, 0), ReturnReason.TIMEOUT, 1, 0)])
    new.commit(second)
    assert restore(rocks, kafka_settings, topic, "q").records_applied == 2
    expected = Expected()
    expected.apply(first + second)
    expected.check(rocks)


def test_dead_letters_land_atomically_with_their_done_records(
    writer_factory: Callable[[str], ChangelogWriter],
    topic_factory: Callable[..., str],
    kafka_settings: dict[str, Any],
    consume_all: Callable[..., list[Any]],
    rocks: RocksDBStore,
) -> None:
    changelog, dlq = topic_factory(partitions=2), topic_factory(partitions=1)
    writer = writer_factory(f"tx-{changelog}")
    bm = Bookmark("under", 0, 4)
    done = Done(bm, DoneReason.MAX_DELIVERIES, 5, 0, 20.0)
    envelope = encode(
        DEAD_LETTER,
        {
            "queue": "q",
            "topic": bm.topic,
            "partition": bm.partition,
            "offset": bm.offset,
            "bookmark": str(bm),
            "key": b"key",
            "headers": [{"key": "h", "value": b"1"}],
            "payload": b"payload",
            "reason": done.reason.value,
            "detail": None,
            "deliveries": 5,
            "cancels": 0,
            "message_timestamp_ms": 1,
            "dead_lettered_at_ms": 20_000,
        },
    )
    headers = [("h", b"1"), ("qlayer.reason", b"max_deliveries")]
    writer.commit(to_records(changelog, "q", [done]), extra=[(dlq, b"key", envelope, headers)])

    letters = consume_all(dlq)
    assert [m.key() for m in letters] == [b"key"]
    assert letters[0].headers() == headers
    assert decode(DEAD_LETTER, letters[0].value())["bookmark"] == "under/0/4"

    assert restore(rocks, kafka_settings, changelog, "q").records_applied == 1
    ((got_bm, state),) = list(rocks.entries("q"))
    assert got_bm == bm and state.reason == "max_deliveries" and state.deliveries == 5


def test_a_stored_offset_beyond_the_log_is_a_recovery_error(
    writer_factory: Callable[[str], ChangelogWriter],
    topic_factory: Callable[..., str],
    kafka_settings: dict[str, Any],
) -> None:
    topic = topic_factory(partitions=1)
    writer_factory(f"tx-{topic}").commit(
        to_records(topic, "q", [Leased(Bookmark("under", 0, 0), "s", 1.0, 1, 0)])
    )
    store = MemoryStore()
    batch = StoreBatch()
    batch.set_changelog_offset(topic, 0, 1000)
    store.write(batch)
    with pytest.raises(RecoveryError, match=topic):
        restore(store, kafka_settings, topic, "q", idle_timeout=10)


def test_commit_returns_nothing_for_an_empty_batch(
    writer_factory: Callable[[str], ChangelogWriter], topic_factory: Callable[..., str]
) -> None:
    assert writer_factory(f"tx-{topic_factory()}").commit([]) == {}


def test_changelog_values_decode_as_entry_states(topic_factory: Callable[..., str]) -> None:
    # The writer's records are exactly what the store keeps: a sanity check of the shared format.
    ((_t, _key, value),) = to_records("t", "q", [Leased(Bookmark("u", 0, 0), "s", 1.5, 2, 1)])
    assert value is not None
    state = EntryState.from_value(decode(CHANGELOG_VALUE, value))
    assert (state.holder, state.lease_deadline_ms, state.deliveries) == ("s", 1500, 2)


def _live_state(store: KeyValueStore, queue: str) -> tuple[dict[Any, bytes], dict[Any, int]]:
    lows = {
        tp: pos.low_water for tp, pos in store.positions(queue).items() if pos.low_water is not None
    }
    entries = {
        bm: value
        for bm, value in store.entry_values(queue)
        if bm.offset >= lows.get(TopicPartition(bm.topic, bm.partition), 0)
    }
    return entries, lows


def test_restore_starts_at_the_last_confirmed_snapshot_and_agrees_with_the_whole_history(
    writer_factory: Callable[[str], ChangelogWriter],
    topic_factory: Callable[..., str],
    kafka_settings: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A changelog of format-1 records, then format-2 runs and snapshots (each confirmed in the
    next transaction), ending with a snapshot never confirmed: a fresh store restores from the
    last confirmed snapshot and the tail (found searching backwards, in several steps) to the
    state a store that applied every record has."""
    from layer.codec import default_codec, encode_run
    from layer.state import recovery
    from layer.state.snapshot import build_snapshot, confirm_records

    monkeypatch.setattr(recovery, "SEARCH_CHUNK", 64)  # several steps back
    topic = topic_factory(partitions=1, config={"cleanup.policy": "compact"})
    writer = writer_factory(f"tx-{topic}")
    live = MemoryStore()  # every record applied, as a coordinator's store
    rng = random.Random(5)
    low: dict[int, int] = {}
    codec = default_codec()

    def v1(record: tuple[str, bytes, bytes | None]) -> tuple[str, bytes, bytes | None]:
        ck = recovery.decode_key(record[1])
        key = {"queue": ck.queue, "topic": ck.topic, "partition": ck.partition, "offset": ck.offset}
        return record[0], codec.encode_version("changelog_key", 1, key), record[2]

    old = [v1(r) for r in to_records(topic, "q", random_changes(rng, 300, low=low))]
    writer.commit(old)  # as today's coordinators write them
    restore(live, kafka_settings, topic, "q")
    total = len(old)
    pending: list[tuple[str, bytes, bytes | None]] = []
    taken = 0
    for i in range(24):
        records = to_records(topic, "q", random_changes(rng, 40, low=low))
        p = rng.randrange(3)
        first = low[p] + 50
        _k, done = encode_change("q", Done(Bookmark("under", p, 0), DoneReason.ACKED, 1, 0, 9.0))
        records.append((topic, encode_run("q", Bookmark("under", p, first), 30), done))
        records += pending
        pending = []
        if i % 5 == 4:
            snapshot, parts_of, _runs = build_snapshot(live, topic, ["q"], f"s{i}", i)
            records = snapshot + records
            pending = confirm_records(topic, f"s{i}", parts_of, i)
            taken += 1
        writer.commit(records)
        total += len(records)
        restore(live, kafka_settings, topic, "q")
    # the last snapshot's confirmation never written (the coordinator was killed before)
    snapshot, _parts, _runs = build_snapshot(live, topic, ["q"], "unconfirmed", 99)
    writer.commit(snapshot)
    total += len(snapshot)
    restore(live, kafka_settings, topic, "q")
    assert taken == 4

    fresh = MemoryStore()
    result = restore(fresh, kafka_settings, topic, "q")
    assert _live_state(fresh, "q") == _live_state(live, "q")
    assert 0 < result.records_applied < total // 4  # from snapshot s19 on, not the history
    assert fresh.changelog_offset(topic, 0) == live.changelog_offset(topic, 0)


def test_a_format_1_changelog_restores_from_kafka(
    writer_factory: Callable[[str], ChangelogWriter],
    topic_factory: Callable[..., str],
    kafka_settings: dict[str, Any],
) -> None:
    """Records written by today's (format-1) coordinators: keys without a count."""
    from layer.codec import decode_key, default_codec

    topic = topic_factory(partitions=2)
    codec = default_codec()
    changes = random_changes(random.Random(2), 400)
    records = []
    for t, key, value in to_records(topic, "q", changes):
        ck = decode_key(key)
        obj = {"queue": ck.queue, "topic": ck.topic, "partition": ck.partition, "offset": ck.offset}
        records.append((t, codec.encode_version("changelog_key", 1, obj), value))
    assert all(key[0] == 1 for _t, key, _v in records)
    writer_factory(f"tx-{topic}").commit(records)
    expected = Expected()
    expected.apply(to_records(topic, "q", changes))
    store = MemoryStore()
    assert restore(store, kafka_settings, topic, "q").records_applied == 400
    expected.check(store)


def test_a_stopped_restore_keeps_what_it_applied_and_the_next_resumes_there(
    writer_factory: Callable[[str], ChangelogWriter],
    topic_factory: Callable[..., str],
    kafka_settings: dict[str, Any],
    rocks: RocksDBStore,
) -> None:
    """A standby's first restore is stopped when the member closes or takes the queue over:
    it stops between two fetches, and what it wrote stays usable."""
    topic = topic_factory(partitions=1)
    writer = writer_factory(f"tx-{topic}")
    rng = random.Random(5)
    expected = Expected()
    low: dict[int, int] = {}
    for _ in range(4):
        records = to_records(topic, "q", random_changes(rng, 500, partitions=1, low=low))
        writer.commit(records)
        expected.apply(records)

    done: list[int] = []

    def progress(applied: int, _total: int) -> None:
        done.append(applied)

    with pytest.raises(RecoveryError, match="stopped before it caught up"):
        # stopped once a batch is applied
        restore(rocks, kafka_settings, topic, "q", progress, batch_size=100, stop=lambda: any(done))
    part = rocks.changelog_offset(topic, 0)
    assert 0 < done[-1] < 2000
    assert part is not None and done[-1] <= part < 2000  # kept with its offset

    rest = restore(rocks, kafka_settings, topic, "q")
    assert rest.records_applied == 2000 - done[-1]  # nothing applied twice
    expected.check(rocks)
    whole = MemoryStore()
    assert restore(whole, kafka_settings, topic, "q").records_applied == 2000
    assert rocks.changelog_offset(topic, 0) == whole.changelog_offset(topic, 0)


def test_a_restore_stopped_at_once_reads_nothing(
    topic_factory: Callable[..., str], kafka_settings: dict[str, Any], rocks: RocksDBStore
) -> None:
    topic = topic_factory(partitions=1)
    with pytest.raises(RecoveryError, match="stopped"):
        restore(rocks, kafka_settings, topic, "q", stop=lambda: True)
    assert rocks.changelog_offset(topic, 0) is None


@pytest.mark.parametrize("partitions", [1, 3])
def test_commit_returns_the_last_offset_of_each_partition(
    partitions: int,
    kafka_settings: dict[str, Any],
    topic_factory: Callable[..., str],
    consume_all: Callable[..., list[Any]],
) -> None:
    """A one-partition topic reports its last record only; one of more, every record: either
    way the offsets returned are each partition's last."""
    topic = topic_factory(partitions=partitions)
    side = topic_factory(partitions=1)
    writer = ChangelogWriter(kafka_settings, f"tx-{topic}")
    try:
        records: Records = [(topic, b"k%d" % (i % 7), b"v%d" % i) for i in range(50)]
        records += [(side, b"s", b"side")]
        first = writer.commit(records)
        second = writer.commit(records[:10])
    finally:
        writer.close()
    last: dict[tuple[str, int], int] = {}
    for m in [*consume_all(topic), *consume_all(side)]:
        key = (m.topic(), m.partition())
        last[key] = max(last.get(key, -1), m.offset())
    written = {**first, **second}
    assert written == last
    assert [m.value() for m in consume_all(side)] == [b"side"]
