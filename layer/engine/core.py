"""The core of a queue engine: its state, and the steps that move a message between states.

``QueueEngine`` (``layer.engine.queue``) is a ``Core`` and the parts that work on it, each
given the core when it is built: ``Intake`` (arrivals), ``Acks`` (acks, cancels, expires,
extends), ``Dispatcher`` (who gets what) and ``Queries`` (read-only answers). The core owns
the shared state, in its own parts where one concern has its own data: ``Partitions``
(``layer.engine.partition``), ``Holding`` (what waits: delays, barriers, last values) and
``ViewJournal`` (the view changes of a round). Every change of a message's state, and of the
counts that follow it, is one of the core's methods, so the counts stay right whichever part
asks.

A message's states (``layer.engine.index``): AVAILABLE (in the delivery order), LEASED (held
by a subscription until a deadline), DELAYED, HELD (behind a barrier) and DONE.
"""

from __future__ import annotations

from array import array
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
    Entry,
    ExpiryIndex,
    FifoOrder,
    LeaseIndex,
    PriorityOrder,
)
from layer.engine.journal import ViewJournal
from layer.engine.model import (
    Bookmark,
    Change,
    Delivery,
    Done,
    DoneReason,
    EngineSettings,
    Leased,
    Leasing,
    Returned,
    ReturnReason,
    Semantics,
    ViewChange,
)
from layer.engine.partition import Partitions, PartitionState
from layer.engine.routing import Router
from layer.engine.runs import Run
from layer.exceptions import QueueError

_INF = float("inf")


