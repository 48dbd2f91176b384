"""Restoring a queue (``layer.coordinator.restore``) over the in-memory store: the engine built
from what the changelog left in the store, and the view topic brought in line."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import pytest
from confluent_kafka import Message

from layer.codec import encode_change
from layer.config import OnUnparseable
from layer.coordinator.health import Health
from layer.coordinator.ingest import Fetched
from layer.coordinator.restore import Restore
from layer.coordinator.runtime import QueueRuntime
from layer.engine.model import (
    Bookmark,
    Done,
    DoneReason,
    Leased,
    LowWater,
    Returned,
    ReturnReason,
    TopicPartition,
    ViewChange,
)
from layer.state.base import EntryState, Store, StoreBatch, StoredMessage
from layer.state.memory import MemoryStore
from layer.state.recovery import Progress, RestoreResult
from layer.viewcodec import decode_round
from tests.unit.ports import TOPIC, TP, Clock, MemoryChangelog, fetch, queue_config

T = TypeVar("T")
NOW = 1_700_000_000.0


def bm(offset: int) -> Bookmark:
    return Bookmark(TOPIC, 0, offset)


def message(n: int) -> StoredMessage:
    return StoredMessage(key=None, value=b'{"n": %d}' % n, headers=(), timestamp_ms=1)


class ReplaySource:
    """A ``ChangelogSource`` whose changelog is a list of changes, applied as the real
    restore applies records (the entry is the record's value)."""

    def __init__(self, changes: list[Leased | Done | LowWater]) -> None:
        self.changes = changes
        self.view: dict[Bookmark, ViewChange] = {}
        self.fetches: list[Fetched] = []  # the underlying topics' backlog
        self.backlog_asked: list[dict[TopicPartition, int]] = []
        self.asked: list[tuple[str, str]] = []

    def restore(self, store: Store, topic: str, queue: str, progress: Progress) -> RestoreResult:
        self.asked.append((topic, queue))
        batch = StoreBatch()
        for change in self.changes:
            _key, value = encode_change(queue, change, int(NOW * 1000))
            if isinstance(change, LowWater):
                batch.put_low_water(queue, change.partition, change.offset)
            else:
                assert value is not None
                batch.put_entry_value(queue, change.bookmark, value)
        store.write(batch)
        progress(len(self.changes), len(self.changes))
        return RestoreResult(len(self.changes), 0.0)

    def read_view(self, topic: str, queue: str) -> Mapping[Bookmark, ViewChange]:
        return self.view

    def backlog(self, starts: Mapping[TopicPartition, int]) -> Iterator[Fetched]:
        self.backlog_asked.append(dict(starts))
        yield from self.fetches


async def at_once(what: str, step: Callable[[], T]) -> T:
    return step()


def restorer(
    store: Store, source: ReplaySource, changelog: MemoryChangelog, lines: list[str]
) -> tuple[Restore, Health]:
    health = Health()
    restore = Restore(
        store,
        source,
        changelog,
        changelog_topic=lambda name: f"{name}-changelog",
        until_reachable=at_once,
        clock=Clock(NOW),
        progress=lines.append,
        health=health,
    )
    return restore, health


def local_copies(store: Store, *offsets: int) -> None:
    batch = StoreBatch()
    for offset in offsets:
        batch.put_message("q", bm(offset), message(offset))
    batch.put_read_position("q", TP, max(offsets) + 1)
    store.write(batch)


def test_the_engine_is_what_the_changelog_says() -> None:
    store = MemoryStore()
    local_copies(store, 0, 1, 2, 3)
    source = ReplaySource(
        [
            LowWater(TP, 1),  # offset 0 was acked and the mark moved past it
            Leased(bm(1), "gone-subscriber", NOW + 30, 2, 1),
            Done(bm(2), DoneReason.ACKED, 1, 0, NOW),
        ]
    )
    lines: list[str] = []
    restore, health = restorer(store, source, MemoryChangelog(), lines)

    rt = asyncio.run(restore.queue(queue_config(), starting=True))

    assert source.asked == [("q-changelog", "q")]
    engine = rt.engine
    # a lease does not survive a restart, its counts do; done and below-the-mark stay gone
    assert engine.available() == [bm(1), bm(3)]
    assert engine.counts(bm(1)) == (2, 1)
    assert engine.low_water(TP) == 1
    # the local copies the crash left behind (done, or under the mark) are deleted
    assert store.get_messages("q", [bm(0), bm(1), bm(2)]) == [None, message(1), None]
    assert rt.restored_done == {bm(2)}  # skipped should the topic be read over it again
    assert any("restored queue=q: 3 changelog records" in line for line in lines)
    assert "restoring state: queue=q 3/3 changelog records" in health.readiness().reasons


def test_done_records_of_messages_not_read_yet_are_skipped_when_read() -> None:
    store = MemoryStore()  # a new state directory: nothing read locally
    source = ReplaySource([Done(bm(4), DoneReason.ACKED, 1, 0, NOW)])
    restore, _ = restorer(store, source, MemoryChangelog(), [])
    rt = asyncio.run(restore.queue(queue_config(), starting=False))
    assert rt.restored_done == {bm(4)}
    assert rt.engine.available() == []


def test_a_view_topic_gets_the_corrections_of_what_the_restart_rebuilt() -> None:
    store = MemoryStore()
    local_copies(store, 0, 1)
    source = ReplaySource([])
    source.view = {bm(7): ViewChange(bm(7), 1, 0, 0, None)}  # left while the coordinator was down
    changelog = MemoryChangelog()
    restore, _ = restorer(store, source, changelog, [])

    rt = asyncio.run(restore.queue(queue_config(view_topic="q-view"), starting=True))

    [tx] = changelog.transactions
    assert tx.records == [] and tx.views == []
    [(topic, key, value, _)] = tx.extra
    assert (topic, key) == ("q-view", b"q")
    assert value is not None
    signs = {c.bookmark: c.sign for c in decode_round(value).changes}
    assert signs == {bm(0): 1, bm(1): 1, bm(7): -1}
    assert not rt.engine.drain().view  # the corrections stand for what was rebuilt


def test_a_view_topic_in_line_gets_nothing() -> None:
    store = MemoryStore()
    local_copies(store, 0)
    source = ReplaySource([])
    source.view = {bm(0): ViewChange(bm(0), 1, 0, 0, None)}
    changelog = MemoryChangelog()
    restore, _ = restorer(store, source, changelog, [])
    asyncio.run(restore.queue(queue_config(view_topic="q-view"), starting=True))
    assert changelog.transactions == []


def test_entry_state_round_trip_is_what_load_reads() -> None:
    # the store keeps the changelog value itself: what load decodes is what a round wrote
    _key, value = encode_change("q", Leased(bm(1), "s", NOW + 30, 2, 1), int(NOW * 1000))
    assert value is not None
    store = MemoryStore()
    batch = StoreBatch()
    batch.put_entry_value("q", bm(1), value)
    store.write(batch)
    [(found, entry)] = list(store.entries("q"))
    assert found == bm(1) and isinstance(entry, EntryState) and entry.deliveries == 2


# -- run records: a restart rebuilds the runs without reading every message ---------------------


def _state(rt) -> tuple:
    engine = rt.engine
    return (
        engine.available(),
        engine.stats(NOW),
        [engine.counts(bm(o)) for o in range(12)],
        engine.low_water(TP),
        sorted(rt.restored_done),
        dict(rt.restored_delays),
    )


def test_a_restart_from_run_records_is_the_restart_that_scans() -> None:
    store = MemoryStore()
    lines: list[str] = []
    restore, _ = restorer(store, ReplaySource([]), MemoryChangelog(), lines)
    rt = restore.load(queue_config(filter="/n <> 5"))  # nothing stored yet: records from now on
    assert rt.record_runs
    values = [b'{"n": %d}' % n for n in range(12)]
    fetch(rt, values)
    batch = StoreBatch()
    assert rt.admit(NOW, batch) == 11  # offset 5 is filtered out: a gap between two runs
    # a delayed message (its header) is recorded alone, to be read whole
    rt.inbox.append(
        Message(TOPIC, 0, 12, b"k", b'{"n": 12}', [("deliver_after", b"%d" % (NOW + 60))])
    )
    rt.engine.set_high_watermark(TP, 13)
    assert rt.admit(NOW, batch) == 1
    store.write(batch)
    records = store.runs("q")
    assert records is not None
    assert [(r.start, len(r.times), r.whole) for r in records] == [
        (0, 5, False),
        (6, 6, False),
        (12, 1, True),
    ]
    # what the changelog then says: 0 and 1 acked (the mark passed them), 3 done, 7 leased
    # twice and returned with a delay, 9 leased once
    changes = [
        LowWater(TP, 2),
        Done(bm(3), DoneReason.ACKED, 1, 0, NOW),
        Returned(bm(7), ReturnReason.CANCEL, 2, 1, NOW + 30),
        Leased(bm(9), "gone", NOW + 30, 1, 0),
    ]
    source = ReplaySource(changes)  # type: ignore[arg-type]

    def restart(scan: bool) -> tuple:
        if scan:  # as a state directory written before run records
            wipe = StoreBatch()
            wipe.delete_runs("q")
            store.write(wipe)
        restore, _ = restorer(store, source, MemoryChangelog(), lines)
        rt = asyncio.run(restore.queue(queue_config(filter="/n <> 5"), starting=True))
        return _state(rt)

    scanned = restart(scan=True)
    assert "(scanned)" in lines[-1]
    from_records = restart(scan=False)
    assert "(run records)" in lines[-1]
    assert from_records == scanned
    available, stats, counts, low, done, delays = from_records
    assert available == [bm(2), bm(4), bm(6), bm(8), bm(9), bm(10), bm(11)]
    assert stats.delayed == 2  # 7 (its restored delay) and 12 (its header)
    assert counts[7] == (2, 1) and counts[9] == (1, 0)
    assert (low, done) == (2, [bm(3)])
    # the copies the changelog says are gone are deleted, the others kept
    assert store.get_messages("q", [bm(1), bm(3), bm(4)])[:2] == [None, None]
    assert store.get_messages("q", [bm(4)])[0] is not None


def test_a_keyed_queue_drops_run_records_and_scans() -> None:
    store = MemoryStore()
    restore, _ = restorer(store, ReplaySource([]), MemoryChangelog(), [])
    rt = restore.load(queue_config())
    fetch(rt, [b'{"n": 1}', b'{"n": 2}'])
    batch = StoreBatch()
    rt.admit(NOW, batch)
    store.write(batch)
    assert store.runs("q") is not None
    keyed = restore.load(queue_config(group_key="/n"))
    assert not keyed.record_runs and store.runs("q") is None
    assert keyed.engine.available() == [bm(0), bm(1)]
    # back to plain: the scan finds them and writes records again
    assert restore.load(queue_config()).engine.available() == [bm(0), bm(1)]
    assert store.runs("q") is not None


def _backlog(first: int, last: int) -> list[Message]:
    """Messages ``first .. last`` of partition 0: JSON, but 5 is not; 6 has a header, 10 a
    delay of its own (headers take the live path's admission, the others the bulk one); every
    third has no key."""
    out = []
    for offset in range(first, last + 1):
        value = b"not json" if offset == 5 else b'{"n": %d}' % offset
        headers = None
        if offset == 6:
            headers = [("h", b"v")]
        elif offset == 10:
            headers = [("deliver_after", b"%d" % (NOW + 60))]
        out.append(
            Message(
                topic=TOPIC,
                partition=0,
                offset=offset,
                key=None if offset % 3 == 2 else b"k%d" % offset,
                value=value,
                headers=headers,
                timestamp=(1, 1_699_999_999_000 + offset),
            )
        )
    return out


def _covered(store: Store) -> dict[int, tuple[float, int | None]] | None:
    records = store.runs("q")
    if records is None:
        return None
    return {r.start + i: (t, r.priority) for r in records for i, t in enumerate(r.times)}


BACKLOG_CHANGES = [
    LowWater(TP, 2),
    Done(bm(3), DoneReason.ACKED, 1, 0, NOW),
    Returned(bm(7), ReturnReason.CANCEL, 2, 1, NOW + 30),
    Leased(bm(9), "gone", NOW + 30, 1, 0),
]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"filter": "/n <> 4"},
        {"priority": "/n"},
        {"message_type": "bytes"},
        {"on_unparseable": OnUnparseable.DELIVER},
    ],
    ids=["plain", "filter", "priority", "bytes", "deliver-unparseable"],
)
def test_the_backlog_read_in_bulk_is_the_backlog_read_live(options: dict[str, str]) -> None:
    q = queue_config(**options)

    def restart(bulk: bool) -> tuple[QueueRuntime, MemoryStore, list[str]]:
        store = MemoryStore()  # the state directory was lost: the changelog is all there is
        source = ReplaySource(BACKLOG_CHANGES)  # type: ignore[arg-type]
        if bulk:
            source.fetches = [
                Fetched(_backlog(2, 6), {TP: 12}, []),
                Fetched(_backlog(7, 11), {TP: 12}, []),
            ]
        lines: list[str] = []
        restore, _ = restorer(store, source, MemoryChangelog(), lines)
        rt = asyncio.run(restore.queue(q, starting=True))
        if bulk:
            assert source.backlog_asked == [{TP: 2}]  # from the low-water mark
        else:  # as the live reader hands the backlog over
            rt.take_fetched(Fetched(_backlog(2, 11), {TP: 12}, []))
            batch = StoreBatch()
            rt.admit(NOW, batch)
            store.write(batch)
        return rt, store, lines

    bulk, bulk_store, lines = restart(bulk=True)
    live, live_store, _ = restart(bulk=False)
    assert _state(bulk) == _state(live)
    assert bulk.engine.low_water(TP) == 2 and not bulk.restored_done
    offsets = [bm(o) for o in range(12)]
    assert bulk_store.get_messages("q", offsets) == live_store.get_messages("q", offsets)
    # the same offsets with the same times in run records (the live path, while a restored
    # delay waits, records every message alone: it is read whole at the next restart)
    assert _covered(bulk_store) == _covered(live_store)
    assert bulk_store.positions("q") == live_store.positions("q")
    assert bulk.counters == live.counters
    assert bulk.counters.ingested == (8 if "filter" in options else 9)
    if options.get("message_type") != "bytes":
        assert bulk.counters.unparseable == 1
        assert bulk_store.get_messages("q", [bm(5)])[0].error.startswith("unparseable json")
    # on_unparseable = "dead-letter" (the default): done on arrival, on either path
    done = {
        r: [c for c in rt.engine.drain().changes if isinstance(c, Done)] for r, rt in (
            ("bulk", bulk), ("live", live)
        )
    }  # fmt: skip
    if options.get("message_type") == "bytes" or "on_unparseable" in options:
        assert done == {"bulk": [], "live": []}
    else:
        assert [(c.bookmark, c.reason) for c in done["bulk"]] == [(bm(5), DoneReason.UNPARSEABLE)]
        assert [(c.bookmark, c.reason) for c in done["live"]] == [(bm(5), DoneReason.UNPARSEABLE)]
    assert any(line.startswith("backlog of queue=q: ") for line in lines)


