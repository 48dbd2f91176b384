"""Property: what ``Round.record`` writes (changelog records, one store batch) says exactly
what the changes say one by one: runs, shared values, the store batch's operations per round
and the entries a tombstone of the same round deletes change how it is written, not what."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from layer.codec import decode_key, encode_change
from layer.coordinator.records import ENTRY_SWEEP, _ordered, changelog_order, mirror
from layer.coordinator.round import Round
from layer.engine.model import (
    Bookmark,
    Change,
    Done,
    DoneReason,
    Effects,
    Forget,
    Leased,
    LowWater,
    Returned,
    ReturnReason,
    TopicPartition,
    singles,
)
from layer.state.base import StoreBatch, StoredMessage
from layer.state.memory import MemoryStore
from tests.unit.ports import TOPIC, Clock, MemoryChangelog, new_runtime, queue_config

NOW = 1_700_000_000.0
PARTITIONS = 2
OFFSETS = 12


@st.composite
def round_changes(draw: st.DrawFn) -> list[Change]:
    """The changes of one round, as an engine drains them: per message its changes in order,
    messages of partitions interleaved, some as runs of consecutive offsets (``count``: a
    lease of a run, an ack of a span), a run's messages changed before or after it too;
    tombstones for runs of done messages; a mark."""
    changes: list[Change] = []
    done: dict[int, set[int]] = {p: set() for p in range(PARTITIONS)}
    holders = ["s1", "s2"]
    for _ in range(draw(st.integers(0, 30))):
        p = draw(st.integers(0, PARTITIONS - 1))
        offset = draw(st.integers(0, OFFSETS - 1))
        count = draw(st.sampled_from([1, 1, 2, 3]))
        span = range(offset, min(offset + count, OFFSETS))
        if any(o in done[p] for o in span):
            continue
        count = len(span)
        bm = Bookmark(TOPIC, p, offset)
        deliveries = draw(st.integers(1, 2))
        kind = draw(st.sampled_from(["leased", "returned", "done"]))
        if kind == "leased":
            holder = draw(st.sampled_from(holders))
            deadline = NOW + draw(st.sampled_from([30.0, 60.0]))
            changes.append(Leased(bm, holder, deadline, deliveries, 0, count))
        elif kind == "returned":
            returned = draw(st.sampled_from(list(ReturnReason)))
            changes.append(Returned(bm, returned, deliveries, 0, None, count))
        else:
            left = draw(
                st.sampled_from(
                    [DoneReason.ACKED, DoneReason.MAX_DELIVERIES, DoneReason.EXPIRATION]
                )
            )
            changes.append(Done(bm, left, deliveries, 0, NOW, count))
            done[p].update(span)
    for p in range(PARTITIONS):
        # the low-water mark passes a prefix of the done offsets: one Forget per run of them
        mark = 0
        while mark in done[p] and draw(st.booleans()):
            mark += 1
        start = 0
        while start < mark:
            end = start + draw(st.integers(1, mark - start))
            changes.append(Forget(Bookmark(TOPIC, p, start), end - start))
            start = end
        if mark:
            changes.append(LowWater(TopicPartition(TOPIC, p), mark))
    return changes


def _seeded() -> MemoryStore:
    store = MemoryStore()
    batch = StoreBatch()
    for p in range(PARTITIONS):
        for offset in range(OFFSETS):
            message = StoredMessage(None, b"{}", (), 1, None, None)
            batch.put_message("q", Bookmark(TOPIC, p, offset), message)
    store.write(batch)
    return store


def _dump(store: MemoryStore) -> tuple[object, ...]:
    """What a reader sees: no entry below a partition's low-water mark."""
    marks = {tp: p.low_water for tp, p in store.positions("q").items() if p.low_water is not None}
    return (
        dict(store.entry_values("q", below=marks)),
        [bm for bm, _ in store.messages("q")],
        store.positions("q"),
    )


