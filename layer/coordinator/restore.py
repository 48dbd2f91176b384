"""Restoring a queue before it serves: its state, its engine, its view topic.

1. The store catches up with the queue's changelog (``layer.state.recovery``: the records it
   has not applied yet; all of them when the state directory is new).
2. The engine is built from the store alone (``Restore.load``): partitions from their low-water
   marks, delivery and cancel counts, done records above the marks, the messages held locally
   (a message done or below a mark is deleted: the crash came between a commit and its local
   write), delays, read positions.
3. A queue with a view topic reads it back and publishes the corrections that bring it to what
   this restart rebuilt (``layer.coordinator.view``).

Steps 1 and 3 read Kafka through a ``ChangelogSource``; step 2 is pure over the store.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from layer.codec import ChangeKind
from layer.config import QueueConfig
from layer.coordinator.health import Health
from layer.coordinator.round import Changelog
from layer.coordinator.runtime import QueueRuntime
from layer.coordinator.view import read_view, reconcile, view_record
from layer.engine.model import Arrival, Bookmark, TopicPartition, ViewChange, ViewChanges
from layer.engine.queue import QueueEngine
from layer.state.base import Store, StoreBatch
from layer.state.recovery import Progress, RestoreResult, restore

__all__ = ["ChangelogSource", "KafkaSource", "Restore"]

T = TypeVar("T")


class ChangelogSource(Protocol):
    """What a restore reads from Kafka."""

    def restore(self, store: Store, topic: str, queue: str, progress: Progress) -> RestoreResult:
        """Apply to the store the changelog records of ``queue`` it has not applied yet."""
        ...

    def read_view(self, topic: str, queue: str) -> Mapping[Bookmark, ViewChange]:
        """What the view topic says the queue holds."""
        ...


class KafkaSource:
    """``ChangelogSource`` over Kafka, with these consumer settings."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self._settings = settings

    def restore(self, store: Store, topic: str, queue: str, progress: Progress) -> RestoreResult:
        # resumable: each applied batch is stored with the offset it reaches
        return restore(store, self._settings, topic, queue, progress)

    def read_view(self, topic: str, queue: str) -> Mapping[Bookmark, ViewChange]:
        return read_view(self._settings, topic, queue)


class Patience(Protocol):
    """Runs a blocking step (in a thread) until Kafka answers it (``outage.until_reachable``)."""

    def __call__(self, what: str, step: Callable[[], T]) -> Awaitable[T]: ...


class Restore:
    """Restores queues into runtimes that are ready to serve (not serving yet)."""

    def __init__(
        self,
        store: Store,
        source: ChangelogSource,
        changelog: Changelog,
        *,
        changelog_topic: Callable[[str], str],
        until_reachable: Patience,
        clock: Callable[[], float],
        progress: Callable[[str], None],
        health: Health,
    ) -> None:
        self._store = store
        self._source = source
        self._changelog = changelog  # where view corrections are committed
        self._changelog_topic = changelog_topic
        self._until_reachable = until_reachable
        self._clock = clock
        self._progress = progress
        self._health = health

    async def queue(self, q: QueueConfig, starting: bool) -> QueueRuntime:
        """All three steps. ``starting``: the coordinator is not ready until every queue is
        restored, and says how far it got; a queue added by a reload restores while the others
        serve, and readiness stays as it is."""
        topic = self._changelog_topic(q.name)
        started = time.monotonic()

        def report(done: int, total: int) -> None:
            line = f"queue={q.name} {done}/{total} changelog records"
            if starting:
                self._health.restoring(line)
            self._progress(f"restoring {line}")

        result = await self._until_reachable(
            f"restore queue {q.name}",
            lambda: self._source.restore(self._store, topic, q.name, report),
        )
        self._progress(
            f"restored queue={q.name}: {result.records_applied} changelog records"
            f" in {time.monotonic() - started:.2f}s"
        )
        rt = self.load(q)
        if q.view_topic:
            await self.reconcile_view(rt)
        return rt

    def load(self, q: QueueConfig) -> QueueRuntime:
        """Step 2: a queue's engine from the store (itself just restored from the changelog)."""
        name = q.name
        store = self._store
        engine = QueueEngine(name, q.engine_settings())
        rt = QueueRuntime(q, engine, self._changelog_topic(name))
        now = self._clock()
        positions = store.positions(name)
        entries = dict(store.entries(name))
        partitions = set(positions) | {TopicPartition(bm.topic, bm.partition) for bm in entries}
        for tp in sorted(partitions):
            pos = positions.get(tp)
            low = pos.low_water if pos is not None and pos.low_water is not None else 0
            engine.start_partition(tp, low)
            rt.known_partitions.add(tp)
        done = {bm for bm, e in entries.items() if e.kind is ChangeKind.DONE}
        engine.restore_counts(
            {
                bm: (e.deliveries, e.cancels)
                for bm, e in entries.items()
                if e.kind is not ChangeKind.DONE
            }
        )
        rt.restored_delays = {
            bm: e.lease_deadline_ms / 1000.0
            for bm, e in entries.items()
            if e.kind is ChangeKind.RETURNED and e.lease_deadline_ms is not None
        }
        engine.restore_done(sorted(done))
        batch = StoreBatch()
        arrivals = []
        exprs = rt.exprs
        # Group, conflation and barrier keys are not stored: evaluate them again from payloads.
        whole = exprs.group is not None or exprs.conflate is not None or exprs.barrier is not None
        for bm, timestamp_ms, priority, maybe_delayed in store.message_meta(name):
            # Done, or below a low-water mark replayed from the changelog: the crash came after
            # the commit but before the local copy was deleted.
            if bm in done or bm.offset < engine.low_water(TopicPartition(bm.topic, bm.partition)):
                batch.delete_message(name, bm)
                continue
            if whole or maybe_delayed:
                stored = store.get_messages(name, [bm])[0]
                if stored is not None:
                    doc = exprs.reader.read(stored.value)[0] if exprs.reader else None
                    arrivals.append(rt.arrival(bm, stored, doc, now))
                    continue
            ts = timestamp_ms / 1000.0 if timestamp_ms else now
            not_before = rt.restored_delays.pop(bm, None)
            # counts: the engine's restored ones (restore_counts above)
            arrivals.append(Arrival(bm, ts, priority, 0, 0, not_before=not_before))
        if arrivals:
            engine.add(arrivals, now)
        for tp, pos in positions.items():
            if pos.read_position is not None and pos.read_position > engine.low_water(tp):
                engine.mark_read(tp, pos.read_position)
        rt.restored_done = done - {a.bookmark for a in arrivals}
        if batch:
            store.write(batch)
        self._progress(
            f"loaded queue={name}: {len(arrivals)} messages from local state,"
            f" {engine.restored_pending()} to re-read, {len(done)} done above the low-water marks"
        )
        return rt

    async def reconcile_view(self, rt: QueueRuntime) -> None:
        """Step 3: bring the view topic to what this restart rebuilt."""
        topic = rt.config.view_topic
        assert topic is not None
        published = await self._until_reachable(
            f"read view topic {topic}", lambda: self._source.read_view(topic, rt.name)
        )
        engine = rt.engine
        live = engine.view_contents()
        corrections = reconcile(published, live)
        if corrections:
            now_ms = int(self._clock() * 1000)
            record = view_record(topic, rt.name, ViewChanges.of(corrections), now_ms)
            await self._changelog.commit([], [record])
        engine.view_synced()
        self._progress(
            f"view of queue={rt.name}: {len(live)} live messages, {len(corrections)} corrections"
        )
