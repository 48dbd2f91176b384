"""Property tests of the queue engine: random interleavings must keep the queue's invariants.

The state machine plays a coordinator: it publishes to an in-memory topic log, reads it into the
engine (within ``room()``), subscribes, dispatches, acks, lets time pass, disconnects, and restarts
the engine from nothing but the durable changes it drained (as the coordinator restores from its
changelog). After every step it checks the effects and the engine's state against a model.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from layer.coordinator.records import changelog_order
from layer.engine.fairness import Subscriber, make_picker
from layer.engine.index import DONE, Entry
from layer.engine.model import (
    AckError,
    AckOp,
    AckOutcome,
    Arrival,
    Bookmark,
    Done,
    DoneReason,
    EngineSettings,
    Fairness,
    Forget,
    Leased,
    Leasing,
    LowWater,
    Returned,
    ReturnReason,
    Semantics,
    TopicPartition,
    singles,
)
from layer.engine.queue import QueueEngine, sort_rank
from layer.engine.runs import Run
from layer.exceptions import QueueError

TOPIC = "t"
PARTITIONS = (0, 1)
SUBSCRIPTIONS = ("s0", "s1", "s2")


def ack_as_runs(
    engine: QueueEngine,
    name: str | None,
    bookmarks: list[Bookmark],
    op: AckOp,
    now: float,
    seconds: float = 0.0,
) -> list[AckOutcome]:
    """``engine.ack`` of sorted, distinct ``bookmarks`` through ``ack_runs``: partition by
    partition, consecutive offsets joined into runs, as the wire carries them."""
    refused: dict[Bookmark, AckError] = {}
    by_partition: dict[tuple[str, int], list[int]] = {}
    for b in bookmarks:
        by_partition.setdefault((b.topic, b.partition), []).append(b.offset)
    for (topic, partition), offsets in by_partition.items():
        runs: list[int] = []
        for o in offsets:
            if runs and o == runs[-1] + 1:
                runs[-1] = o
            else:
                runs += (o, o)
        tp = TopicPartition(topic, partition)
        for offset, error in engine.ack_runs(name, tp, runs, op, now, seconds):
            refused[Bookmark(topic, partition, offset)] = error
    return [AckOutcome(b, refused.get(b)) for b in bookmarks]


@st.composite
def engine_settings(draw: st.DrawFn) -> EngineSettings:
    semantics = draw(st.sampled_from(Semantics))
    fairness = (
        Fairness.ROUND_ROBIN
        if semantics is Semantics.AT_MOST_ONCE
        else draw(st.sampled_from(Fairness))
    )
    # the queue type: arrival order, priority, Qpid's sorted queue, Solace's last value queue
    # (a spool of one per partition), or per-message TTLs
    mode = draw(st.sampled_from(["fifo", "fifo", "priority", "priority", "sort", "last", "ttl"]))
    return EngineSettings(
        semantics=semantics,
        lease_period=draw(st.sampled_from([1.0, 4.0])),
        max_per_subscription_backlog=draw(st.integers(1, 4)),
        fairness=fairness,
        leasing=draw(st.sampled_from(Leasing)),
        max_deliveries=draw(st.sampled_from([0, 1, 3])),
        max_cancels=draw(st.sampled_from([0, 1, 2])),
        expiration=draw(st.sampled_from([None, 3.0, 12.0])),
        target_queue_depth=draw(st.sampled_from([0, 0, 3])),
        priority=mode == "priority",
        sort=mode == "sort",
        conflate=mode == "last",
        message_ttl=mode == "ttl",
    )


class EngineMachine(RuleBasedStateMachine):
    # -- setup and restart -----------------------------------------------------------------------

    @initialize(config=engine_settings(), backlog=st.integers(1, 5))
    def start(self, config: EngineSettings, backlog: int) -> None:
        self.config = config
        self.alo = config.semantics is Semantics.AT_LEAST_ONCE
        self.now = 0.0
        # The topic: per partition, (timestamp, priority, filtered out) by offset.
        self.log: dict[int, list[tuple[float, int | None, bool]]] = {p: [] for p in PARTITIONS}
        # and its (sort key, ttl) by offset: what a sorted or TTL queue reads from a message
        self.meta: dict[int, list[tuple[str | None, float | None]]] = {p: [] for p in PARTITIONS}
        self.last_read: dict[int, Bookmark] = {}  # per partition, the newest message read
        # What the changelog holds: the last Leased/Returned/Done per bookmark, and the marks.
        self.durable: dict[Bookmark, Leased | Returned | Done] = {}
        self.low = dict.fromkeys(PARTITIONS, 0)
        # Across restarts.
        self.done_ever: set[Bookmark] = set()
        self.delivered_ever: set[Bookmark] = set()
        self.forgotten: set[Bookmark] = set()
        self.deliveries: dict[Bookmark, int] = {}
        self.boot()
        self.subscribe("s0", backlog)

    def boot(self) -> None:
        """A fresh engine built from the durable changes only (leases and subscriptions die)."""
        self.engine = QueueEngine("q", self.config)
        self.last_read = {}  # read again from the low-water marks
        self.read_next: dict[int, int] = {}
        for p in PARTITIONS:
            self.engine.start_partition(TopicPartition(TOPIC, p), self.low[p])
            self.read_next[p] = self.low[p]
        self.engine.restore_done([b for b, c in self.durable.items() if isinstance(c, Done)])
        # as the coordinator does: counts of messages not read yet live in the engine, and
        # arrivals carry none (a remembered ack of one must keep its count: it never goes back)
        self.engine.restore_counts(
            {
                b: (c.deliveries, c.cancels)
                for b, c in self.durable.items()
                if isinstance(c, (Leased, Returned))
            }
        )
        self.holders: dict[Bookmark, str] = {}
        self.deadlines: dict[Bookmark, float] = {}
        self.backlogs: dict[str, int] = {}
        self.excess: dict[str, int] = {}
        self.handed: dict[str, set[Bookmark]] = {}
        self.check_effects()

    @rule(dice=st.integers(0, 5))
    def restart(self, dice: int) -> None:
        if dice == 0:  # rarer than the other steps, so that work piles up between restarts
            self.boot()

    # -- the topic and reading -------------------------------------------------------------------

    @rule(
        partition=st.sampled_from(PARTITIONS),
        priority=st.none() | st.integers(0, 3),
        filtered=st.sampled_from([False, False, False, True]),
        lag=st.sampled_from([0.0, 0.0, 0.0, 1.5]),
        count=st.integers(1, 4),
        then=st.sampled_from(["nothing", "read", "read and dispatch"]),
        key=st.none() | st.sampled_from(["a", "b", "B", "ab"]),
        ttl=st.none() | st.sampled_from([0.5, 2.0, 6.0]),
    )
    def publish(
        self,
        partition: int,
        priority: int | None,
        filtered: bool,
        lag: float,
        count: int,
        then: str,
        key: str | None = None,
        ttl: float | None = None,
    ) -> None:
        for _ in range(count):
            self.log[partition].append((self.now - lag, priority, filtered))
            self.meta[partition].append((key, ttl))
        if then != "nothing":
            self.read()
        if then == "read and dispatch":
            self.dispatch()

    @rule(batches=st.booleans())
    def read(self, batches: bool = False) -> None:
        """``batches``: as the coordinator's ingest does, consecutive offsets of one priority
        go in with ``add_run``, the others with ``add`` (always ``add`` for the queue types
        whose messages carry something of their own, as the coordinator does)."""
        config = self.config
        if config.sort or config.conflate or config.message_ttl:
            batches = False
        for p in PARTITIONS:
            tp = TopicPartition(TOPIC, p)
            room = self.engine.room()
            offset, arrivals = self.read_next[p], []
            while offset < len(self.log[p]) and room > 0:
                timestamp, priority, filtered = self.log[p][offset]
                if not filtered:
                    b = Bookmark(TOPIC, p, offset)
                    key, ttl = self.meta[p][offset]
                    arrival = Arrival(b, timestamp, priority, 0, 0)
                    if config.sort:
                        arrival.sort_key = key
                    if config.conflate:
                        arrival.conflate_key = ("last", p)  # a spool of one per partition
                    if config.message_ttl and ttl is not None:
                        arrival.expires_at = timestamp + ttl
                    arrivals.append(arrival)
                    self.last_read[p] = b
                    room -= 1
                offset += 1
            if batches:
                self.add_runs(tp, arrivals)
            else:
                self.engine.add(arrivals, self.now)
            self.engine.mark_read(tp, offset)
            self.engine.set_high_watermark(tp, len(self.log[p]))
            self.read_next[p] = offset
        self.check_effects()

    def add_runs(self, tp: TopicPartition, arrivals: list[Arrival]) -> None:
        i = 0
        while i < len(arrivals):
            j = i + 1
            while (
                j < len(arrivals)
                and arrivals[j].bookmark.offset == arrivals[j - 1].bookmark.offset + 1
                and arrivals[j].priority == arrivals[i].priority
            ):
                j += 1
            if j - i == 1 and i % 2:
                self.engine.add(arrivals[i:j], self.now)
            else:
                times = [a.timestamp for a in arrivals[i:j]]
                start = arrivals[i].bookmark.offset
                self.engine.add_run(tp, start, times, self.now, arrivals[i].priority)
                event("read a run of " + ("one" if j - i == 1 else "several"))
            i = j

    # -- subscriptions ---------------------------------------------------------------------------

    @rule(name=st.sampled_from(SUBSCRIPTIONS), backlog=st.integers(1, 5))
    def subscribe(self, name: str, backlog: int) -> None:
        effective = self.engine.subscribe(name, backlog, self.now)
        assert effective == min(backlog, self.config.max_per_subscription_backlog)
        self.backlogs[name] = effective
        # A smaller backlog takes nothing back: the excess drains as the subscription acks.
        self.excess[name] = len(self.engine.outstanding(name))
        self.handed.setdefault(name, set())
        self.check_effects()

    @rule(name=st.sampled_from(SUBSCRIPTIONS), dice=st.integers(0, 2))
    def disconnect(self, name: str, dice: int) -> None:
        if dice:
            return
        held = {b for b, h in self.holders.items() if h == name}
        self.engine.disconnect(name, self.now)
        self.backlogs.pop(name, None)
        self.handed.pop(name, None)
        changes = self.check_effects()
        ended = {c.bookmark for c in changes if isinstance(c, (Returned, Done))}
        assert ended == held
        for c in changes:
            if isinstance(c, Returned):
                assert c.reason is ReturnReason.DISCONNECT

    @rule(name=st.sampled_from(SUBSCRIPTIONS), dice=st.integers(0, 2))
    def disconnect_then_dispatch(self, name: str, dice: int) -> None:
        """A subscription leaves and what it held goes out again in the same round (one
        drain): the Returned of each message and the Leased of their run meet in one round's
        changes, the case ``changelog_order`` takes message by message."""
        if dice or name not in self.backlogs:
            return
        self.engine.disconnect(name, self.now)
        self.backlogs.pop(name)
        self.handed.pop(name, None)
        self.engine.dispatch(self.now)
        self.check_effects()

    @rule()
    def dispatch(self) -> None:
        self.engine.dispatch(self.now)
        changes = self.check_effects()
        if self.config.sort:
            # a sorted queue hands out in sort order: nothing left available sorts before
            # what this dispatch handed out
            handed = [
                c.bookmark
                for c in changes
                if isinstance(c, Leased)
                or (isinstance(c, Done) and c.reason is DoneReason.DELIVERED)
            ]
            left = self.engine.available()
            if handed and left:
                assert max(map(self.rank, handed)) <= min(map(self.rank, left))
                event("sorted dispatch with messages left")
        if self.engine.stats(self.now).available:
            for name, backlog in self.backlogs.items():
                assert len(self.engine.outstanding(name)) >= backlog, "a subscription was idle"

    # -- acks --------------------------------------------------------------------------------

    @rule(name=st.sampled_from(SUBSCRIPTIONS))
    def ack_unregistered(self, name: str) -> None:
        if name not in self.backlogs:
            with pytest.raises(QueueError, match="not registered"):
                self.engine.ack(name, [Bookmark(TOPIC, 0, 0)], AckOp.ACK, self.now)

    @precondition(lambda self: self.backlogs)
    @rule(
        data=st.data(),
        op=st.sampled_from(AckOp),
        seconds=st.sampled_from([0.0, 2.0, 10.0]),
        own=st.integers(0, 3),
    )
    def ack(self, data: st.DataObject, op: AckOp, seconds: float, own: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.backlogs)))
        outstanding = self.engine.outstanding(name)
        if own == 3 and outstanding:
            # all it holds at once, as a consumer's batched acks do (whole spans of a run in
            # one step, ``_ack_span``), now and then with one more bookmark of the topic
            bookmarks = list(outstanding)
            extra = [Bookmark(TOPIC, p, o) for p in PARTITIONS for o in range(len(self.log[p]))]
            if extra and data.draw(st.booleans(), label="and one more"):
                bookmarks.append(data.draw(st.sampled_from(extra)))
        elif own and outstanding:  # mostly ack what the subscription holds, as consumers do
            candidates = list(outstanding)
            bookmarks = data.draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3))
        else:
            candidates = list(outstanding)
            candidates += [
                Bookmark(TOPIC, p, o) for p in PARTITIONS for o in range(len(self.log[p]))
            ]
            candidates.append(Bookmark(TOPIC, 0, len(self.log[0]) + 2))
            candidates.append(Bookmark("other", 0, 0))
            bookmarks = data.draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3))
        holders = dict(self.holders)
        handed = set(self.handed[name])
        # a delayed cancel is the routing machine's business (test_engine_routing_properties)
        delay = seconds if op is AckOp.EXTEND else 0.0
        if data.draw(st.booleans(), label="as runs"):  # what the wire carries: ack_runs
            bookmarks = sorted(set(bookmarks))
            outcomes = ack_as_runs(self.engine, name, bookmarks, op, self.now, delay)
        else:
            outcomes = self.engine.ack(name, bookmarks, op, self.now, delay)
        assert [o.bookmark for o in outcomes] == bookmarks
        accepted = set()
        for outcome in outcomes:
            b = outcome.bookmark
            event(f"{self.config.leasing} {op} {outcome.error or 'accepted'}")
            if outcome.error is not None:
                assert self.alo or b not in handed, "at-most-once ack of a handed bookmark refused"
                continue
            accepted.add(b)
            if not self.alo:
                assert b in handed, "at-most-once ack of a bookmark not handed out"
                handed.discard(b)
                continue
            if self.config.leasing is Leasing.STRICT and self.is_read(b):
                assert holders.get(b) == name, f"strict leasing let {name} {op} {b}"
            if op in (AckOp.CANCEL, AckOp.EXTEND):
                assert b in holders, f"{op} of a message nobody holds"
            if op is AckOp.EXTEND:
                self.deadlines[b] = self.now + seconds
            elif op is not AckOp.CANCEL:
                holders.pop(b, None)
        if not self.alo:
            self.handed[name] = handed
        changes = self.check_effects()
        for c in changes:
            if isinstance(c, (Returned, Done)):
                assert c.bookmark in accepted, f"{c} for a bookmark whose ack was refused"
                if isinstance(c, Done) and op is AckOp.ACK:
                    assert c.reason is DoneReason.ACKED
                if isinstance(c, Done) and op is AckOp.EXPIRE:
                    assert c.reason is DoneReason.CONSUMER_EXPIRE
            if isinstance(c, Leased):
                raise AssertionError("an ack leased a message")

    @precondition(lambda self: self.alo)
    @rule(data=st.data(), op=st.sampled_from([AckOp.ACK, AckOp.EXPIRE]))
    def ack_by_filter(self, data: st.DataObject, op: AckOp) -> None:
        """An ack on behalf of no subscription (the API's ack by filter): it finishes available
        messages wherever they sit in their run (splitting it), and under strict leasing never
        a held one."""
        candidates = [Bookmark(TOPIC, p, o) for p in PARTITIONS for o in range(len(self.log[p]))]
        if not candidates:
            return
        bookmarks = data.draw(
            st.lists(st.sampled_from(candidates), min_size=1, max_size=4, unique=True)
        )
        holders = dict(self.holders)
        available = set(self.engine.available())
        if data.draw(st.booleans(), label="as runs"):
            bookmarks = sorted(bookmarks)
            outcomes = ack_as_runs(self.engine, None, bookmarks, op, self.now)
        else:
            outcomes = self.engine.ack(None, bookmarks, op, self.now)
        accepted = set()
        for outcome in outcomes:
            b = outcome.bookmark
            event(f"by filter {op} {outcome.error or 'accepted'}")
            if b in available:
                assert outcome.error is None, f"{op} by filter of available {b} refused"
            if outcome.error is None:
                accepted.add(b)
                if self.config.leasing is Leasing.STRICT and self.is_read(b):
                    assert b not in holders, f"strict leasing let an ack by filter take {b}"
        for c in self.check_effects():
            if isinstance(c, Done):
                assert c.bookmark in accepted
                assert c.reason is (
                    DoneReason.ACKED if op is AckOp.ACK else DoneReason.CONSUMER_EXPIRE
                )
            assert not isinstance(c, (Leased, Returned)), f"an ack by filter made {c}"

    def rank(self, b: Bookmark) -> tuple[int, str, float]:
        """A message's place in a sorted queue: by sort key, None last, then enqueue time."""
        return sort_rank(self.meta[b.partition][b.offset][0], self.log[b.partition][b.offset][0])

    def expired(self, b: Bookmark) -> bool:
        """The message is older than the queue's expiration, or past its own TTL."""
        timestamp = self.log[b.partition][b.offset][0]
        ttl = self.meta[b.partition][b.offset][1] if self.config.message_ttl else None
        expiration = self.config.expiration
        return (expiration is not None and self.now - timestamp >= expiration) or (
            ttl is not None and self.now >= timestamp + ttl
        )

    def is_read(self, b: Bookmark) -> bool:
        return b.topic == TOPIC and b.offset < self.read_next[b.partition]

    # -- time ------------------------------------------------------------------------------------

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.5, 7.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.engine.tick(self.now)
        for c in self.check_effects():
            if isinstance(c, Returned):
                assert c.reason is ReturnReason.TIMEOUT
        for b in self.engine.available():
            assert not self.expired(b), f"{b} still available after its expiry"

    # -- checks ----------------------------------------------------------------------------------

    def check_effects(self) -> list:
        effects = self.engine.drain()
        for c in effects.changes:
            count = getattr(c, "count", 1)
            assert count >= 1
            if count > 1 and not isinstance(c, Forget):
                event(f"{type(c).__name__} of a run")
        self.check_changelog_order(effects.changes)
        for c in singles(effects.changes):
            b = getattr(c, "bookmark", None)
            event(type(c).__name__ + (f" {c.reason}" if isinstance(c, (Done, Returned)) else ""))
            if isinstance(c, Leased):
                assert self.alo
                assert b not in self.holders, f"{b} leased twice at once"
                assert b not in self.done_ever
                assert c.deliveries == self.deliveries.get(b, 0) + 1
                assert c.holder in self.backlogs
                assert c.deadline == self.now + self.config.lease_period
                assert not self.expired(b), f"{b} delivered after it expired"
                limit = self.config.max_deliveries
                assert not limit or c.deliveries <= limit, "delivered beyond max_deliveries"
                self.holders[b] = c.holder
                self.deadlines[b] = c.deadline
                self.deliveries[b] = c.deliveries
                self.durable[b] = c
            elif isinstance(c, Returned):
                assert b in self.holders, f"{b} returned but not leased"
                if c.reason is ReturnReason.TIMEOUT:
                    assert self.deadlines[b] <= self.now, "timed out before its deadline"
                del self.holders[b]
                assert c.deliveries == self.deliveries[b]
                for count, limit in (
                    (c.deliveries, self.config.max_deliveries),
                    (c.cancels, self.config.max_cancels),
                ):
                    assert not limit or count < limit, "returned at a limit instead of done"

                self.durable[b] = c
            elif isinstance(c, Done):
                assert b not in self.done_ever, f"{b} done twice"
                assert c.deliveries >= self.deliveries.get(b, 0)
                if c.reason is DoneReason.DELIVERED:
                    assert not self.alo
                    assert not self.expired(b), f"{b} delivered after it expired"
                if c.reason is DoneReason.EXPIRATION:
                    assert self.expired(b), f"{b} expired early"
                    event("expired" + (" by its own TTL" if self.config.message_ttl else ""))
                if c.reason is DoneReason.CONFLATED:
                    assert self.config.conflate
                    assert b != self.last_read.get(b.partition), "the newest message was conflated"
                self.holders.pop(b, None)
                self.done_ever.add(b)
                self.deliveries[b] = c.deliveries
                self.durable[b] = c
            elif isinstance(c, LowWater):
                p = c.partition.partition
                assert c.offset > self.low[p], "the low-water mark went back (or stood still)"
                self.low[p] = c.offset
                for offset in range(c.offset):
                    done = Bookmark(TOPIC, p, offset)
                    assert self.log[p][offset][2] or done in self.done_ever, (
                        f"low-water mark {c.offset} passed {done}, which is not done"
                    )
            elif isinstance(c, Forget):  # a run: the tombstones of c.count messages from b
                assert c.count >= 1
                if c.count > 1:
                    event("Forget of a run")
                for offset in range(b.offset, b.offset + c.count):
                    f = Bookmark(b.topic, b.partition, offset)
                    assert f not in self.forgotten, f"{f} forgotten twice"
                    assert f in self.done_ever and f.offset < self.low[f.partition]
                    self.forgotten.add(f)
                    self.durable.pop(f, None)
        for d in effects.deliveries:
            assert d.subscription in self.backlogs
            if self.alo:
                assert self.holders[d.bookmark] == d.subscription
                assert d.deadline == self.deadlines[d.bookmark]
            else:
                assert d.bookmark not in self.delivered_ever, f"{d.bookmark} delivered twice"
                assert d.bookmark in self.done_ever, "at-most-once delivered before done"
                assert d.deadline is None
                self.delivered_ever.add(d.bookmark)
                self.handed[d.subscription].add(d.bookmark)
        for b in self.done_ever:
            if b.offset < self.low[b.partition]:
                assert b in self.forgotten, f"{b} is below the low-water mark but not forgotten"
        return list(singles(effects.changes))

    def check_changelog_order(self, changes: list) -> None:
        """The changes as a round writes them (``changelog_order``: sorted, runs kept where no
        other change of the round is inside them) leave each message as the engine's order
        does: what a restore from the changelog reads back."""
        ordered = changelog_order(list(changes))
        if any(getattr(c, "count", 1) > 1 and not isinstance(c, Forget) for c in ordered):
            event("a run kept in the changelog order")
        by_engine: dict[Bookmark, object] = {}
        by_round: dict[Bookmark, object] = {}
        for into, source in ((by_engine, changes), (by_round, ordered)):
            for c in singles(source):
                if isinstance(c, Leased | Returned | Done):
                    into[c.bookmark] = c
                elif isinstance(c, Forget):
                    for offset in range(c.bookmark.offset, c.bookmark.offset + c.count):
                        into[c.bookmark._replace(offset=offset)] = None
        assert by_round == by_engine

    @invariant()
    def state_is_consistent(self) -> None:
        engine = self.engine
        available = engine.available()
        assert len(available) == len(set(available))
        available_set = set(available)
        leased = set(self.holders)
        assert not available_set & leased
        assert not available_set & self.done_ever
        assert not leased & self.done_ever
        for p in PARTITIONS:
            for offset in range(self.read_next[p]):
                b = Bookmark(TOPIC, p, offset)
                if not self.log[p][offset][2]:
                    assert b in available_set or b in leased or b in self.done_ever, f"{b} lost"
        for b, holder in self.holders.items():
            lease = engine.lease_of(b)
            assert lease is not None and lease.subscription == holder
            assert lease.deadline == self.deadlines[b]
        stats = engine.stats(self.now)
        assert stats.available == len(available_set)
        assert stats.leased == len(leased)
        assert stats.subscriptions == len(self.backlogs)
        for name, backlog in self.backlogs.items():
            outstanding = engine.outstanding(name)
            self.excess[name] = min(self.excess[name], len(outstanding))
            assert len(outstanding) <= max(backlog, self.excess[name])
            if self.alo:
                assert set(outstanding) == {b for b, h in self.holders.items() if h == name}
            else:
                assert set(outstanding) == self.handed[name]
        if self.config.target_queue_depth:
            active = len(available_set) + len(leased)
            assert engine.room() == max(0, self.config.target_queue_depth - active)
        if self.config.sort:
            ranks = [self.rank(b) for b in available]
            assert ranks == sorted(ranks), "a sorted queue's contents out of sort order"
        if self.config.conflate:  # a spool of one: at most the newest message waits
            for b in available:
                for offset in range(b.offset + 1, self.read_next[b.partition]):
                    newer = Bookmark(TOPIC, b.partition, offset)
                    assert self.log[b.partition][offset][2] or newer in self.done_ever, (
                        f"{b} waits behind a newer message, {newer}"
                    )
        if self.config.message_ttl or self.config.expiration is not None:
            for b in available:
                # expired ones leave at the next tick (or are skipped by dispatch)
                if self.expired(b):
                    event("expired, waiting for the tick")

    @invariant()
    def runs_are_sound(self) -> None:
        """The representation: per partition, items in offset order; a run's plain region, its
        materialized messages and its done ones partition its offsets; every live message is
        in exactly one place."""
        live: dict[Bookmark, str] = {}
        for part in self.engine._core.partitions.all:
            offsets, items = part.offsets, part.items
            assert offsets == sorted(set(offsets)), "partition items out of offset order"
            end = -1
            for i in range(part.head, len(items)):
                item, offset = items[i], offsets[i]
                assert offset > end, "partition items overlap"
                if isinstance(item, Run):
                    assert item.start == offset
                    assert 0 <= item.lo <= item.hi <= item.count == len(item.times)
                    assert list(item.times) == sorted(item.times), "run times go down"
                    assert item.forgotten <= (item.low() or item.end) - item.start
                    for o, entry in item.detail.items():
                        assert item.start <= o < item.end and not item.is_plain(o)
                        assert entry.bookmark.offset == o and entry.state != DONE
                        live[entry.bookmark] = "materialized"
                    for j in range(item.lo, item.hi):
                        live[Bookmark(TOPIC, part.tp.partition, item.start + j)] = "plain"
                    if item.detail and item.lo < item.hi:
                        event("run with plain and materialized messages")
                    if item.hi < item.count and item.lo < item.hi:
                        event("run trimmed at the back")
                    if 0 < item.forgotten < item.count:
                        event("run partly forgotten")
                    end = item.end - 1
                elif isinstance(item, Entry):
                    assert item.state != DONE
                    live[item.bookmark] = "entry"
                    end = offset
                else:
                    end = offset
        expected = set(self.engine.available()) | set(self.holders)
        assert set(live) == expected, "live messages and the representation disagree"
        if any(kind == "plain" for kind in live.values()):
            event("plain messages in runs")

    @invariant()
    def low_water_is_sound(self) -> None:
        for p in PARTITIONS:
            mark = self.engine.low_water(TopicPartition(TOPIC, p))
            assert mark >= self.low[p]
            for offset in range(mark):
                assert self.log[p][offset][2] or Bookmark(TOPIC, p, offset) in self.done_ever


EngineMachine.TestCase.settings = settings(
    max_examples=500,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineProperties = EngineMachine.TestCase


# -- a picker's quota: the run of picks one subscription gets ------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    fairness=st.sampled_from(Fairness),
    subs=st.lists(
        st.tuples(st.integers(0, 12), st.integers(1, 12)), min_size=1, max_size=5
    ),  # (outstanding, backlog)
)
def test_quota_is_the_run_of_picks_one_by_one(
    fairness: Fairness, subs: list[tuple[int, int]]
) -> None:
    """``quota`` (what dispatch hands one subscription at once) is the number of picks in a
    row the picker gives it when served one message at a time."""
    picker, subscribers = _served(make_picker(fairness), subs)
    first = picker.pick()
    if first is None:
        assert all(s.outstanding >= s.backlog for s in subscribers)
        return
    quota = picker.quota(first)
    assert quota >= 1
    run = 0
    while (sub := picker.pick()) is first:
        run += 1
        sub.outstanding += 1
        picker.served(sub)
    if quota > 1:  # 1: the picker does not say (it may give more)
        assert run == quota
    else:
        assert run >= 1


@settings(max_examples=300, deadline=None)
@given(
    subs=st.lists(
        st.tuples(st.integers(0, 12), st.integers(1, 12)), min_size=1, max_size=5
    ),  # (outstanding, backlog)
    n=st.integers(1, 40),
)
def test_share_counts_the_picks_one_by_one(subs: list[tuple[int, int]], n: int) -> None:
    """``share(n)`` (what dispatch hands each subscription as a run) gives each as many as
    ``n`` picks one at a time would, in the order they are first picked, and changes nothing."""
    _share_is_the_picks(subs, n)


@settings(max_examples=300, deadline=None)
@given(
    subs=st.lists(
        st.integers(1, 1000).flatmap(lambda b: st.tuples(st.integers(0, b), st.just(b))),
        min_size=1,
        max_size=16,
    ),  # (outstanding, backlog)
    n=st.integers(17, 5000),
)
def test_share_counts_many_picks_at_once(subs: list[tuple[int, int]], n: int) -> None:
    """The same for rounds of many messages and up to 16 subscriptions, which ``share``
    counts in bulk below a water level (the loads tie often: equal backlogs, equal fractions)."""
    _share_is_the_picks(subs, n)


def test_share_of_the_throughput_shape() -> None:
    """Four consumers of 100, some acks back: the counts fill them level, least loaded first;
    beyond their room, all of it; beyond 16 subscriptions, no answer (picks one at a time)."""
    picker, _ = _served(
        make_picker(Fairness.PROPORTIONAL), [(0, 100), (7, 100), (14, 100), (21, 100)]
    )
    shares = [(sub.name, count) for sub, count in picker.share(300)]
    assert shares == [("s0", 86), ("s1", 79), ("s2", 71), ("s3", 64)]
    shares = [(sub.name, count) for sub, count in picker.share(10_000)]
    assert shares == [("s0", 100), ("s1", 93), ("s2", 86), ("s3", 79)]
    assert picker.share(0) == []
    crowd, _ = _served(make_picker(Fairness.PROPORTIONAL), [(0, 10)] * 17)
    assert crowd.share(5) is None


def _share_is_the_picks(subs: list[tuple[int, int]], n: int) -> None:
    counts = [
        _served(make_picker(Fairness.PROPORTIONAL), subs),
        _served(make_picker(Fairness.PROPORTIONAL), subs),
    ]
    (planner, planned), (stepper, stepped) = counts
    before = [s.outstanding for s in planned]
    shares = planner.share(n)
    assert shares is not None
    assert [s.outstanding for s in planned] == before
    one_by_one: dict[str, int] = {}
    for _ in range(n):
        sub = stepper.pick()
        if sub is None:
            break
        one_by_one[sub.name] = one_by_one.get(sub.name, 0) + 1
        sub.outstanding += 1
        stepper.served(sub)
    assert [(sub.name, count) for sub, count in shares] == list(one_by_one.items())


def _served(picker: Any, subs: list[tuple[int, int]]) -> tuple[Any, list[Subscriber]]:
    """``picker`` told of one subscriber per (outstanding, backlog) of ``subs``."""
    subscribers = []
    for i, (outstanding, backlog) in enumerate(subs):
        sub = Subscriber(f"s{i}", i, backlog)
        sub.outstanding = min(outstanding, backlog)
        picker.update(sub)
        subscribers.append(sub)
    return picker, subscribers
