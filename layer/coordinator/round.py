"""The coordinator's unit of work, the round, and the loop that runs rounds one after another.

A round (``Round``), in this order:

1. admit: fetched messages go into the engines; their local copies and read positions are
   written to the store at once (they are no changelog state: a restart reads the topics again
   from the positions, and the engines come back from the changelog alone).
2. decide, queue by queue: routed publishes are copied, the engine ticks, the subscriptions'
   backlogs are set, the engine dispatches and its effects are drained. Each change becomes its
   changelog record and is mirrored into one store batch; a message that left without an ack
   gets its dead letter; each delivery gets its payload.
3. commit: the changelog records, the dead letters, routed copies and view rounds, in one Kafka
   transaction, done again until it is durable, however long Kafka is away.
4. apply: the store batch, with the changelog offsets it reaches, in one write.
5. hand out: the deliveries go to their subscriptions; whoever waited on this commit (an ack,
   ``RoundSignal.next_commit``) is answered.

A commit that fails (the process stops while Kafka is away, or any other error) ends the round
at step 3: nothing of it reaches the store, nothing is handed out, its waiters are told to retry
and the loop fails, so the coordinator stops serving. The engines then hold decisions the
changelog does not; a restart rebuilds them from the store and the changelog, where the round
left nothing.

While a round commits, the next one's events accumulate: that is the group commit, and no
message ever costs a broker round trip of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol

from layer.api.deliveries import DeliveryBatch
from layer.codec import encode_change, encode_run
from layer.coordinator.commits import Changelog, Offsets
from layer.coordinator.deliveries import by_subscription
from layer.coordinator.records import (
    RunMirror,
    bookmarks_of,
    changelog_order,
    covered,
    follows,
    forgotten_spans,
    low_water_marks,
    mirror,
    record_fields,
)
from layer.coordinator.runtime import QueueRuntime
from layer.coordinator.view import lease_changes, view_record
from layer.engine.model import (
    AckOp,
    Bookmark,
    Done,
    DoneReason,
    Effects,
    Forget,
    Leased,
    Returned,
    TopicPartition,
)
from layer.exceptions import BrokerError, CommitUncertain, QLayerError, StateError
from layer.state.base import Store, StoreBatch, StoredMessage
from layer.state.changelog import ChangelogRecord, ExtraRecord

if TYPE_CHECKING:
    from layer.coordinator.snapshots import Snapshots

__all__ = ["Round", "RoundSignal", "Rounds", "restart_leases"]

log = logging.getLogger(__name__)

_ACKED = DoneReason.ACKED
_BOOKMARK = attrgetter("bookmark")

# A round whose commit took longer than this (seconds; Kafka was slow or away) restarts the
# leases it hands out (``restart_leases``).
LATE_ROUND = 1.0

# How long (seconds) after a round's hand-out the next round waits for the acks of its
# deliveries when the queues it delivered from have no room left (``Rounds``): about the way
# of a push to the client and of its ack back, under load (4 clients of a 2-core machine at
# 10,000 msg/s: 3-9 ms p50, 10-17 ms p90).
ROOM_WAIT = 0.010

#: one queue's deliveries of a round, by subscription
Push = tuple[QueueRuntime, list[tuple[str, DeliveryBatch]]]


class RoundSignal:
    """What the serving side and the rounds tell each other: ``wake`` when there is work, and
    ``next_commit`` to wait until what was changed so far is durable."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._waiting: list[asyncio.Future[None]] = []
        self._committing: list[asyncio.Future[None]] = []

    def wake(self) -> None:
        self._event.set()

    def next_commit(self) -> asyncio.Future[None]:
        """Done when the next round to decide has committed (``QLayerError`` if it failed)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        return fut

    async def wait(self, timeout: float) -> None:
        """Until woken, or ``timeout`` seconds; then the next wake is a new one."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout=timeout)

    def clear(self) -> None:
        self._event.clear()

    def seal(self) -> None:
        """A round has decided: whoever waits so far waits on its commit."""
        self._committing, self._waiting = self._waiting, []

    def answer(self) -> None:
        """The sealed round's commit is durable."""
        committing, self._committing = self._committing, []
        for fut in committing:
            if not fut.done():
                fut.set_result(None)

    def fail(self, error: BaseException, committing: BaseException | None = None) -> None:
        """The rounds stopped: fail whoever waits with ``error``, and those whose commit was
        under way with ``committing`` (its outcome unknown) if given."""
        for fut in self._committing:
            if not fut.done():
                fut.set_exception(committing or error)
        for fut in self._waiting:
            if not fut.done():
                fut.set_exception(error)
        self._committing, self._waiting = [], []


