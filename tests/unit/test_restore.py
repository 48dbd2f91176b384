"""Restoring a queue (``layer.coordinator.restore``) over the in-memory store: the engine built
from what the changelog left in the store, and the view topic brought in line."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TypeVar

from layer.codec import encode_change
from layer.coordinator.health import Health
from layer.coordinator.restore import Restore
from layer.engine.model import (
    Bookmark,
    Done,
    DoneReason,
    Leased,
    LowWater,
    ViewChange,
)
from layer.state.base import EntryState, Store, StoreBatch, StoredMessage
from layer.state.memory import MemoryStore
from layer.state.recovery import Progress, RestoreResult
from layer.viewcodec import decode_round
from tests.unit.ports import TOPIC, TP, Clock, MemoryChangelog, queue_config

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
