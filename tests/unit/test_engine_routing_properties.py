"""Property tests of the delivery model beyond plain queues: random interleavings with content
filters, replaces, message groups, exclusive consumers, barriers, conflation and delays must keep
the invariants (checked against a model after every step):

- no message is leased twice at once, none is lost, none is done twice;
- a subscription only receives messages its filter matches (barriers too);
- a message group is never held by two subscriptions at once;
- exclusive: only the oldest subscription holds messages;
- a barrier is sent only when everything before it is done; nothing after it goes first;
- a last-value queue never has two available messages with one key;
- after a dispatch no subscription with room is idle while a message it may take is available.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from layer.engine.model import (
    AckOp,
    Arrival,
    Bookmark,
    Done,
    DoneReason,
    EngineSettings,
    Fairness,
    GroupMode,
    Leased,
    Leasing,
    Returned,
    Semantics,
    TopicPartition,
    singles,
)
from layer.engine.queue import QueueEngine

TOPIC = "t"
TP = TopicPartition(TOPIC, 0)
SUBS = ("s0", "s1", "s2")
FILTERS: dict[str, Callable[[Bookmark], bool] | None] = {
    "all": None,
    "even": lambda b: b.offset % 2 == 0,
    "odd": lambda b: b.offset % 2 == 1,
    "small": lambda b: b.offset % 5 < 2,
}


@st.composite
def engine_settings(draw: st.DrawFn) -> EngineSettings:
    priority, conflate = draw(st.booleans()), draw(st.booleans())
    return EngineSettings(
        semantics=draw(st.sampled_from([Semantics.AT_LEAST_ONCE] * 3 + [Semantics.AT_MOST_ONCE])),
        lease_period=draw(st.sampled_from([1.0, 4.0])),
        max_per_subscription_backlog=draw(st.integers(1, 3)),
        fairness=draw(st.sampled_from(Fairness)),
        leasing=draw(st.sampled_from(Leasing)),
        max_deliveries=draw(st.sampled_from([0, 3])),
        expiration=draw(st.sampled_from([None, 20.0])),
        priority=priority,
        # Qpid's sorted queue, which excludes priority and conflation
        sort=not (priority or conflate) and draw(st.booleans()),
        message_ttl=draw(st.booleans()),
        groups=draw(st.sampled_from([None, GroupMode.STICKY, GroupMode.SHARED])),
        exclusive=draw(st.sampled_from([False, False, True])),
        conflate=conflate,
        redelivery_backoff=draw(st.sampled_from([None, (1.0, 2.0, 4.0)])),
        track_view=True,
    )


class RoutingMachine(RuleBasedStateMachine):
    @initialize(config=engine_settings())
    def start(self, config: EngineSettings) -> None:
        self.config = config
        self.alo = config.semantics is Semantics.AT_LEAST_ONCE
        self.engine = QueueEngine("q", config)
        self.engine.start_partition(TP, 0)
        self.now = 0.0
        self.next_offset = 0
        self.meta: dict[Bookmark, tuple[object, object, bool]] = {}  # group, key, barrier
        self.times: dict[Bookmark, tuple[float, float | None]] = {}  # enqueued, own expiry
        self.filters: dict[str, str] = {}  # subscription -> filter name
        self.backlogs: dict[str, int] = {}
        self.order: list[str] = []  # subscribe order
        self.holders: dict[Bookmark, str] = {}
        self.handed: dict[str, set[Bookmark]] = {}
        self.done: set[Bookmark] = set()
        self.barriers_sent: set[Bookmark] = set()
        self.group_holds: dict[object, dict[str, int]] = {}
        self.view: set[Bookmark] = set()  # the live contents, as a view-topic reader sees them

    # -- events --------------------------------------------------------------------------------

    @rule(
        count=st.integers(1, 3),
        group=st.none() | st.sampled_from(["g1", "g2"]),
        key=st.none() | st.sampled_from(["k1", "k2"]),
        barrier=st.sampled_from([False] * 6 + [True]),
        delay=st.sampled_from([None, None, None, 2.0]),
        priority=st.none() | st.integers(0, 2),
        sort_key=st.none() | st.sampled_from(["a", "b"]),
        ttl=st.sampled_from([None, None, 1.0, 6.0]),
    )
    def publish(
        self,
        count: int,
        group: object,
        key: object,
        barrier: bool,
        delay: float | None,
        priority: int | None,
        sort_key: str | None = None,
        ttl: float | None = None,
    ) -> None:
        arrivals = []
        for _ in range(count):
            b = Bookmark(TOPIC, 0, self.next_offset)
            self.next_offset += 1
            self.meta[b] = (group, key, barrier)
            not_before = None if delay is None else self.now + delay
            expires_at = None if ttl is None else self.now + ttl
            self.times[b] = (self.now, expires_at if self.config.message_ttl else None)
            arrivals.append(
                Arrival(
                    b,
                    self.now,
                    priority,
                    0,
                    0,
                    group,
                    key,
                    barrier,
                    not_before,
                    sort_key,
                    expires_at,
                )
            )
        self.engine.add(arrivals, self.now)
        self.engine.mark_read(TP, self.next_offset)
        self.engine.set_high_watermark(TP, self.next_offset)
        self.check()

    @rule(
        name=st.sampled_from(SUBS), backlog=st.integers(1, 3), flt=st.sampled_from(sorted(FILTERS))
    )
    def subscribe(self, name: str, backlog: int, flt: str) -> None:
        self.backlogs[name] = self.engine.subscribe(name, backlog, self.now, match=FILTERS[flt])
        self.filters[name] = flt
        if name not in self.order:
            self.order.append(name)
        self.handed.setdefault(name, set())
        self.check()

    @precondition(lambda self: self.order)
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self.order))
        self.engine.disconnect(name, self.now)
        self.order.remove(name)
        del self.filters[name]
        del self.backlogs[name]
        self.handed.pop(name, None)
        self.check()
        assert name not in self.holders.values()
        for holds in self.group_holds.values():  # a gone subscription holds no group
            holds.pop(name, None)

    @rule()
    def dispatch(self) -> None:
        self.engine.dispatch(self.now)
        self.check()
        self.check_nobody_idle()

    @precondition(lambda self: self.order)
    @rule(data=st.data(), op=st.sampled_from(AckOp), seconds=st.sampled_from([0.0, 1.5]))
    def ack(self, data: st.DataObject, op: AckOp, seconds: float) -> None:
        name = data.draw(st.sampled_from(self.order))
        held = self.engine.outstanding(name)
        pool = (
            held
            or [Bookmark(TOPIC, 0, o) for o in range(self.next_offset)]
            or [Bookmark(TOPIC, 0, 0)]
        )
        bookmarks = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
        if not self.alo:
            for outcome in self.engine.ack(name, bookmarks, op, self.now, seconds):
                if outcome.error is None:
                    self.handed[name].discard(outcome.bookmark)
                    self.release_group(name, outcome.bookmark)
            self.check()
            return
        self.engine.ack(name, bookmarks, op, self.now, seconds)
        self.check()

    @rule(dt=st.sampled_from([0.5, 1.0, 2.5, 7.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.engine.tick(self.now)
        self.check()

    # -- model -----------------------------------------------------------------------------------

    def release_group(self, name: str, b: Bookmark) -> None:
        group = self.meta[b][0]
        if group is None or self.config.groups is None:
            return
        holds = self.group_holds.setdefault(group, {})
        holds[name] = holds.get(name, 0) - 1
        if holds[name] <= 0:
            del holds[name]

    def take_group(self, name: str, b: Bookmark) -> None:
        group = self.meta[b][0]
        if group is None or self.config.groups is None:
            return
        holds = self.group_holds.setdefault(group, {})
        others = [s for s, n in holds.items() if s != name and n > 0]
        assert not others, f"group {group} held by {others} and {name} at once"
        holds[name] = holds.get(name, 0) + 1

    def expired(self, b: Bookmark) -> bool:
        enqueued, expires = self.times[b]
        expiration = self.config.expiration
        return (expiration is not None and self.now - enqueued >= expiration) or (
            expires is not None and self.now >= expires
        )

    def check(self) -> None:
        effects = self.engine.drain()
        for v in effects.view:
            if v.sign > 0:
                assert v.bookmark not in self.view, f"{v.bookmark} entered the view twice"
                self.view.add(v.bookmark)
            else:
                assert v.bookmark in self.view, f"{v.bookmark} left a view it was not in"
                self.view.discard(v.bookmark)
        assert self.view == set(self.engine.available()), "the view differs from a browse"
        for c in singles(effects.changes):  # runs (a count) message by message
            if isinstance(c, Leased):
                assert c.bookmark not in self.holders, f"{c.bookmark} leased twice at once"
                assert c.bookmark not in self.done
                self.holders[c.bookmark] = c.holder
            elif isinstance(c, Returned):
                holder = self.holders.pop(c.bookmark)
                self.release_group(holder, c.bookmark)
            elif isinstance(c, Done):
                assert c.bookmark not in self.done, f"{c.bookmark} done twice"
                self.done.add(c.bookmark)
                holder = self.holders.pop(c.bookmark, None)
                if holder is not None:
                    self.release_group(holder, c.bookmark)
                if c.reason is DoneReason.BARRIER:
                    assert self.meta[c.bookmark][2]
                    earlier = [b for b in self.meta if b.offset < c.bookmark.offset]
                    assert all(b in self.done for b in earlier), "barrier sent too early"
                if c.reason is DoneReason.CONFLATED:
                    assert self.config.conflate
                if c.reason is DoneReason.EXPIRATION:
                    assert self.expired(c.bookmark), f"{c.bookmark} expired early"
                    event("expired" + (" (own TTL)" if self.times[c.bookmark][1] else ""))
        for d in effects.deliveries:
            if not d.barrier:
                assert not self.expired(d.bookmark), f"{d.bookmark} delivered after it expired"
            flt = FILTERS[self.filters[d.subscription]]
            assert flt is None or flt(d.bookmark), f"{d.subscription} got {d.bookmark}"
            pending = [b for b, m in self.meta.items() if m[2] and b not in self.done]
            assert not any(b.offset < d.bookmark.offset for b in pending), (
                f"{d.bookmark} delivered before an earlier barrier was sent"
            )
            if d.barrier:
                self.barriers_sent.add(d.bookmark)
                continue
            if self.config.exclusive:
                assert d.subscription == self.order[0], "exclusive queue fed a standby"
            if not self.alo:
                self.handed[d.subscription].add(d.bookmark)
            self.take_group(d.subscription, d.bookmark)

    def check_nobody_idle(self) -> None:
        engine = self.engine
        stats = engine.stats(self.now)
        if stats.held:
            return  # a barrier is pending: its rules decide, checked above
        for b in engine.available():
            group = self.meta[b][0]
            owner = engine.group_owner(group) if group is not None else None
            for name in self.order:
                if self.config.exclusive and name != self.order[0]:
                    continue
                flt = FILTERS[self.filters[name]]
                if flt is not None and not flt(b):
                    continue
                if owner is not None and owner != name:
                    continue
                outstanding = len(engine.outstanding(name))
                assert outstanding >= self.backlogs[name], f"{name} idle while {b} waits"

    @invariant()
    def nothing_lost(self) -> None:
        if not hasattr(self, "engine"):
            return
        engine = self.engine
        available = set(engine.available())
        stats = engine.stats(self.now)
        leased = set(self.holders)
        assert not available & leased and not available & self.done and not leased & self.done
        accounted = stats.available + stats.leased + stats.delayed + stats.held + len(self.done)
        assert accounted == self.next_offset, "a message is lost (or counted twice)"
        assert stats.leased == len(leased)
        if self.config.conflate:
            keys = [self.meta[b][1] for b in available if self.meta[b][1] is not None]
            assert len(keys) == len(set(keys)), "two available messages with one conflate key"


RoutingMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRoutingProperties = RoutingMachine.TestCase