class Round:
    """One round (the steps are in the module's docstring). Built by ``Rounds`` for each round,
    and by a queue's removal for its last records (``record`` then ``send``)."""

    def __init__(self, store: Store, changelog: Changelog, clock: Callable[[], float]) -> None:
        self._store = store
        self._changelog = changelog
        self._clock = clock
        self.now = clock()
        self.now_ms = int(self.now * 1000)
        self.records: list[ChangelogRecord] = []
        self.extra: list[ExtraRecord] = []
        self.views: list[ExtraRecord] = []
        self.batch = StoreBatch()  # written once the records are durable (step 4)
        self.pushes: list[Push] = []
        # wall clock marks for the latency stages (layer.coordinator.stages)
        self.started = time.time()
        self.sent_at = self.durable_at = 0.0

    @property
    def for_changelog(self) -> bool:
        return bool(self.records or self.extra or self.views)

    def admit(self, runtimes: Iterable[QueueRuntime]) -> bool:
        """Step 1. True when a queue has fetched more than it had room for this round."""
        local = StoreBatch()
        more = False
        for rt in runtimes:
            if rt.admit(self.now, local) and rt.inbox:
                more = True
        if local:
            self._store.write(local)
        return more

    def decide(self, rt: QueueRuntime, before_dispatch: Callable[[QueueRuntime], None]) -> bool:
        """Step 2 for one queue. True when its publish route has more to copy than one round
        takes."""
        more = False
        route = rt.route
        if route is not None and route.inbox:
            routed, copies = route.take(self.batch, self.now_ms)
            rt.counters.routed += len(copies)
            self.records.extend(routed)
            self.extra.extend(copies)
            more = bool(route.inbox)
        engine = rt.engine
        engine.tick(self.now)
        before_dispatch(rt)
        engine.dispatch(self.now)
        self.record(rt, engine.drain())
        return more

    def record(self, rt: QueueRuntime, effects: Effects) -> None:
        """A queue's effects, and the changes the coordinator originated for it
        (``QueueRuntime.pending_changes``), into this round."""
        changes = rt.pending_changes + effects.changes
        rt.pending_changes = []
        if not changes and not effects.deliveries and not effects.view:
            return
        name = rt.name
        # the payloads of dead letters (an acked message, the most common, is told apart by
        # identity: ``dead_letter`` is a property call); a Done may be a run (a count)
        need: list[Bookmark] = []
        for c in changes:
            if type(c) is Done and c.reason is not _ACKED and c.reason.dead_letter:
                need.extend(bookmarks_of(c))
        payloads = rt.payloads(self._store, need) if need else {}
        deliveries = effects.deliveries
        # those of the deliveries in their order, read before the changes drop them from the
        # cache (an at-most-once delivery is done in its round)
        stored = rt.stored(self._store, list(map(_BOOKMARK, deliveries))) if deliveries else []
        topic = rt.changelog_topic
        records = self.records
        if len(changes) > 1:
            # By partition and offset, so runs form (acks and leases of several partitions come
            # interleaved); stable, so the changes of one message keep their order. A partition's
            # tombstones (Forget: the low-water mark passed a done message, so no other change
            # of it follows) and its low-water mark go after its messages: restore drops what is
            # below the mark either way.
            changes = changelog_order(changes)
        # Consecutive changes of consecutive offsets of one partition with the same value go
        # to the changelog as one record: the run (first bookmark, count, value); the engine
        # makes most runs itself (a change with a ``count``), they join here. A change whose
        # fields (all its value holds but the round's time) are those of the run before it
        # joins it without being encoded: a run costs one encoding, not one per message, and
        # is mirrored into the store batch as a whole (``mirror_run``). Runs that do not join
        # (leases to consumers in turn) share the value of earlier runs with their fields: one
        # encoding per distinct value of the round, not per run. Tombstones (Forget) go as one
        # record for the run of offsets the low-water mark passed.
        values: dict[tuple[object, ...], bytes] = {}
        forgotten = forgotten_spans(changes)
        # the low-water marks this round writes: the entries of the tombstones below them
        # need no delete of their own (``_forget_run``)
        marks = low_water_marks(changes) if forgotten else None
        # before the tombstones' deletes in the batch, as the runs are before them in changes
        to = RunMirror(self.batch)
        run: list[Leased | Returned | Done] = []
        run_value = b""
        run_fields: tuple[object, ...] = ()
        # the run's partition, its first offset and the offset that would extend it
        run_topic = ""
        run_partition = run_first = run_next = -1
        # the tombstones at hand: the first one's bookmark and how many (each Forget is a run)
        forget_head: Bookmark | None = None
        forget_count = 0
        now_ms = self.now_ms
        for change in changes:
            kind = type(change)
            if kind is Leased or kind is Done or kind is Returned:
                if forget_head is not None:
                    self._forget_run(rt, forget_head, forget_count, marks)
                    forget_head = None
                bm = change.bookmark  # type: ignore[union-attr]
                fields = record_fields(change)  # type: ignore[arg-type]
                if run:
                    if (
                        bm.offset == run_next
                        and bm.partition == run_partition
                        and bm.topic == run_topic
                        and fields == run_fields
                    ):
                        run.append(change)  # type: ignore[arg-type]
                        run_next += change.count  # type: ignore[union-attr]
                        continue
                    self._record_run(
                        rt, run, run_next - run_first, run_value, payloads, forgotten, to
                    )
                value = values.get(fields)
                if value is None:
                    value = encode_change(name, change, now_ms)[1]
                    assert value is not None
                    values[fields] = value
                run, run_value, run_fields = [change], value, fields  # type: ignore[list-item]
                run_topic, run_partition, run_first = bm.topic, bm.partition, bm.offset
                run_next = run_first + change.count  # type: ignore[union-attr]
                continue
            if run:
                self._record_run(rt, run, run_next - run_first, run_value, payloads, forgotten, to)
                run = []
            if kind is Forget:
                if forget_head is None:
                    forget_head, forget_count = change.bookmark, change.count  # type: ignore[union-attr]
                elif follows(forget_head, forget_count, change):  # type: ignore[arg-type]
                    forget_count += change.count  # type: ignore[union-attr]
                else:
                    self._forget_run(rt, forget_head, forget_count, marks)
                    forget_head, forget_count = change.bookmark, change.count  # type: ignore[union-attr]
                continue
            if forget_head is not None:
                self._forget_run(rt, forget_head, forget_count, marks)
                forget_head = None
            key, value = encode_change(name, change, now_ms)
            records.append((topic, key, value))
            letter = mirror(rt, change, value, self.batch, payloads)
            if letter is not None:
                self.extra.append(letter)
        if run:
            self._record_run(rt, run, run_next - run_first, run_value, payloads, forgotten, to)
        if forget_head is not None:
            self._forget_run(rt, forget_head, forget_count, marks)
        if rt.config.view_topic is not None:
            leases = lease_changes(rt.view_leases, changes, now_ms) if changes else []
            if effects.view or leases:
                if rt.views is not None:  # the generation being written (view_history)
                    rt.views.write(rt, effects.view, now_ms, self.views, leases)
                else:
                    self.views.append(
                        view_record(rt.config.view_topic, name, effects.view, now_ms, leases)
                    )
        if effects.deliveries:
            # counted with the round whose commit makes them durable (its counters go with it)
            rt.counters.delivered += len(effects.deliveries)
            self.pushes.append((rt, by_subscription(name, deliveries, stored)))

    def _record_run(
        self,
        rt: QueueRuntime,
        run: list[Leased | Returned | Done],
        count: int,
        value: bytes,
        payloads: Mapping[Bookmark, StoredMessage | None],
        forgotten: Mapping[tuple[str, int], list[list[int]]],
        to: RunMirror,
    ) -> None:
        """One run of changes with one value (``count`` messages: the changes may be runs
        themselves): its changelog record and its store mirror."""
        first = run[0].bookmark
        self.records.append((rt.changelog_topic, encode_run(rt.name, first, count), value))
        # the entries of done messages a tombstone of this round deletes again: not put (the
        # batch is applied whole, so the store ends the same)
        spans = forgotten.get((first.topic, first.partition)) if forgotten else None
        entries = not (spans and covered(spans, first.offset, first.offset + count))
        letters = to.add(rt, run, value, payloads, entries=entries, count=count)
        if letters:
            self.extra.extend(letters)

    def _forget_run(
        self,
        rt: QueueRuntime,
        first: Bookmark,
        count: int,
        marks: Mapping[tuple[str, int], int] | None,
    ) -> None:
        """The tombstones of a run of messages the low-water mark passed: one changelog record.
        Their entries stay in the store when the mark this round writes passes them (readers
        take no entry below a partition's mark, and ``mirror`` deletes them in one range once
        in ``ENTRY_SWEEP`` offsets); otherwise one store operation deletes them."""
        key = encode_change(rt.name, Forget(first, count), self.now_ms)[0]
        self.records.append((rt.changelog_topic, key, None))
        mark = marks.get((first.topic, first.partition)) if marks else None
        if mark is None or first.offset + count > mark:
            tp = TopicPartition(first.topic, first.partition)
            self.batch.delete_entry_run(rt.name, tp, first.offset, count)

    def send(self) -> Awaitable[Offsets] | None:
        """Step 3 begun (commits complete in the order they begin); None: nothing to commit."""
        if not self.for_changelog:
            return None
        return self._changelog.commit(self.records, self.extra, self.views)

    def apply(self, offsets: Offsets) -> None:
        """Step 4: the round's store batch, with where it leaves each changelog partition."""
        for (topic, partition), last in offsets.items():
            self.batch.set_changelog_offset(topic, partition, last + 1)
        if self.batch:
            self._store.write(self.batch)

    async def commit(self) -> None:
        """Steps 3 and 4."""
        offsets: Offsets = {}
        self.sent_at = time.time()
        sending = self.send()
        if sending is not None:
            # done again until durable, however long Kafka is away: deliveries and ack
            # answers wait here, lease deadlines keep counting in the engines
            offsets = await sending
            if self.pushes and self._clock() - self.now > LATE_ROUND:
                restart_leases(self.pushes, self._clock())
        self.apply(offsets)
        self.durable_at = time.time()

    def time_stages(self) -> None:
        """Its decide and commit stages, for each queue it delivers from (committed rounds)."""
        for rt, by_sub in self.pushes:
            stages = rt.stages
            if stages is not None:
                n = sum(len(messages) for _sub, messages in by_sub)
                # from the Kafka timestamps of each batch's first and last message (a clock
                # reading per batch, as the push's ``server`` stage)
                for _sub, messages in by_sub:
                    if not messages:
                        continue
                    ends = (messages[0],) if len(messages) == 1 else (messages[0], messages[-1])
                    for m in ends:
                        if m.timestamp_ms > 0:
                            stages.add(
                                "lease",
                                self.started - m.timestamp_ms / 1000.0,
                                len(messages) // len(ends),
                            )
                stages.add("decide", self.sent_at - self.started, n)
                stages.add("commit", self.durable_at - self.sent_at, n)

    def hand_out(self) -> None:
        """Step 5: the deliveries, to the subscriptions still open."""
        for rt, by_sub in self.pushes:
            for sub_id, messages in by_sub:
                sub = rt.subscriptions.get(sub_id)
                if sub is not None and not sub.closed:
                    sub.sink.deliver(messages)