def test_the_backlog_stops_at_the_target_depth() -> None:
    store = MemoryStore()
    source = ReplaySource([LowWater(TP, 2)])  # type: ignore[list-item]
    source.fetches = [Fetched(_backlog(2, 11), {TP: 12}, []), Fetched(_backlog(12, 13), {}, [])]
    lines: list[str] = []
    restore, _ = restorer(store, source, MemoryChangelog(), lines)
    rt = asyncio.run(restore.queue(queue_config(target_queue_depth=3), starting=True))
    # 2, 3, 4 queued; the live reader goes on from 5
    assert rt.engine.available() == [bm(2), bm(3), bm(4)]
    assert store.positions("q")[TP].read_position == 5
    assert store.get_messages("q", [bm(4), bm(5)])[1] is None
    assert "(target depth reached)" in lines[-1]


@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "run-records"])
def test_an_unparseable_message_admitted_but_not_committed_is_dead_lettered_at_restart(
    scan: bool,
) -> None:
    """The crash came after the round wrote its local copies (messages, read positions) and
    before the changelog commit of the done record: the restart must not queue the message."""
    store = MemoryStore()
    restore, _ = restorer(store, ReplaySource([]), MemoryChangelog(), [])
    rt = restore.load(queue_config())
    fetch(rt, [b'{"n": 0}', b'{"n": 1,', b'{"n": 2}'])
    batch = StoreBatch()
    assert rt.admit(NOW, batch) == 3
    store.write(batch)  # what Round.admit writes at once; the round then dies uncommitted
    assert [(c.bookmark, c.reason) for c in rt.engine.drain().changes if isinstance(c, Done)] == [
        (bm(1), DoneReason.UNPARSEABLE)
    ]
    if scan:
        wipe = StoreBatch()
        wipe.delete_runs("q")
        store.write(wipe)
    restore, _ = restorer(store, ReplaySource([LowWater(TP, 0)]), MemoryChangelog(), [])
    again = asyncio.run(restore.queue(queue_config(), starting=True))
    done = [c for c in again.engine.drain().changes if isinstance(c, Done)]
    assert [(c.bookmark, c.reason) for c in done] == [(bm(1), DoneReason.UNPARSEABLE)]
    assert again.engine.available() == [bm(0), bm(2)]
    # under "deliver" the same copy is queued, with its error
    restore, _ = restorer(store, ReplaySource([LowWater(TP, 0)]), MemoryChangelog(), [])
    kept = asyncio.run(
        restore.queue(queue_config(on_unparseable=OnUnparseable.DELIVER), starting=True)
    )
    assert kept.engine.available() == [bm(0), bm(1), bm(2)]
    assert (store.get_messages("q", [bm(1)])[0] or message(9)).error


