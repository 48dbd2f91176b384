"""The queue engine: a deterministic state machine for one queue. No I/O, no threads, no clock.

The contract the coordinator is written against is the docstring of ``layer.engine``.
``QueueEngine`` is its face: it builds the queue's ``Core`` (``layer.engine.core``: the state
and the transitions of a message) and the parts that work on it, ``Intake``, ``Acks``,
``Dispatcher`` and ``Queries``, and takes the events itself where they are the core's own
(partitions, subscriptions, ticks, drains).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

from layer.engine.core import Core
from layer.engine.dispatch import Dispatcher
from layer.engine.fairness import Subscriber, make_picker
from layer.engine.intake import Intake
from layer.engine.leases import Acks
from layer.engine.model import (
    AckError,
    AckOp,
    AckOutcome,
    Arrival,
    Bookmark,
    DoneReason,
    Effects,
    EngineSettings,
    EngineStats,
    Forget,
    ReturnReason,
    TopicPartition,
    ViewChange,
)
from layer.engine.queries import Lease, Queries
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


class QueueEngine:
    """One queue's state machine (see the module docstring for the contract)."""

    def __init__(self, name: str, settings: EngineSettings) -> None:
        self.name = name
        core = self._core = Core(name, settings)
        self._intake = Intake(core)
        self._acks = Acks(core)
        self._dispatcher = Dispatcher(core)
        self._queries = Queries(core)

    @property
    def settings(self) -> EngineSettings:
        return self._core.settings

    def __repr__(self) -> str:
        core = self._core
        return (
            f"QueueEngine({self.name!r}, available={core.available}, leased={core.leased}, "
            f"subscriptions={len(core.subs)})"
        )

    # -- partitions --------------------------------------------------------------------------

    def start_partition(self, partition: TopicPartition, low_water: int) -> None:
        tp = TopicPartition(*partition)
        if low_water < 0:
            raise ValueError(f"queue {self.name!r}: low_water of {tp} must be >= 0")
        self._core.partitions.start(tp, low_water)

    def restore_done(self, bookmarks: Iterable[Bookmark]) -> None:
        core = self._core
        for bm in bookmarks:
            part = core.partitions.require(bm)
            offset = bm.offset
            if offset < part.low_water:
                # A stale record the low-water mark already passed: tombstone it again.
                core.changes.append(Forget(bm))
            elif offset < part.read_pos:
                raise QueueError(
                    f"queue {self.name!r}: done record {bm} is below the read position "
                    f"{part.read_pos}; restore done records before reading"
                )
            else:
                part.remember(offset)

    def restore_counts(self, counts: Mapping[Bookmark, tuple[int, int]]) -> None:
        self._core.restored.update(counts)
        self._core.restored_index = None  # built again when add_run needs it

    def restored_pending(self) -> int:
        """How many restored counts still wait for their message to be read (or acked)."""
        return len(self._core.restored)

    def mark_read(self, partition: TopicPartition, next_offset: int) -> None:
        part = self._core.partitions.get(partition)
        if next_offset > part.read_pos:
            part.read_to(next_offset)
            self._core.partitions.touch(part)

    def set_high_watermark(self, partition: TopicPartition, offset: int) -> None:
        self._core.partitions.get(partition).high_watermark = offset

    def low_water(self, partition: TopicPartition) -> int:
        part = self._core.partitions.get(partition)
        part.advance()
        if part.low_water > part.emitted:
            self._core.partitions.touch(part)
        return part.low_water

    def room(self) -> int:
        core = self._core
        if not core.depth:
            return UNLIMITED
        return max(0, core.depth - core.live())

    # -- events ------------------------------------------------------------------------------

    def add(self, arrivals: Iterable[Arrival], now: float) -> None:
        """Arrivals in offset order per partition (``Intake.add``)."""
        self._intake.add(arrivals, now)

    def add_run(
        self,
        partition: TopicPartition,
        start: int,
        timestamps: Sequence[float],
        now: float,
        priority: int | None = None,
    ) -> None:
        """The plain messages at offsets ``start, start + 1, ...`` of ``partition`` (one per
        timestamp), all of ``priority``: the same as ``add`` of an ``Arrival`` for each."""
        self._intake.add_run(partition, start, timestamps, now, priority)

    def subscribe(
        self,
        subscription: str,
        max_backlog: int,
        now: float,
        match: Callable[[Bookmark], bool] | None = None,
    ) -> int:
        core = self._core
        if max_backlog < 0:
            raise ValueError(
                f"queue {self.name!r}: max_backlog of {subscription!r} must be >= 0 "
                f"(got {max_backlog})"
            )
        backlog = min(max_backlog, core.settings.max_per_subscription_backlog)
        sub = core.subs.get(subscription)
        if sub is None:
            sub = Subscriber(subscription, core.next_sub, backlog, match)
            core.next_sub += 1
            core.subs[subscription] = sub
        else:
            # a replace: leases and outstanding count stay, even above the new backlog
            sub.backlog = backlog
            sub.match = match
        core.picker.update(sub)
        if core.router.active():
            core.router.requeue_all()
        return backlog

    def set_backlog(self, subscription: str, backlog: int) -> None:
        """Change a subscription's backlog without a replace; 0 pauses it (the coordinator
        shares one backlog between the queues of a multi-queue subscription this way)."""
        if backlog < 0:
            raise ValueError(f"queue {self.name!r}: backlog {backlog} must be >= 0")
        core = self._core
        sub = core.subscriber(subscription)
        sub.backlog = min(backlog, core.settings.max_per_subscription_backlog)
        core.picker.update(sub)

    def reconfigure(self, settings: EngineSettings) -> None:
        """Take new values of the settings that may change while the queue runs (a reload).

        Each applies from now on: ``lease_period`` to leases granted later, the limits
        (``max_deliveries``, ``max_cancels``, ``expiration``) whenever a message is next checked,
        ``fairness`` to the next pick, a lower ``max_per_subscription_backlog`` at once (open
        subscriptions above it are lowered; what they hold stays theirs). The settings that shape
        the state already built (semantics, priority, groups, exclusive, conflate, track_view)
        raise ``ValueError`` naming them."""
        settings.validate(self.name)
        core = self._core
        old = core.settings
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
            if getattr(settings, name) != getattr(old, name)
        ]
        if fixed:
            raise ValueError(f"queue {self.name!r}: cannot change {', '.join(fixed)} live")
        core.configure(settings)
        cap = settings.max_per_subscription_backlog
        if settings.fairness != old.fairness:
            core.picker = make_picker(settings.fairness)
        for sub in core.subs.values():
            if settings.fairness != old.fairness:
                sub.ready = False  # not in the new picker's set yet: update() adds it
            if sub.backlog > cap:
                sub.backlog = cap
            core.picker.update(sub)

    def disconnect(self, subscription: str, now: float) -> None:
        """Unregister; idempotent (an unknown subscription is ignored)."""
        core = self._core
        sub = core.subs.pop(subscription, None)
        if sub is None:
            return
        if core.alo:
            for entry in list(sub.leases):
                core.end_lease(entry, ReturnReason.DISCONNECT, now)
        sub.handed.clear()
        sub.outstanding = 0
        core.picker.remove(sub)
        router = core.router
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
        return self._acks.ack(subscription, bookmarks, op, now, seconds)

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
        return self._acks.ack_runs(subscription, partition, runs, op, now, seconds)

    def tick(self, now: float) -> None:
        core = self._core
        leases = core.leases
        while (entry := leases.pop_due(now)) is not None:
            core.end_lease(entry, ReturnReason.TIMEOUT, now)
        holding = core.holding
        while (entry := holding.pop_due(now)) is not None:
            core.make_available(entry)
        if core.expiration is not None:
            ages, cutoff = core.ages, now - core.expiration
            while (entry := ages.pop_expired(cutoff)) is not None:
                core.finish(entry, DoneReason.EXPIRATION, now)
        if core.ttl:
            expiries = core.expiries
            while (entry := expiries.pop_due(now)) is not None:
                core.finish(entry, DoneReason.EXPIRATION, now)

    def dispatch(self, now: float) -> None:
        self._dispatcher.dispatch(now)

    def drain(self) -> Effects:
        core = self._core
        core.partitions.drain(core.changes)
        available, leased, delayed = core.available, core.leased, core.holding.delayed
        core.order.compact(available)
        core.ages.compact(available + leased)
        core.leases.compact(leased)
        core.holding.delays.compact(delayed)
        core.expiries.compact(available + leased + delayed)
        core.router.compact(available)
        effects = Effects(core.changes, core.deliveries)
        core.changes, core.deliveries = [], []
        journal = core.journal
        if journal:
            journal.drain(effects.view, core.priority_of if core.priority else None)
        return effects

    def view_synced(self) -> None:
        """The caller published the whole live contents (a restart's reconciliation): the
        view changes recorded until now are part of that and must not be reported again."""
        if self._core.journal is not None:
            self._core.journal.clear()

    # -- read-only answers (``layer.engine.queries``) ----------------------------------------

    def stats(self, now: float) -> EngineStats:
        return self._queries.stats(now)

    def available(self, limit: int | None = None) -> list[Bookmark]:
        """The messages in the queue that nobody holds and that are not delayed, in delivery
        order (messages held behind a barrier, the barrier included, come last): a browse."""
        return self._queries.available(limit)

    def view_contents(self) -> list[ViewChange]:
        """What a view topic must hold now: a +1 change for every message a browse lists."""
        return self._queries.view_contents()

    def lease_contents(self) -> list[tuple[Bookmark, str, int, int]]:
        """Every leased message as (bookmark, holder, deliveries, cancels)."""
        return self._queries.lease_contents()

    def lease_of(self, bookmark: Bookmark) -> Lease | None:
        return self._queries.lease_of(bookmark)

    def leases_of(
        self, subscription: str, limit: int = 100
    ) -> list[tuple[Bookmark, float | None, int]]:
        """Up to ``limit`` messages the subscription holds, in lease order, as (bookmark,
        lease deadline or None, deliveries)."""
        return self._queries.leases_of(subscription, limit)

    def partitions(self) -> list[TopicPartition]:
        return self._queries.partitions()

    def outstanding(self, subscription: str) -> list[Bookmark]:
        return self._queries.outstanding(subscription)

    def held_by(self, subscription: str) -> int:
        """How many messages ``subscription`` holds against its backlog (0 when unknown)."""
        return self._queries.held_by(subscription)

    def barriers(self) -> set[Bookmark]:
        """The barrier messages not sent yet."""
        return self._queries.barriers()

    def leased(self) -> list[Bookmark]:
        """Every leased message (ack by filter looks at these too)."""
        return self._queries.leased()

    def counts(self, bookmark: Bookmark) -> tuple[int, int]:
        """``(deliveries, cancels)`` of a message in the queue; (0, 0) when it is not."""
        return self._queries.counts(bookmark)

    def group_owner(self, group: object) -> str | None:
        """The subscription a message group is bound to now, if any."""
        return self._queries.group_owner(group)
