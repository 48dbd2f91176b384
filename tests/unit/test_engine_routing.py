"""Unit tests of the engine's delivery model beyond plain queues: content filters, replace,
message groups, exclusive consumers, barriers, last-value conflation, delayed redelivery."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from layer.engine.model import (
    AckError,
    AckOp,
    Arrival,
    Bookmark,
    Done,
    DoneReason,
    EngineSettings,
    Fairness,
    GroupMode,
    Leasing,
    Returned,
    ReturnReason,
    Semantics,
    TopicPartition,
)
from layer.engine.queue import QueueEngine

TOPIC = "orders"
ACK, CANCEL, EXPIRE = AckOp.ACK, AckOp.CANCEL, AckOp.EXPIRE


def bm(offset: int) -> Bookmark:
    return Bookmark(TOPIC, 0, offset)


def even(b: Bookmark) -> bool:
    return b.offset % 2 == 0


def odd(b: Bookmark) -> bool:
    return b.offset % 2 == 1


@pytest.fixture
def make() -> Callable[..., QueueEngine]:
    def factory(**settings: object) -> QueueEngine:
        engine = QueueEngine("jobs", EngineSettings(**settings))  # type: ignore[arg-type]
        engine.start_partition(TopicPartition(TOPIC, 0), 0)
        return engine

    return factory


def arrive(engine: QueueEngine, *offsets: int, now: float = 0.0, **kw: object) -> None:
    engine.add([Arrival(bm(o), now, **kw) for o in offsets], now)  # type: ignore[arg-type]


def dispatch(engine: QueueEngine, now: float = 0.0) -> list[tuple[str, int]]:
    engine.dispatch(now)
    return [(d.subscription, d.bookmark.offset) for d in engine.drain().deliveries]


def done(engine: QueueEngine) -> list[tuple[int, DoneReason]]:
    return [(c.bookmark.offset, c.reason) for c in engine.drain().changes if isinstance(c, Done)]


# -- content filters -----------------------------------------------------------------------------


def test_each_subscription_gets_the_oldest_message_its_filter_matches(make):
    engine = make()
    arrive(engine, 0, 1, 2, 3)
    engine.subscribe("odd", 10, 0.0, match=odd)
    engine.subscribe("even", 10, 0.0, match=even)
    assert sorted(dispatch(engine)) == [("even", 0), ("even", 2), ("odd", 1), ("odd", 3)]


def test_a_message_nobody_matches_waits_and_goes_to_a_later_subscription(make):
    engine = make()
    arrive(engine, 0, 1)
    engine.subscribe("odd", 10, 0.0, match=odd)
    assert dispatch(engine) == [("odd", 1)]
    assert engine.available() == [bm(0)]  # waits, still available
    engine.subscribe("all", 10, 0.0)
    assert dispatch(engine) == [("all", 0)]


def test_a_full_subscription_gets_its_waiting_message_when_it_has_room_in_order(make):
    engine = make()
    engine.subscribe("even", 1, 0.0, match=even)
    arrive(engine, 0, 2, 4, 5)
    engine.subscribe("odd", 1, 0.0, match=odd)
    assert sorted(dispatch(engine)) == [("even", 0), ("odd", 5)]
    engine.ack("even", [bm(0)], ACK, 1.0)
    assert dispatch(engine, 1.0) == [("even", 2)]
    engine.ack("even", [bm(2)], ACK, 1.0)
    assert dispatch(engine, 1.0) == [("even", 4)]


def test_fairness_applies_among_the_subscriptions_a_message_matches(make):
    engine = make(fairness=Fairness.ROUND_ROBIN)
    engine.subscribe("a", 10, 0.0, match=even)
    engine.subscribe("b", 10, 0.0, match=even)
    engine.subscribe("c", 10, 0.0, match=odd)
    arrive(engine, 0, 2, 4, 6, 7)
    got = dispatch(engine)
    assert [o for s, o in got if s == "a"] == [0, 4]
    assert [o for s, o in got if s == "b"] == [2, 6]
    assert [o for s, o in got if s == "c"] == [7]


def test_priority_order_holds_per_filter(make):
    engine = make(priority=True)
    engine.add([Arrival(bm(o), 0.0, priority=p) for o, p in [(0, 1), (1, 9), (2, 5), (3, 7)]], 0.0)
    engine.subscribe("even", 1, 0.0, match=even)
    engine.subscribe("odd", 1, 0.0, match=odd)
    assert sorted(dispatch(engine)) == [("even", 2), ("odd", 1)]


def test_filters_that_raise_nothing_are_never_called_for_unfiltered_queues(make):
    calls = []

    def counting(b: Bookmark) -> bool:
        calls.append(b)
        return True

    engine = make()
    arrive(engine, 0, 1, 2)
    engine.subscribe("a", 10, 0.0, match=counting)
    assert len(dispatch(engine)) == 3
    assert calls == [bm(0), bm(1), bm(2)]  # once per message, not once per dispatch


# -- replace ------------------------------------------------------------------------------------


def test_replace_keeps_leases_and_delivers_only_what_the_new_filter_matches(make):
    engine = make()
    arrive(engine, 0, 1, 2, 3)
    engine.subscribe("s", 2, 0.0, match=even)
    assert dispatch(engine) == [("s", 0), ("s", 2)]
    engine.subscribe("s", 1, 0.0, match=odd)  # replace: backlog 1, but 2 still leased
    assert dispatch(engine) == []
    assert engine.lease_of(bm(0)) is not None and engine.lease_of(bm(2)) is not None
    engine.ack("s", [bm(0)], ACK, 0.0)
    assert dispatch(engine) == []  # 1 outstanding = the new backlog
    engine.ack("s", [bm(2)], ACK, 0.0)
    assert dispatch(engine) == [("s", 1)]


def test_set_backlog_zero_pauses_and_keeps_leases(make):
    engine = make()
    arrive(engine, 0, 1)
    engine.subscribe("s", 5, 0.0)
    engine.set_backlog("s", 0)
    assert dispatch(engine) == []
    engine.set_backlog("s", 1)
    assert dispatch(engine) == [("s", 0)]


# -- message groups -----------------------------------------------------------------------------


def grouped(engine: QueueEngine, pairs: list[tuple[int, str]], now: float = 0.0) -> None:
    engine.add([Arrival(bm(o), now, group=g) for o, g in pairs], now)


def test_a_group_stays_with_its_consumer_and_other_groups_are_not_blocked(make):
    engine = make(groups=GroupMode.STICKY, fairness=Fairness.ROUND_ROBIN)
    engine.subscribe("a", 1, 0.0)
    engine.subscribe("b", 1, 0.0)
    grouped(engine, [(0, "x"), (1, "x"), (2, "y")])
    assert sorted(dispatch(engine)) == [("a", 0), ("b", 2)]
    assert engine.group_owner("x") == "a"
    engine.ack("b", [bm(2)], ACK, 0.0)
    assert dispatch(engine) == []  # 1 is of group x: only a may take it, and a is full
    engine.ack("a", [bm(0)], ACK, 0.0)
    assert dispatch(engine) == [("a", 1)]


def test_sticky_groups_move_only_when_the_owner_disconnects(make):
    engine = make(groups=GroupMode.STICKY)
    engine.subscribe("a", 5, 0.0)
    engine.subscribe("b", 5, 0.0)
    grouped(engine, [(0, "x")])
    assert dispatch(engine) == [("a", 0)]
    engine.ack("a", [bm(0)], ACK, 0.0)
    grouped(engine, [(1, "x")])
    assert dispatch(engine) == [("a", 1)]  # still a's, though a held nothing of x
    engine.disconnect("a", 1.0)
    assert dispatch(engine, 1.0) == [("b", 1)]
    assert engine.group_owner("x") == "b"


def test_shared_groups_are_free_once_the_owner_holds_none_of_them(make):
    engine = make(groups=GroupMode.SHARED, fairness=Fairness.ROUND_ROBIN)
    engine.subscribe("a", 5, 0.0)
    engine.subscribe("b", 5, 0.0)
    grouped(engine, [(0, "x"), (1, "x")])
    assert dispatch(engine) == [("a", 0), ("a", 1)]
    engine.ack("a", [bm(0), bm(1)], ACK, 0.0)
    assert engine.group_owner("x") is None
    grouped(engine, [(2, "x")])
    assert dispatch(engine) == [("b", 2)]


def test_a_cancelled_group_message_goes_back_to_the_owner_first(make):
    engine = make(groups=GroupMode.STICKY)
    engine.subscribe("a", 2, 0.0)
    engine.subscribe("b", 2, 0.0)
    grouped(engine, [(0, "x"), (1, "x")])
    assert dispatch(engine) == [("a", 0), ("a", 1)]
    engine.ack("a", [bm(0)], CANCEL, 0.0)
    assert dispatch(engine) == [("a", 0)]


def test_groups_at_most_once(make):
    engine = make(groups=GroupMode.SHARED, semantics=Semantics.AT_MOST_ONCE)
    engine.subscribe("a", 1, 0.0)
    engine.subscribe("b", 1, 0.0)
    grouped(engine, [(0, "x"), (1, "x"), (2, "y")])
    got = dispatch(engine)
    assert ("a", 0) in got and ("b", 2) in got
    engine.ack("a", [bm(0)], ACK, 0.0)  # releases the slot and the group
    assert dispatch(engine) == [("a", 1)]


# -- exclusive ----------------------------------------------------------------------------------


def test_exclusive_queue_feeds_one_consumer_and_a_standby_takes_over_in_order(make):
    engine = make(exclusive=True)
    engine.subscribe("active", 2, 0.0)
    engine.subscribe("standby", 2, 0.0)
    arrive(engine, 0, 1, 2)
    assert dispatch(engine) == [("active", 0), ("active", 1)]
    engine.ack("active", [bm(0)], ACK, 0.0)
    assert dispatch(engine) == [("active", 2)]
    engine.disconnect("active", 1.0)  # 1 and 2 come back
    assert dispatch(engine, 1.0) == [("standby", 1), ("standby", 2)]


# -- barriers -----------------------------------------------------------------------------------


def test_barrier_waits_for_every_earlier_message_and_holds_later_ones(make):
    engine = make()
    engine.subscribe("a", 10, 0.0)
    engine.subscribe("b", 10, 0.0, match=odd)
    arrive(engine, 0, 2)
    arrive(engine, 3, barrier=True)
    arrive(engine, 4, 5)
    engine.dispatch(0.0)
    effects = engine.drain()
    assert {(d.subscription, d.bookmark.offset) for d in effects.deliveries} == {("a", 0), ("a", 2)}
    assert engine.stats(0.0).held == 3  # the barrier and the two after it
    assert engine.available() == [bm(3), bm(4), bm(5)]
    engine.ack("a", [bm(0)], ACK, 0.0)
    assert dispatch(engine) == []  # 2 is not acked yet
    engine.ack("a", [bm(2)], ACK, 0.0)
    engine.dispatch(0.0)
    effects = engine.drain()
    barriers = [d for d in effects.deliveries if d.barrier]
    # sent to every current subscription whose filter matches, no lease, no backlog
    assert {(d.subscription, d.bookmark.offset) for d in barriers} == {("a", 3), ("b", 3)}
    assert all(d.deadline is None for d in barriers)
    assert Done(bm(3), DoneReason.BARRIER, 1, 0, 0.0) in effects.changes
    # and then the held messages flow
    rest = {(d.subscription, d.bookmark.offset) for d in effects.deliveries if not d.barrier}
    assert rest == {("a", 4), ("b", 5)}


def test_barrier_ignores_backlog_and_a_non_matching_subscription_still_waits(make):
    engine = make()
    engine.subscribe("full", 1, 0.0)
    engine.subscribe("evens", 5, 0.0, match=even)
    arrive(engine, 0)
    arrive(engine, 1, barrier=True)
    arrive(engine, 2)
    assert dispatch(engine) == [("full", 0)]
    assert dispatch(engine) == []  # evens matches 2 but it is behind the barrier
    engine.ack("full", [bm(0)], ACK, 0.0)
    engine.dispatch(0.0)
    got = engine.drain().deliveries
    assert [(d.subscription, d.bookmark.offset, d.barrier) for d in got] == [
        ("full", 1, True),
        ("full", 2, False),
    ]


def test_a_subscription_with_backlog_0_gets_barrier_messages_only(make):
    """AMPS: subscribers that request max_backlog=0 still receive the barrier message."""
    engine = make()
    assert engine.subscribe("zero", 0, 0.0) == 0
    arrive(engine, 0)
    arrive(engine, 1, barrier=True)
    assert dispatch(engine) == []  # nobody may take 0, so the barrier waits behind it
    engine.subscribe("one", 1, 0.0)
    assert dispatch(engine) == [("one", 0)]
    engine.ack("one", [bm(0)], ACK, 0.0)
    engine.dispatch(0.0)
    got = engine.drain().deliveries
    assert sorted((d.subscription, d.bookmark.offset, d.barrier) for d in got) == [
        ("one", 1, True),
        ("zero", 1, True),
    ]
    arrive(engine, 2)
    assert dispatch(engine) == [("one", 2)]
    with pytest.raises(ValueError, match=">= 0"):
        engine.subscribe("minus", -1, 0.0)


def test_barrier_waits_for_a_subscriber_and_chains(make):
    engine = make()
    arrive(engine, 0, barrier=True)
    arrive(engine, 1)
    arrive(engine, 2, barrier=True)
    assert dispatch(engine) == []  # nobody to send it to: it waits
    engine.subscribe("a", 5, 0.0)
    engine.dispatch(0.0)
    got = [(d.bookmark.offset, d.barrier) for d in engine.drain().deliveries]
    assert got == [(0, True), (1, False)]
    engine.ack("a", [bm(1)], ACK, 0.0)
    engine.dispatch(0.0)
    assert [(d.bookmark.offset, d.barrier) for d in engine.drain().deliveries] == [(2, True)]


def test_barrier_counts_expired_and_dead_lettered_messages_as_done(make):
    engine = make(expiration=10.0)
    arrive(engine, 0)
    arrive(engine, 1, barrier=True)
    engine.subscribe("a", 5, 0.0)
    engine.tick(20.0)  # 0 expires unacked (the barrier is held, it does not expire)
    engine.dispatch(20.0)
    effects = engine.drain()
    assert [(d.bookmark.offset, d.barrier) for d in effects.deliveries] == [(1, True)]


# -- last-value queues --------------------------------------------------------------------------


def test_a_newer_message_replaces_an_older_available_one_with_its_key(make):
    engine = make(conflate=True)
    engine.add(
        [Arrival(bm(0), 0.0, conflate_key="IBM"), Arrival(bm(1), 0.0, conflate_key="MSFT")], 0.0
    )
    engine.add([Arrival(bm(2), 0.0, conflate_key="IBM")], 0.0)
    assert done(engine) == [(0, DoneReason.CONFLATED)]
    assert engine.available() == [bm(1), bm(2)]


def test_a_leased_message_is_not_conflated_until_it_comes_back(make):
    engine = make(conflate=True)
    engine.subscribe("a", 1, 0.0)
    engine.add([Arrival(bm(0), 0.0, conflate_key="IBM")], 0.0)
    assert dispatch(engine) == [("a", 0)]
    engine.add([Arrival(bm(1), 0.0, conflate_key="IBM")], 0.0)
    assert engine.lease_of(bm(0)) is not None
    engine.ack("a", [bm(0)], CANCEL, 0.0)
    assert (0, DoneReason.CONFLATED) in done(engine)
    assert dispatch(engine) == [("a", 1)]


def test_conflated_is_not_a_dead_letter():
    assert not DoneReason.CONFLATED.dead_letter and not DoneReason.BARRIER.dead_letter


# -- delays -------------------------------------------------------------------------------------


def test_deliver_after_holds_a_message_until_its_time(make):
    engine = make()
    engine.subscribe("a", 5, 0.0)
    arrive(engine, 0, not_before=10.0)
    arrive(engine, 1)
    assert dispatch(engine) == [("a", 1)]
    assert engine.stats(0.0).delayed == 1
    assert engine.available() == []
    engine.tick(10.0)
    assert dispatch(engine, 10.0) == [("a", 0)]


def test_cancel_with_a_delay_returns_the_message_later(make):
    engine = make()
    engine.subscribe("a", 5, 0.0)
    arrive(engine, 0)
    assert dispatch(engine) == [("a", 0)]
    engine.ack("a", [bm(0)], CANCEL, 1.0, seconds=5.0)
    changes = engine.drain().changes
    assert Returned(bm(0), ReturnReason.CANCEL, 1, 1, 6.0) in changes
    engine.tick(5.9)
    assert dispatch(engine, 5.9) == []
    engine.tick(6.0)
    assert dispatch(engine, 6.0) == [("a", 0)]


def test_redelivery_backoff_grows_after_each_lease_timeout(make):
    engine = make(lease_period=1.0, redelivery_backoff=(2.0, 3.0, 10.0))
    engine.subscribe("a", 5, 0.0)
    arrive(engine, 0)
    now = 0.0
    waits = []
    for _ in range(4):
        assert dispatch(engine, now) == [("a", 0)]
        now += 1.0
        engine.tick(now)
        returned = [c for c in engine.drain().changes if isinstance(c, Returned)]
        assert returned[0].not_before is not None
        waits.append(returned[0].not_before - now)
        now = returned[0].not_before
        engine.tick(now)
    assert waits == [2.0, 6.0, 10.0, 10.0]


def test_a_disconnect_returns_at_once_despite_backoff(make):
    engine = make(redelivery_backoff=(5.0, 2.0, 60.0))
    engine.subscribe("a", 5, 0.0)
    arrive(engine, 0)
    dispatch(engine)
    engine.disconnect("a", 1.0)
    engine.subscribe("b", 5, 1.0)
    assert dispatch(engine, 1.0) == [("b", 0)]


# -- acks on behalf of nobody (ack by filter) ---------------------------------------------------


def test_ack_for_nobody_under_strict_leasing_finishes_only_unleased_messages(make):
    engine = make()
    engine.subscribe("a", 1, 0.0)
    arrive(engine, 0, 1)
    dispatch(engine)
    outcomes = engine.ack(None, [bm(0), bm(1)], ACK, 0.0)
    assert [o.error for o in outcomes] == [AckError.NOT_LEASE_HOLDER, None]


def test_ack_for_nobody_under_lenient_leasing_finishes_leased_messages_too(make):
    engine = make(leasing=Leasing.LENIENT)
    engine.subscribe("a", 1, 0.0)
    arrive(engine, 0, 1)
    dispatch(engine)
    assert [o.error for o in engine.ack(None, [bm(0), bm(1)], ACK, 0.0)] == [None, None]
    assert engine.stats(0.0).leased == 0


def test_settings_name_what_is_wrong():
    with pytest.raises(ValueError, match="redelivery_backoff"):
        QueueEngine("jobs", EngineSettings(redelivery_backoff=(1.0, 0.5, 10.0)))
