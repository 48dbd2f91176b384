"""The coordinator: wires queue engines to Kafka, RocksDB and the API.

One asyncio loop owns every engine. The coordinator is the wiring of its parts:

- ``Restore`` (``layer.coordinator.restore``) brings each queue back from its changelog;
- ``Rounds`` (``layer.coordinator.round``) runs the unit of work: admit fetched messages, tick
  and dispatch the engines, commit the round's changelog records and dead letters in one Kafka
  transaction, apply them to the store, and only then hand out deliveries and answer acks;
- ``Subscriptions`` (``layer.coordinator.subscriptions``) serves subscribe, replace, ack, close;
- the readers (``layer.coordinator.ingest``) feed each queue's inbox from its topics;
- ``Seat`` (``layer.coordinator.seat``) is its place in a cluster: the control partitions the
  group gives it, and so the queues it serves, the fences of their last owners, the standby
  copies, and who serves a queue that it does not.

Kafka may go away at any time, for any length of time (``layer.coordinator.outage``): the
start-up steps wait for it, a round's commit is done again until it is durable (so nothing is
handed out and no ack is answered before that), the readers keep their positions, and the API
keeps answering from memory; publishes fail fast while Kafka is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

from connectors.admin import TopicAdmin
from connectors.kafka import (
    BrokerProfile,
    client_settings,
    consumer_settings,
    producer_settings,
    with_client_logging,
)
from layer.api.service import (
    AckWhereResult,
    ClusterInfo,
    ClusterStats,
    DeadLetter,
    DeliveredMessage,
    DeliverySink,
    QueueDefinitionInfo,
    QueueInfo,
    QueueStats,
    RedriveResult,
    ReloadResult,
)
from layer.config import Config, QueueConfig, reread
from layer.coordinator.cluster_queues import ClusterQueues, info_of
from layer.coordinator.cluster_stats import gather_stats
from layer.coordinator.commits import CommitPool, Offsets
from layer.coordinator.definitions import DefinitionsLog
from layer.coordinator.health import Health
from layer.coordinator.ingest import Fetched, IngestReader
from layer.coordinator.outage import KafkaWatch, until_reachable
from layer.coordinator.partitioned import (
    browse_shards,
    dead_letters_of_shards,
    stats_of_shards,
)
from layer.coordinator.peers import Peers, peer_tls
from layer.coordinator.publish import Publisher
from layer.coordinator.publish_route import PublishRoute, routes_publishes
from layer.coordinator.redrive import REDRIVE_SUFFIX, move, read_dead_letters
from layer.coordinator.reload import ReloadPlan, plan
from layer.coordinator.replay import ReplayReader, start_points
from layer.coordinator.restore import KafkaSource, Restore
from layer.coordinator.round import Round, Rounds, RoundSignal, RoundTimings
from layer.coordinator.runtime import QueueRuntime, lookup
from layer.coordinator.seat import OUTAGE_MEMORY_S, Seat, writer_id
from layer.coordinator.snapshots import Snapshots
from layer.coordinator.stages import Stages
from layer.coordinator.subscriptions import SubscriptionHandle, Subscriptions
from layer.coordinator.topics import check_view_topic, needed_topics
from layer.coordinator.view_history import ViewHistory
from layer.definitions import Write, toml_literal
from layer.documents import DocumentReader
from layer.engine.model import AckOp, Bookmark
from layer.exceptions import (
    ConfigError,
    ConnectionLost,
    InvalidRequest,
    PartitionedQueue,
    QLayerError,
    QueueBusy,
    QueueRemoved,
    StateError,
)
from layer.expr import Expression, Record, compile_expression
from layer.shards import expand
from layer.state.base import Store
from layer.state.changelog import ChangelogWriter, DurableChangelog

if TYPE_CHECKING:
    from confluent_kafka import Message

log = logging.getLogger(__name__)

REPLAY_THREADS = 8  # replays reading at once; more wait their turn a batch at a time

T = TypeVar("T")


class Coordinator:
    """Implements ``layer.api.service.QueueService`` over Kafka topics."""

    def __init__(
        self,
        config: Config,
        store: Store,
        bootstrap_servers: str,
        profile: BrokerProfile,
        clock: Callable[[], float] = time.time,
        progress: Callable[[str], None] | None = None,
        health: Health | None = None,
        reread: Callable[[Config], Config] = reread,
        timings: RoundTimings | None = None,
    ) -> None:
        self.health = health or Health()
        self._config = config
        self._reread = reread  # reads the config file again for a reload
        self._store = store
        self._clock = clock
        self._profile = profile
        self._progress = progress or (lambda line: log.info("%s", line))
        self._base_settings = with_client_logging(
            client_settings(bootstrap_servers, dict(config.broker.kafka))
        )
        self._interrupt = threading.Event()  # set when stopping: a waiting commit gives up
        self._kafka_changed_at: float | None = None
        self._watch = KafkaWatch(self._base_settings, self.health, on_change=self._kafka_changed)
        self._durable = DurableChangelog(
            self._new_writer,
            wait_reachable=self._watch.wait_reachable,
            on_trouble=self._watch.suspect,
            interrupt=self._interrupt,
            # in a cluster a fenced writer is not replaced, a failed one only once no other
            # member claimed what this one may commit for (``DurableChangelog``)
            replace_failed=config.coordinator.cluster is None,
            confirm_replacement=lambda: self._seat.confirm_replacement(),
            on_dead=self._writer_dead,
        )
        self._changelog = CommitPool(self._durable)
        self._publisher = Publisher(self._base_settings, self._watch)
        self._runtimes: dict[str, QueueRuntime] = {}
        self._readers: dict[str, IngestReader] = {}
        self._stopping = False
        self._signal = RoundSignal()
        self._snapshots = Snapshots(
            store,
            every=config.coordinator.snapshot_every,
            interval=config.coordinator.snapshot_interval,
            clock=time.monotonic,
        )
        self._subscriptions = Subscriptions(
            self._runtimes,
            store,
            clock=clock,
            wake=self._signal.wake,
            next_commit=self._signal.next_commit,
            check_alive=self._check_alive,
            instance=uuid.uuid4().hex[:8],
            check_served=self.check_served,
        )
        self._rounds = Rounds(
            self._runtimes,
            store,
            self._changelog,
            self._signal,
            clock=clock,
            before_dispatch=self._subscriptions.apply_backlogs,
            readers=self._all_readers,
            commit_interval=config.coordinator.commit_interval,
            interrupt=self._interrupt,
            snapshots=self._snapshots,
            timings=timings,
        )
        self._views = ViewHistory(
            TopicAdmin(self._base_settings), consumer_settings(self._base_settings, profile)
        )
        self._restore = Restore(
            store,
            KafkaSource(consumer_settings(self._base_settings, profile)),
            self._changelog,
            changelog_topic=config.coordinator.changelog_topic,
            until_reachable=self.until_reachable,
            clock=clock,
            progress=self._progress,
            health=self.health,
            views=self._views,
        )
        self._pump_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._redrive_lock = asyncio.Lock()
        self.reload_lock = asyncio.Lock()  # one reload at a time, and none while stopping
        self._reload_tasks: set[asyncio.Task[None]] = set()  # reloads started by SIGHUP
        self._replays: set[asyncio.Future[None]] = set()  # replay consumers being closed
        # replays read on threads of their own: many following clients never hold up the
        # default executor's work (reader stops, dead-letter scans)
        self._replay_pool = ThreadPoolExecutor(REPLAY_THREADS, thread_name_prefix="replay")
        # the cluster's queue definitions (layer.definitions): the topic reduced, its reader
        # and writer, and the writers waiting to read their own change back
        self._cluster: ClusterQueues | None = None
        self._temporary_task: asyncio.Task[None] | None = None
        self._converging: asyncio.Task[None] | None = None
        self._defs_dirty = False  # records reduced that _converge has not applied yet
        c = config.coordinator
        self._peers = Peers(c.admin_token or c.auth_token, tls=peer_tls(c))
        # which queues this member serves, in a cluster (``[coordinator] cluster``)
        self._seat = Seat(self, c, self._base_settings, profile, store, self._peers)

    @property
    def rounds(self) -> int:
        """Rounds completed."""
        return self._rounds.count

    # ----------------------------------------------------------------------------------------
    # life cycle
    # ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the topics, restore every queue and start serving. Waits for Kafka (saying
        so once) as long as it is unreachable; raises only for errors Kafka answers with."""
        self._loop = asyncio.get_running_loop()
        cfg = self._config
        self.health.restoring("waiting for Kafka")
        # probes ask for one topic's metadata (a small answer on a broker with many topics)
        first = cfg.queues[0].name if cfg.queues else None
        self._watch.start(cfg.coordinator.changelog_topic(first) if first else None)
        self._cluster = ClusterQueues(
            cfg.coordinator,
            DefinitionsLog(
                cfg.coordinator.definitions_topic,
                self._base_settings,
                consumer_settings(self._base_settings, self._profile),
                producer_settings(self._base_settings),
            ),
            self._clock,
        )
        # the queues served are the definitions topic's, once the file's changes are in it
        # (in a cluster: those the group gives this member, none until it joins)
        defined = await self._cluster.open(cfg, self.until_reachable)
        served = expand(defined)  # a partitioned queue as its shards (layer.shards)
        owned = tuple(q for q in served if self._seat.owns(q.name))
        cfg = self._config = replace(cfg, queues=owned)
        await self._ensure_topics(cfg.queues)
        # The writer comes first: initialising its transactions fences a killed predecessor and
        # aborts its open transaction, which a read_committed restore would otherwise wait on.
        await self.until_reachable("start the changelog writer", self._durable.open)
        for q in cfg.queues:
            self._runtimes[q.name] = await self._restore.queue(q, starting=True)
        self.health.restored()
        self._publisher.start()
        for rt in self._runtimes.values():
            self._serve_queue(rt)
        self._pump_task = asyncio.create_task(self._rounds.run(), name="coordinator-pump")
        self._cluster.tail(self._loop, self._definitions_changed)
        self._temporary_task = asyncio.create_task(self._watch_temporary(), name="temporary")

    async def _ensure_topics(self, queues: Sequence[QueueConfig]) -> None:
        """Create the topics these queues need and are missing (waiting for Kafka if away)."""
        cfg = self._config
        admin = TopicAdmin(self._base_settings)
        specs = needed_topics(cfg, queues)
        await self.until_reachable("create the topics", lambda: admin.ensure_topics(specs))
        for q in queues:
            if q.view_topic:
                topic_config = await self.until_reachable(
                    "read the view topic's config", partial(admin.topic_config, q.view_topic)
                )
                check_view_topic(cfg, q, topic_config)

    def _serve_queue(self, rt: QueueRuntime) -> None:
        """Start reading a restored queue's topics (and routing its publishes)."""
        rt.stages = Stages()
        self._readers[rt.name] = self._start_reader(rt)
        if routes_publishes(rt.config):
            self._start_route(rt)

    def _new_writer(self) -> ChangelogWriter:
        return ChangelogWriter(
            producer_settings(self._base_settings),
            writer_id(self._config.coordinator),
            patient=True,
            interrupt=self._interrupt,
        )

    async def until_reachable(self, what: str, step: Callable[[], T]) -> T:
        return await until_reachable(self._watch, what, step, self._progress)

    def _kafka_changed(self, reachable: bool) -> None:
        """The watch's verdict changed (its thread): publishes waiting on Kafka fail now."""
        self._kafka_changed_at = time.monotonic()
        if not reachable and self._loop is not None:
            self._loop.call_soon_threadsafe(self._publisher.fail_waiting)

    def outage_lately(self) -> bool:
        """(Blocking: a probe.) Whether Kafka is unreachable now or was within the last
        ``OUTAGE_MEMORY_S``: what tells a member evicted by an outage (every member's session
        ran out) from one evicted because it stopped (a pause past its session)."""
        if not self._watch.probe():
            return True
        changed = self._kafka_changed_at
        return changed is not None and time.monotonic() - changed < OUTAGE_MEMORY_S

    # ----------------------------------------------------------------------------------------
    # what the seat in the cluster asks (``layer.coordinator.seat.SeatHost``)
    # ----------------------------------------------------------------------------------------

    def current_config(self) -> Config:
        return self._config

    def cluster_queues(self) -> ClusterQueues | None:
        return self._cluster

    def serves(self, queue: str) -> bool:
        return queue in self._runtimes

    def failed(self) -> bool:
        return self._rounds.failed is not None

    def stopping(self) -> bool:
        return self._stopping

    def give_up(self, error: StateError) -> None:
        """Stop serving: a commit waiting on Kafka gives up, the rounds fail with ``error``
        and the process exits (a supervisor starts it again)."""
        self._interrupt.set()
        self._writer_dead(error)

    # ----------------------------------------------------------------------------------------
    # the queues' readers
    # ----------------------------------------------------------------------------------------

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
            on_trouble=self._watch.suspect,
            partition=q.shard,
            partitions=q.partitions,
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

        settings = consumer_settings(self._base_settings, self._profile)
        route.start(self._store, settings, on_batch, self._watch.suspect)

    def _on_routed(self, route: PublishRoute, fetched: Fetched) -> None:
        route.inbox.extend(fetched.messages)
        self._signal.wake()

    def _on_fetched(self, rt: QueueRuntime, fetched: Fetched) -> None:
        rt.take_fetched(fetched)
        self._signal.wake()

    def record_stage(self, queue: str, stage: str, seconds: float, messages: int) -> None:
        """A latency stage the API timed (the push: ``layer.coordinator.stages``)."""
        rt = self._runtimes.get(queue)
        if rt is not None and rt.stages is not None:
            rt.stages.add(stage, seconds, messages)

    def _all_readers(self) -> list[IngestReader]:
        readers = list(self._readers.values())
        readers.extend(
            rt.route.reader for rt in self._runtimes.values() if rt.route and rt.route.reader
        )
        return readers

    # ----------------------------------------------------------------------------------------
    # serving, alone or in a cluster (``layer.coordinator.seat``)
    # ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until ``stop()``; raises if the coordinator failed (the process should exit)."""
        assert self._pump_task is not None
        await self._pump_task

    async def join(self, address: str, timeout: float = 30.0) -> None:
        """In a cluster: advertise ``address`` (this member's API), join the group and wait
        (at most ``timeout``) for its first assignment (``Seat.join``). Alone: nothing."""
        await self._seat.join(address, timeout)

    async def leaving(self) -> None:
        """A graceful stop, while the API still serves: leave the cluster, handing its queues
        over, so the clients of the queues follow them at once instead of after the API's
        stop (``Seat.leaving``)."""
        await self._seat.leaving()

    async def deliverable(self) -> bool:
        """Whether messages this coordinator pushes may be written now (the API awaits it,
        ``Seat.deliverable``)."""
        return await self._seat.deliverable()

    async def current_since(self, made_at: float) -> bool:
        """Whether messages this coordinator decided to push at ``made_at``
        (``time.monotonic``) are still its to deliver (``Seat.current_since``)."""
        return await self._seat.current_since(made_at)

    def stale_after_s(self) -> float:
        """How old a pushed frame must be to be asked about (``Seat.stale_after_s``)."""
        return self._seat.stale_after_s()

    async def cluster_info(self) -> ClusterInfo:
        """The metadata call: the members and the owner of each queue
        (``Seat.cluster_info``)."""
        return await self._seat.cluster_info(list(self._runtimes))

    async def stop(self) -> None:
        self._seat.stop_evictions()
        await self._seat.leave()
        await self._seat.close()
        self._stopping = True
        self._interrupt.set()
        self.health.stopping()
        self._rounds.stop()
        async with self.reload_lock:  # a reload under way finishes first (its readers too)
            pass
        if self._pump_task is not None:
            with contextlib.suppress(BaseException):  # already logged; stopping anyway
                await self._pump_task
        for rt in self._runtimes.values():
            for sub in list(rt.subscriptions.values()):
                sub.sink.close("coordinator stopping")
        for reader in self._all_readers():
            await asyncio.to_thread(reader.stop)
        await self._publisher.stop()
        if self._replays:
            await asyncio.gather(*self._replays, return_exceptions=True)
        self._replay_pool.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self._durable.close)
        if self._temporary_task is not None:
            self._temporary_task.cancel()
        if self._cluster is not None:
            await asyncio.to_thread(self._cluster.close)
        self._changelog.shutdown()
        self._views.close()
        await self._peers.close()
        await asyncio.to_thread(self._watch.stop)

    # ----------------------------------------------------------------------------------------
    # QueueService
    # ----------------------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._rounds.failed is not None or self._stopping:
            # UNAVAILABLE on the wire: a client reconnects (to this one restarted, or another)
            raise ConnectionLost("the coordinator is stopping; reconnect")

    async def subscribe(
        self,
        queue: str,
        max_backlog: int,
        sink: DeliverySink,
        client: str = "",
        filter: str | None = None,
    ) -> SubscriptionHandle:
        self.check_served(queue)
        return await self._subscriptions.subscribe(queue, max_backlog, sink, client, filter)

    async def browse(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> list[DeliveredMessage]:
        self._check_alive()
        _check_limit(limit)
        if shards := self._shards(queue):
            return await browse_shards(
                shards, lambda shard: self.browse(shard, filter, limit), limit
            )
        owner = await self._seat.owner_settled(queue)
        if owner is not None:
            return await self._peers.browse(owner, queue, filter, limit)
        rt = self._lookup(queue)
        match = self._subscriptions.matcher(rt, filter)
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
                    parse_error=stored.error,
                )
            )
        return out

    async def ack_where(self, queue: str, filter: str, expire: bool = False) -> AckWhereResult:
        """AMPS's sow_delete with a filter: every deliverable message (available or leased, not
        inactive) that matches; under strict leasing leased ones are skipped."""
        self._check_alive()
        rt = self._lookup(queue)
        match = self._subscriptions.matcher(rt, filter)
        assert match is not None
        engine = rt.engine
        candidates = [bm for bm in engine.available() + engine.leased() if match(bm)]
        op = AckOp.EXPIRE if expire else AckOp.ACK
        outcomes = engine.ack(None, candidates, op, self._clock())
        acked = sum(1 for o in outcomes if o.error is None)
        if acked:
            self._signal.wake()
            await self._signal.next_commit()
        return AckWhereResult(acked, len(outcomes) - acked)

    async def redrive(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> RedriveResult:
        """See ``layer.coordinator.redrive``; one redrive at a time, so none moves a letter
        another is moving."""
        self._check_alive()
        rt = self._lookup(queue)
        q = rt.config
        if q.dead_letter_topic is None:
            raise InvalidRequest(f"queue {queue!r} has no dead_letter_topic: nothing to redrive")
        try:
            target = q.publish_target
        except ConfigError as exc:
            raise InvalidRequest(str(exc)) from None
        matches = _letter_filter(rt, filter)
        _check_limit(limit)
        if not self._watch.reachable:
            raise self._watch.unreachable_error(f"redrive of queue {queue!r}")
        async with self._redrive_lock:
            settings = consumer_settings(self._base_settings, self._profile)
            letters = await asyncio.to_thread(
                read_dead_letters, settings, q.dead_letter_topic, queue
            )
            with self._snapshots.hold(queue):
                result = await move(
                    letters,
                    queue=queue,
                    changelog_topic=rt.changelog_topic,
                    target=target,
                    matches=matches,
                    limit=limit,
                    store=self._store,
                    changelog=self._changelog,
                    now_ms=int(self._clock() * 1000),
                )
        rt.counters.redriven += result.moved
        log.info(
            "queue=%s redrive filter=%r: moved=%d already=%d unmatched=%d",
            queue,
            filter,
            result.moved,
            result.already,
            result.unmatched,
        )
        return result

    async def dead_letters(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        """Read the queue's dead-letter topic from the start (``read_dead_letters``): a scan of
        the topic per call, for operators, not for a hot path."""
        self._check_alive()
        if shards := self._shards(queue):
            return await dead_letters_of_shards(
                shards, lambda shard: self.dead_letters(shard, filter, limit), limit
            )
        owner = await self._seat.owner_settled(queue)
        if owner is not None:
            return await self._peers.dead_letters(owner, queue, filter, limit)
        rt = self._lookup(queue)
        topic = rt.config.dead_letter_topic
        if topic is None:
            raise InvalidRequest(f"queue {queue!r} has no dead_letter_topic")
        matches = _letter_filter(rt, filter)
        _check_limit(limit)
        if not self._watch.reachable:
            raise self._watch.unreachable_error(f"reading the dead letters of queue {queue!r}")
        settings = consumer_settings(self._base_settings, self._profile)
        letters = await asyncio.to_thread(read_dead_letters, settings, topic, queue)
        redriven = {bm for bm, _ in self._store.entries(queue + REDRIVE_SUFFIX)}
        out: list[DeadLetter] = []
        for where, env in letters:
            if limit is not None and len(out) >= limit:
                break
            if matches is not None and not matches(env):
                continue
            out.append(
                DeadLetter(
                    bookmark=str(where),
                    original=env["bookmark"],
                    reason=env["reason"],
                    detail=env["detail"],
                    deliveries=env["deliveries"],
                    cancels=env["cancels"],
                    key=env["key"],
                    payload=env["payload"],
                    headers=[(h["key"], h["value"]) for h in env["headers"]],
                    message_timestamp_ms=env["message_timestamp_ms"],
                    dead_lettered_at_ms=env["dead_lettered_at_ms"],
                    redriven=where in redriven,
                )
            )
        return out

    async def publish(
        self,
        queue: str,
        value: bytes,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> Bookmark:
        self._check_alive()
        if shards := self._shards(queue):
            # any shard publishes to the topic, whose partitioner picks the partition by key
            return await self.publish(shards[0], value, key, headers)
        owner = await self._seat.owner_settled(queue)
        if owner is not None:
            return await self._peers.publish(owner, queue, value, key, list(headers))
        rt = self._lookup(queue)
        try:
            target = rt.config.publish_target
        except ConfigError as exc:  # a regex queue without default_publish_target
            raise InvalidRequest(f"{exc}; set it to publish through the queue") from None
        reader = rt.exprs.checker
        if reader is not None:
            error = reader.read(value)[1]
            if error is not None:
                raise InvalidRequest(
                    f"queue {queue!r} holds {rt.config.message_type} messages: "
                    f"publish refused, {error}"
                )
        return await self._publisher.publish(target, value, key, headers)

    async def replay(
        self,
        queue: str,
        since_bookmarks: Sequence[str] = (),
        since_ms: int | None = None,
        until_ms: int | None = None,
        follow: bool = False,
        filter: str | None = None,
    ) -> AsyncIterator[list[DeliveredMessage]]:
        """See ``layer.coordinator.replay``: batches of the queue's topics' records, read by a
        consumer of the replay's own; the queue's runtime is only looked at, never changed."""
        self._check_alive()
        rt = self._lookup(queue)
        config = rt.config
        if since_bookmarks and since_ms is not None:
            raise InvalidRequest("replay: give since bookmarks or a since time, not both")
        starts = start_points(config, since_bookmarks)
        expression = compile_expression(filter) if filter is not None else None
        checker = rt.exprs.checker
        if expression is not None and checker is None and expression.uses_document:
            raise InvalidRequest(
                f"queue {queue!r} holds {config.message_type} messages: a replay filter reads"
                " only the Kafka record there (KEY(), HEADER('name'), ...), not field paths"
            )
        if not self._watch.reachable:
            raise self._watch.unreachable_error(f"replay of queue {queue!r}")
        uses_record = expression is not None and expression.uses_record

        def keep(msg: Message) -> tuple[bool, str | None]:
            doc: object = None
            error: str | None = None
            if checker is not None:
                doc, error = checker.read(msg.value())
            if expression is None:
                return True, error
            record = None
            if uses_record:
                headers = tuple(cast(list[tuple[str, bytes | None]], msg.headers() or []))
                ts = msg.timestamp()[1]
                stamp = ts if ts > 0 else 0
                record = Record(msg.key(), headers, stamp, msg.topic(), msg.partition())
            return error is None and expression.matches(doc, None, record), error

        reader = ReplayReader(
            consumer_settings(self._base_settings, self._profile),
            config,
            starts=starts,
            since_ms=since_ms,
            until_ms=until_ms,
            follow=follow,
            keep=keep,
        )
        loop = asyncio.get_running_loop()
        pool = self._replay_pool
        try:
            await loop.run_in_executor(pool, reader.open)
            while not self._stopping:
                batch = await loop.run_in_executor(pool, reader.next_batch)
                if batch is None:
                    return
                if batch:
                    yield batch
        finally:
            # the client went away (or it ended): close once a read in progress returns
            closing = loop.run_in_executor(pool, reader.close)
            self._replays.add(closing)
            closing.add_done_callback(self._replays.discard)

    async def stats(self, queue: str | None = None) -> list[QueueStats]:
        """Of one queue (forwarded to its owner in a cluster; a partitioned one summed over its
        shards), or of those served here."""
        if queue is not None and (shards := self._shards(queue)):
            return await stats_of_shards(queue, shards, self.stats)
        owner = None if queue is None else await self._seat.owner_settled(queue)
        if owner is not None:
            assert queue is not None
            return await self._peers.stats(owner, queue)
        names = [queue] if queue is not None else sorted(self._runtimes)
        now = self._clock()
        out = []
        me = self._seat.member_id
        for name in names:
            reader = self._readers.get(name)
            fetch_wait_ms = reader.fetch_wait_ms if reader else 0
            figures = self._lookup(name).stats(now, self.rounds, fetch_wait_ms)
            out.append(replace(figures, owner=me) if me else figures)
        return out

    async def cluster_stats(self) -> ClusterStats:
        """Stats of every queue of the cluster: those served here, and each other one asked of
        its owner as a named queue's are (``layer.coordinator.cluster_stats``); alone, those
        served here."""
        local = await self.stats()
        membership, cluster = self._seat.membership, self._cluster
        if membership is None or cluster is None:
            return ClusterStats(local)
        served = sorted(q.name for q in cluster.served())
        elsewhere = [q for q in served if q not in self._runtimes]
        return await gather_stats(local, elsewhere, membership.map, self._peers)

    def subscriptions_of(self, queue: str, leases: int = 100) -> list[dict[str, object]]:
        """The web console's view of a queue's subscriptions, each with up to ``leases`` of
        the messages it holds (read-only)."""
        if shards := self._shards(queue):  # a partitioned queue: its shards served here
            return [
                {**sub, "queue": shard}
                for shard in shards
                if shard in self._runtimes
                for sub in self.subscriptions_of(shard, leases)
            ]
        if self._seat.owner_elsewhere(queue) is not None:
            return []  # listed by the member serving it (``subscribers_elsewhere``)
        rt = self._lookup(queue)
        out: list[dict[str, object]] = []
        for sub in rt.subscriptions.values():
            held = rt.engine.leases_of(sub.id, leases)
            out.append(
                {
                    "id": sub.id,
                    "client": sub.client,
                    "backlog": sub.backlog,
                    "filter": sub.filter,
                    "stalled": sub.stalled,
                    "leases": [
                        {"bookmark": str(bm), "deadline": deadline, "deliveries": deliveries}
                        for bm, deadline, deliveries in held
                    ],
                }
            )
        return out

    def subscribers_elsewhere(self, queue: str) -> list[str]:
        """The members (``id at address``) serving ``queue``, or shards of it, other than this
        one: the web console lists only the subscriptions held here."""
        membership = self._seat.membership
        if membership is None:
            return []
        names = self._shards(queue) or [queue]
        owners = (membership.map.owner_of(name) for name in names if name not in self._runtimes)
        return sorted(
            {f"{o.id} at {o.address}" for o in owners if o and o.id != membership.member.id}
        )

    def queue_config(self, queue: str) -> QueueConfig:
        """The configuration of a queue served here, or (in a cluster) as defined for it."""
        rt = self._runtimes.get(queue)
        if rt is not None:
            return rt.config
        if self._cluster is not None:
            defined = self._cluster.definitions.queues.get(queue)
            if defined is not None:
                return defined
        return self._lookup(queue).config

    def queues(self) -> list[QueueInfo]:
        served = self._config.queues
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
            # in a cluster: every queue of it (stats, browse, publish are forwarded); a
            # partitioned queue once, not its shards
            for q in (
                self._cluster.defined()
                if self._cluster is not None
                and (self._seat.clustered or any(q.shard is not None for q in served))
                else served
            )
        ]

    # ----------------------------------------------------------------------------------------
    # queue definitions (layer.coordinator.cluster_queues): the cluster's queues, in Kafka
    # ----------------------------------------------------------------------------------------

    def _definitions_changed(self) -> None:
        """The tail reduced new records (the loop): apply them once the lock is free."""
        self._defs_dirty = True
        if self._converging is None or self._converging.done():
            self._converging = asyncio.get_running_loop().create_task(self._converge())

    async def _converge(self) -> None:
        """Apply the topic's definitions until no batch came in meanwhile."""
        while self._defs_dirty and not self._stopping:
            self._defs_dirty = False
            try:
                async with self.reload_lock:
                    if not self._stopping:
                        await self.apply_definitions("changed in the definitions topic")
            except Exception:
                log.exception("applying the definitions topic failed")

    async def apply_definitions(self, reason: str, source: str | None = None) -> ReloadResult:
        """Bring the running queues to the topic's definitions (holding the reload lock). A queue
        whose new definition changes a fixed option keeps its running one (logged): only a
        definition written by another path (another version, by hand) can do that, as create,
        alter and reload refuse such a change before writing it. ``source`` names the file of a
        reload in the summary; None: the topic."""
        assert self._cluster is not None
        topic = self._config.coordinator.definitions_topic
        file_source = self._config.source  # the running config's stays its file's
        desired = replace(self._config, queues=self._defined(), source=source or f"topic {topic}")
        the_plan = plan(self._config, desired)
        if not the_plan.empty:
            kept = {q.name: q for q in self._config.queues if q.name in the_plan.refused_queues}
            applied = replace(desired, queues=tuple(kept.get(q.name, q) for q in desired.queues))
            await self._apply_plan(the_plan, applied, reason)
            self._config = replace(self._config, source=file_source)
        ended = self._cluster.take_ended_temporary() - set(self._runtimes)
        standby = self._seat.standby
        if standby is not None:
            # a copy of a deleted queue stops before its state and changelog topic go (a
            # consumer assigned a deleted topic crashed librdkafka on the embedded broker)
            self._seat.want_standbys()
            await standby.release(ended, unassigned=True)
        if ended:
            try:
                await self._discard_state(ended)
            except QLayerError as exc:
                log.warning("the changelog of deleted temporary queues stays: %s", exc)
        for r in the_plan.refused:
            log.error(
                "%s: option %r of the definitions topic (%s -> %s) not applied while it serves: %s",
                r.where,
                r.option,
                r.old,
                r.new,
                r.reason,
            )
        result = replace(the_plan.result(applied=True), refused=[])
        if not the_plan.empty or source is not None:  # a reload says so even when empty
            for line in result.lines():
                log.info("%s", line, extra={"source": desired.source})
        return result

    async def _write_and_apply(
        self, writes: Sequence[Write], reason: str, source: str | None = None
    ) -> ReloadResult:
        """Write records to the topic, wait until they are read back, apply (holding the reload
        lock)."""
        assert self._cluster is not None
        if not self._watch.reachable:
            raise self._watch.unreachable_error("changing the queue definitions")
        await self._cluster.write(writes)
        return await self.apply_definitions(reason, source)

    def definitions(self) -> list[QueueDefinitionInfo]:
        """The cluster's queue definitions, as the topic has them (the list call)."""
        return [] if self._cluster is None else self._cluster.infos()

    async def create_queue(self, options: Mapping[str, str], by: str) -> QueueDefinitionInfo:
        """A new queue for the whole cluster (``ConfigError`` as the file's, ``QueueExists``)."""
        cluster = self._check_serving()
        async with self.reload_lock:
            self._check_alive()
            d = cluster.create(options, by)
            await self._write_and_apply([Write.of(d)], f"created by {by}")
            return info_of(d)

    async def create_temporary_queue(
        self, name: str, options: Mapping[str, str], by: str
    ) -> QueueDefinitionInfo:
        """A temporary queue, watched by the member serving it: deleted with its state once no
        subscription has been open on it for ``temporary_queue_grace``."""
        cluster = self._check_serving()
        async with self.reload_lock:
            self._check_alive()
            d = cluster.create({**options, "name": toml_literal(name)}, by, temporary=True)
            await self._write_and_apply([Write.of(d)], f"created by {by}")
            return info_of(d)

    async def _watch_temporary(self) -> None:
        """Delete, with its state, each temporary queue served here once no subscription has
        been open on it for the grace period. In a cluster the member serving a queue watches
        it, whichever member created it; a queue that moves starts its grace again on its new
        owner (its client follows it there)."""
        grace = self._config.coordinator.temporary_queue_grace
        idle: dict[str, float] = {}  # queue -> when it was last seen without a subscription
        while not self._stopping:
            await asyncio.sleep(min(1.0, grace / 4))
            if self._cluster is None:
                continue
            now = time.monotonic()
            watched = self._cluster.temporary()
            for name in list(idle):
                if name not in watched:
                    del idle[name]
            for name in watched:
                rt = self._runtimes.get(name)
                if rt is None or rt.subscriptions:
                    idle.pop(name, None)
                elif now - idle.setdefault(name, now) >= grace:
                    del idle[name]
                    try:
                        await self._end_temporary(name, grace)
                    except QLayerError as exc:  # Kafka away: tried again after a grace
                        log.warning("temporary queue=%s not deleted yet: %s", name, exc)
                    except Exception:
                        log.exception("temporary queue=%s not deleted yet", name)

    async def _end_temporary(self, name: str, grace: float) -> None:
        async with self.reload_lock:
            rt = self._runtimes.get(name)
            if self._stopping or rt is None or rt.subscriptions:
                return  # its client came back meanwhile
            reason = f"deleted: a temporary queue with no subscription for {grace:g}s"
            await self._write_and_apply([Write.delete(name)], reason)

    def _discard_state(self, names: set[str]) -> Awaitable[None]:
        """The state of deleted temporary queues goes: the local store's and the changelog
        topic (a temporary queue's name is not meant to come back)."""
        for name in names:
            self._store.wipe_queue(name)
        topics = [self._config.coordinator.changelog_topic(name) for name in names]
        admin = TopicAdmin(self._base_settings)
        log.info("temporary queues deleted with their state: %s", ", ".join(sorted(names)))
        return asyncio.to_thread(admin.delete_topics, topics)

    async def alter_queue(
        self, name: str, options: Mapping[str, str], by: str
    ) -> QueueDefinitionInfo:
        """New values of a queue's options; one that cannot change live is refused (nothing
        changes), with the reason."""
        cluster = self._check_serving()
        async with self.reload_lock:
            self._check_alive()
            d = cluster.alter(name, options, by)
            await self._write_and_apply([Write.of(d)], f"altered by {by}")
            return info_of(d)

    async def delete_queue(self, name: str, force: bool, by: str) -> None:
        """Delete a queue for the whole cluster; refused while messages are leased unless
        ``force`` (``QueueBusy``)."""
        cluster = self._check_serving()
        async with self.reload_lock:
            self._check_alive()
            cluster.queue(name)
            here = [self._runtimes.get(n) for n in cluster.shards(name) or [name]]
            now = self._clock()
            leased = sum(rt.stats(now, 0, 0).leased for rt in here if rt is not None)
            if leased and not force:
                raise QueueBusy(
                    f"queue {name!r} has {leased} leased message(s): their acks would be"
                    " refused; delete it with force once its consumers are done (or anyway)"
                )
            await self._write_and_apply([Write.delete(name)], f"deleted by {by}")

    # ----------------------------------------------------------------------------------------
    # the cluster (layer.coordinator.membership): which queues this member serves
    # ----------------------------------------------------------------------------------------

    def _shards(self, queue: str) -> list[str]:
        """The shards of ``queue`` when it is partitioned (``layer.shards``), else empty."""
        return [] if self._cluster is None else self._cluster.shards(queue)

    def _defined(self) -> tuple[QueueConfig, ...]:
        """The queues this member is to serve: the topic's, those it owns in a cluster."""
        assert self._cluster is not None
        return tuple(q for q in self._cluster.served() if self._seat.owns(q.name))

    def _lookup(self, queue: str) -> QueueRuntime:
        """The runtime of a queue served here; ``NotOwner`` naming the member that serves a
        queue of the cluster this one does not, ``UnknownQueue`` otherwise."""
        rt = self._runtimes.get(queue)
        if rt is not None:
            return rt
        cluster = self._cluster
        if cluster is not None and (shards := cluster.shards(queue)):
            raise PartitionedQueue(
                f"queue {queue!r} is partitioned into {len(shards)} shards ({shards[0]} .."
                f" {shards[-1]}): name a shard (a subscription opens one stream per shard, as"
                " the Python client does)"
            )
        if self._seat.clustered and cluster is not None and cluster.is_served(queue):
            raise self._seat.not_owner(queue)
        return lookup(self._runtimes, queue)

    def check_served(self, queue: str) -> None:
        """``NotOwner`` for a queue of the cluster another member serves (subscribe's check;
        a regex subscription takes the queues served here)."""
        if not queue.startswith("^"):
            self._lookup(queue)

    def _writer_dead(self, exc: StateError) -> None:
        """The changelog writer was fenced (or failed) and is not replaced (a cluster member):
        whichever path found it (a round, a handover, a reload), the rounds fail, so the
        process exits (leaving the group) instead of serving on with nothing durable."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._rounds.fail, exc)

    def _check_serving(self) -> ClusterQueues:
        self._check_alive()
        if self._pump_task is None or self._cluster is None:
            raise QLayerError("the coordinator is still starting: try again once it serves")
        return self._cluster

    # ----------------------------------------------------------------------------------------
    # live configuration (the plan: layer.coordinator.reload)
    # ----------------------------------------------------------------------------------------

    async def reload(self) -> ReloadResult:
        """Read the config file again and apply it, all or nothing; the summary is logged.
        ``ConfigError`` for a file that does not load (nothing changes)."""
        self._check_alive()
        if self._pump_task is None:
            raise QLayerError("the coordinator is still starting: reload once it serves")
        async with self.reload_lock:
            self._check_alive()
            source = self._config.source
            assert self._cluster is not None
            try:
                new = await asyncio.to_thread(self._reread, self._config)
                self._cluster.check_file(new)  # a cluster's view topics: one queue each
            except ConfigError as exc:
                log.error("reload failed, nothing changed: %s", exc, extra={"source": source})
                raise
            # the file's changes go through the topic: planned against what it would then hold
            # planned on the queues as defined (a partitioned queue's distribution and
            # partitions are fixed), then on what runs (its shards)
            defined = plan(
                replace(self._config, queues=self._cluster.defined()),
                replace(new, queues=self._cluster.after_file(new)),
            )
            after = expand(self._cluster.after_file(new))
            the_plan = (
                defined if defined.refused else plan(self._config, replace(new, queues=after))
            )
            if not the_plan.applicable:
                result = the_plan.result(applied=False)
                for line in result.lines():
                    log.warning("%s", line, extra={"source": source})
                return result
            self._config = replace(
                self._config, broker=new.broker, coordinator=new.coordinator, source=new.source
            )
            writes = self._cluster.file_writes(new)
            reason = f"removed by reload of {new.source}"
            if not writes:  # the file changed nothing: the topic's queues as they are
                return await self.apply_definitions(reason, new.source)
            return await self._write_and_apply(writes, reason, new.source)

    def reload_on_signal(self) -> None:
        """SIGHUP: reload in the background (a signal handler must not wait); ``reload`` logs
        what happened."""
        task = asyncio.get_running_loop().create_task(self._reload_logged())
        self._reload_tasks.add(task)
        task.add_done_callback(self._reload_tasks.discard)

    async def _reload_logged(self) -> None:
        try:
            await self.reload()
        except QLayerError as exc:
            if not isinstance(exc, ConfigError):  # reload logged that one already
                log.error("reload failed: %s", exc)
        except Exception:
            log.exception("reload failed")

    async def _apply_plan(self, the_plan: ReloadPlan, new: Config, reason: str) -> None:
        """What can fail (topics, restores) first, while nothing has changed; then the rest at
        once, between two rounds; then the removed queues' last records and readers."""
        await self._ensure_topics([*the_plan.added, *the_plan.changed])
        standby = self._seat.standby
        if standby is not None:  # its copy stops here: the restore reads on from it
            await standby.release({q.name for q in the_plan.added})
        added = [await self._restore.queue(q, starting=False) for q in the_plan.added]
        for rt in added:
            self._runtimes[rt.name] = rt
            self._serve_queue(rt)
        for q in the_plan.changed:
            self.change_queue(q)
        retiring = [self.remove_queue(name, reason) for name in the_plan.removed]
        self._config = new
        for retire in retiring:
            await retire
        if added or the_plan.changed:
            self._signal.wake()

    def change_queue(self, q: QueueConfig) -> None:
        """Apply new values of a queue's live options (``layer.coordinator.reload``)."""
        rt = lookup(self._runtimes, q.name)
        rt.engine.reconfigure(q.engine_settings())
        rt.config = q
        cap = q.max_per_subscription_backlog
        for sub in rt.subscriptions.values():
            sub.backlog = min(sub.backlog, cap)
        log.info("queue=%s options changed", q.name, extra={"queue": q.name})

    def remove_queue(self, name: str, reason: str) -> Awaitable[None]:
        """Stop serving a queue at once: no new calls find it, its subscriptions end with
        ``QueueRemoved`` (one over several queues just leaves it), and what its engine has not
        committed yet (acks accepted, leases returned) goes to the changelog before any later
        round commits, so no ack is confirmed without its record. The state stays on disk: the
        queue resumes from it when added again. Returns what finishes the removal (the last
        commit, the readers stopping)."""
        rt = self._runtimes.pop(name)
        self._snapshots.forget(name)
        error = QueueRemoved(f"queue {name!r} was {reason}")
        now = self._clock()
        for other in self._runtimes.values():
            for sub in other.subscriptions.values():
                sub.draining.discard(name)
        for sub in list(rt.subscriptions.values()):
            rt.engine.disconnect(sub.id, now)
            sub.queues = [q for q in sub.queues if q != name]
            sub.draining.discard(name)
            if not sub.queues:
                self._subscriptions.close(sub)
                sub.sink.close(str(error), error)
        rt.subscriptions.clear()
        commit = self._commit_retired(rt)
        readers = [r for r in (self._readers.pop(name, None), rt.route and rt.route.reader) if r]
        return self._finish_removal(rt, commit, readers)

    def _commit_retired(self, rt: QueueRuntime) -> tuple[Awaitable[Offsets], Round] | None:
        """Begin committing a removed queue's last changes now (commits complete in the order
        they begin, so this one lands before the next round's)."""
        last = Round(self._store, self._changelog, self._clock)
        last.record(rt, rt.engine.drain())
        if rt.views is not None:
            rt.views.detach(rt)
        # durable before anything goes on: the commit is redone until Kafka takes it
        sending = last.send()
        return None if sending is None else (sending, last)

    async def _finish_removal(
        self,
        rt: QueueRuntime,
        commit: tuple[Awaitable[Offsets], Round] | None,
        readers: list[IngestReader],
    ) -> None:
        if commit is not None:
            sending, last = commit
            last.apply(await sending)
        for reader in readers:
            await asyncio.to_thread(reader.stop)
        log.info("queue=%s removed; its state is kept", rt.name, extra={"queue": rt.name})


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise InvalidRequest(f"limit must be >= 0, got {limit}")


def _letter_filter(
    rt: QueueRuntime, filter: str | None
) -> Callable[[Mapping[str, Any]], bool] | None:
    """``filter`` (None: all) compiled to a test of a dead letter of ``rt``'s queue (redrive,
    dead_letters); a filter on fields of a queue whose messages have none is refused."""
    if filter is None:
        return None
    expression = compile_expression(filter)
    if expression.uses_document and rt.exprs.reader is None:
        raise InvalidRequest(
            f"queue {rt.config.name!r} holds {rt.config.message_type} messages: no filter on fields"
        )
    return partial(_matches, expression, rt.exprs.reader)


def _matches(
    expression: Expression, reader: DocumentReader | None, envelope: Mapping[str, Any]
) -> bool:
    """A dead letter's filter: over its payload and its original record's Kafka fields."""
    doc = None if reader is None else reader.read(envelope["payload"])[0]
    if not expression.uses_record:
        return expression.matches(doc)
    record = Record(
        envelope["key"],
        [(h["key"], h["value"]) for h in envelope["headers"]],
        envelope["message_timestamp_ms"],
        envelope["topic"],
        envelope["partition"],
    )
    return expression.matches(doc, None, record)
