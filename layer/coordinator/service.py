"""The coordinator: wires queue engines to Kafka, RocksDB and the API.

One asyncio loop owns every engine. Work happens in *rounds*: admit fetched messages, tick and
dispatch the engines, drain their effects, commit the round's changelog records and dead letters
in one Kafka transaction (in a worker thread), apply them to RocksDB with the changelog offsets
in one write batch, and only then hand out deliveries and answer acks. While a round commits,
the next one's events accumulate: that is the group commit, and no message ever costs a broker
round trip of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import KafkaException, Producer

from connectors.admin import TopicAdmin, TopicSpec
from connectors.kafka import (
    BrokerProfile,
    client_settings,
    consumer_settings,
    producer_settings,
)
from layer.api.service import (
    AckWhereResult,
    DeliveredMessage,
    QueueInfo,
    QueueStats,
    RedriveResult,
)
from layer.codec import ChangeKind, encode, encode_change
from layer.config import Config
from layer.coordinator.ingest import Fetched, IngestReader
from layer.coordinator.publish_route import PublishRoute, routes_publishes
from layer.coordinator.redrive import REDRIVE_SUFFIX, copy_of, read_dead_letters, redriven_record
from layer.coordinator.runtime import QueueRuntime
from layer.coordinator.subscriptions import Subscriptions
from layer.coordinator.view import read_view, reconcile, view_record
from layer.engine.model import (
    AckOp,
    Arrival,
    Bookmark,
    Change,
    Delivery,
    Done,
    DoneReason,
    Forget,
    Leased,
    LowWater,
    Returned,
    TopicPartition,
    ViewChanges,
)
from layer.engine.queue import QueueEngine
from layer.exceptions import BrokerError, ConfigError, InvalidRequest, QLayerError
from layer.expr import compile_expression
from layer.state.base import Store, StoreBatch, StoredMessage
from layer.state.changelog import ChangelogRecord, ChangelogWriter, ExtraRecord
from layer.state.recovery import restore

log = logging.getLogger(__name__)

# A dead letter's payload is cut beyond this, so its envelope (key, headers and all) stays under
# librdkafka's default message.max.bytes of 1,000,000.
DEAD_LETTER_PAYLOAD_MAX = 900_000


class Coordinator(Subscriptions):
    """Implements ``layer.api.service.QueueService`` over Kafka topics."""

    def __init__(
        self,
        config: Config,
        store: Store,
        bootstrap_servers: str,
        profile: BrokerProfile,
        clock: Callable[[], float] = time.time,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self._profile = profile
        self._progress = progress or (lambda line: log.info("%s", line))
        self._base_settings = client_settings(bootstrap_servers, dict(config.broker.kafka))
        self._runtimes: dict[str, QueueRuntime] = {}
        self._readers: dict[str, IngestReader] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._failed: BaseException | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._commit_pool = ThreadPoolExecutor(1, thread_name_prefix="changelog")
        self._writer: ChangelogWriter | None = None
        self._producer: Producer | None = None
        self._producer_stop = threading.Event()
        self._poll_task: asyncio.Future[None] | None = None
        self._sub_ids = itertools.count(1)
        self._instance = uuid.uuid4().hex[:8]
        self._loop: asyncio.AbstractEventLoop | None = None
        self.rounds = 0
        self._last_commit = 0.0
        self._redrive_lock = asyncio.Lock()  # monotonic start of the last changelog commit

    # ----------------------------------------------------------------------------------------
    # life cycle
    # ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        cfg = self._config
        admin = TopicAdmin(self._base_settings)
        specs = []
        for q in cfg.queues:
            specs.append(
                TopicSpec(
                    cfg.coordinator.changelog_topic(q.name),
                    partitions=1,
                    config={"cleanup.policy": "compact"},
                )
            )
            if q.dead_letter_topic:
                specs.append(TopicSpec(q.dead_letter_topic, partitions=1))
            if not q.topic_is_regex:
                specs.append(TopicSpec(q.underlying_topic, partitions=1))
            if q.default_publish_target:
                specs.append(TopicSpec(q.default_publish_target, partitions=1))
            if routes_publishes(q):
                specs.append(TopicSpec(q.name, partitions=1))
            if q.view_topic:
                # every round is kept: a queue's rounds share one key (layer.coordinator.view)
                config = {"cleanup.policy": "delete", "retention.ms": "-1"}
                specs.append(TopicSpec(q.view_topic, partitions=1, config=config))
        # queues may share topics: create each once (a duplicate in one request is an error)
        admin.ensure_topics(list({spec.name: spec for spec in specs}.values()))
        for q in cfg.queues:
            if q.view_topic:
                policy = admin.topic_config(q.view_topic).get("cleanup.policy", "delete")
                if "compact" in policy:
                    raise ConfigError(
                        f"{cfg.source}: queue {q.name!r}: option 'view_topic': topic"
                        f" {q.view_topic!r} has cleanup.policy={policy}, but a view topic must"
                        " keep every record (a queue's rounds share one key): use a new topic,"
                        " or set cleanup.policy=delete and retention.ms=-1 on it"
                    )

        # The writer comes first: initialising its transactions fences a killed predecessor and
        # aborts its open transaction, which a read_committed restore would otherwise wait on.
        self._writer = await asyncio.to_thread(
            ChangelogWriter,
            producer_settings(self._base_settings),
            f"{cfg.coordinator.id}-changelog",
        )
        restore_settings = consumer_settings(self._base_settings, self._profile)
        for q in cfg.queues:
            topic = cfg.coordinator.changelog_topic(q.name)
            started = time.monotonic()

            def report(done: int, total: int, queue: str = q.name) -> None:
                self._progress(f"restoring queue={queue}: {done}/{total} changelog records")

            result = await asyncio.to_thread(
                restore, self._store, restore_settings, topic, q.name, report
            )
            self._progress(
                f"restored queue={q.name}: {result.records_applied} changelog records"
                f" in {time.monotonic() - started:.2f}s"
            )
            self._runtimes[q.name] = self._load_runtime(q.name)
            if q.view_topic:
                await self._reconcile_view(self._runtimes[q.name])

        self._producer = Producer(producer_settings(self._base_settings, linger_ms=2))
        self._poll_task = asyncio.ensure_future(asyncio.to_thread(self._poll_producer))
        for name, rt in self._runtimes.items():
            self._readers[name] = self._start_reader(rt)
            if routes_publishes(rt.config):
                self._start_route(rt)
        self._pump_task = asyncio.create_task(self._pump(), name="coordinator-pump")

    def _load_runtime(self, name: str) -> QueueRuntime:
        """Build a queue's engine from the store (itself just restored from the changelog)."""
        q = self._config.queue(name)
        engine = QueueEngine(name, q.engine_settings())
        rt = QueueRuntime(q, engine, self._config.coordinator.changelog_topic(name))
        now = self._clock()
        positions = self._store.positions(name)
        entries = dict(self._store.entries(name))
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
        for bm, timestamp_ms, priority, maybe_delayed in self._store.message_meta(name):
            # Done, or below a low-water mark replayed from the changelog: the crash came after
            # the commit but before the local copy was deleted.
            if bm in done or bm.offset < engine.low_water(TopicPartition(bm.topic, bm.partition)):
                batch.delete_message(name, bm)
                continue
            if whole or maybe_delayed:
                stored = self._store.get_messages(name, [bm])[0]
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
            self._store.write(batch)
        self._progress(
            f"loaded queue={name}: {len(arrivals)} messages from local state,"
            f" {engine.restored_pending()} to re-read, {len(done)} done above the low-water marks"
        )
        return rt

    async def _reconcile_view(self, rt: QueueRuntime) -> None:
        """Bring the view topic to what this restart rebuilt (see layer.coordinator.view)."""
        topic = rt.config.view_topic
        assert topic is not None and self._writer is not None
        settings = consumer_settings(self._base_settings, self._profile)
        published = await asyncio.to_thread(read_view, settings, topic, rt.name)
        engine = rt.engine
        live = engine.view_contents()
        corrections = reconcile(published, live)
        if corrections:
            now_ms = int(self._clock() * 1000)
            record = view_record(topic, rt.name, ViewChanges.of(corrections), now_ms)
            await asyncio.to_thread(self._writer.commit, [], [record])
        engine.view_synced()
        self._progress(
            f"view of queue={rt.name}: {len(live)} live messages, {len(corrections)} corrections"
        )

    def _start_reader(self, rt: QueueRuntime) -> IngestReader:
        q = rt.config
        # Resume where this store read up to; never below the low-water mark, which the
        # changelog may have moved past a stale local read position.
        positions = {}
        for tp, pos in self._store.positions(q.name).items():
            if tp in rt.known_partitions:
                positions[tp] = max(pos.read_position or 0, rt.engine.low_water(tp))
        for tp in rt.known_partitions:
            positions.setdefault(tp, rt.engine.low_water(tp))
        loop = self._loop
        assert loop is not None

        def on_batch(fetched: Fetched) -> None:
            loop.call_soon_threadsafe(self._on_fetched, rt, fetched)

        reader = IngestReader(
            q.name,
            consumer_settings(self._base_settings, self._profile),
            q.underlying_topic,
            q.topic_is_regex,
            positions,
            q.start_from,
            on_batch,
            lambda: len(rt.inbox),
            refresh_interval=self._config.coordinator.topic_refresh_interval,
        )
        reader.start()
        return reader

    def _start_route(self, rt: QueueRuntime) -> None:
        q = rt.config
        assert q.default_publish_target is not None and self._loop is not None
        route = rt.route = PublishRoute(
            q.name, q.name, q.default_publish_target, rt.changelog_topic
        )
        loop = self._loop

        def on_batch(fetched: Fetched) -> None:
            loop.call_soon_threadsafe(self._on_routed, route, fetched)

        route.start(self._store, consumer_settings(self._base_settings, self._profile), on_batch)

    def _on_routed(self, route: PublishRoute, fetched: Fetched) -> None:
        route.inbox.extend(fetched.messages)
        self._wake.set()

    def _on_fetched(self, rt: QueueRuntime, fetched: Fetched) -> None:
        for started in fetched.started:
            if started.partition not in rt.known_partitions:
                rt.engine.start_partition(started.partition, started.offset)
                rt.known_partitions.add(started.partition)
                rt.pending_changes.append(LowWater(started.partition, started.offset))
        for tp, high in fetched.high_watermarks.items():
            rt.engine.set_high_watermark(tp, high)
        rt.inbox.extend(fetched.messages)
        self._wake.set()

    def _all_readers(self) -> list[IngestReader]:
        readers = list(self._readers.values())
        readers.extend(
            rt.route.reader for rt in self._runtimes.values() if rt.route and rt.route.reader
        )
        return readers

    async def run(self) -> None:
        """Serve until ``stop()``; raises if the coordinator failed (the process should exit)."""
        assert self._pump_task is not None
        await self._pump_task

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._pump_task is not None:
            with contextlib.suppress(BaseException):  # already logged; stopping anyway
                await self._pump_task
        for rt in self._runtimes.values():
            for sub in list(rt.subscriptions.values()):
                sub.sink.close("coordinator stopping")
        for reader in self._all_readers():
            await asyncio.to_thread(reader.stop)
        self._producer_stop.set()
        if self._poll_task is not None:
            await self._poll_task
        if self._producer is not None:
            await asyncio.to_thread(self._producer.flush, 5)
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close)
        self._commit_pool.shutdown(wait=True)

    # ----------------------------------------------------------------------------------------
    # rounds
    # ----------------------------------------------------------------------------------------

    async def _pump(self) -> None:
        try:
            while not self._stopping:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=0.05)
                # the group-commit window: a commit follows the last one by at least
                # commit_interval, so what arrives meanwhile shares its transaction
                delay = self._last_commit + self._config.coordinator.commit_interval
                delay -= time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                self._wake.clear()
                for reader in self._all_readers():
                    if reader.error is not None:
                        raise BrokerError(f"reading queue topics failed: {reader.error}")
                await self._round()
        except BaseException as exc:
            self._failed = exc
            for fut in self._waiters:
                if not fut.done():
                    fut.set_exception(QLayerError("the coordinator failed; retry"))
            if not isinstance(exc, asyncio.CancelledError):
                log.critical("coordinator failed: %s", exc, exc_info=exc)
            raise

    async def _round(self) -> None:
        now = self._clock()
        now_ms = int(now * 1000)
        store = self._store
        local = StoreBatch()
        for rt in self._runtimes.values():
            if rt.admit(now, local) and rt.inbox:
                self._wake.set()  # more to admit: go round again at once
        if local:
            store.write(local)

        records: list[ChangelogRecord] = []
        extra: list[ExtraRecord] = []
        views: list[ExtraRecord] = []
        batch = StoreBatch()
        pushes: list[tuple[QueueRuntime, list[tuple[str, list[DeliveredMessage]]]]] = []
        for rt in self._runtimes.values():
            route = rt.route
            if route is not None and route.inbox:
                routed, copies = route.take(batch, now_ms)
                records.extend(routed)
                extra.extend(copies)
                if route.inbox:
                    self._wake.set()
            engine = rt.engine
            engine.tick(now)
            self.apply_backlogs(rt)
            engine.dispatch(now)
            effects = engine.drain()
            changes = rt.pending_changes + effects.changes
            rt.pending_changes = []
            if not changes and not effects.deliveries and not effects.view:
                continue
            name = rt.name
            need = [d.bookmark for d in effects.deliveries]
            dead = [c for c in changes if isinstance(c, Done) and c.reason.dead_letter]
            need.extend(c.bookmark for c in dead)
            payloads = rt.payloads(store, need) if need else {}
            for change in changes:
                key, value = encode_change(name, change, now_ms)
                records.append((rt.changelog_topic, key, value))
                self._apply(rt, change, value, batch, payloads, extra)
            if effects.view:
                assert rt.config.view_topic is not None
                views.append(view_record(rt.config.view_topic, name, effects.view, now_ms))
            if effects.deliveries:
                pushes.append((rt, self._materialize(rt, effects.deliveries, payloads)))
        waiters, self._waiters = self._waiters, []

        if records or extra or views:
            assert self._writer is not None
            loop = asyncio.get_running_loop()
            self._last_commit = time.monotonic()
            offsets = await loop.run_in_executor(
                self._commit_pool, self._writer.commit, records, extra, views
            )
            for (topic, partition), last in offsets.items():
                batch.set_changelog_offset(topic, partition, last + 1)
        if batch:
            store.write(batch)
        self.rounds += 1
        for rt, by_sub in pushes:
            for sub_id, messages in by_sub:
                sub = rt.subscriptions.get(sub_id)
                if sub is not None and not sub.closed:
                    sub.sink.deliver(messages)
                    rt.counters.delivered += len(messages)
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _apply(
        self,
        rt: QueueRuntime,
        change: Change,
        value: bytes | None,
        batch: StoreBatch,
        payloads: dict[Bookmark, StoredMessage | None],
        extra: list[ExtraRecord],
    ) -> None:
        """Mirror one committed change into the local store (the entry is the changelog value)."""
        name = rt.name
        if isinstance(change, Leased | Returned):
            assert value is not None
            batch.put_entry_value(name, change.bookmark, value)
        elif isinstance(change, Done):
            assert value is not None
            batch.put_entry_value(name, change.bookmark, value)
            batch.delete_message(name, change.bookmark)
            rt.payload_cache.pop(change.bookmark, None)
            if change.reason is DoneReason.ACKED:
                rt.counters.acked += 1
            if change.reason.dead_letter:
                rt.counters.dead_lettered += 1
                if rt.config.dead_letter_topic:
                    extra.append(self._dead_letter(rt, change, payloads.get(change.bookmark)))
        elif isinstance(change, LowWater):
            batch.put_low_water(name, change.partition, change.offset)
        elif isinstance(change, Forget):
            batch.delete_entry(name, change.bookmark)

    def _dead_letter(
        self, rt: QueueRuntime, change: Done, stored: StoredMessage | None
    ) -> ExtraRecord:
        bm = change.bookmark
        payload = stored.value if stored else None
        detail = stored.error if stored else None
        if payload is not None and len(payload) > DEAD_LETTER_PAYLOAD_MAX:
            # the envelope must fit the producer's message.max.bytes, or the transaction (and
            # the coordinator) would fail on this message again after every restart
            cut = f"payload cut from {len(payload)} to {DEAD_LETTER_PAYLOAD_MAX} bytes"
            detail = f"{detail}; {cut}" if detail else cut
            payload = payload[:DEAD_LETTER_PAYLOAD_MAX]
        envelope = {
            "queue": rt.name,
            "topic": bm.topic,
            "partition": bm.partition,
            "offset": bm.offset,
            "bookmark": str(bm),
            "key": stored.key if stored else None,
            "headers": [{"key": k, "value": v} for k, v in (stored.headers if stored else ())],
            "payload": payload,
            "reason": change.reason.value,
            "detail": detail,
            "deliveries": change.deliveries,
            "cancels": change.cancels,
            "message_timestamp_ms": stored.timestamp_ms if stored else 0,
            "dead_lettered_at_ms": int(change.at * 1000),
        }
        assert rt.config.dead_letter_topic is not None
        headers = [
            ("qlayer.reason", change.reason.value.encode()),
            ("qlayer.bookmark", str(bm).encode()),
        ]
        return (
            rt.config.dead_letter_topic,
            str(bm).encode(),
            encode("dead_letter", envelope),
            headers,
        )

    @staticmethod
    def _materialize(
        rt: QueueRuntime,
        deliveries: Sequence[Delivery],
        payloads: dict[Bookmark, StoredMessage | None],
    ) -> list[tuple[str, list[DeliveredMessage]]]:
        by_sub: dict[str, list[DeliveredMessage]] = defaultdict(list)
        for d in deliveries:
            stored = payloads.get(d.bookmark)
            if stored is None:  # cannot happen while the store is intact; never hand out a hole
                log.error("queue=%s bookmark=%s has no stored payload", rt.name, d.bookmark)
                continue
            by_sub[d.subscription].append(
                DeliveredMessage(
                    bookmark=d.bookmark,
                    key=stored.key,
                    value=stored.value,
                    headers=list(stored.headers),
                    timestamp_ms=stored.timestamp_ms,
                    deliveries=d.deliveries,
                    cancels=d.cancels,
                    lease_deadline_ms=int(d.deadline * 1000) if d.deadline is not None else None,
                    barrier=d.barrier,
                    queue=rt.name,
                )
            )
        return list(by_sub.items())

    # ----------------------------------------------------------------------------------------
    # QueueService
    # ----------------------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._failed is not None or self._stopping:
            raise QLayerError("the coordinator is stopping; reconnect")

    async def browse(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> list[DeliveredMessage]:
        self._check_alive()
        rt = self._runtime(queue)
        if limit is not None and limit < 0:
            raise InvalidRequest(f"limit must be >= 0, got {limit}")
        match = self._matcher(rt, filter)
        engine = rt.engine
        matching = (bm for bm in engine.available() if match is None or match(bm))
        chosen = list(itertools.islice(matching, limit))  # stops matching at the limit
        payloads = rt.payloads(self._store, chosen)  # one store read for all of them
        barriers = engine.barriers()
        out: list[DeliveredMessage] = []
        for bm in chosen:
            stored = payloads.get(bm)
            if stored is None:
                continue
            deliveries, cancels = engine.counts(bm)
            out.append(
                DeliveredMessage(
                    bookmark=bm,
                    key=stored.key,
                    value=stored.value,
                    headers=list(stored.headers),
                    timestamp_ms=stored.timestamp_ms,
                    deliveries=deliveries,
                    cancels=cancels,
                    lease_deadline_ms=None,
                    barrier=bm in barriers,
                    queue=queue,
                )
            )
        return out

    async def ack_where(self, queue: str, filter: str, expire: bool = False) -> AckWhereResult:
        """AMPS's sow_delete with a filter: every deliverable message (available or leased, not
        inactive) that matches; under strict leasing leased ones are skipped."""
        self._check_alive()
        rt = self._runtime(queue)
        match = self._matcher(rt, filter)
        assert match is not None
        engine = rt.engine
        candidates = [bm for bm in engine.available() + engine.leased() if match(bm)]
        op = AckOp.EXPIRE if expire else AckOp.ACK
        outcomes = engine.ack(None, candidates, op, self._clock())
        acked = sum(1 for o in outcomes if o.error is None)
        if acked:
            self._wake.set()
            assert self._loop is not None
            fut: asyncio.Future[None] = self._loop.create_future()
            self._waiters.append(fut)
            await fut
        return AckWhereResult(acked, len(outcomes) - acked)

    async def redrive(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> RedriveResult:
        """See ``layer.coordinator.redrive``; one redrive at a time, so none moves a letter
        another is moving."""
        self._check_alive()
        rt = self._runtime(queue)
        q = rt.config
        if q.dead_letter_topic is None:
            raise InvalidRequest(f"queue {queue!r} has no dead_letter_topic: nothing to redrive")
        try:
            target = q.publish_target
        except ConfigError as exc:
            raise InvalidRequest(str(exc)) from None
        expression = compile_expression(filter) if filter is not None else None
        if expression is not None and rt.exprs.reader is None:
            raise InvalidRequest(f"queue {queue!r} holds {q.message_type} messages: no filter")
        if limit is not None and limit < 0:
            raise InvalidRequest(f"limit must be >= 0, got {limit}")
        assert self._writer is not None
        async with self._redrive_lock:
            settings = consumer_settings(self._base_settings, self._profile)
            letters = await asyncio.to_thread(
                read_dead_letters, settings, q.dead_letter_topic, queue
            )
            done = {bm for bm, _ in self._store.entries(queue + REDRIVE_SUFFIX)}
            now_ms = int(self._clock() * 1000)
            records: list[ChangelogRecord] = []
            extra: list[ExtraRecord] = []
            batch = StoreBatch()
            already = unmatched = 0
            for letter, envelope in letters:
                if letter in done:
                    already += 1
                    continue
                if expression is not None:
                    assert rt.exprs.reader is not None
                    doc = rt.exprs.reader.read(envelope["payload"])[0]
                    if not expression.matches(doc):
                        unmatched += 1
                        continue
                if limit is not None and len(extra) >= limit:
                    break
                key, value = redriven_record(queue, letter, now_ms)
                records.append((rt.changelog_topic, key, value))
                extra.append(copy_of(target, letter, envelope))
                batch.put_entry_value(queue + REDRIVE_SUFFIX, letter, value)
            if records:
                loop = asyncio.get_running_loop()
                offsets = await loop.run_in_executor(
                    self._commit_pool, self._writer.commit, records, extra
                )
                for (topic, partition), last in offsets.items():
                    batch.set_changelog_offset(topic, partition, last + 1)
                self._store.write(batch)
        log.info(
            "queue=%s redrive filter=%r: moved=%d already=%d unmatched=%d",
            queue,
            filter,
            len(extra),
            already,
            unmatched,
        )
        return RedriveResult(len(extra), already, unmatched)

    async def publish(
        self,
        queue: str,
        value: bytes,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> Bookmark:
        self._check_alive()
        rt = self._runtime(queue)
        target = rt.config.publish_target
        if target is None:
            raise InvalidRequest(
                f"queue {queue!r} reads a topic pattern; set default_publish_target to publish"
            )
        assert self._loop is not None and self._producer is not None
        loop = self._loop
        fut: asyncio.Future[Bookmark] = loop.create_future()

        def delivered(err: object, msg: object) -> None:
            if err is not None:
                loop.call_soon_threadsafe(
                    _set_exception, fut, BrokerError(f"publish to {target!r} failed: {err}")
                )
            else:
                bm = Bookmark(msg.topic(), msg.partition(), msg.offset())  # type: ignore[attr-defined]
                loop.call_soon_threadsafe(_set_result, fut, bm)

        try:
            self._producer.produce(
                target, value=value, key=key, headers=list(headers) or None, on_delivery=delivered
            )
        except (KafkaException, BufferError) as exc:
            raise BrokerError(f"publish to {target!r} failed: {exc}") from exc
        return await fut

    def _poll_producer(self) -> None:
        assert self._producer is not None
        while not self._producer_stop.is_set():
            self._producer.poll(0.05)

    async def stats(self, queue: str | None = None) -> list[QueueStats]:
        names = [queue] if queue is not None else sorted(self._runtimes)
        now = self._clock()
        out = []
        for name in names:
            rt = self._runtime(name)
            s = rt.engine.stats(now)
            out.append(
                QueueStats(
                    queue=name,
                    available=s.available,
                    leased=s.leased,
                    # fetched but not admitted yet: within the engine's count once the
                    # fetch's high watermark is known (the same fetch brings both)
                    inactive=max(s.inactive, len(rt.inbox)),
                    subscriptions=s.subscriptions,
                    oldest_available_age_s=(
                        now - s.oldest_available_at if s.oldest_available_at is not None else None
                    ),
                    delivered_total=rt.counters.delivered,
                    acked_total=rt.counters.acked,
                    dead_lettered_total=rt.counters.dead_lettered,
                    extra={
                        "ingested_total": float(rt.counters.ingested),
                        "unparseable_total": float(rt.counters.unparseable),
                        "filtered_total": float(rt.counters.filtered),
                        "delayed": float(s.delayed),
                        "held": float(s.held),
                        "unread": float(max(s.unread, len(rt.inbox))),
                        "routed_total": float(rt.route.copied_total if rt.route else 0),
                        "rounds_total": float(self.rounds),
                        "stalled_subscriptions": float(
                            sum(sub.stalled for sub in rt.subscriptions.values())
                        ),
                        "fetch_wait_ms": float(
                            reader.fetch_wait_ms if (reader := self._readers.get(name)) else 0
                        ),
                    },
                )
            )
        return out

    def queues(self) -> list[QueueInfo]:
        return [
            QueueInfo(
                name=q.name,
                underlying_topic=q.underlying_topic,
                semantics=str(q.semantics),
                message_type=q.message_type,
                lease_period_s=q.lease_period,
                max_per_subscription_backlog=q.max_per_subscription_backlog,
                dead_letter_topic=q.dead_letter_topic,
                default_publish_target=q.default_publish_target,
            )
            for q in self._config.queues
        ]


def _set_result(fut: asyncio.Future[Bookmark], value: Bookmark) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Bookmark], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
