"""Restoring a queue before it serves: its state, its engine, its view topic.

1. The store catches up with the queue's changelog (``layer.state.recovery``: the records it
   has not applied yet; all of them when the state directory is new).
2. The engine is built from the store alone (``Restore.load``): partitions from their low-water
   marks, delivery and cancel counts, done records above the marks, the messages held locally
   (a message done or below a mark is deleted: the crash came between a commit and its local
   write), delays, read positions.
2b. The backlog, from each partition's read position (its low-water mark when the state was
   lost) to its high watermark, is read in bulk (``layer.coordinator.backlog``), so a queue
   rebuilt from its changelog serves with all its messages available.
3. A queue with a view topic reads it back and publishes the corrections that bring it to what
   this restart rebuilt (``layer.coordinator.view``).

Steps 1, 2b and 3 read Kafka through a ``ChangelogSource``; step 2 is pure over the store.
"""

from __future__ import annotations

import logging
import time
import uuid
from array import array
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator, Mapping
from functools import partial
from typing import Any, Protocol, TypeVar, cast

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition

from layer.codec import ChangeKind
from layer.config import QueueConfig
from layer.coordinator.backlog import Backlog
from layer.coordinator.commits import Changelog
from layer.coordinator.counters import Counters
from layer.coordinator.health import Health
from layer.coordinator.ingest import Fetched
from layer.coordinator.runtime import QueueRuntime
from layer.coordinator.view import read_view, reconcile, reconcile_leases, view_record
from layer.coordinator.view_history import ViewHistory
from layer.engine.model import Arrival, Bookmark, TopicPartition, ViewChange, ViewChanges
from layer.engine.queue import QueueEngine
from layer.state.base import RunRecord, Store, StoreBatch
from layer.state.recovery import Progress, RestoreResult, restore, take_batch

