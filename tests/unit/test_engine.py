"""Unit tests of the pure queue engine: one test per semantic of its contract."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from layer.engine import UNLIMITED, Lease, QueueEngine
from layer.engine.model import (
    AckError,
    AckOp,
    AckOutcome,
    Arrival,
    Bookmark,
    Delivery,
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
    ViewChange,
    singles,
)
from layer.exceptions import QueueError

TOPIC = "orders"
TP0 = TopicPartition(TOPIC, 0)
TP1 = TopicPartition(TOPIC, 1)

ACK, CANCEL, EXPIRE, EXTEND = AckOp.ACK, AckOp.CANCEL, AckOp.EXPIRE, AckOp.EXTEND


def bm(offset: int, partition: int = 0) -> Bookmark:
    return Bookmark(TOPIC, partition, offset)


@pytest.fixture
def engine_factory() -> Callable[..., QueueEngine]:
    def make(partitions: int = 1, **settings: object) -> QueueEngine:
        engine = QueueEngine("jobs", EngineSettings(**settings))  # type: ignore[arg-type]
        for p in range(partitions):
            engine.start_partition(TopicPartition(TOPIC, p), 0)
        return engine

    return make


def add(engine: QueueEngine, *offsets: int, now: float = 0.0, partition: int = 0, **kw: object):
    engine.add(
        [Arrival(bm(o, partition), kw.pop("timestamp", now), **kw) for o in offsets],  # type: ignore[arg-type]
        now,
    )


def changes(engine: QueueEngine) -> list:
    """The drained changes, a run (a Forget, Leased or Done with a ``count``) as one per
    message (``test_a_run_the_mark_passes_is_one_forget`` and ``test_leases_and_acks_of_a_run
    _are_one_change`` check the runs themselves)."""
    out = []
    for c in singles(engine.drain().changes):
        if isinstance(c, Forget) and c.count > 1:
            bm = c.bookmark
            out.extend(Forget(bm._replace(offset=bm.offset + i)) for i in range(c.count))
        else:
            out.append(c)
    return out


def delivered(engine: QueueEngine, now: float = 0.0) -> list[tuple[str, int]]:
    engine.dispatch(now)
    return [(d.subscription, d.bookmark.offset) for d in engine.drain().deliveries]


def errors(outcomes: list) -> list[AckError | None]:
    return [o.error for o in outcomes]


# -- leasing and acks ----------------------------------------------------------------------------


def test_delivery_leases_the_message_for_the_lease_period(engine_factory):
    engine = engine_factory(lease_period=30.0)
    add(engine, 0)
    engine.subscribe("a", 5, 0.0)
    engine.dispatch(10.0)
    effects = engine.drain()
    assert effects.deliveries == [Delivery("a", bm(0), 1, 0, 40.0)]
    assert effects.changes == [Leased(bm(0), "a", 40.0, 1, 0)]
    assert engine.lease_of(bm(0)) == Lease("a", 40.0, 1, 0)
    assert engine.outstanding("a") == [bm(0)]
    assert engine.stats(10.0).leased == 1 and engine.stats(10.0).available == 0


def test_ack_removes_the_message(engine_factory):
    engine = engine_factory()
    add(engine, 0, 1)
    engine.subscribe("a", 5, 0.0)
    engine.dispatch(0.0)
    engine.drain()
    assert errors(engine.ack("a", [bm(0)], ACK, 1.0)) == [None]
    assert changes(engine)[0] == Done(bm(0), DoneReason.ACKED, 1, 0, 1.0)
    assert engine.lease_of(bm(0)) is None
    assert engine.outstanding("a") == [bm(1)]
    assert errors(engine.ack("a", [bm(0)], ACK, 1.0)) == [AckError.UNKNOWN_BOOKMARK]
    stats = engine.stats(1.0)
    assert (stats.done_total, stats.dead_lettered_total, stats.delivered_total) == (1, 0, 2)


def test_ack_runs_acks_offset_runs_and_returns_only_the_refused(engine_factory):
    engine = engine_factory(partitions=2)
    add(engine, *range(6))
    add(engine, 0, partition=1)
    engine.subscribe("a", 4, 0.0)  # holds 0..3 of partition 0 (and nothing of partition 1)
    engine.dispatch(0.0)
    engine.drain()
    refused = engine.ack_runs("a", TP0, [0, 1, 3, 4], ACK, 1.0)
    # 4 is available: under strict leasing only its holder may ack it, and nobody holds it
    assert refused == [(4, AckError.NOT_LEASE_HOLDER)]
    done = [c for c in changes(engine) if isinstance(c, Done)]
    assert [c.bookmark.offset for c in done] == [0, 1, 3]
    assert engine.outstanding("a") == [bm(2)]
    assert engine.ack_runs("a", TP0, [0, 0], ACK, 1.0) == [(0, AckError.UNKNOWN_BOOKMARK)]
    assert engine.ack_runs("a", TP1, [0, 0], CANCEL, 1.0) == [(0, AckError.NOT_LEASED)]
    unknown = TopicPartition("other", 0)
    assert engine.ack_runs("a", unknown, [0, 1], ACK, 1.0) == [
        (0, AckError.UNKNOWN_BOOKMARK),
        (1, AckError.UNKNOWN_BOOKMARK),
    ]
    with pytest.raises(QueueError, match="not registered"):
        engine.ack_runs("b", TP0, [2, 2], ACK, 1.0)


def test_cancel_returns_the_message_with_one_more_cancel(engine_factory):
    engine = engine_factory()
    add(engine, 0)
    engine.subscribe("a", 5, 0.0)
    engine.dispatch(0.0)
    engine.drain()
    assert errors(engine.ack("a", [bm(0)], CANCEL, 1.0)) == [None]
    assert changes(engine) == [Returned(bm(0), ReturnReason.CANCEL, 1, 1)]
    assert engine.available() == [bm(0)]
    engine.dispatch(2.0)
    assert engine.drain().deliveries == [Delivery("a", bm(0), 2, 1, 62.0)]


def test_the_third_cancel_expires_the_message_when_max_cancels_is_3(engine_factory):
    engine = engine_factory(max_cancels=3)
    add(engine, 0)
    engine.subscribe("a", 1, 0.0)
    for n in (1, 2):
        engine.dispatch(0.0)
        engine.ack("a", [bm(0)], CANCEL, 0.0)
        assert changes(engine)[-1] == Returned(bm(0), ReturnReason.CANCEL, n, n)
    engine.dispatch(0.0)
    engine.ack("a", [bm(0)], CANCEL, 5.0)
    done = changes(engine)[1]
    assert done == Done(bm(0), DoneReason.MAX_CANCELS, 3, 3, 5.0)
    assert done.reason.dead_letter
    assert engine.stats(5.0).dead_lettered_total == 1
    assert delivered(engine) == []


def test_not_delivered_again_after_the_10th_unsuccessful_delivery(engine_factory):
    engine = engine_factory(max_deliveries=10, lease_period=1.0)
    add(engine, 0)
    engine.subscribe("a", 1, 0.0)
    now = 0.0
    for n in range(1, 10):
        engine.dispatch(now)
        now += 1.0
        engine.tick(now)
        assert changes(engine)[-1] == Returned(bm(0), ReturnReason.TIMEOUT, n, 0)
    engine.dispatch(now)
    now += 1.0
    engine.tick(now)
    assert changes(engine)[1] == Done(bm(0), DoneReason.MAX_DELIVERIES, 10, 0, now)
    assert delivered(engine, now) == []
    assert engine.stats(now).available == 0


def test_cancel_of_a_message_at_max_deliveries_does_not_deliver_it_again(engine_factory):
    engine = engine_factory(max_deliveries=1)
    add(engine, 0)
    engine.subscribe("a", 1, 0.0)
    engine.dispatch(0.0)
    engine.ack("a", [bm(0)], CANCEL, 1.0)
    assert changes(engine)[1] == Done(bm(0), DoneReason.MAX_DELIVERIES, 1, 1, 1.0)


def test_lease_timeout_returns_the_message_at_its_deadline(engine_factory):
    engine = engine_factory(lease_period=10.0)
    add(engine, 0)
    engine.subscribe("a", 1, 0.0)
    engine.dispatch(0.0)
    engine.drain()
    engine.tick(9.999)
    assert changes(engine) == []
    engine.tick(10.0)
    assert changes(engine) == [Returned(bm(0), ReturnReason.TIMEOUT, 1, 0)]
    assert engine.outstanding("a") == []
    assert delivered(engine, 10.0) == [("a", 0)]


def test_disconnect_returns_every_lease_at_once(engine_factory):
    engine = engine_factory(max_deliveries=2)
    add(engine, 0, 1, 2)
    add(engine, 3, deliveries=1)
    engine.subscribe("a", 10, 0.0)
    engine.dispatch(0.0)
    engine.drain()
    engine.disconnect("a", 5.0)
    assert changes(engine) == [
        Returned(bm(0), ReturnReason.DISCONNECT, 1, 0),
        Returned(bm(1), ReturnReason.DISCONNECT, 1, 0),
        Returned(bm(2), ReturnReason.DISCONNECT, 1, 0),
        Done(bm(3), DoneReason.MAX_DELIVERIES, 2, 0, 5.0),
    ]
    assert engine.stats(5.0).subscriptions == 0
    with pytest.raises(QueueError, match="not registered"):
        engine.outstanding("a")
    engine.disconnect("a", 5.0)  # idempotent
    engine.subscribe("b", 10, 6.0)
    assert delivered(engine, 6.0) == [("b", 0), ("b", 1), ("b", 2)]


def test_strict_leasing_only_the_holder_may_ack(engine_factory):
    engine = engine_factory(leasing=Leasing.STRICT)
    add(engine, 0, 1)
    engine.subscribe("a", 1, 0.0)
    engine.subscribe("b", 1, 0.0)
    engine.dispatch(0.0)
    engine.drain()
    assert engine.lease_of(bm(0)).subscription == "a"  # type: ignore[union-attr]
    for op in (ACK, CANCEL, EXPIRE, EXTEND):
        assert errors(engine.ack("b", [bm(0)], op, 1.0)) == [AckError.NOT_LEASE_HOLDER]
    assert changes(engine) == []
    add(engine, 2)
    assert errors(engine.ack("a", [bm(2)], ACK, 1.0)) == [AckError.NOT_LEASE_HOLDER]
    assert errors(engine.ack("a", [bm(2)], EXPIRE, 1.0)) == [AckError.NOT_LEASE_HOLDER]
    assert errors(engine.ack("a", [bm(2)], CANCEL, 1.0)) == [AckError.NOT_LEASED]
    assert errors(engine.ack("a", [bm(2)], EXTEND, 1.0)) == [AckError.NOT_LEASED]
    assert changes(engine) == []


def test_lenient_leasing_any_subscription_may_ack_any_message(engine_factory):
    engine = engine_factory(leasing=Leasing.LENIENT)
    add(engine, 0, 1, 2)
    engine.subscribe("a", 1, 0.0)
    engine.subscribe("b", 1, 0.0)
    engine.dispatch(0.0)
    engine.drain()
    outcomes = engine.ack("b", [bm(0), bm(2)], ACK, 1.0)
    assert errors(outcomes) == [None, None]
    assert [c.reason for c in changes(engine) if isinstance(c, Done)] == ["acked", "acked"]
    assert engine.outstanding("a") == [] and engine.outstanding("b") == [bm(1)]
    assert errors(engine.ack("a", [bm(1)], CANCEL, 1.0)) == [None]
    add(engine, 3)
    assert errors(engine.ack("a", [bm(3)], CANCEL, 1.0)) == [AckError.NOT_LEASED]
    assert errors(engine.ack("a", [bm(3)], EXPIRE, 2.0)) == [None]
    assert changes(engine)[-1] == Done(bm(3), DoneReason.CONSUMER_EXPIRE, 0, 0, 2.0)


def test_a_refused_bookmark_changes_nothing_and_the_rest_of_the_batch_applies(engine_factory):
    engine = engine_factory()
    add(engine, 0)
    engine.subscribe("a", 5, 0.0)
    engine.dispatch(0.0)
    engine.drain()
    outcomes = engine.ack("a", [Bookmark("other", 0, 0), bm(7), bm(0)], ACK, 1.0)
    assert errors(outcomes) == [AckError.UNKNOWN_BOOKMARK, AckError.UNKNOWN_BOOKMARK, None]
    assert [c for c in changes(engine) if isinstance(c, Done)] == [
        Done(bm(0), DoneReason.ACKED, 1, 0, 1.0)
    ]


def test_extend_moves_the_deadline_without_a_durable_change(engine_factory):
    engine = engine_factory(lease_period=10.0)
    add(engine, 0)
    engine.subscribe("a", 1, 0.0)
    engine.dispatch(0.0)
    engine.drain()
    assert errors(engine.ack("a", [bm(0)], EXTEND, 5.0, seconds=30.0)) == [None]
    assert engine.drain().changes == []
    assert engine.lease_of(bm(0)) == Lease("a", 35.0, 1, 0)
    engine.tick(10.0)
    engine.tick(34.0)
    assert changes(engine) == []
    engine.tick(35.0)
    assert changes(engine) == [Returned(bm(0), ReturnReason.TIMEOUT, 1, 0)]
    with pytest.raises(ValueError, match="extend"):
        engine.ack("a", [bm(0)], EXTEND, 5.0, seconds=-1.0)


def test_extend_can_also_shorten_a_lease(engine_factory):
    engine = engine_factory(lease_period=10.0)
    add(engine, 0)
    engine.subscribe("a", 1, 0.0)
    engine.dispatch(0.0)
    engine.ack("a", [bm(0)], EXTEND, 1.0, seconds=1.0)
    engine.drain()
    engine.tick(2.0)
    assert changes(engine) == [Returned(bm(0), ReturnReason.TIMEOUT, 1, 0)]
    engine.tick(10.0)
    assert changes(engine) == []


# -- expiration ----------------------------------------------------------------------------------


def test_an_unleased_message_expires_by_age(engine_factory):
    engine = engine_factory(expiration=10.0)
    add(engine, 0, now=0.0)
    add(engine, 1, now=5.0)
    engine.tick(9.9)
    assert changes(engine) == []
    engine.tick(10.0)
    done = changes(engine)[0]
    assert done == Done(bm(0), DoneReason.EXPIRATION, 0, 0, 10.0) and done.reason.dead_letter
    assert engine.available() == [bm(1)]
    assert engine.stats(10.0).oldest_available_at == 5.0


def test_a_leased_message_never_expires_while_leased_but_does_when_the_lease_ends(
    engine_factory,
):
    engine = engine_factory(expiration=10.0, lease_period=30.0)
    add(engine, 0, 1)
    engine.subscribe("a", 2, 0.0)
    engine.dispatch(0.0)
    engine.drain()
    engine.tick(29.0)
    assert changes(engine) == []
    engine.ack("a", [bm(1)], CANCEL, 29.5)
    assert changes(engine) == [Done(bm(1), DoneReason.EXPIRATION, 1, 1, 29.5)]
    engine.tick(30.0)
    assert changes(engine)[0] == Done(bm(0), DoneReason.EXPIRATION, 1, 0, 30.0)


def test_dispatch_never_hands_out_an_expired_message(engine_factory):
    engine = engine_factory(expiration=10.0)
    add(engine, 0, now=0.0)
    add(engine, 1, now=6.0)
    engine.subscribe("a", 5, 0.0)
    engine.dispatch(12.0)
    effects = engine.drain()
    assert [d.bookmark for d in effects.deliveries] == [bm(1)]
    assert effects.changes[0] == Done(bm(0), DoneReason.EXPIRATION, 0, 0, 12.0)


def test_an_unparseable_arrival_is_dead_lettered_at_once_and_never_delivered(engine_factory):
    engine = engine_factory()
    engine.subscribe("a", 5, 0.0)
    add(engine, 0, now=1.0)
    add(engine, 1, now=1.0, unparseable=True)
    add(engine, 2, now=1.0)
    done = [c for c in changes(engine) if isinstance(c, Done)]
    assert done == [Done(bm(1), DoneReason.UNPARSEABLE, 0, 0, 1.0)] and done[0].reason.dead_letter
    assert delivered(engine, 1.0) == [("a", 0), ("a", 2)]
    assert engine.stats(1.0).available == 0
    engine.ack("a", [bm(0), bm(2)], ACK, 2.0)
    assert LowWater(TP0, 3) in changes(engine)  # the done one does not hold the mark back


def test_an_arrival_already_older_than_expiration_is_done_at_once(engine_factory):
    engine = engine_factory(expiration=10.0)
    add(engine, 0, now=20.0, timestamp=5.0)
    assert changes(engine)[0] == Done(bm(0), DoneReason.EXPIRATION, 0, 0, 20.0)
    assert engine.stats(20.0).available == 0


def test_expiration_with_out_of_order_timestamps(engine_factory):
    engine = engine_factory(expiration=10.0)
    add(engine, 0, timestamp=5.0)
    add(engine, 1, timestamp=1.0)
    add(engine, 2, timestamp=8.0)
    assert engine.stats(9.0).oldest_available_at == 1.0
    engine.tick(11.0)
    assert [c.bookmark for c in changes(engine) if isinstance(c, Done)] == [bm(1)]
    engine.tick(15.0)
    assert [c.bookmark for c in changes(engine) if isinstance(c, Done)] == [bm(0)]


# -- backlog and fairness ------------------------------------------------------------------------


def test_subscribe_caps_the_backlog_at_the_queue_maximum(engine_factory):
    engine = engine_factory(max_per_subscription_backlog=3)
    assert engine.subscribe("a", 10, 0.0) == 3
    assert engine.subscribe("b", 2, 0.0) == 2
    assert engine.subscribe("b", 1, 0.0) == 1  # re-registering changes the backlog
    with pytest.raises(ValueError, match="max_backlog"):
        engine.subscribe("c", -1, 0.0)  # 0 is allowed: barrier messages only
    add(engine, *range(10))
    # proportional: a 3, b 1, each its share as a run (one at a time: a, b, a, a)
    assert delivered(engine) == [("a", 0), ("a", 1), ("a", 2), ("b", 3)]
    assert len(engine.outstanding("a")) == 3 and len(engine.outstanding("b")) == 1


def test_fast_fills_the_first_subscription_with_room(engine_factory):
    engine = engine_factory(fairness=Fairness.FAST)
    engine.subscribe("a", 2, 0.0)
    engine.subscribe("b", 2, 0.0)
    add(engine, *range(5))
    assert delivered(engine) == [("a", 0), ("a", 1), ("b", 2), ("b", 3)]
    engine.ack("a", [bm(0)], ACK, 0.0)
    assert delivered(engine) == [("a", 4)]


def test_round_robin_takes_turns_and_skips_full_subscriptions(engine_factory):
    engine = engine_factory(fairness=Fairness.ROUND_ROBIN)
    engine.subscribe("a", 5, 0.0)
    engine.subscribe("b", 1, 0.0)
    engine.subscribe("c", 5, 0.0)
    add(engine, *range(6))
    assert delivered(engine) == [("a", 0), ("b", 1), ("c", 2), ("a", 3), ("c", 4), ("a", 5)]
    engine.ack("b", [bm(1)], ACK, 0.0)
    add(engine, 6, 7)
    assert delivered(engine) == [("b", 6), ("c", 7)]


def test_proportional_follows_the_guide_example(engine_factory):
    # Inky 1 outstanding of 2, Blinky 3 of 4, Clyde 4 of 10: the next message goes to Clyde.
    engine = engine_factory(fairness=Fairness.PROPORTIONAL)
    engine.subscribe("Blinky", 4, 0.0)
    add(engine, 0, 1, 2)
    assert delivered(engine) == [("Blinky", 0), ("Blinky", 1), ("Blinky", 2)]
    engine.subscribe("Clyde", 10, 0.0)
    add(engine, 3, 4, 5, 6)
    assert [s for s, _ in delivered(engine)] == ["Clyde"] * 4
    engine.subscribe("Inky", 2, 0.0)
    add(engine, 7)
    assert delivered(engine) == [("Inky", 7)]
    counts = {s: len(engine.outstanding(s)) for s in ("Inky", "Blinky", "Clyde")}
    assert counts == {"Inky": 1, "Blinky": 3, "Clyde": 4}
    add(engine, 8)
    assert delivered(engine) == [("Clyde", 8)]


def test_proportional_ties_go_to_subscribe_order(engine_factory):
    engine = engine_factory(fairness=Fairness.PROPORTIONAL)
    engine.subscribe("b", 2, 0.0)
    engine.subscribe("a", 4, 0.0)
    add(engine, *range(6))
    # the picks one by one are b, a, a, b, a, a: b's 2 and a's 4, each as a run, b first
    assert delivered(engine) == [("b", 0), ("b", 1), ("a", 2), ("a", 3), ("a", 4), ("a", 5)]


def test_proportional_hands_each_its_share_as_a_run(engine_factory):
    # four consumers whose acks came in the same round: runs of offsets, not one each in turn
    engine = engine_factory(fairness=Fairness.PROPORTIONAL)
    for name in "abcd":
        engine.subscribe(name, 3, 0.0)
    add(engine, *range(12))
    assert delivered(engine) == [(name, o) for o, name in enumerate("aaabbbcccddd")]
    engine.ack("b", [bm(3), bm(4), bm(5)], ACK, 0.0)
    engine.ack("d", [bm(9), bm(10)], ACK, 0.0)
    add(engine, *range(12, 17))
    assert delivered(engine) == [("b", 12), ("b", 13), ("b", 14), ("d", 15), ("d", 16)]


def test_no_subscription_with_room_delivers_nothing(engine_factory):
    engine = engine_factory()
    add(engine, 0, 1)
    assert delivered(engine) == []
    engine.subscribe("a", 1, 0.0)
    assert delivered(engine) == [("a", 0)]
    assert delivered(engine) == []
    assert engine.available() == [bm(1)]


# -- order ---------------------------------------------------------------------------------------


def test_a_returned_message_is_oldest_first_again(engine_factory):
    engine = engine_factory(partitions=2)
    add(engine, 0, 1)
    add(engine, 0, 1, partition=1)
    engine.subscribe("a", 1, 0.0)
    assert delivered(engine) == [("a", 0)]
    engine.ack("a", [bm(0)], ACK, 0.0)
    assert delivered(engine) == [("a", 1)]
    engine.ack("a", [bm(1)], CANCEL, 0.0)
    assert engine.available() == [bm(1), bm(0, 1), bm(1, 1)]
    assert engine.available(limit=2) == [bm(1), bm(0, 1)]
    assert delivered(engine) == [("a", 1)]


def test_priority_highest_first_oldest_within_a_priority_none_lowest(engine_factory):
    engine = engine_factory(priority=True)
    for offset, priority in enumerate([None, 5, 1, 5, None, 9]):
        add(engine, offset, priority=priority)
    order = [5, 1, 3, 2, 0, 4]
    assert engine.available() == [bm(o) for o in order]
    assert engine.available(limit=3) == [bm(o) for o in order[:3]]
    assert engine.stats(0.0).available == 6  # browsing leases nothing
    engine.subscribe("a", 1, 0.0)
    assert delivered(engine) == [("a", 5)]
    engine.ack("a", [bm(5)], CANCEL, 0.0)  # returned: first again
    assert delivered(engine) == [("a", 5)]
    engine.ack("a", [bm(5)], ACK, 0.0)
    got = []
    for _ in range(5):
        ((sub, offset),) = delivered(engine)
        got.append(offset)
        engine.ack("a", [bm(offset)], ACK, 0.0)
    assert got == order[1:]


# -- target queue depth and remembered acks ------------------------------------------------------


def test_room_is_the_target_depth_minus_the_active_messages(engine_factory):
    engine = engine_factory(target_queue_depth=3)
    assert engine.room() == 3
    add(engine, 0, 1)
    assert engine.room() == 1
    engine.subscribe("a", 5, 0.0)
    engine.dispatch(0.0)
    assert engine.room() == 1
    add(engine, 2, 3)
    assert engine.room() == 0
    engine.ack("a", [bm(0)], ACK, 0.0)
    assert engine.room() == 0  # 2 available + 1 leased
    engine.ack("a", [bm(1)], ACK, 0.0)
    assert engine.room() == 1
    assert engine_factory().room() == UNLIMITED


def test_unread_is_the_lag_behind_the_high_watermark_with_or_without_a_depth(engine_factory):
    plain, capped = engine_factory(partitions=2), engine_factory(target_queue_depth=2)
    for engine in (plain, capped):
        add(engine, 0, 1)
        engine.mark_read(TP0, 2)
        engine.set_high_watermark(TP0, 9)
    plain.set_high_watermark(TP1, 3)
    assert (plain.stats(0.0).unread, plain.stats(0.0).inactive) == (10, 0)
    assert (capped.stats(0.0).unread, capped.stats(0.0).inactive) == (7, 7)
    add(plain, 0, 1, 2, partition=1)
    assert plain.stats(0.0).unread == 7


def test_acks_between_read_position_and_high_watermark_are_remembered(engine_factory):
    engine = engine_factory(target_queue_depth=2)
    add(engine, 0, 1)
    engine.mark_read(TP0, 2)
    engine.set_high_watermark(TP0, 6)
    assert engine.stats(0.0).inactive == 4
    engine.subscribe("a", 5, 0.0)
    outcomes = engine.ack("a", [bm(3), bm(6), bm(3)], ACK, 1.0)
    assert errors(outcomes) == [None, AckError.UNKNOWN_BOOKMARK, AckError.UNKNOWN_BOOKMARK]
    assert changes(engine) == [Done(bm(3), DoneReason.ACKED, 0, 0, 1.0)]
    assert engine.stats(1.0).inactive == 3
    for op in (CANCEL, EXPIRE, EXTEND):
        assert errors(engine.ack("a", [bm(4)], op, 1.0)) == [AckError.UNKNOWN_BOOKMARK]
    engine.dispatch(1.0)
    engine.ack("a", [bm(0), bm(1)], ACK, 2.0)
    engine.drain()
    add(engine, 2, 3, 4, now=3.0)
    assert engine.available() == [bm(2), bm(4)]
    assert engine.stats(3.0).done_total == 3
    engine.dispatch(3.0)
    engine.drain()
    engine.ack("a", [bm(2)], ACK, 4.0)
    assert changes(engine) == [
        Done(bm(2), DoneReason.ACKED, 1, 0, 4.0),
        LowWater(TP0, 4),
        Forget(bm(2)),
        Forget(bm(3)),
    ]
    assert engine.low_water(TP0) == 4


def test_restored_counts_survive_a_restart_whether_the_message_is_read_or_acked_unread(
    engine_factory,
):
    """After a restart, counts restored from the changelog are the message's counts: when it is
    read again (whatever the arrival says) and in the Done of an ack remembered before it is
    read (beyond target_queue_depth), so a restart never turns a delivery count back."""
    engine = engine_factory(target_queue_depth=1, max_deliveries=3)
    engine.restore_counts({bm(0): (2, 1), bm(1): (1, 0), bm(2): (3, 0)})
    assert engine.restored_pending() == 3
    add(engine, 0)
    engine.mark_read(TP0, 1)
    engine.set_high_watermark(TP0, 3)
    engine.subscribe("a", 1, 0.0)
    assert errors(engine.ack("a", [bm(1)], ACK, 1.0)) == [None]
    assert changes(engine) == [Done(bm(1), DoneReason.ACKED, 1, 0, 1.0)]
    engine.dispatch(1.0)
    assert engine.drain().deliveries == [Delivery("a", bm(0), 3, 1, 61.0)]
    engine.ack("a", [bm(0)], ACK, 2.0)
    engine.drain()
    add(engine, 1, 2, now=3.0)  # 1 was acked unread; 2 reached max_deliveries before the restart
    assert changes(engine)[0] == Done(bm(2), DoneReason.MAX_DELIVERIES, 3, 0, 3.0)
    assert engine.restored_pending() == 0


def test_view_changes_are_netted_per_drain_and_carry_counts_and_priorities(engine_factory):
    engine = engine_factory(track_view=True, priority=True)
    add(engine, 0, priority=5)
    add(engine, 1)  # no priority: lowest
    add(engine, 2, priority=2**64 - 1)
    assert list(engine.drain().view) == [
        ViewChange(bm(0), 1, 0, 0, 5),
        ViewChange(bm(1), 1, 0, 0, None),
        ViewChange(bm(2), 1, 0, 0, 2**64 - 1),
    ]
    engine.subscribe("a", 1, 0.0)
    engine.dispatch(0.0)  # the highest priority first
    assert list(engine.drain().view) == [ViewChange(bm(2), -1, 1, 0, 2**64 - 1)]
    engine.ack("a", [bm(2)], CANCEL, 1.0)  # back, and at once out again to "a"
    engine.dispatch(1.0)
    assert not engine.drain().view  # came and went within the drain: no change
    add(engine, 3, priority=1)
    engine.dispatch(2.0)  # "a" is full: 3 stays
    engine.disconnect("a", 3.0)  # 2 comes back
    assert list(engine.drain().view) == [
        ViewChange(bm(3), 1, 0, 0, 1),
        ViewChange(bm(2), 1, 2, 1, 2**64 - 1),
    ]


# -- at-most-once ----------------------------------------------------------------------------


def test_at_most_once_is_done_when_delivered_and_never_redelivered(engine_factory):
    engine = engine_factory(semantics=Semantics.AT_MOST_ONCE, fairness=Fairness.ROUND_ROBIN)
    add(engine, 0, 1, 2)
    engine.subscribe("a", 1, 0.0)
    engine.dispatch(0.0)
    effects = engine.drain()
    assert effects.deliveries == [Delivery("a", bm(0), 1, 0, None)]
    assert effects.changes == [
        Done(bm(0), DoneReason.DELIVERED, 1, 0, 0.0),
        LowWater(TP0, 1),
        Forget(bm(0)),
    ]
    assert not effects.changes[0].reason.dead_letter
    assert engine.lease_of(bm(0)) is None
    assert engine.outstanding("a") == [bm(0)]
    assert delivered(engine) == []  # the slot is still used
    assert errors(engine.ack("a", [bm(1)], ACK, 0.0)) == [AckError.UNKNOWN_BOOKMARK]
    assert errors(engine.ack("a", [bm(0)], CANCEL, 0.0)) == [None]  # any op frees the slot
    assert errors(engine.ack("a", [bm(0)], ACK, 0.0)) == [AckError.UNKNOWN_BOOKMARK]
    assert changes(engine) == []
    assert delivered(engine) == [("a", 1)]
    engine.disconnect("a", 1.0)
    assert changes(engine) == []
    engine.subscribe("b", 5, 1.0)
    assert delivered(engine) == [("b", 2)]
    stats = engine.stats(1.0)
    assert (stats.available, stats.leased, stats.done_total, stats.delivered_total) == (0, 0, 3, 3)


# -- low-water mark ------------------------------------------------------------------------------


def test_low_water_advances_over_done_messages_and_gaps(engine_factory):
    engine = engine_factory(leasing=Leasing.LENIENT)
    engine.subscribe("a", 10, 0.0)
    add(engine, 0, 2, 3)  # 1 was filtered out
    assert changes(engine) == []
    engine.ack("a", [bm(2)], ACK, 0.0)
    assert changes(engine) == [Done(bm(2), DoneReason.ACKED, 0, 0, 0.0)]
    engine.ack("a", [bm(0)], ACK, 0.0)
    assert changes(engine) == [
        Done(bm(0), DoneReason.ACKED, 0, 0, 0.0),
        LowWater(TP0, 3),
        Forget(bm(0)),
        Forget(bm(2)),
    ]
    engine.ack("a", [bm(3)], ACK, 0.0)
    engine.mark_read(TP0, 10)
    assert changes(engine) == [
        Done(bm(3), DoneReason.ACKED, 0, 0, 0.0),
        LowWater(TP0, 10),
        Forget(bm(3)),
    ]
    engine.mark_read(TP0, 8)  # never backwards
    assert changes(engine) == [] and engine.low_water(TP0) == 10
    add(engine, 12)
    assert changes(engine) == [LowWater(TP0, 12)]


def test_one_low_water_per_partition_per_drain(engine_factory):
    engine = engine_factory(partitions=2, leasing=Leasing.LENIENT)
    engine.subscribe("a", 10, 0.0)
    add(engine, 0, 1, 2)
    add(engine, 0, partition=1)
    engine.ack("a", [bm(0)], ACK, 0.0)
    assert engine.low_water(TP0) == 1
    engine.ack("a", [bm(1), bm(0, 1)], ACK, 0.0)
    lows = [c for c in changes(engine) if isinstance(c, LowWater)]
    assert lows == [LowWater(TP0, 2), LowWater(TP1, 1)]
    assert engine.partitions() == [TP0, TP1]


def test_restore_done_and_start_partition(engine_factory):
    engine = QueueEngine("jobs", EngineSettings(max_deliveries=3, max_cancels=2))
    engine.start_partition(TP0, 10)
    engine.restore_done([bm(11), bm(13), bm(5)])
    assert changes(engine) == [Forget(bm(5))]  # a stale record below the mark
    assert engine.low_water(TP0) == 10
    engine.add(
        [
            Arrival(bm(10), 0.0, deliveries=2, cancels=1),
            Arrival(bm(11), 0.0),
            Arrival(bm(12), 0.0, deliveries=3),
            Arrival(bm(14), 0.0, cancels=2),
            Arrival(bm(15), 0.0),
        ],
        1.0,
    )
    assert changes(engine) == [
        Done(bm(12), DoneReason.MAX_DELIVERIES, 3, 0, 1.0),
        Done(bm(14), DoneReason.MAX_CANCELS, 0, 2, 1.0),
    ]
    assert engine.available() == [bm(10), bm(15)]
    engine.subscribe("a", 5, 1.0)
    engine.dispatch(1.0)
    assert engine.drain().deliveries[0] == Delivery("a", bm(10), 3, 1, 61.0)
    engine.ack("a", [bm(10)], ACK, 2.0)
    assert changes(engine)[1:] == [
        LowWater(TP0, 15),
        Forget(bm(10)),
        Forget(bm(11)),
        Forget(bm(12)),
        Forget(bm(13)),
        Forget(bm(14)),
    ]


# -- misuse ----------------------------------------------------------------------------------


def test_programming_errors_raise(engine_factory):
    engine = engine_factory()
    with pytest.raises(QueueError, match="'ghost' is not registered"):
        engine.ack("ghost", [bm(0)], ACK, 0.0)
    with pytest.raises(QueueError, match="not started"):
        add(engine, 0, partition=7)
    with pytest.raises(QueueError, match="already started"):
        engine.start_partition(TP0, 0)
    add(engine, 5)
    with pytest.raises(QueueError, match="below the read position"):
        add(engine, 3)
    with pytest.raises(QueueError, match="restore done records before reading"):
        engine.restore_done([bm(4)])
    with pytest.raises(ValueError, match="lease_period"):
        QueueEngine("bad", EngineSettings(lease_period=0, max_cancels=-1))


def test_lazy_indexes_stay_proportional_to_live_messages(engine_factory):
    engine = engine_factory(leasing=Leasing.LENIENT, expiration=1e9)
    engine.subscribe("a", 5000, 0.0)
    add(engine, *range(5000))
    engine.dispatch(0.0)
    engine.ack("a", [bm(o) for o in range(0, 5000, 2)], CANCEL, 0.0)
    engine.ack("a", [bm(o) for o in range(1, 5000)], ACK, 0.0)
    engine.drain()
    assert len(engine._core.order) <= 1 + 1024 and len(engine._core.leases) <= 1 + 1024
    assert len(engine._core.ages) <= 2 * 1 + 1024
    assert engine.available() == [bm(0)]


# -- runs: a batch of plain messages kept as one run --------------------------------------------


def _twins(engine_factory, **settings: object) -> tuple[QueueEngine, QueueEngine]:
    return engine_factory(partitions=2, **settings), engine_factory(partitions=2, **settings)


def _same(a: QueueEngine, b: QueueEngine, now: float) -> None:
    ea, eb = a.drain(), b.drain()
    assert ea.changes == eb.changes
    assert ea.deliveries == eb.deliveries
    assert list(ea.view) == list(eb.view)
    assert a.available() == b.available()
    assert a.stats(now) == b.stats(now)
    assert a.view_contents() == b.view_contents()


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"priority": True},
        {"expiration": 5.0},
        {"track_view": True, "priority": True},
        {"leasing": Leasing.LENIENT},
        {"semantics": Semantics.AT_MOST_ONCE, "fairness": Fairness.ROUND_ROBIN},
    ],
)
def test_add_run_is_add_of_plain_arrivals(engine_factory, settings):
    by_run, by_add = _twins(engine_factory, **settings)
    for engine in (by_run, by_add):
        engine.set_high_watermark(TP0, 100)
        engine.restore_counts({bm(9): (1, 0)})
        engine.ack(None, [bm(4)], ACK, 0.0)  # remembered: done before it is read
    batches = [
        (TP0, 0, [0.0, 0.5, 1.0, 1.0, 2.0, 2.0], 7),  # offset 4 is done already
        (TP1, 0, [1.0, 2.0, 3.0], None),
        (TP0, 6, [3.0, 3.0, 2.5, 4.0], 7),  # a timestamp goes back; 9 has a restored count
        (TP0, 10, [-9.0, 4.0], None),  # an expired one where expiration is set
        (TP0, 12, [4.0, 4.5, 5.0, 5.0], 2),
    ]
    for tp, start, times, priority in batches:
        by_run.add_run(tp, start, times, 5.0, priority)
        offsets = range(start, start + len(times))
        arrivals = [
            Arrival(bm(o, tp.partition), t, priority) for o, t in zip(offsets, times, strict=True)
        ]
        by_add.add(arrivals, 5.0)
        _same(by_run, by_add, 5.0)
    for engine in (by_run, by_add):
        engine.subscribe("a", 3, 5.0)
        engine.dispatch(5.0)
    _same(by_run, by_add, 5.0)
    for engine in (by_run, by_add):
        # an ack by filter inside a run splits it; then everything is delivered and acked
        engine.ack(None, [bm(13), bm(7), bm(1, 1)], ACK, 5.5)
    _same(by_run, by_add, 5.5)
    for step in range(12):
        now = 6.0 + step
        for engine in (by_run, by_add):
            engine.tick(now)
            engine.ack("a", engine.outstanding("a"), ACK, now)
            engine.dispatch(now)
        _same(by_run, by_add, now)
    assert by_run.stats(20.0).available == 0
    for tp in (TP0, TP1):
        assert by_run.low_water(tp) == by_add.low_water(tp)


def test_add_run_below_the_read_position_is_refused(engine_factory):
    engine = engine_factory()
    engine.add_run(TP0, 0, [0.0, 0.0], 0.0)
    with pytest.raises(QueueError, match="below the read position"):
        engine.add_run(TP0, 1, [0.0], 0.0)
    assert engine.stats(0.0).available == 2


def test_a_run_materializes_only_what_is_singled_out(engine_factory):
    engine = engine_factory(leasing=Leasing.LENIENT)
    engine.add_run(TP0, 0, [float(i) for i in range(1000)], 0.0)
    engine.subscribe("a", 2, 0.0)
    assert delivered(engine) == [("a", 0), ("a", 1)]
    assert engine.ack("a", [bm(500)], ACK, 0.0) == [AckOutcome(bm(500))]
    items = engine._core.partitions.all[0].items
    (run, tail) = [item for item in items if not isinstance(item, Bookmark)]
    assert (run.start, run.lo, run.hi, sorted(run.detail)) == (0, 2, 500, [0, 1])
    assert (tail.start, tail.lo, tail.hi, tail.detail) == (501, 0, 499, {})
    assert engine.stats(0.0).available == 997
    assert engine.available(3) == [bm(2), bm(3), bm(4)]


def test_a_refused_arrival_keeps_the_run_built_before_it(engine_factory):
    engine = engine_factory()
    arrivals = [Arrival(bm(o), 0.0) for o in (0, 1, 2, 1)]
    with pytest.raises(QueueError, match="below the read position"):
        engine.add(arrivals, 0.0)
    assert engine.available() == [bm(0), bm(1), bm(2)]
    engine.subscribe("a", 5, 0.0)
    assert delivered(engine) == [("a", 0), ("a", 1), ("a", 2)]


def test_leases_and_acks_of_a_run_are_one_change(engine_factory):
    """A run of consecutive offsets leased to one subscription is one Leased (its count), an
    ack of a span of them one Done; what differs (a cancel in the middle, a message delivered
    before) splits the run, and ``singles`` gives the changes message by message."""
    engine = engine_factory()
    engine.set_high_watermark(TP0, 10)
    engine.add_run(TP0, 0, [0.0] * 10, 0.0)
    engine.mark_read(TP0, 10)
    engine.subscribe("a", 10, 0.0)
    engine.dispatch(0.0)
    leased = engine.drain().changes
    assert leased == [Leased(bm(0), "a", 60.0, 1, 0, count=10)]
    assert list(singles(leased)) == [Leased(bm(o), "a", 60.0, 1, 0) for o in range(10)]
    assert errors(engine.ack("a", [bm(4)], CANCEL, 1.0)) == [None]
    assert engine.ack_runs("a", TP0, [0, 3, 5, 9], ACK, 1.0) == []
    assert [c for c in engine.drain().changes if not isinstance(c, LowWater | Forget)] == [
        Returned(bm(4), ReturnReason.CANCEL, 1, 1),
        Done(bm(0), DoneReason.ACKED, 1, 0, 1.0, count=4),
        Done(bm(5), DoneReason.ACKED, 1, 0, 1.0, count=5),
    ]
    engine.dispatch(2.0)
    assert engine.drain().changes == [Leased(bm(4), "a", 62.0, 2, 1)]


def test_a_run_the_mark_passes_is_one_forget(engine_factory):
    """Messages admitted as a run and acked are tombstoned as one Forget of the run (its
    count), not one a message; a message singled out before stays a Forget of its own."""
    engine = engine_factory()
    engine.set_high_watermark(TP0, 10)
    engine.add_run(TP0, 0, [0.0] * 10, 0.0)
    engine.mark_read(TP0, 10)
    engine.subscribe("a", 10, 0.0)
    engine.dispatch(0.0)
    engine.drain()
    assert errors(engine.ack("a", [bm(o) for o in range(10)], ACK, 1.0)) == [None] * 10
    forgets = [c for c in engine.drain().changes if isinstance(c, Forget)]
    assert sum(f.count for f in forgets) == 10
    assert len(forgets) < 10
    covered = [f.bookmark.offset + i for f in forgets for i in range(f.count)]
    assert covered == list(range(10))