TP1 = TopicPartition(TOPIC, 1)


def _plain_backlog(spans: list[tuple[int, int, int]], tombstones: bool) -> list[Message]:
    """Plain messages (no headers, JSON that parses) of the spans ``(partition, first, end)``,
    in that order (a fetch interleaves partitions); every fifth without a key, every seventh a
    tombstone when ``tombstones``."""
    return [
        Message(
            topic=TOPIC,
            partition=p,
            offset=o,
            key=None if o % 5 == 4 else b"k%d" % o,
            value=None if tombstones and o % 7 == 6 else b'{"n": %d}' % o,
            timestamp=(1, 1_699_999_999_000 + o),
        )
        for p, first, end in spans
        for o in range(first, end)
    ]


@pytest.mark.parametrize(
    ("options", "depth", "gap"),
    [({}, None, False), ({"message_type": "bytes"}, None, True), ({}, 2_000, True)],
    ids=["json", "bytes-tombstones-gap", "json-target-depth-gap"],
)
def test_a_plain_backlog_read_by_columns_is_the_backlog_read_live(
    options: dict[str, str], depth: int | None, gap: bool
) -> None:
    """Fetches of plain messages only (the backlog's columns path): two partitions interleaved,
    blobs cut past ``BLOB_MESSAGES``, a gap in the offsets (transaction markers) and a target
    depth reached inside a fetch: the same queue, store and counters as the live path's."""
    skip = 1_500 if gap else -1  # an offset never produced (a transaction marker's)
    spans = [(0, 0, 1_200), (1, 0, 700), (0, 1_200, 2_600), (1, 700, 1_900)]
    fetches = [
        [m for m in _plain_backlog(spans[:2], "bytes" in str(options)) if m.offset() != skip],
        [m for m in _plain_backlog(spans[2:], "bytes" in str(options)) if m.offset() != skip],
    ]
    if depth is not None:
        options = {**options, "target_queue_depth": depth}  # type: ignore[dict-item]
    q = queue_config(**options)
    starts = [LowWater(TP, 0), LowWater(TP1, 0)]
    every = [bm(o) for o in range(2_600)] + [Bookmark(TOPIC, 1, o) for o in range(1_900)]

    def restart(bulk: bool) -> tuple[QueueRuntime, MemoryStore]:
        store = MemoryStore()
        source = ReplaySource(starts)  # type: ignore[arg-type]
        if bulk:
            source.fetches = [Fetched(f, {TP: 2_600, TP1: 1_900}, []) for f in fetches]
        restore, _ = restorer(store, source, MemoryChangelog(), [])
        rt = asyncio.run(restore.queue(q, starting=True))
        if not bulk:
            for f in fetches:
                rt.take_fetched(Fetched(f, {TP: 2_600, TP1: 1_900}, []))
            while True:
                batch = StoreBatch()
                taken = rt.admit(NOW, batch)
                store.write(batch)
                if not taken:
                    break
        return rt, store

    bulk, bulk_store = restart(bulk=True)
    live, live_store = restart(bulk=False)
    assert bulk.engine.available() == live.engine.available()
    assert len(bulk.engine.available()) == (depth or 2_600 + 1_900 - (2 if gap else 0))
    assert bulk.engine.stats(NOW) == live.engine.stats(NOW)
    assert bulk_store.get_messages("q", every) == live_store.get_messages("q", every)
    assert bulk_store.positions("q") == live_store.positions("q")
    assert bulk.counters == live.counters