@settings(max_examples=300, deadline=None)
@given(round_changes(), st.booleans())
def test_a_rounds_records_and_batch_say_what_its_changes_say_one_by_one(
    changes: list[Change], swept: bool
) -> None:
    q = queue_config()
    now_ms = int(NOW * 1000)

    # the round, as it writes them (swept: its marks are not far enough past the last range
    # delete of entries for one of their own, so the tombstones' entries stay, hidden)
    store = _seeded()
    rt = new_runtime(q)
    if swept:
        rt.entries_swept = {TopicPartition(TOPIC, p): 0 for p in range(PARTITIONS)}
    r = Round(store, MemoryChangelog(), Clock(NOW))
    r.record(rt, Effects(list(changes), []))
    store.write(r.batch)

    # one change of one message at a time, in the order the engine made them (by message):
    # a record and a mirror each
    expected = _seeded()
    reference = new_runtime(q)
    batch = StoreBatch()
    records: list[tuple[int, int, bytes | None]] = []
    singled = list(singles(changes))
    for change in _ordered(singled) if len(singled) > 1 else singled:
        key, value = encode_change("q", change, now_ms)
        mirror(reference, change, value, batch, {})
        ck = decode_key(key)
        if ck.offset >= 0:
            records.extend((ck.partition, ck.offset + i, value) for i in range(ck.length))
    expected.write(batch)

    assert _dump(store) == _dump(expected)
    written: list[tuple[int, int, bytes | None]] = []
    for _topic, key, value in r.records:
        ck = decode_key(key)
        if ck.offset >= 0:
            written.extend((ck.partition, ck.offset + i, value) for i in range(ck.length))
    # each message's records in the same order (a restore reads the last of each)
    assert sorted(written, key=lambda w: w[:2]) == sorted(records, key=lambda w: w[:2])
    assert rt.counters.acked == reference.counters.acked
    assert rt.counters.dead_lettered == reference.counters.dead_lettered


def test_the_entries_a_mark_passes_go_in_one_range_delete_every_entry_sweep_offsets() -> None:
    q = queue_config()
    store = MemoryStore()
    rt = new_runtime(q)
    tp = TopicPartition(TOPIC, 0)
    rt.entries_swept[tp] = 0
    step = ENTRY_SWEEP // 4
    for first in range(0, ENTRY_SWEEP, step):
        bm = Bookmark(TOPIC, 0, first)
        r = Round(store, MemoryChangelog(), Clock(NOW))
        leased = [
            Leased(bm._replace(offset=o), "s1", NOW + 30, 1, 0) for o in range(first, first + step)
        ]
        r.record(rt, Effects(leased, []))
        store.write(r.batch)
        r = Round(store, MemoryChangelog(), Clock(NOW))
        done = [Done(c.bookmark, DoneReason.ACKED, 1, 0, NOW) for c in leased]
        forget = Forget(bm, step)
        r.record(rt, Effects([*done, forget, LowWater(tp, first + step)], []))
        store.write(r.batch)
        assert [(f.topic, f.partition, v) for (f, v) in store.entries("q")] == []
        # the tombstones went to the changelog all the same
        assert any(value is None for _t, _k, value in r.records)
        kept = len(store._data["entries"])
        if first + step < ENTRY_SWEEP:
            assert kept == first + step  # kept below the mark, hidden
        else:
            assert kept == 0  # the mark is ENTRY_SWEEP past the last sweep: one range delete
            assert rt.entries_swept[tp] == first + step


def test_changelog_order_takes_a_run_message_by_message_where_a_change_is_inside_it():
    """A change of a message inside a run of the engine's that came before the run (a return,
    then the lease of a run that holds it) must stay before the run's change of that message:
    the round writes such runs message by message; runs nothing is inside stay whole."""
    tp = ("t", 0)
    first = Bookmark(*tp, 5)
    inside = Returned(Bookmark(*tp, 6), ReturnReason.CANCEL, 1, 1)
    run = Leased(first, "a", 60.0, 2, 1, count=3)
    ordered = changelog_order([inside, run])
    assert ordered == [
        Leased(first, "a", 60.0, 2, 1),
        inside,
        Leased(Bookmark(*tp, 6), "a", 60.0, 2, 1),
        Leased(Bookmark(*tp, 7), "a", 60.0, 2, 1),
    ]
    other = Done(Bookmark("t", 1, 0), DoneReason.ACKED, 1, 0, 1.0, count=4)
    assert changelog_order([run, other, Leased(Bookmark(*tp, 5), "b", 60.0, 3, 1)]) == [
        run,
        Leased(Bookmark(*tp, 5), "b", 60.0, 3, 1),
        other,
    ]