class RoundTimings(Protocol):
    """Told how long rounds take (``layer.coordinator.metrics.Metrics``)."""

    def round(self, seconds: float) -> None: ...

    def commit(self, seconds: float) -> None: ...


class Reader(Protocol):
    @property
    def error(self) -> BaseException | None: ...


class Rounds:
    """Runs rounds until stopped: one when woken (or every 50 ms, for the engines' timers), at
    least ``commit_interval`` after the last commit began, so what arrives meanwhile shares its
    transaction. Fails (and stays failed) when a round or a topic reader does.

    A round that leaves the queues it delivered from without room (each subscription holds its
    backlog) is followed by one only once the acks of its deliveries gave that room back, or
    ``room_wait`` after its hand-out (or when another queue has messages for a subscription with
    room). Begun at once, the next round would find no room and decide while those acks arrive,
    and the slots they free would wait for the round after it: a slot of a backlog served one
    round in two, which capped 4 consumers of 100 unacked messages at about 200 messages a
    round (9,000-10,000 msg/s on a loaded 2-core machine). Waiting, a slot serves again in
    the first round after its ack: the backlog is leased whole each round. The room waited
    for is that of the round's deliveries on top of what is there at its hand-out (acks of
    earlier deliveries that came during its commit)."""

    def __init__(
        self,
        runtimes: Mapping[str, QueueRuntime],
        store: Store,
        changelog: Changelog,
        signal: RoundSignal,
        *,
        clock: Callable[[], float],
        before_dispatch: Callable[[QueueRuntime], None],
        readers: Callable[[], Iterable[Reader]],
        commit_interval: float,
        interrupt: threading.Event,
        snapshots: Snapshots | None = None,
        timings: RoundTimings | None = None,
        room_wait: float = ROOM_WAIT,
    ) -> None:
        self._timings = timings
        self._runtimes = runtimes
        self._store = store
        self._changelog = changelog
        self._signal = signal
        self._clock = clock
        self._before_dispatch = before_dispatch
        self._readers = readers
        self._commit_interval = commit_interval
        self._interrupt = interrupt  # set when stopping: a commit waiting on Kafka gives up
        self._snapshots = snapshots
        self._stopping = False
        self._last_commit = 0.0  # monotonic start of the last changelog commit
        self._room_wait = room_wait
        # the queues the last round left without room, each with the room the next round
        # waits for (``_wait_for_room``), and until when at most
        self._full: list[tuple[QueueRuntime, int]] = []
        self._full_until = 0.0
        self.count = 0  # rounds completed
        self.failed: BaseException | None = None
        self._fatal: BaseException | None = None  # set by fail()

    def stop(self) -> None:
        """The loop ends after the round under way."""
        self._stopping = True
        self._signal.wake()

    def fail(self, exc: BaseException) -> None:
        """Fail the loop from outside a round (e.g. the changelog writer was fenced during a
        handover): it raises ``exc`` when it next wakes."""
        if self._fatal is None:
            self._fatal = exc
        self._signal.wake()

    async def run(self) -> None:
        try:
            while not self._stopping:
                await self._signal.wait(0.05)
                delay = self._last_commit + self._commit_interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._full:
                    await self._wait_for_room()
                self._signal.clear()
                if self._fatal is not None:
                    raise self._fatal
                for reader in self._readers():
                    if reader.error is not None:
                        raise BrokerError(f"reading queue topics failed: {reader.error}")
                await self.one()
        except BaseException as exc:
            self.failed = exc
            self._signal.fail(
                QLayerError("the coordinator failed; retry"),
                CommitUncertain(f"the coordinator failed while committing this change: {exc}"),
            )
            if self._interrupt.is_set() and isinstance(exc, StateError) and self._fatal is None:
                # stopping while a commit waited for Kafka: its round was never answered, and
                # the next start aborts the transaction it left open
                log.warning("stopped with a round not committed: %s", exc)
                return
            if not isinstance(exc, asyncio.CancelledError):
                log.critical("coordinator failed: %s", exc, exc_info=exc)
            raise

    async def _wait_for_room(self) -> None:
        """Until a queue the last round left without room has its room back (woken by each
        ack), another queue has work, or ``_full_until``.
        Meanwhile what is fetched is admitted (the next round's step 1, taken early): the
        round that the acks start has that much less to do before its leases."""
        full, self._full = self._full, []
        until = self._full_until
        while not self._stopping and self._fatal is None:
            left = until - time.monotonic()
            if left <= 0 or any(_room(rt) >= room for rt, room in full):
                return
            if self._others_ready(full):
                return
            runtimes = self._runtimes.values()
            if any(rt.inbox for rt in runtimes):
                Round(self._store, self._changelog, self._clock).admit(runtimes)
            self._signal.clear()
            await self._signal.wait(left)

    def _others_ready(self, full: Sequence[tuple[QueueRuntime, int]]) -> bool:
        """Whether a queue other than ``full``'s has fetched messages for a subscription with
        room, or publishes to route."""
        if len(self._runtimes) == len(full):
            return False
        waiting = {id(rt) for rt, _ in full}
        for rt in self._runtimes.values():
            if id(rt) in waiting:
                continue
            if (rt.route is not None and rt.route.inbox) or (rt.inbox and _room(rt)):
                return True
        return False

    async def one(self) -> None:
        """One round, its steps in order."""
        began = time.monotonic()
        r = Round(self._store, self._changelog, self._clock)
        runtimes = list(self._runtimes.values())
        again = r.admit(runtimes)
        if again:
            self._signal.wake()  # more to admit: go round again at once
        snapshots = self._snapshots
        for rt in runtimes:
            start = len(r.records)
            if r.decide(rt, self._before_dispatch):
                again = True
                self._signal.wake()
            if snapshots is not None:
                snapshots.add(rt.name, rt.changelog_topic, r.records, start, r.now_ms)
        # the counters ride on the round's commit (or, in a quiet changelog, on one a second)
        commits = r.for_changelog
        for rt in runtimes:
            r.records.extend(
                rt.counters.flush(
                    rt.name, rt.changelog_topic, r.batch, r.now, r.now_ms, force=commits
                )
            )
        self._signal.seal()
        full = [] if again else _left_full(r.pushes)
        committing = r.for_changelog
        if committing:
            self._last_commit = time.monotonic()
        sent = time.monotonic()
        try:
            await r.commit()
        except BaseException:
            if snapshots is not None:
                snapshots.failed()
            raise
        durable = time.monotonic()
        if snapshots is not None:
            snapshots.committed()
        self.count += 1
        r.time_stages()
        r.hand_out()
        self._signal.answer()
        if full:
            # the room there now (acks of earlier rounds' deliveries that came during the
            # commit) and the room of this round's deliveries: waiting only for room as large
            # as the round leased, two rounds would go on taking turns, each leasing what the
            # acks of the one before freed, half the backlog
            self._full = [(rt, min(_room(rt) + leased, _backlog(rt))) for rt, leased in full]
            self._full_until = time.monotonic() + self._room_wait
        if committing and self._timings is not None:
            self._timings.commit(durable - sent)  # the transaction and the store write
            self._timings.round(time.monotonic() - began)


