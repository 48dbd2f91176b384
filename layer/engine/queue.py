"""The queue engine: a deterministic state machine for one queue. No I/O, no threads, no clock.

The contract the coordinator is written against is the docstring of ``layer.engine``.
"""

from __future__ import annotations

import sys
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from layer.engine.fairness import Subscriber, make_picker
from layer.engine.holding import Holding
from layer.engine.index import (
    AVAILABLE,
    DELAYED,
    DONE,
    HELD,
    LEASED,
    AgeIndex,
    DelayIndex,
    Entry,
    ExpiryIndex,
    FifoOrder,
    LeaseIndex,
    PriorityOrder,
)
from layer.engine.intake import Intake
from layer.engine.leases import Leases
from layer.engine.model import (
    AckError,
    AckOp,
    AckOutcome,
    Arrival,
    Bookmark,
    Change,
    Delivery,
    Done,
    DoneReason,
    Effects,
    EngineSettings,
    Forget,
    Leased,
    Leasing,
    LowWater,
    ReturnReason,
    Semantics,
    TopicPartition,
    ViewChange,
)
from layer.engine.partition import PartitionState
from layer.engine.queries import Queries
from layer.engine.routing import Router
from layer.engine.runs import Run
from layer.exceptions import QueueError

UNLIMITED = sys.maxsize  # room() without target_queue_depth


def sort_rank(value: str | None, timestamp: float) -> tuple[int, str, float]:
    """A sorted queue's delivery rank: ascending by the sort value (code point order, the
    alphanumeric order of Java's String.compareTo for text within the BMP), a message without
    one after every message with one, and the oldest (by enqueue time) first among equals. The
    timestamp makes the order the same after a restart, whatever order the restore reads in.
    A message's delivery key is its rank followed by its arrival sequence (``add``)."""
    if value is None:
        return (1, "", timestamp)
    return (0, value, timestamp)


_INF = float("inf")
# the view changes of a message by (it left during the round, it is in the view at its end)
_SIGNS = {(False, False): (), (False, True): (1,), (True, False): (-1,), (True, True): (-1, 1)}
_UNKNOWN = AckError.UNKNOWN_BOOKMARK
_NOT_HOLDER = AckError.NOT_LEASE_HOLDER
_NOT_LEASED = AckError.NOT_LEASED


