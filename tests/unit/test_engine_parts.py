"""The queue engine's parts, each built and driven alone: ``Holding``, ``Partitions``,
``ViewJournal`` and the ``Core``'s transitions (``layer.engine.core``). The engine's contract as
a whole is tested through ``QueueEngine`` (test_engine.py, test_engine_properties.py)."""

from __future__ import annotations

import pytest

from layer.engine.core import Core
from layer.engine.fairness import Subscriber
from layer.engine.holding import Holding
from layer.engine.index import AVAILABLE, DELAYED, DONE, HELD, LEASED, Entry
from layer.engine.journal import ViewJournal
from layer.engine.model import (
    Bookmark,
    Done,
    DoneReason,
    EngineSettings,
    Forget,
    Leased,
    LowWater,
    Returned,
    ReturnReason,
    TopicPartition,
    ViewChanges,
)
from layer.engine.partition import Partitions
from layer.exceptions import QueueError

TP = TopicPartition("t", 0)


def entry(offset: int, state: int = AVAILABLE) -> Entry:
    e = Entry(Bookmark("t", 0, offset), offset, 100.0 + offset, 0, 0)
    e.state = state
    return e


# -- Holding -----------------------------------------------------------------------------------


def test_holding_releases_what_a_barrier_held_in_order_up_to_the_next_barrier() -> None:
    h = Holding(conflate=False)
    first, a, b, second, c = (entry(i) for i in range(5))
    h.hold(first, barrier=True)
    h.hold(a, barrier=False)
    h.hold(b, barrier=False)
    h.hold(second, barrier=True)
    h.hold(c, barrier=False)
    assert h.held_count == 5 and all(e.state == HELD for e in (first, a, b, second, c))
    assert h.release() == []  # the first barrier is still pending: nothing passes it
    assert h.barriers.popleft() is first  # sent
    first.state = DONE
    b.state = DONE  # acked while held: passed over, not released
    h.held_count -= 2  # what Core.finish does for each (``left_held``)
    assert h.release() == [a]  # up to the second barrier
    assert h.held_count == 1 + 1  # the second barrier and c


def test_holding_left_held_says_when_the_first_barrier_went() -> None:
    h = Holding(conflate=False)
    first, second, a = entry(0), entry(1), entry(2)
    h.hold(first, barrier=True)
    h.hold(second, barrier=True)
    h.hold(a, barrier=False)
    assert h.left_held(a) is False  # not a barrier
    assert h.left_held(second) is False  # a barrier, but not the first
    assert list(h.barriers) == [first]
    assert h.left_held(first) is True
    assert not h.barriers and h.held_count == 0


def test_holding_delays_count_until_due() -> None:
    h = Holding(conflate=False)
    late, soon = entry(0), entry(1)
    h.delay(late, until=20.0)
    h.delay(soon, until=10.0)
    assert (late.state, soon.state, h.delayed) == (DELAYED, DELAYED, 2)
    assert h.pop_due(5.0) is None and h.delayed == 2
    assert h.pop_due(10.0) is soon and h.delayed == 1
    late.state = DONE  # finished while delayed: its heap item is skipped
    h.delayed -= 1
    assert h.pop_due(30.0) is None and h.delayed == 0


def test_holding_conflation_replaces_the_older_unless_it_is_leased() -> None:
    h = Holding(conflate=True)
    old, new, newest = entry(0), entry(1), entry(2)
    assert h.newest(old, "k") is None
    assert h.newest(new, "k") is old  # available: replaced
    new.state = LEASED
    assert h.newest(newest, "k") is None  # leased: both stay
    assert h.superseded(new) and not h.superseded(newest)
    h.forget(new)  # not the newest: nothing to forget
    assert h.latest == {"k": newest}
    h.forget(newest)
    assert h.latest == {}


# -- Partitions --------------------------------------------------------------------------------


def test_partitions_name_the_queue_and_partition_in_their_errors() -> None:
    parts = Partitions("orders")
    parts.start(TP, 5)
    with pytest.raises(QueueError, match=r"queue 'orders'.*already started"):
        parts.start(TP, 0)
    with pytest.raises(QueueError, match=r"queue 'orders': partition t/1 of .* is not started"):
        parts.require(Bookmark("t", 1, 0))
    with pytest.raises(QueueError, match=r"queue 'orders'.*not started"):
        parts.get(TopicPartition("u", 0))
    assert parts.lookup(Bookmark("u", 0, 0)) is None
    assert parts.find("t", 0) is parts.get(TP) is parts.all[0]


