"""The queue engine: a deterministic state machine for one queue. No I/O, no threads, no clock.

CONTRACT (the coordinator is written against exactly this; keep it):

Events in (each takes ``now``, the caller's clock, seconds):
- ``add(arrivals, now)``: messages read from the underlying topics enter the queue, in read order
  per partition (offsets strictly increasing per partition). Arrivals whose bookmark was already
  acked while not yet read (a *remembered ack*, see ``ack``) are skipped and counted done.
  A message whose restored ``deliveries``/``cancels`` already reach the limits is done at once
  (dead-lettered with MAX_DELIVERIES / MAX_CANCELS).
- ``room()``: how many more arrivals ``add`` may take now. Unlimited (a large int) without
  target_queue_depth; with it, ``target_queue_depth - (available + leased)`` (never < 0). The
  coordinator does not read further than ``room()`` allows ("not read into state").
- ``start_partition(partition, low_water)``: the queue tracks this partition from ``low_water``
  (restored from the changelog, or where the coordinator starts reading a new partition); its read
  position starts there too.
- ``restore_done(bookmarks)``: done records restored from the changelog at or above the low-water
  mark. They count as done for the low-water mark, and are forgotten (Forget) once it passes them.
  They emit no Done.
- ``mark_read(partition, next_offset)``: the coordinator read up to ``next_offset`` (exclusive) on
  this partition, including offsets that never became arrivals (filtered, control records, gaps).
  Needed for the low-water mark.
- ``set_high_watermark(partition, offset)``: the broker's high watermark; acks for offsets in
  ``[read position, high watermark)`` are remembered (see ``ack``), beyond it they are unknown.
- ``subscribe(subscription, max_backlog, now) -> int``: register (or re-register) a subscription;
  returns the effective backlog ``min(max_backlog, max_per_subscription_backlog)`` (>= 1).
- ``disconnect(subscription, now)``: the subscription is gone; every lease it holds is returned at
  once (Returned DISCONNECT; delivery count kept; a message whose deliveries reached max_deliveries
  is done with MAX_DELIVERIES instead). At-most-once: simply forgotten.
- ``ack(subscription, bookmarks, op, now, seconds=0.0) -> list[AckOutcome]``: one outcome per
  bookmark, in order; a refused bookmark changes nothing.
    * ACK: done (ACKED). Leasing strict: only the lease holder may ack a leased message; an
      available (unleased) message may not be acked under strict (NOT_LEASE_HOLDER). Lenient: any
      subscription may ack any message in the queue (available or leased by anyone). A bookmark at
      or beyond the partition's read position and below its high watermark is a remembered ack:
      a Done(ACKED) is emitted now and the message is skipped when it arrives. Anything else
      (other topic, below the low-water mark, already done, beyond the high watermark) is
      UNKNOWN_BOOKMARK.
    * CANCEL (at-least-once): the lease ends, cancels += 1, Returned(CANCEL); if cancels reaches
      max_cancels the message is done with MAX_CANCELS instead ("expires on the 3rd cancel when
      max_cancels = 3"). Cancel of an unleased message: NOT_LEASED.
    * EXPIRE: done with CONSUMER_EXPIRE (dead-lettered), leased or (lenient) available.
    * EXTEND: the lease deadline becomes ``now + seconds``; no durable change; NOT_LEASED if not
      leased.
    * At-most-once: every op only releases the subscription's backlog slot for a bookmark it was
      handed and has not released yet; anything else is UNKNOWN_BOOKMARK. No state changes.
- ``tick(now)``: lease timeouts (deadline <= now) return messages (Returned TIMEOUT), or finish
  them with MAX_DELIVERIES when deliveries >= max_deliveries ("not delivered again after its 10th
  unsuccessful delivery when max_deliveries = 10") or EXPIRATION when the message is older than
  ``expiration``. Available (unleased) messages older than ``expiration`` (now - timestamp >=
  expiration) are done with EXPIRATION. Leased messages never expire while leased.
- ``dispatch(now)``: hand available messages to subscriptions with free backlog, in queue order
  (arrival order; with ``priority``, highest priority first and oldest first within a priority,
  None lowest), choosing the subscription by fairness:
    fast: the first subscription (in subscribe order) with room;
    round-robin: the next subscription with room after the one served last;
    proportional: the one with the lowest outstanding/max_backlog ratio (ties: subscribe order).
  At-least-once: Leased + Delivery (deliveries += 1, deadline = now + lease_period). At-most-once:
  Done(DELIVERED) + Delivery (deadline None); the subscription's slot stays used until it acks.

Effects out, via ``drain() -> Effects``: ``changes`` (Leased / Returned / Done / LowWater / Forget)
in the order decided, and ``deliveries``. After any change that advances a partition's low-water
mark (the smallest offset not done, or the read position when every read offset is done), a
LowWater is emitted, followed by Forget for each done bookmark now below it (each done bookmark is
forgotten exactly once). At most one LowWater per partition per drain (the latest).

Queries: ``stats(now)``, ``available(limit=None)`` (bookmarks in delivery order; browse),
``lease_of(bookmark)``, ``low_water(partition)``, ``partitions()``, ``outstanding(subscription)``.

Precisions (decided while implementing; the contract above still holds):
- A lease that ends without ack (cancel, timeout, disconnect) checks the limits in this order:
  cancels >= max_cancels -> MAX_CANCELS, deliveries >= max_deliveries -> MAX_DELIVERIES, older than
  ``expiration`` -> EXPIRATION; otherwise Returned. So a cancel at max_deliveries, or a disconnect
  of an expired message, is done at once rather than returned and finished on the next tick.
- ``dispatch`` and ``add`` also apply expiration (an expired message is done, never handed out).
- Every partition must be started before ``add``/``mark_read``/``set_high_watermark``/
  ``restore_done`` name it (QueueError otherwise). ``add`` needs offsets at or beyond the read
  position (call it before ``mark_read`` for the same batch); ``restore_done`` must come before
  reading. A restored done record below the low-water mark is stale: a Forget is emitted for it.
- A remembered ack is accepted under strict leasing too (nobody can hold an unread message);
  CANCEL/EXPIRE/EXTEND of an unread message are UNKNOWN_BOOKMARK. Leasing lenient also lets any
  subscription cancel or extend another's lease.
- ``ack`` from an unregistered subscription raises QueueError; ``disconnect`` of one is a no-op.
  Re-subscribing keeps the subscription's place in subscribe order and its leases.
- ``stats().inactive`` = offsets in [read position, high watermark) not already done (only with
  target_queue_depth; 0 otherwise). ``lease_of`` returns a ``Lease`` or None (always None for
  at-most-once). ``low_water`` is the current mark (may be ahead of the last LowWater emitted).
- LowWater/Forget are appended at the end of ``drain()``'s changes, after the Done that caused them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import NamedTuple

from layer.engine.fairness import Subscriber, make_picker
from layer.engine.index import (
    AVAILABLE,
    DONE,
    LEASED,
    AgeIndex,
    Entry,
    FifoOrder,
    LeaseIndex,
    PriorityOrder,
)
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
    EngineStats,
    Forget,
    Leased,
    Leasing,
    LowWater,
    Returned,
    ReturnReason,
    Semantics,
    TopicPartition,
)
from layer.engine.partition import PartitionState
from layer.exceptions import QueueError

UNLIMITED = sys.maxsize  # room() without target_queue_depth

_INF = float("inf")
_UNKNOWN = AckError.UNKNOWN_BOOKMARK
_NOT_HOLDER = AckError.NOT_LEASE_HOLDER
_NOT_LEASED = AckError.NOT_LEASED


class Lease(NamedTuple):
    """A current lease, as answered by ``QueueEngine.lease_of``."""

    subscription: str
    deadline: float
    deliveries: int
    cancels: int


def _check_settings(name: str, s: EngineSettings) -> None:
    problems = []
    if not s.lease_period > 0:
        problems.append(f"lease_period must be > 0 (got {s.lease_period})")
    if s.max_per_subscription_backlog < 1:
        problems.append(
            f"max_per_subscription_backlog must be >= 1 (got {s.max_per_subscription_backlog})"
        )
    if s.max_deliveries < 0:
        problems.append(f"max_deliveries must be >= 0 (got {s.max_deliveries})")
    if s.max_cancels < 0:
        problems.append(f"max_cancels must be >= 0 (got {s.max_cancels})")
    if s.expiration is not None and not s.expiration > 0:
        problems.append(f"expiration must be > 0 or None (got {s.expiration})")
    if s.target_queue_depth < 0:
        problems.append(f"target_queue_depth must be >= 0 (got {s.target_queue_depth})")
    if problems:
        raise ValueError(f"queue {name!r}: " + "; ".join(problems))


class QueueEngine:
    """One queue's state machine (see the module docstring for the contract)."""

    def __init__(self, name: str, settings: EngineSettings) -> None:
        _check_settings(name, settings)
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
        self._order: FifoOrder | PriorityOrder = (
            PriorityOrder() if settings.priority else FifoOrder()
        )
        self._ages = AgeIndex()
        self._leases = LeaseIndex()
        self._picker = make_picker(settings.fairness)
        self._subs: dict[str, Subscriber] = {}
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
        return max(0, self._depth - self._available - self._leased)

    # -- events ------------------------------------------------------------------------------

    def add(self, arrivals: Iterable[Arrival], now: float) -> None:
        expiration = self._expiration
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
                    continue
            part.read_pos = offset + 1
            reason = self._limit_reason(arrival.deliveries, arrival.cancels)
            if reason is None and expiration is not None and now - arrival.timestamp >= expiration:
                reason = DoneReason.EXPIRATION
            if reason is not None:
                part.offsets.append(offset)
                part.items.append(bm)
                self._touch(part)
                self._emit_done(bm, reason, arrival.deliveries, arrival.cancels, now)
                continue
            seq = self._seq
            self._seq = seq + 1
            if self._priority:
                priority = arrival.priority
                key: object = (_INF if priority is None else -priority, seq)
            else:
                key = seq
            entry = Entry(bm, key, arrival.timestamp, arrival.deliveries, arrival.cancels)
            part.offsets.append(offset)
            part.items.append(entry)
            if not part.dirty:
                self._touch(part)
            self._order.push_new(entry)
            self._ages.push(entry)
            self._available += 1

    def subscribe(self, subscription: str, max_backlog: int, now: float) -> int:
        if max_backlog < 1:
            raise ValueError(
                f"queue {self.name!r}: max_backlog of {subscription!r} must be >= 1 "
                f"(got {max_backlog})"
            )
        backlog = min(max_backlog, self.settings.max_per_subscription_backlog)
        sub = self._subs.get(subscription)
        if sub is None:
            sub = Subscriber(subscription, self._next_sub, backlog)
            self._next_sub += 1
            self._subs[subscription] = sub
        else:
            sub.backlog = backlog
        self._picker.update(sub)
        return backlog

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

    def ack(
        self,
        subscription: str,
        bookmarks: Iterable[Bookmark],
        op: AckOp,
        now: float,
        seconds: float = 0.0,
    ) -> list[AckOutcome]:
        sub = self._subs.get(subscription)
        if sub is None:
            raise QueueError(
                f"queue {self.name!r}: subscription {subscription!r} is not registered"
            )
        if op is AckOp.EXTEND and seconds < 0:
            raise ValueError(f"queue {self.name!r}: extend by {seconds} seconds (must be >= 0)")
        if not self._alo:
            return [AckOutcome(bm, self._release_slot(sub, bm)) for bm in bookmarks]
        return [AckOutcome(bm, self._ack_one(sub, bm, op, now, seconds)) for bm in bookmarks]

    def tick(self, now: float) -> None:
        leases = self._leases
        while (entry := leases.pop_due(now)) is not None:
            self._end_lease(entry, ReturnReason.TIMEOUT, now)
        if self._expiration is not None:
            ages, cutoff = self._ages, now - self._expiration
            while (entry := ages.pop_expired(cutoff)) is not None:
                self._finish(entry, DoneReason.EXPIRATION, now)

    def dispatch(self, now: float) -> None:
        picker, order = self._picker, self._order
        expiration = self._expiration
        changes, deliveries = self._changes, self._deliveries
        alo, lease_period = self._alo, self._lease_period
        while self._available:
            sub = picker.pick()
            if sub is None:
                return
            entry = order.pop()
            if entry is None:  # unreachable while the available count is right
                return
            if expiration is not None and now - entry.timestamp >= expiration:
                self._finish(entry, DoneReason.EXPIRATION, now)
                continue
            bm = entry.bookmark
            entry.deliveries += 1
            self._delivered_total += 1
            if alo:
                deadline = now + lease_period
                entry.state = LEASED
                entry.holder = sub
                entry.deadline = deadline
                sub.leases[entry] = None
                self._available -= 1
                self._leased += 1
                self._leases.push(entry, deadline)
                changes.append(Leased(bm, sub.name, deadline, entry.deliveries, entry.cancels))
                deliveries.append(Delivery(sub.name, bm, entry.deliveries, entry.cancels, deadline))
            else:
                # Done durably before it is handed out: never delivered twice, even across
                # restarts.
                sub.handed[bm] = None
                self._finish(entry, DoneReason.DELIVERED, now)
                deliveries.append(Delivery(sub.name, bm, entry.deliveries, entry.cancels, None))
            sub.outstanding += 1
            picker.served(sub)

    def drain(self) -> Effects:
        for part in self._dirty:
            part.dirty = False
            part.advance()
            if part.low_water > part.emitted:
                part.emitted = part.low_water
                self._changes.append(LowWater(part.tp, part.low_water))
                self._changes.extend(Forget(bm) for bm in part.forgets)
                part.forgets.clear()
        self._dirty.clear()
        self._order.compact(self._available)
        self._ages.compact(self._available + self._leased)
        self._leases.compact(self._leased)
        effects = Effects(self._changes, self._deliveries)
        self._changes, self._deliveries = [], []
        return effects

    # -- queries -----------------------------------------------------------------------------

    def stats(self, now: float) -> EngineStats:
        oldest = self._ages.oldest()
        return EngineStats(
            available=self._available,
            leased=self._leased,
            inactive=sum(p.inactive() for p in self._parts) if self._depth else 0,
            subscriptions=len(self._subs),
            oldest_available_at=None if oldest is None else oldest.timestamp,
            done_total=self._done_total,
            dead_lettered_total=self._dead_total,
            delivered_total=self._delivered_total,
        )

    def available(self, limit: int | None = None) -> list[Bookmark]:
        return [entry.bookmark for entry in self._order.browse(limit)]

    def lease_of(self, bookmark: Bookmark) -> Lease | None:
        part = self._lookup(bookmark)
        entry = None if part is None else part.entry(bookmark.offset)
        if entry is None or entry.state != LEASED or entry.deadline is None:
            return None
        return Lease(entry.holder.name, entry.deadline, entry.deliveries, entry.cancels)

    def low_water(self, partition: TopicPartition) -> int:
        part = self._partition(partition)
        part.advance()
        if part.low_water > part.emitted:
            self._touch(part)
        return part.low_water

    def partitions(self) -> list[TopicPartition]:
        return [part.tp for part in self._parts]

    def outstanding(self, subscription: str) -> list[Bookmark]:
        sub = self._subs.get(subscription)
        if sub is None:
            raise QueueError(
                f"queue {self.name!r}: subscription {subscription!r} is not registered"
            )
        if self._alo:
            return [entry.bookmark for entry in sub.leases]
        return list(sub.handed)

    # -- internals ---------------------------------------------------------------------------

    def _lookup(self, bm: Bookmark) -> PartitionState | None:
        by_partition = self._topics.get(bm.topic)
        return None if by_partition is None else by_partition.get(bm.partition)

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

    def _release(self, entry: Entry) -> None:
        """End ``entry``'s lease in the bookkeeping (no effect emitted)."""
        sub: Subscriber = entry.holder
        del sub.leases[entry]
        sub.outstanding -= 1
        if sub.name in self._subs:
            self._picker.update(sub)
        self._leased -= 1
        entry.holder = None
        entry.deadline = None

    def _finish(self, entry: Entry, reason: DoneReason, now: float) -> None:
        """The message leaves the queue."""
        state = entry.state
        if state == AVAILABLE:
            self._available -= 1
        elif state == LEASED:
            self._release(entry)
        entry.state = DONE
        bm = entry.bookmark
        part = self._require(bm)
        part.items[part.find(bm.offset)] = bm
        self._touch(part)
        self._emit_done(bm, reason, entry.deliveries, entry.cancels, now)

    def _end_lease(self, entry: Entry, reason: ReturnReason, now: float) -> None:
        """A lease ends without ack: the message is returned, or done when a limit is reached."""
        if reason is ReturnReason.CANCEL:
            entry.cancels += 1
        done = self._limit_reason(entry.deliveries, entry.cancels)
        expiration = self._expiration
        if done is None and expiration is not None and now - entry.timestamp >= expiration:
            done = DoneReason.EXPIRATION
        if done is not None:
            self._finish(entry, done, now)
            return
        self._release(entry)
        entry.state = AVAILABLE
        self._available += 1
        self._order.push_returned(entry)
        self._ages.push(entry)
        self._changes.append(Returned(entry.bookmark, reason, entry.deliveries, entry.cancels))

    def _ack_one(
        self, sub: Subscriber, bm: Bookmark, op: AckOp, now: float, seconds: float
    ) -> AckError | None:
        part = self._lookup(bm)
        if part is None:
            return _UNKNOWN
        offset = bm.offset
        entry = part.entry(offset)
        if entry is None:
            if (
                op is AckOp.ACK
                and part.read_pos <= offset < part.high_watermark
                and part.remember(offset)
            ):
                self._emit_done(bm, DoneReason.ACKED, 0, 0, now)
                return None
            return _UNKNOWN
        holder = entry.holder
        if op is AckOp.ACK or op is AckOp.EXPIRE:
            if self._strict and holder is not sub:
                return _NOT_HOLDER
            reason = DoneReason.ACKED if op is AckOp.ACK else DoneReason.CONSUMER_EXPIRE
            self._finish(entry, reason, now)
            return None
        if holder is None:
            return _NOT_LEASED
        if self._strict and holder is not sub:
            return _NOT_HOLDER
        if op is AckOp.CANCEL:
            self._end_lease(entry, ReturnReason.CANCEL, now)
        else:
            deadline = now + seconds
            entry.deadline = deadline
            self._leases.push(entry, deadline)
        return None

    def _release_slot(self, sub: Subscriber, bm: Bookmark) -> AckError | None:
        """At-most-once: an ack only gives the subscription its backlog slot back."""
        if bm not in sub.handed:
            return _UNKNOWN
        del sub.handed[bm]
        sub.outstanding -= 1
        self._picker.update(sub)
        return None