class QueueEngine(Queries, Holding, Leases, Intake):
    """One queue's state machine (see the module docstring for the contract)."""

    def __init__(self, name: str, settings: EngineSettings) -> None:
        settings.validate(name)
        self.name = name
        self.settings = settings
        self._alo = settings.semantics == Semantics.AT_LEAST_ONCE
        self._strict = settings.leasing == Leasing.STRICT
        self._lease_period = settings.lease_period
        self._max_deliveries = settings.max_deliveries
        self._max_cancels = settings.max_cancels
        self._expiration = settings.expiration
        self._depth = settings.target_queue_depth
        self._priority = settings.priority
        self._sort = settings.sort
        self._ttl = settings.message_ttl
        self._order: FifoOrder | PriorityOrder = (
            PriorityOrder() if settings.priority or settings.sort else FifoOrder()
        )
        self._expiries = ExpiryIndex()  # messages with a TTL of their own (message_ttl)
        self._ages = AgeIndex()
        self._leases = LeaseIndex()
        self._picker = make_picker(settings.fairness)
        self._deferred: dict[int, Subscriber] | None = None
        self._subs: dict[str, Subscriber] = {}
        self._router = Router(self._subs, self._requeue, settings.exclusive, settings.groups)
        self._delays = DelayIndex()
        self._delayed = 0
        # Barriers: the pending ones in arrival order; the first holds every later arrival.
        self._barriers: deque[Entry] = deque()
        self._held: deque[Entry] = deque()
        self._held_count = 0
        self._conflate = settings.conflate
        self._latest: dict[object, Entry] = {}  # last-value queues: conflate key -> newest
        # Delivery and cancel counts restored from the changelog for messages not read yet
        self._restored: dict[Bookmark, tuple[int, int]] = {}
        self._restored_index: dict[tuple[str, int], list[int]] | None = None
        self._next_sub = 0
        self._topics: dict[str, dict[int, PartitionState]] = {}
        self._parts: list[PartitionState] = []
        self._dirty: list[PartitionState] = []
        self._seq = 0
        self._available = 0
        self._leased = 0
        self._done_total = 0
        self._dead_total = 0
        self._delivered_total = 0
        self._changes: list[Change] = []
        self._deliveries: list[Delivery] = []
        # bookmark -> [first sign, last sign, entry] since the last drain (track_view only)
        self._view: dict[Bookmark, list[Any]] | None = {} if settings.track_view else None

    def __repr__(self) -> str:
        return (
            f"QueueEngine({self.name!r}, available={self._available}, leased={self._leased}, "
            f"subscriptions={len(self._subs)})"
        )

    # -- partitions --------------------------------------------------------------------------

    def start_partition(self, partition: TopicPartition, low_water: int) -> None:
        tp = TopicPartition(*partition)
        if low_water < 0:
            raise ValueError(f"queue {self.name!r}: low_water of {tp} must be >= 0")
        by_partition = self._topics.setdefault(tp.topic, {})
        if tp.partition in by_partition:
            raise QueueError(f"queue {self.name!r}: partition {tp} is already started")
        part = PartitionState(tp, low_water)
        by_partition[tp.partition] = part
        self._parts.append(part)

    def restore_done(self, bookmarks: Iterable[Bookmark]) -> None:
        for bm in bookmarks:
            part = self._require(bm)
            offset = bm.offset
            if offset < part.low_water:
                # A stale record the low-water mark already passed: tombstone it again.
                self._changes.append(Forget(bm))
            elif offset < part.read_pos:
                raise QueueError(
                    f"queue {self.name!r}: done record {bm} is below the read position "
                    f"{part.read_pos}; restore done records before reading"
                )
            else:
                part.remember(offset)

    def restore_counts(self, counts: Mapping[Bookmark, tuple[int, int]]) -> None:
        self._restored.update(counts)
        self._restored_index = None  # built again when add_run needs it

    def restored_pending(self) -> int:
        """How many restored counts still wait for their message to be read (or acked)."""
        return len(self._restored)

    def mark_read(self, partition: TopicPartition, next_offset: int) -> None:
        part = self._partition(partition)
        if next_offset > part.read_pos:
            part.read_to(next_offset)
            self._touch(part)

    def set_high_watermark(self, partition: TopicPartition, offset: int) -> None:
        self._partition(partition).high_watermark = offset

    def room(self) -> int:
        if not self._depth:
            return UNLIMITED
        return max(0, self._depth - self._live())

    # -- events ------------------------------------------------------------------------------

    def add(self, arrivals: Iterable[Arrival], now: float) -> None:
        """Arrivals in offset order per partition. The plain ones (see ``layer.engine.runs``)
        that come one after another, from consecutive offsets, join one run."""
        expiration = self._expiration
        priority_queue = self._priority
        sort_queue = self._sort
        ttl_queue = self._ttl
        run: Run | None = None  # the run being built
        times: array[float] = array("d")
        try:
            for arrival in arrivals:
                bm = arrival.bookmark
                part = self._require(bm)
                offset = bm.offset
                if offset < part.read_pos:
                    raise QueueError(
                        f"queue {self.name!r}: arrival {bm} is below the read position "
                        f"{part.read_pos} of its partition"
                    )
                if part.pending_heap:
                    part.read_to(offset)
                    if offset in part.pending:
                        # Acked before it was read (or restored done): it only counts for the mark.
                        part.take_pending(offset, bm)
                        self._touch(part)
                        if self._restored:
                            self._restored.pop(bm, None)
                        continue
                part.read_pos = offset + 1
                deliveries, cancels = arrival.deliveries, arrival.cancels
                if self._restored:
                    deliveries, cancels = self._restored.pop(bm, (deliveries, cancels))
                reason = self._limit_reason(deliveries, cancels) if deliveries or cancels else None
                timestamp = arrival.timestamp
                if reason is None and arrival.unparseable:
                    reason = DoneReason.UNPARSEABLE
                if reason is None and expiration is not None and now - timestamp >= expiration:
                    reason = DoneReason.EXPIRATION
                expires = arrival.expires_at if ttl_queue else None
                if reason is None and expires is not None and now >= expires:
                    reason = DoneReason.EXPIRATION
                if reason is not None:
                    if run is not None:
                        self._close_run(run, times)
                        run = None
                    part.append(offset, bm)
                    self._touch(part)
                    self._emit_done(bm, reason, deliveries, cancels, now)
                    continue
                rank: Any
                if priority_queue:
                    priority = arrival.priority
                    rank = _INF if priority is None else -priority
                else:
                    rank = None
                not_before = arrival.not_before
                if (
                    not sort_queue  # each message of a sorted queue has a key of its own
                    and not (deliveries or cancels)
                    and arrival.group is None
                    and (arrival.conflate_key is None or not self._conflate)
                    and not arrival.barrier
                    and not self._barriers
                    and (not_before is None or not_before <= now)
                    and expires is None
                ):
                    # plain: one more message of the run being built, or the first of a new one
                    if (
                        run is not None
                        and run.tp is part.tp
                        and offset == run.start + len(times)
                        and rank == run.rank
                        and timestamp >= times[-1]
                    ):
                        times.append(timestamp)
                        self._seq += 1
                        continue
                    if run is not None:
                        self._close_run(run, times)
                    times = array("d", (timestamp,))
                    run = Run(part.tp, offset, self._seq, rank, times)
                    self._seq += 1
                    part.append(offset, run)
                    continue
                if run is not None:
                    self._close_run(run, times)
                    run = None
                seq = self._seq
                self._seq = seq + 1
                key: object
                if sort_queue:  # sort_rank + (seq,), as one flat tuple: it is kept per message
                    value = arrival.sort_key
                    key = (1, "", timestamp, seq) if value is None else (0, value, timestamp, seq)
                else:
                    key = seq if rank is None else (rank, seq)
                entry = Entry(bm, key, timestamp, deliveries, cancels)
                part.append(offset, entry)
                if not part.dirty:
                    self._touch(part)
                if arrival.group is not None:
                    entry.group = arrival.group
                if expires is not None:
                    entry.expires = expires
                if arrival.conflate_key is not None and self._conflate:
                    self._conflate_older(entry, arrival.conflate_key, now)
                if arrival.barrier or self._barriers:
                    entry.state = HELD
                    self._held.append(entry)
                    self._held_count += 1
                    if arrival.barrier:
                        self._barriers.append(entry)
                    if self._view is not None:
                        self._viewed(entry, 1)
                elif not_before is not None and not_before > now:
                    self._delay(entry, not_before)
                else:
                    self._order.push_new(entry)
                    self._ages.push(entry)
                    if expires is not None:
                        self._expiries.push(entry)
                    self._available += 1
                    if self._view is not None:
                        self._viewed(entry, 1)
        finally:
            if run is not None:  # also when an arrival is refused: what came before it stays
                self._close_run(run, times)

    def _close_run(self, run: Run, times: array[float]) -> None:
        """A run is built: its messages are available."""
        run.count = run.hi = len(times)
        self._order.push_new(run)
        self._ages.push(run)
        self._available += run.count
        self._touch(self._partition(run.tp))
        if self._view is not None:
            for entry in run.entries():
                self._viewed(entry, 1)

    def subscribe(
        self,
        subscription: str,
        max_backlog: int,
        now: float,
        match: Callable[[Bookmark], bool] | None = None,
    ) -> int:
        if max_backlog < 0:
            raise ValueError(
                f"queue {self.name!r}: max_backlog of {subscription!r} must be >= 0 "
                f"(got {max_backlog})"
            )
        backlog = min(max_backlog, self.settings.max_per_subscription_backlog)
        sub = self._subs.get(subscription)
        if sub is None:
            sub = Subscriber(subscription, self._next_sub, backlog, match)
            self._next_sub += 1
            self._subs[subscription] = sub
        else:
            # a replace: leases and outstanding count stay, even above the new backlog
            sub.backlog = backlog
            sub.match = match
        self._picker.update(sub)
        if self._router.active():
            self._router.requeue_all()
        return backlog

    def set_backlog(self, subscription: str, backlog: int) -> None:
        """Change a subscription's backlog without a replace; 0 pauses it (the coordinator
        shares one backlog between the queues of a multi-queue subscription this way)."""
        if backlog < 0:
            raise ValueError(f"queue {self.name!r}: backlog {backlog} must be >= 0")
        sub = self._subscriber(subscription)
        sub.backlog = min(backlog, self.settings.max_per_subscription_backlog)
        self._picker.update(sub)

    def reconfigure(self, settings: EngineSettings) -> None:
        """Take new values of the settings that may change while the queue runs (a reload).

        Each applies from now on: ``lease_period`` to leases granted later, the limits
        (``max_deliveries``, ``max_cancels``, ``expiration``) whenever a message is next checked,
        ``fairness`` to the next pick, a lower ``max_per_subscription_backlog`` at once (open
        subscriptions above it are lowered; what they hold stays theirs). The settings that shape
        the state already built (semantics, priority, groups, exclusive, conflate, track_view)
        raise ``ValueError`` naming them."""
        settings.validate(self.name)
        fixed = [
            name
            for name in (
                "semantics",
                "priority",
                "groups",
                "exclusive",
                "conflate",
                "track_view",
                "sort",
                "message_ttl",
            )
            if getattr(settings, name) != getattr(self.settings, name)
        ]
        if fixed:
            raise ValueError(f"queue {self.name!r}: cannot change {', '.join(fixed)} live")
        old, self.settings = self.settings, settings
        self._strict = settings.leasing == Leasing.STRICT
        self._lease_period = settings.lease_period
        self._max_deliveries = settings.max_deliveries
        self._max_cancels = settings.max_cancels
        self._expiration = settings.expiration
        self._depth = settings.target_queue_depth
        cap = settings.max_per_subscription_backlog
        if settings.fairness != old.fairness:
            self._picker = make_picker(settings.fairness)
        for sub in self._subs.values():
            if settings.fairness != old.fairness:
                sub.ready = False  # not in the new picker's set yet: update() adds it
            if sub.backlog > cap:
                sub.backlog = cap
            self._picker.update(sub)

    def disconnect(self, subscription: str, now: float) -> None:
        """Unregister; idempotent (an unknown subscription is ignored)."""
        sub = self._subs.pop(subscription, None)
        if sub is None:
            return
        if self._alo:
            for entry in list(sub.leases):
                self._end_lease(entry, ReturnReason.DISCONNECT, now)
        sub.handed.clear()
        sub.outstanding = 0
        self._picker.remove(sub)
        router = self._router
        router.forget(sub)
        if router.active():
            # an exclusive queue's standby may be the active one now; filters may match again
            router.requeue_all()

    def ack(
        self,
        subscription: str | None,
        bookmarks: Iterable[Bookmark],
        op: AckOp,
        now: float,
        seconds: float = 0.0,
    ) -> list[AckOutcome]:
        """``subscription`` None: an ack on behalf of no subscription (ack by filter through the
        API): under strict leasing it may only finish messages nobody holds."""
        sub = None if subscription is None else self._subscriber(subscription)
        if seconds < 0:
            raise ValueError(f"queue {self.name!r}: {op} by {seconds} seconds (must be >= 0)")
        if not self._alo:
            if sub is None:
                return [AckOutcome(bm, self._amo_finish(bm, op, now)) for bm in bookmarks]
            return [AckOutcome(bm, self._release_slot(sub, bm)) for bm in bookmarks]
        return [AckOutcome(bm, self._ack_one(sub, bm, op, now, seconds)) for bm in bookmarks]

    def ack_runs(
        self,
        subscription: str | None,
        partition: TopicPartition,
        runs: Sequence[int],
        op: AckOp,
        now: float,
        seconds: float = 0.0,
    ) -> list[tuple[int, AckError]]:
        """``ack`` of the offsets ``runs`` names in one partition (inclusive runs: ``[first,
        last, first, last, ...]``), in that order, without an object per message: returns only
        the refused ones, as (offset, error)."""
        sub = None if subscription is None else self._subscriber(subscription)
        if seconds < 0:
            raise ValueError(f"queue {self.name!r}: {op} by {seconds} seconds (must be >= 0)")
        topic, number = partition
        failures: list[tuple[int, AckError]] = []
        if not self._alo:
            for i in range(0, len(runs), 2):
                for offset in range(runs[i], runs[i + 1] + 1):
                    bm = Bookmark(topic, number, offset)
                    if sub is None:
                        error = self._amo_finish(bm, op, now)
                    else:
                        error = self._release_slot(sub, bm)
                    if error is not None:
                        failures.append((offset, error))
            return failures
        by_partition = self._topics.get(topic)
        part = None if by_partition is None else by_partition.get(number)
        if part is None:
            for i in range(0, len(runs), 2):
                failures.extend((o, _UNKNOWN) for o in range(runs[i], runs[i + 1] + 1))
            return failures
        ack_span = self._ack_span
        # The picker hears of the freed slots once per subscription, when the batch is
        # through, not once per message: nothing picks while acks are taken.
        deferred: dict[int, Subscriber] = {}
        self._deferred = deferred
        try:
            for i in range(0, len(runs), 2):
                ack_span(sub, part, runs[i], runs[i + 1], op, now, seconds, failures)
        finally:
            self._deferred = None
            for freed in deferred.values():
                if freed.name in self._subs:
                    self._picker.update(freed)
        return failures

    def tick(self, now: float) -> None:
        leases = self._leases
        while (entry := leases.pop_due(now)) is not None:
            self._end_lease(entry, ReturnReason.TIMEOUT, now)
        delays = self._delays
        while (entry := delays.pop_due(now)) is not None:
            self._delayed -= 1
            self._make_available(entry)
        if self._expiration is not None:
            ages, cutoff = self._ages, now - self._expiration
            while (entry := ages.pop_expired(cutoff)) is not None:
                self._finish(entry, DoneReason.EXPIRATION, now)
        if self._ttl:
            expiries = self._expiries
            while (entry := expiries.pop_due(now)) is not None:
                self._finish(entry, DoneReason.EXPIRATION, now)

    def dispatch(self, now: float) -> None:
        if self._barriers:
            self._send_barriers(now)
        if self._router.active():
            self._dispatch_routed(now)
            return
        picker, order = self._picker, self._order
        expiration = self._expiration
        ttl = self._ttl
        alo = self._alo
        # A picker that rules only how many each gets (proportional) splits what is available
        # at once, and each subscription gets its share as a run of consecutive messages: to
        # consumers whose acks came in the same round, one at a time in turn would make runs of
        # one (a changelog record, an ack run, a dispatch step per message).
        while alo and self._available > 1:
            shares = picker.share(self._available)
            if shares is None:
                break
            if not shares:
                return
            for sub, n in shares:
                entries = order.pop_many(n)
                if not entries:  # unreachable while the available count is right
                    return
                self._lease_many(sub, entries, now)  # expired ones leave room: asked again
        # the picker is asked for a quota only when it picks the one it picked last: with
        # subscriptions taking turns, quota would answer 1 each time, at a cost
        last: Subscriber | None = None
        while self._available:
            sub = picker.pick()
            if sub is None:
                return
            if alo and last is not None and last is sub:
                n = picker.quota(sub)
                if n > 1:
                    entries = order.pop_many(min(n, self._available))
                    if not entries:  # unreachable while the available count is right
                        return
                    self._lease_many(last, entries, now)
                    continue
            last = sub
            entry = order.pop()
            if entry is None:  # unreachable while the available count is right
                return
            if (expiration is not None and now - entry.timestamp >= expiration) or (
                ttl and entry.expires is not None and now >= entry.expires
            ):
                self._finish(entry, DoneReason.EXPIRATION, now)
                continue
            self._deliver(entry, sub, now)

    def drain(self) -> Effects:
        for part in self._dirty:
            part.dirty = False
            part.advance()
            if part.low_water > part.emitted:
                part.emitted = part.low_water
                self._changes.append(LowWater(part.tp, part.low_water))
                self._changes.extend(part.forgets)
                part.forgets.clear()
        self._dirty.clear()
        self._order.compact(self._available)
        self._ages.compact(self._available + self._leased)
        self._leases.compact(self._leased)
        self._delays.compact(self._delayed)
        self._expiries.compact(self._available + self._leased + self._delayed)
        self._router.compact(self._available)
        effects = Effects(self._changes, self._deliveries)
        self._changes, self._deliveries = [], []
        if self._view:
            # columns, not a ViewChange per change: this runs for every message of a queue
            # with a view topic, twice
            view = effects.view
            marks, signs, counts, cancels = (
                view.bookmarks,
                view.signs,
                view.deliveries,
                view.cancels,
            )
            priorities = view.priorities = [] if self._priority else None
            for first, last, entry in self._view.values():
                # -1 if it was in the view when the round began, +1 if it is in it now
                for sign in _SIGNS[first < 0, last > 0]:
                    marks.append(entry.bookmark)
                    signs.append(sign)
                    counts.append(entry.deliveries)
                    cancels.append(entry.cancels)
                    if priorities is not None:
                        priorities.append(self._priority_of(entry))
            self._view.clear()
        return effects

    def leases_of(
        self, subscription: str, limit: int = 100
    ) -> list[tuple[Bookmark, float | None, int]]:
        """Read-only: up to ``limit`` messages the subscription holds, in lease order, as
        (bookmark, lease deadline or None, deliveries); at-most-once: those handed out whose
        backlog slot is not released yet."""
        sub = self._subs.get(subscription)
        if sub is None:
            return []
        out: list[tuple[Bookmark, float | None, int]] = []
        for entry in sub.leases:
            if len(out) >= limit:
                return out
            out.append((entry.bookmark, entry.deadline, entry.deliveries))
        for bookmark in sub.handed:
            if len(out) >= limit:
                break
            out.append((bookmark, None, 1))
        return out

    def low_water(self, partition: TopicPartition) -> int:
        part = self._partition(partition)
        part.advance()
        if part.low_water > part.emitted:
            self._touch(part)
        return part.low_water

    # -- internals ---------------------------------------------------------------------------

    def _priority_of(self, entry: Entry) -> int | None:
        rank = entry.key[0]  # see add: -priority, or infinity for none
        return None if rank == _INF else -rank

    def _view_change(self, entry: Entry, sign: int) -> ViewChange:
        priority = self._priority_of(entry) if self._priority else None
        return ViewChange(entry.bookmark, sign, entry.deliveries, entry.cancels, priority)

    def _live(self) -> int:
        return self._available + self._leased + self._delayed + self._held_count

    def _deliver(self, entry: Entry, sub: Subscriber, now: float) -> None:
        bm = entry.bookmark
        entry.deliveries += 1
        self._delivered_total += 1
        self._router.taken(sub, entry)
        if self._alo:
            deadline = now + self._lease_period
            entry.state = LEASED
            entry.holder = sub
            entry.deadline = deadline
            sub.leases[entry] = None
            self._available -= 1
            self._leased += 1
            self._leases.push(entry, deadline)
            if self._view is not None:
                self._viewed(entry, -1)
            self._changes.append(Leased(bm, sub.name, deadline, entry.deliveries, entry.cancels))
            self._deliveries.append(
                Delivery(sub.name, bm, entry.deliveries, entry.cancels, deadline)
            )
        else:
            # Done durably before it is handed out: never delivered twice, even across restarts.
            sub.handed[bm] = entry.group
            self._finish(entry, DoneReason.DELIVERED, now)
            self._deliveries.append(Delivery(sub.name, bm, entry.deliveries, entry.cancels, None))
        sub.outstanding += 1
        self._picker.served(sub)

    def _lease_many(self, sub: Subscriber, entries: list[Entry], now: float) -> None:
        """At-least-once, no router: ``_deliver`` of each of ``entries`` to ``sub`` (those not
        expired), the picker told once."""
        expiration = self._expiration
        ttl = self._ttl
        deadline = now + self._lease_period
        name = sub.name
        leases = sub.leases
        leased: list[Entry] = []  # to the lease index as one batch (one deadline)
        push = leased.append
        changes, deliveries = self._changes, self._deliveries
        viewed = self._view is not None
        count = 0
        # consecutive offsets leased alike are one Leased of their run (``Leased.count``):
        # ``run`` grows while each entry is the offset after it, with its counts
        run: Leased | None = None
        run_next = run_n = run_cancels = run_partition = -1
        run_topic = ""
        for entry in entries:
            if (expiration is not None and now - entry.timestamp >= expiration) or (
                ttl and entry.expires is not None and now >= entry.expires
            ):
                self._finish(entry, DoneReason.EXPIRATION, now)
                run = None
                continue
            bm = entry.bookmark
            n = entry.deliveries = entry.deliveries + 1
            cancels = entry.cancels
            entry.state = LEASED
            entry.holder = sub
            entry.deadline = deadline
            leases[entry] = None
            push(entry)
            if viewed:
                self._viewed(entry, -1)
            topic, partition, offset = bm
            if (
                offset == run_next
                and n == run_n
                and cancels == run_cancels
                and partition == run_partition
                and topic == run_topic
                and run is not None
            ):
                run.count += 1  # still being built: nobody has seen it yet
                run_next += 1
            else:
                run = Leased(bm, name, deadline, n, cancels)
                changes.append(run)
                run_next, run_n, run_cancels = offset + 1, n, cancels
                run_topic, run_partition = topic, partition
            deliveries.append(Delivery(name, bm, n, cancels, deadline))
            count += 1
        if count:
            self._leases.push_many(leased, deadline)
            self._delivered_total += count
            self._available -= count
            self._leased += count
            sub.outstanding += count
            self._picker.served(sub)

    def _requeue(self, entry: Entry) -> None:
        """Back into the main delivery order (the router's callback; ``gen`` already bumped)."""
        self._order.push_returned(entry)

    def _require(self, bm: Bookmark) -> PartitionState:
        part = self._lookup(bm)
        if part is None:
            raise QueueError(
                f"queue {self.name!r}: partition {bm.topic}/{bm.partition} of {bm} is not started"
            )
        return part

    def _partition(self, partition: TopicPartition) -> PartitionState:
        by_partition = self._topics.get(partition[0])
        part = None if by_partition is None else by_partition.get(partition[1])
        if part is None:
            raise QueueError(f"queue {self.name!r}: partition {partition} is not started")
        return part

    def _touch(self, part: PartitionState) -> None:
        if not part.dirty:
            part.dirty = True
            self._dirty.append(part)

    def _limit_reason(self, deliveries: int, cancels: int) -> DoneReason | None:
        if self._max_cancels and cancels >= self._max_cancels:
            return DoneReason.MAX_CANCELS
        if self._max_deliveries and deliveries >= self._max_deliveries:
            return DoneReason.MAX_DELIVERIES
        return None

    def _emit_done(
        self, bm: Bookmark, reason: DoneReason, deliveries: int, cancels: int, now: float
    ) -> None:
        self._changes.append(Done(bm, reason, deliveries, cancels, now))
        self._done_total += 1
        if reason.dead_letter:
            self._dead_total += 1

    def _finish(
        self, entry: Entry, reason: DoneReason, now: float, part: PartitionState | None = None
    ) -> None:
        """The message leaves the queue (``part``: its partition, when the caller has it)."""
        state = entry.state
        if self._view is not None and state in (AVAILABLE, HELD):
            self._viewed(entry, -1)
        if state == AVAILABLE:
            self._available -= 1
        elif state == LEASED:
            self._release(entry)
        elif state == DELAYED:
            self._delayed -= 1
        elif state == HELD:
            self._held_count -= 1
            if entry in self._barriers:  # a barrier acked (lenient) before it was sent
                first = self._barriers[0] is entry
                self._barriers.remove(entry)
                if first:
                    entry.state = DONE
                    self._release_held(now)
        entry.state = DONE
        if entry.ckey is not None and self._latest.get(entry.ckey) is entry:
            del self._latest[entry.ckey]
        bm = entry.bookmark
        if part is None:
            part = self._require(bm)
        part.done(bm)
        self._touch(part)
        self._emit_done(bm, reason, entry.deliveries, entry.cancels, now)