def _room(rt: QueueRuntime) -> int:
    """How many more messages the queue's subscriptions that read (not stalled) may take."""
    held_by = rt.engine.held_by
    return sum(
        max(0, sub.backlog - held_by(sub.id))
        for sub in rt.subscriptions.values()
        if not sub.stalled
    )


def _backlog(rt: QueueRuntime) -> int:
    """The room of the queue's subscriptions that read when they hold nothing."""
    return sum(sub.backlog for sub in rt.subscriptions.values() if not sub.stalled)


def _left_full(pushes: Sequence[Push]) -> list[tuple[QueueRuntime, int]]:
    """The queues a round delivered from whose subscriptions it left without room, each with
    how many messages it leased there."""
    return [
        (rt, sum(len(messages) for _sub, messages in by_sub))
        for rt, by_sub in pushes
        if rt.subscriptions and not _room(rt)
    ]


def restart_leases(pushes: Sequence[Push], now: float) -> None:
    """The leases of a round whose commit waited (on Kafka) lost that time before their
    messages were even handed out: start them again now, so a consumer gets its whole lease
    period, and none runs out between its push and the consumer's ack. Lease deadlines are
    not durable (a restart returns every lease), so this needs no changelog record."""
    for rt, by_sub in pushes:
        period = rt.config.lease_period
        deadline_ms = int((now + period) * 1000)
        for sub_id, batch in by_sub:
            sub = rt.subscriptions.get(sub_id)
            leased = batch.leased()
            if sub is None or sub.closed or not leased:
                continue
            rt.engine.ack(sub_id, leased, AckOp.EXTEND, now, period)
            batch.restart(deadline_ms)  # not handed out yet