__all__ = ["ChangelogSource", "KafkaSource", "Restore"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ChangelogSource(Protocol):
    """What a restore reads from Kafka."""

    def restore(self, store: Store, topic: str, queue: str, progress: Progress) -> RestoreResult:
        """Apply to the store the changelog records of ``queue`` it has not applied yet."""
        ...

    def read_view(self, topic: str, queue: str) -> Mapping[Bookmark, ViewChange]:
        """What the view topic says the queue holds."""
        ...

    def backlog(self, starts: Mapping[TopicPartition, int]) -> Iterator[Fetched]:
        """The underlying partitions' messages from ``starts`` until each is caught up (or the
        reading stops making progress), a fetch at a time; the caller may stop early."""
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

    #: the backlog reader gives up (the live reader goes on) after this long without a message
    BACKLOG_IDLE_S = 10.0

    def backlog(self, starts: Mapping[TopicPartition, int]) -> Iterator[Fetched]:
        if not starts:
            return
        settings = {
            **self._settings,
            "group.id": f"qlayer-backlog-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
            # a partition already read to its end answers after this wait (a restart on its
            # state directory waits it once); on Tansu a much shorter one comes back empty from
            # a partition of many small batches (ingest.FetchWait)
            "fetch.wait.max.ms": 100,
            "max.partition.fetch.bytes": 4 << 20,
            # once its prefetch queue is full (queued.max.messages.kbytes), librdkafka puts a
            # partition's next fetch off by this long (1 s by default): the bulk read, faster
            # than one fetch round trip, then waited on every refill (a third of its time)
            "fetch.queue.backoff.ms": 10,
        }
        consumer = Consumer(settings)
        try:
            if at_end(consumer, starts):
                return
            consumer.assign(
                [KafkaPartition(tp.topic, tp.partition, offset) for tp, offset in starts.items()]
            )
            pending = set(starts)
            # A partition's backlog ends at its high watermark as first seen: publishers that go
            # on meanwhile are the live reader's (an end-of-partition event may never come while
            # they publish, and on Tansu not even when they stop: its watermark can lag).
            ends: dict[TopicPartition, int] = {}
            last = time.monotonic()
            while pending and time.monotonic() - last < self.BACKLOG_IDLE_S:
                msgs = take_batch(consumer, 10_000, 0.5)
                # nothing per message but its error: how far each partition got is the
                # consumer's position (one call a fetch), not the offsets of its messages
                events = [m for m in msgs if m.error() is not None]
                good = msgs
                if events:
                    good = [m for m in msgs if m.error() is None]
                    for m in events:
                        err = cast(KafkaError, m.error())
                        if err.code() == KafkaError._PARTITION_EOF:
                            pending.discard(
                                TopicPartition(cast(str, m.topic()), cast(int, m.partition()))
                            )
                        elif not err.retriable():
                            log.warning("backlog fetch error, the live reader goes on: %s", err)
                            return
                if not good:
                    continue
                last = time.monotonic()
                high = {}
                for tp in starts:
                    _low, hw = consumer.get_watermark_offsets(
                        KafkaPartition(tp.topic, tp.partition), cached=True
                    )
                    if hw >= 0:
                        high[tp] = hw
                        ends.setdefault(tp, hw)
                if pending:
                    waiting = [tp for tp in pending if tp in ends]
                    where = consumer.position(
                        [KafkaPartition(tp.topic, tp.partition) for tp in waiting]
                    )
                    for tp, kp in zip(waiting, where, strict=True):
                        # (negative: nothing consumed from it yet, it is still at its start)
                        if (kp.offset if kp.offset >= 0 else starts[tp]) >= ends[tp]:
                            pending.discard(tp)
                yield Fetched(good, high, [])
        finally:
            consumer.close()


#: ``at_end`` asks the end of at most this many partitions (one request each); a queue over
#: more reads its backlog as before
AT_END_MAX_PARTITIONS = 8


def at_end(consumer: Consumer, starts: Mapping[TopicPartition, int]) -> bool:
    """Whether every partition's high watermark (ListOffsets) is at most its start: its backlog
    is empty, and the bulk read can be skipped. A read finding that out waits for a fetch the
    broker holds ``fetch.wait.max.ms`` (0.1 s of every takeover of a queue with nothing
    waiting); this asks one request a partition. Tansu answers the first offset of the last
    batch plus one, short of the end by the rest of that batch: then the live reader, which
    starts where the backlog stopped (here: where it would have started), reads what is left,
    as after a backlog read that stopped early. False when unsure (an error, too many
    partitions)."""
    if len(starts) > AT_END_MAX_PARTITIONS:
        return False
    for tp, start in starts.items():
        try:
            _low, high = consumer.get_watermark_offsets(
                KafkaPartition(tp.topic, tp.partition), timeout=5, cached=False
            )
        except KafkaException:
            return False
        if high is None or high < 0 or high > start:
            return False
    return True


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
        views: ViewHistory | None = None,
    ) -> None:
        self._store = store
        self._views = views  # the view topics' generations (None: one topic, kept whole)
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
                self._health.restoring(line, done, total)
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
        await self.backlog(rt, starting)
        if q.view_topic:
            await self.reconcile_view(rt)
        return rt

    def load(self, q: QueueConfig) -> QueueRuntime:
        """Step 2: a queue's engine from the store (itself just restored from the changelog).

        A queue whose expressions give its messages nothing of their own (no group, conflation
        or barrier key) keeps run records (``layer.state.base.RunRecord``): when they cover its
        messages, the engine's runs are rebuilt from them and no message is read but the
        singled-out ones; otherwise every stored message is scanned (and run records are
        written for what was found, so the next restart has them)."""
        name = q.name
        store = self._store
        engine = QueueEngine(name, q.engine_settings())
        rt = QueueRuntime(q, engine, self._changelog_topic(name))
        rt.counters = Counters.load(store, name)
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
        exprs = rt.exprs
        plain_queue = exprs.plain
        batch = StoreBatch()
        records = store.runs(name) if plain_queue else None
        if records is not None:
            loaded = self._load_runs(rt, records, entries, done, batch, now)
        else:
            loaded = self._scan(rt, done, batch, now, plain_queue)
        for tp, pos in positions.items():
            if pos.read_position is not None and pos.read_position > engine.low_water(tp):
                engine.mark_read(tp, pos.read_position)
            if pos.read_position is not None:
                # blobs written before this restart end below it (QueueRuntime.blobs_below)
                rt.blobs_before[tp] = pos.read_position
        rt.restored_done = done
        rt.record_runs = plain_queue
        if batch:
            store.write(batch)
        self._progress(
            f"loaded queue={name}: {loaded} messages from local state"
            f" ({'run records' if records is not None else 'scanned'}),"
            f" {engine.restored_pending()} to re-read, {len(done)} done above the low-water marks"
        )
        return rt

    async def backlog(self, rt: QueueRuntime, starting: bool) -> None:
        """Step 2b: the queue's backlog, read in bulk (``layer.coordinator.backlog``)."""
        engine = rt.engine
        positions = self._store.positions(rt.name)
        starts = {}
        for tp in rt.known_partitions:
            pos = positions.get(tp)
            read = pos.read_position if pos is not None else None
            starts[tp] = max(read or 0, engine.low_water(tp))
        backlog = Backlog(rt, starts)
        started = time.monotonic()

        def step() -> None:
            # resumable (Kafka away: ``until_reachable`` calls it again): from where it got
            with self._store.bulk_load():
                for fetched in self._source.backlog(dict(backlog.positions)):
                    batch = StoreBatch()
                    for tp, high in fetched.high_watermarks.items():
                        engine.set_high_watermark(tp, high)
                    backlog.take(fetched.messages, batch, self._clock())
                    self._store.write(batch)
                    line = f"queue={rt.name} {backlog.admitted} messages of its backlog read"
                    if starting:
                        self._health.restoring(line)
                    if backlog.full:
                        return

        await self._until_reachable(f"read the backlog of queue {rt.name}", step)
        if not backlog.admitted and not backlog.full:
            return
        self._progress(
            f"backlog of queue={rt.name}: {backlog.admitted} messages read"
            f" in {time.monotonic() - started:.2f}s"
            + (" (target depth reached)" if backlog.full else "")
        )

    def _scan(
        self, rt: QueueRuntime, done: set[Bookmark], batch: StoreBatch, now: float, plain: bool
    ) -> int:
        """Every stored message into the engine; a plain queue gets run records for them."""
        name = rt.name
        store = self._store
        engine = rt.engine
        exprs = rt.exprs
        # Group, conflation and barrier keys are not stored: evaluate them again from payloads.
        whole = not plain
        arrivals = []
        lows: dict[TopicPartition, int] = {}
        runs: list[tuple[TopicPartition, int, list[float], int | None, bool]] = []
        for bm, timestamp_ms, priority, maybe_delayed in store.message_meta(name):
            tp = TopicPartition(bm.topic, bm.partition)
            low = lows.get(tp)
            if low is None:
                low = lows[tp] = engine.low_water(tp)
            # Done, or below a low-water mark replayed from the changelog: the crash came after
            # the commit but before the local copy was deleted.
            if bm in done or bm.offset < low:
                batch.delete_message(name, bm)
                continue
            if whole or maybe_delayed:
                stored = store.get_messages(name, [bm])[0]
                if stored is not None:
                    doc = exprs.document_of(stored)
                    arrival = rt.arrival(bm, stored, doc, now)
                    arrivals.append(arrival)
                    runs.append((tp, bm.offset, [arrival.timestamp], stored.priority, True))
                    continue
            ts = timestamp_ms / 1000.0 if timestamp_ms else now
            not_before = rt.restored_delays.pop(bm, None)
            # counts: the engine's restored ones (restore_counts above)
            arrivals.append(Arrival(bm, ts, priority, 0, 0, not_before=not_before))
            last = runs[-1] if runs else None
            if (
                last is not None
                and not last[4]
                and last[0] == tp
                and last[1] + len(last[2]) == bm.offset
                and last[3] == priority
            ):
                last[2].append(ts)
            else:
                runs.append((tp, bm.offset, [ts], priority, False))
        if arrivals:
            engine.add(arrivals, now)
        for tp, low in lows.items():
            batch.delete_blobs_below(name, tp, low)  # what the loop above skipped
        batch.delete_runs(name)
        if plain:
            for tp, start, times, priority, singled in runs:
                batch.put_run(name, tp, start, array("d", times), priority, singled)
            batch.put_runs_complete(name)
        return len(arrivals)

    def _load_runs(
        self,
        rt: QueueRuntime,
        records: list[RunRecord],
        entries: Mapping[Bookmark, Any],
        done: set[Bookmark],
        batch: StoreBatch,
        now: float,
    ) -> int:
        """The engine's runs from run records: what is done or below a low-water mark is left
        out, and a message with a durable state of its own (a delivery count, a delay) or
        that is not plain is added alone."""
        name = rt.name
        engine = rt.engine
        lows: dict[TopicPartition, int] = {}
        # offsets to leave out of runs, per partition: done ones, and those with an entry
        apart: dict[TopicPartition, list[int]] = {}
        for bm in entries:
            apart.setdefault(TopicPartition(bm.topic, bm.partition), []).append(bm.offset)
        for offsets in apart.values():
            offsets.sort()
        for tp in engine.partitions():
            lows[tp] = engine.low_water(tp)
            batch.delete_messages_below(name, tp, lows[tp])  # a crash after the commit left them
            batch.delete_blobs_below(name, tp, lows[tp])
        loaded = 0
        for record in records:
            tp, start, times = record.partition, record.start, record.times
            if tp not in lows:
                continue  # a partition no position or entry knows of: nothing of it is live
            low = lows[tp]
            end = start + len(times)
            if end <= low:
                continue
            i = max(low - start, 0)
            offsets = apart.get(tp, [])
            k = bisect_left(offsets, start + i)
            while i < len(times):
                stop = offsets[k] - start if k < len(offsets) and offsets[k] < end else len(times)
                if stop > i and not record.whole:
                    engine.add_run(tp, start + i, times[i:stop], now, record.priority)
                    loaded += stop - i
                elif stop > i:
                    for o in range(start + i, start + stop):
                        loaded += self._add_whole(rt, Bookmark(tp.topic, tp.partition, o), now)
                if stop >= len(times):
                    break
                bm = Bookmark(tp.topic, tp.partition, start + stop)
                if bm in done:
                    batch.delete_message(name, bm)
                elif record.whole:
                    loaded += self._add_whole(rt, bm, now)
                else:
                    not_before = rt.restored_delays.pop(bm, None)
                    arrival = Arrival(bm, times[stop], record.priority, not_before=not_before)
                    engine.add([arrival], now)
                    loaded += 1
                i = stop + 1
                k += 1
        return loaded

    def _add_whole(self, rt: QueueRuntime, bm: Bookmark, now: float) -> int:
        """A message that is not plain, read whole (its keys and delay are evaluated again)."""
        stored = self._store.get_messages(rt.name, [bm])[0]
        if stored is None:
            return 0
        doc = rt.exprs.document_of(stored)
        rt.engine.add([rt.arrival(bm, stored, doc, now)], now)
        return 1

    async def reconcile_view(self, rt: QueueRuntime) -> None:
        """Step 3: bring the view topic (the generation being written) to what this restart
        rebuilt."""
        base = rt.config.view_topic
        assert base is not None
        topic: str = base
        views = self._views
        generation = 0
        if views is not None:
            generation, topic = await self._until_reachable(
                f"find the generation of view topic {base}", partial(views.current, base)
            )
        published = await self._until_reachable(
            f"read view topic {topic}", lambda: self._source.read_view(topic, rt.name)
        )
        engine = rt.engine
        live = engine.view_contents()
        corrections = reconcile(published, live)
        now_ms = int(self._clock() * 1000)
        rt.view_leases, lease_fixes = reconcile_leases(
            getattr(published, "leases", {}), engine.lease_contents(), now_ms
        )
        if corrections or lease_fixes:
            record = view_record(topic, rt.name, ViewChanges.of(corrections), now_ms, lease_fixes)
            await self._changelog.commit([], [record])
        engine.view_synced()
        if views is not None:
            views.attach(rt, generation, len(live))
        self._progress(
            f"view of queue={rt.name}: {len(live)} live messages, {len(corrections)} corrections,"
            f" {len(rt.view_leases)} leases, {len(lease_fixes)} lease corrections"
            f" ({topic})"
        )