def test_partitions_drain_emits_a_moved_low_water_mark_once() -> None:
    parts = Partitions("q")
    part = parts.start(TP, 0)
    for offset in range(3):
        part.append(offset, entry(offset))
    part.read_pos = 3
    part.done(Bookmark("t", 0, 0))
    part.done(Bookmark("t", 0, 1))
    parts.touch(part)
    parts.touch(part)  # once in the list however often touched
    assert parts.dirty == [part]
    changes: list[object] = []
    parts.drain(changes)
    assert changes == [LowWater(TP, 2), Forget(Bookmark("t", 0, 0)), Forget(Bookmark("t", 0, 1))]
    assert parts.dirty == [] and not part.dirty
    changes.clear()
    parts.touch(part)
    parts.drain(changes)
    assert changes == []  # the mark did not move


# -- ViewJournal -------------------------------------------------------------------------------


def test_view_journal_keeps_the_net_change_per_message() -> None:
    journal = ViewJournal()
    came_went, went_came, came, went = entry(0), entry(1), entry(2), entry(3)
    journal.record(came_went, 1)
    journal.record(came_went, -1)
    journal.record(went_came, -1)
    journal.record(went_came, 1)
    journal.record(came, 1)
    journal.record(went, -1)
    view = ViewChanges()
    journal.drain(view, None)
    assert list(zip(view.bookmarks, view.signs, strict=True)) == [
        (went_came.bookmark, -1),
        (went_came.bookmark, 1),
        (came.bookmark, 1),
        (went.bookmark, -1),
    ]
    assert view.priorities is None and len(journal) == 0


# -- Core --------------------------------------------------------------------------------------


def core_with(n: int, **settings: object) -> Core:
    core = Core("q", EngineSettings(**settings))  # type: ignore[arg-type]
    part = core.partitions.start(TP, 0)
    for offset in range(n):
        e = entry(offset)
        part.append(offset, e)
        core.arrive(e)
    part.read_pos = n
    return core


def test_core_transitions_keep_the_counts_right() -> None:
    core = core_with(3, lease_period=30.0, max_deliveries=2)
    sub = Subscriber("s", 0, 10)
    core.subs["s"] = sub
    core.picker.update(sub)
    a, b, c = (core.order.pop() for _ in range(3))  # what the dispatcher hands out
    assert a is not None and b is not None and c is not None
    core.deliver(a, sub, 1.0)
    core.lease_many(sub, [b, c], 1.0)
    assert (core.available, core.leased, sub.outstanding, core.live()) == (0, 3, 3, 3)
    assert all(e.state == LEASED and e.holder is sub and e.deadline == 31.0 for e in (a, b, c))
    core.end_lease(a, ReturnReason.TIMEOUT, 40.0)  # back, after its backoff (none: at once)
    assert (a.state, core.available, core.leased) == (AVAILABLE, 1, 2)
    core.finish(b, DoneReason.ACKED, 41.0)
    assert (b.state, core.leased, core.done_total, sub.outstanding) == (DONE, 1, 1, 1)
    c.deliveries = 2
    core.end_lease(c, ReturnReason.CANCEL, 42.0)  # at max_deliveries: done, dead-lettered
    assert (c.state, core.leased, core.dead_total) == (DONE, 0, 1)
    assert [type(x) for x in core.changes] == [Leased, Leased, Returned, Done, Done]
    assert core.changes[-1].reason is DoneReason.MAX_DELIVERIES  # type: ignore[union-attr]


def test_core_finishing_the_first_barrier_releases_what_it_held() -> None:
    core = core_with(0)
    part = core.partitions.get(TP)
    barrier, held = entry(0), entry(1)
    for e in (barrier, held):
        part.append(e.bookmark.offset, e)
        core.hold(e, barrier=e is barrier)
    part.read_pos = 2
    assert (core.available, core.live()) == (0, 2)
    core.finish(barrier, DoneReason.ACKED, 1.0)  # acked (lenient) before it was sent
    assert (held.state, core.available, core.holding.held_count) == (AVAILABLE, 1, 0)
    assert core.order.pop() is held