class Core:
    """One queue's state and the transitions of its messages."""

    def __init__(self, name: str, settings: EngineSettings) -> None:
        settings.validate(name)
        self.name = name
        self.alo = settings.semantics == Semantics.AT_LEAST_ONCE
        self.priority = settings.priority
        self.sort = settings.sort
        self.ttl = settings.message_ttl
        self.configure(settings)
        self.order: FifoOrder | PriorityOrder = (
            PriorityOrder() if settings.priority or settings.sort else FifoOrder()
        )
        self.expiries = ExpiryIndex()  # messages with a TTL of their own (message_ttl)
        self.ages = AgeIndex()
        self.leases = LeaseIndex()
        self.picker: Any = make_picker(settings.fairness)
        # while an ack batch runs: the subscriptions whose picker update waits for its end
        self.deferred: dict[int, Subscriber] | None = None
        self.subs: dict[str, Subscriber] = {}
        self.next_sub = 0
        self.router = Router(self.subs, self.requeue, settings.exclusive, settings.groups)
        self.partitions = Partitions(name)
        self.holding = Holding(settings.conflate)
        self.journal: ViewJournal | None = ViewJournal() if settings.track_view else None
        # Delivery and cancel counts restored from the changelog for messages not read yet
        self.restored: dict[Bookmark, tuple[int, int]] = {}
        # offsets of the restored counts per (topic, partition), sorted; None: to be built
        self.restored_index: dict[tuple[str, int], list[int]] | None = None
        self.seq = 0  # the next arrival's sequence number (its place among equals)
        self.available = 0
        self.leased = 0
        self.done_total = 0
        self.dead_total = 0
        self.delivered_total = 0
        self.changes: list[Change] = []
        self.deliveries: list[Delivery] = []

    def configure(self, settings: EngineSettings) -> None:
        """Take the settings that may change while the queue runs (see
        ``QueueEngine.reconfigure``)."""
        self.settings = settings
        self.strict = settings.leasing == Leasing.STRICT
        self.lease_period = settings.lease_period
        self.max_deliveries = settings.max_deliveries
        self.max_cancels = settings.max_cancels
        self.expiration = settings.expiration
        self.depth = settings.target_queue_depth

    # -- answers the parts share -------------------------------------------------------------

    def live(self) -> int:
        """The messages in the queue (read and not done)."""
        holding = self.holding
        return self.available + self.leased + holding.delayed + holding.held_count

    def subscriber(self, subscription: str) -> Subscriber:
        sub = self.subs.get(subscription)
        if sub is None:
            raise QueueError(
                f"queue {self.name!r}: subscription {subscription!r} is not registered"
            )
        return sub

    def limit_reason(self, deliveries: int, cancels: int) -> DoneReason | None:
        if self.max_cancels and cancels >= self.max_cancels:
            return DoneReason.MAX_CANCELS
        if self.max_deliveries and deliveries >= self.max_deliveries:
            return DoneReason.MAX_DELIVERIES
        return None

    def expired(self, entry: Entry, now: float) -> bool:
        """Its age passed the queue's expiration, or its own TTL passed."""
        expiration = self.expiration
        return (expiration is not None and now - entry.timestamp >= expiration) or (
            entry.expires is not None and now >= entry.expires
        )

    def priority_of(self, entry: Entry) -> int | None:
        rank = entry.key[0]  # see Intake.add: -priority, or infinity for none
        return None if rank == _INF else -rank

    def view_change(self, entry: Entry, sign: int) -> ViewChange:
        priority = self.priority_of(entry) if self.priority else None
        return ViewChange(entry.bookmark, sign, entry.deliveries, entry.cancels, priority)

    # -- into the queue ----------------------------------------------------------------------

    def close_run(self, run: Run, times: array[float]) -> None:
        """A run is built: its messages are available."""
        run.count = run.hi = len(times)
        self.order.push_new(run)
        self.ages.push(run)
        self.available += run.count
        self.partitions.touch(self.partitions.get(run.tp))
        if self.journal is not None:
            for entry in run.entries():
                self.journal.record(entry, 1)

    def arrive(self, entry: Entry) -> None:
        """A new message is available."""
        self.order.push_new(entry)
        self.ages.push(entry)
        if entry.expires is not None:
            self.expiries.push(entry)
        self.available += 1
        if self.journal is not None:
            self.journal.record(entry, 1)

    def make_available(self, entry: Entry) -> None:
        """A returned or delayed message is available again."""
        entry.state = AVAILABLE
        entry.gen += 1
        self.available += 1
        self.order.push_returned(entry)
        self.ages.push(entry)
        if entry.expires is not None:
            self.expiries.push(entry)
        if self.journal is not None:
            self.journal.record(entry, 1)

    def hold(self, entry: Entry, barrier: bool) -> None:
        """A new message waits behind the pending barriers (or is one)."""
        self.holding.hold(entry, barrier)
        if self.journal is not None:
            self.journal.record(entry, 1)  # held messages are in the view

    def release_held(self) -> None:
        """What the first pending barrier held (up to the next one) is available."""
        for entry in self.holding.release():
            entry.state = AVAILABLE  # already in the view
            self.available += 1
            self.order.push_returned(entry)
            self.ages.push(entry)
            if entry.expires is not None:
                self.expiries.push(entry)

    def conflate(self, entry: Entry, key: object, now: float) -> None:
        """Last-value queues: ``entry`` replaces the older message with its key unless that one
        is leased (then both stay; the older is conflated if it comes back)."""
        older = self.holding.newest(entry, key)
        if older is not None:
            self.finish(older, DoneReason.CONFLATED, now)

    def requeue(self, entry: Entry) -> None:
        """Back into the main delivery order (the router's callback; ``gen`` already bumped)."""
        self.order.push_returned(entry)

    # -- out to subscriptions ----------------------------------------------------------------

    def deliver(self, entry: Entry, sub: Subscriber, now: float) -> None:
        bm = entry.bookmark
        entry.deliveries += 1
        self.delivered_total += 1
        self.router.taken(sub, entry)
        if self.alo:
            deadline = now + self.lease_period
            entry.state = LEASED
            entry.holder = sub
            entry.deadline = deadline
            sub.leases[entry] = None
            self.available -= 1
            self.leased += 1
            self.leases.push(entry, deadline)
            if self.journal is not None:
                self.journal.record(entry, -1)
            self.changes.append(Leased(bm, sub.name, deadline, entry.deliveries, entry.cancels))
            self.deliveries.append(
                Delivery(sub.name, bm, entry.deliveries, entry.cancels, deadline)
            )
        else:
            # Done durably before it is handed out: never delivered twice, even across restarts.
            sub.handed[bm] = entry.group
            self.finish(entry, DoneReason.DELIVERED, now)
            self.deliveries.append(Delivery(sub.name, bm, entry.deliveries, entry.cancels, None))
        sub.outstanding += 1
        self.picker.served(sub)

    def lease_many(self, sub: Subscriber, entries: list[Entry], now: float) -> None:
        """At-least-once, no router: ``deliver`` of each of ``entries`` to ``sub`` (those not
        expired), the picker told once."""
        expiration = self.expiration
        ttl = self.ttl
        deadline = now + self.lease_period
        name = sub.name
        leases = sub.leases
        leased: list[Entry] = []  # to the lease index as one batch (one deadline)
        push = leased.append
        changes, deliveries = self.changes, self.deliveries
        journal = self.journal
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
                self.finish(entry, DoneReason.EXPIRATION, now)
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
            if journal is not None:
                journal.record(entry, -1)
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
            self.leases.push_many(leased, deadline)
            self.delivered_total += count
            self.available -= count
            self.leased += count
            sub.outstanding += count
            self.picker.served(sub)

    # -- leases ending -----------------------------------------------------------------------

    def release(self, entry: Entry) -> None:
        """End ``entry``'s lease in the bookkeeping (no effect emitted)."""
        sub: Subscriber = entry.holder
        del sub.leases[entry]
        sub.outstanding -= 1
        if sub.name in self.subs:
            self.repick(sub)
            self.router.returned(sub, entry.group)
        self.leased -= 1
        entry.holder = None
        entry.deadline = None

    def repick(self, sub: Subscriber) -> None:
        """The picker learns ``sub``'s room changed: now, or at the end of a deferred pass."""
        deferred = self.deferred
        if deferred is None:
            self.picker.update(sub)
        else:
            deferred[sub.index] = sub

    def end_lease(self, entry: Entry, reason: ReturnReason, now: float, delay: float = 0.0) -> None:
        """A lease ends without ack: the message is returned, or done when a limit is reached."""
        if reason is ReturnReason.CANCEL:
            entry.cancels += 1
        done = self.limit_reason(entry.deliveries, entry.cancels)
        if done is None and self.expired(entry, now):
            done = DoneReason.EXPIRATION  # its age, or its own TTL, passed while leased
        if done is None and self.holding.superseded(entry):
            done = DoneReason.CONFLATED  # a newer message with its key arrived meanwhile
        if done is not None:
            self.finish(entry, done, now)
            return
        self.release(entry)
        if reason is ReturnReason.TIMEOUT:
            delay = self.settings.backoff(entry.deliveries)
        not_before = now + delay if delay > 0 else None
        if not_before is None:
            self.make_available(entry)
        else:
            self.holding.delay(entry, not_before)
        self.changes.append(
            Returned(entry.bookmark, reason, entry.deliveries, entry.cancels, not_before)
        )

    # -- out of the queue --------------------------------------------------------------------

    def emit_done(
        self, bm: Bookmark, reason: DoneReason, deliveries: int, cancels: int, now: float
    ) -> None:
        self.changes.append(Done(bm, reason, deliveries, cancels, now))
        self.done_total += 1
        if reason.dead_letter:
            self.dead_total += 1

    def finish(
        self, entry: Entry, reason: DoneReason, now: float, part: PartitionState | None = None
    ) -> None:
        """The message leaves the queue (``part``: its partition, when the caller has it)."""
        state = entry.state
        if self.journal is not None and state in (AVAILABLE, HELD):
            self.journal.record(entry, -1)
        if state == AVAILABLE:
            self.available -= 1
        elif state == LEASED:
            self.release(entry)
        elif state == DELAYED:
            self.holding.delayed -= 1
        elif state == HELD and self.holding.left_held(entry):
            entry.state = DONE
            self.release_held()
        entry.state = DONE
        self.holding.forget(entry)
        bm = entry.bookmark
        if part is None:
            part = self.partitions.require(bm)
        part.done(bm)
        self.partitions.touch(part)
        self.emit_done(bm, reason, entry.deliveries, entry.cancels, now)

    def send_barriers(self, now: float) -> None:
        """Send the first pending barrier once everything before it is done, to every current
        subscription whose filter matches, then release what it held (up to the next one).
        With no subscription at all it waits: a barrier sent to nobody would be lost."""
        holding = self.holding
        barriers = holding.barriers
        while barriers and self.subs and not (self.available + self.leased + holding.delayed):
            barrier = barriers.popleft()
            bm = barrier.bookmark
            for sub in self.subs.values():
                if sub.match is None or sub.match(bm):
                    self.deliveries.append(
                        Delivery(sub.name, bm, barrier.deliveries + 1, barrier.cancels, None, True)
                    )
            barrier.deliveries += 1
            self.finish(barrier, DoneReason.BARRIER, now)
            self.release_held()
