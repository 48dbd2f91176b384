"""The Qpid and Solace queue types in the pure engine: sorted queues, the last value queue (a
spool of one), and per-message time to live. The Qpid Java broker's "Other queue types" and
Solace PubSub+'s "Queues" chapters are quoted where a test reproduces what they say."""

from __future__ import annotations

import pytest

from layer.engine import QueueEngine
from layer.engine.model import (
    AckOp,
    Arrival,
    Bookmark,
    Done,
    DoneReason,
    EngineSettings,
    Returned,
    TopicPartition,
)
from layer.engine.queue import sort_rank

TOPIC = "prices"
TP = TopicPartition(TOPIC, 0)


def bm(offset: int, partition: int = 0) -> Bookmark:
    return Bookmark(TOPIC, partition, offset)


def engine(partitions: int = 1, **settings: object) -> QueueEngine:
    e = QueueEngine("q", EngineSettings(**settings))  # type: ignore[arg-type]
    for p in range(partitions):
        e.start_partition(TopicPartition(TOPIC, p), 0)
    return e


def handed(e: QueueEngine, now: float = 0.0) -> list[int]:
    e.dispatch(now)
    return [d.bookmark.offset for d in e.drain().deliveries]


def dones(e: QueueEngine) -> list[tuple[int, DoneReason]]:
    return [(c.bookmark.offset, c.reason) for c in e.drain().changes if isinstance(c, Done)]


# -- Qpid sorted queues --------------------------------------------------------------------------


def sorted_engine(keys: list[str | None], **settings: object) -> QueueEngine:
    e = engine(sort=True, **settings)
    e.add([Arrival(bm(i), float(i), sort_key=k) for i, k in enumerate(keys)], 10.0)
    return e


def test_a_sorted_queue_delivers_in_ascending_alphanumeric_order():
    e = sorted_engine(["delta", "Bravo", "alpha", "charlie", "10", "9"])
    e.subscribe("s", 10, 10.0)
    # String order: digits before upper case before lower case ("10" before "9": text, not
    # numbers, as Qpid's String property)
    assert handed(e, 10.0) == [4, 5, 1, 2, 3, 0]


def test_a_message_without_the_sort_key_goes_last_and_equal_keys_keep_arrival_order():
    # Qpid: "Messages sent to a sorted queue without the specified JMS message property will be
    # inserted into the 'last' position in the queue."
    e = sorted_engine([None, "b", "a", None, "a", "b"])
    e.subscribe("s", 10, 10.0)
    assert handed(e, 10.0) == [2, 4, 1, 5, 0, 3]


def test_equal_sort_keys_are_ordered_by_enqueue_time_so_a_restart_keeps_the_order():
    # Two partitions read in either order give the same delivery order: the oldest first.
    orders = []
    for first, second in ((0, 1), (1, 0)):
        e = engine(partitions=2, sort=True)
        stamps = {0: [1.0, 3.0], 1: [2.0, 4.0]}
        for p in (first, second):
            e.add([Arrival(bm(i, p), t, sort_key="k") for i, t in enumerate(stamps[p])], 5.0)
        e.subscribe("s", 10, 5.0)
        e.dispatch(5.0)
        orders.append([(d.bookmark.partition, d.bookmark.offset) for d in e.drain().deliveries])
    assert orders[0] == orders[1] == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_a_returned_message_goes_back_to_its_sorted_position():
    e = sorted_engine(["c", "a", "b"])
    e.subscribe("s", 1, 10.0)
    assert handed(e, 10.0) == [1]  # "a"
    e.ack("s", [bm(1)], AckOp.CANCEL, 11.0)
    e.drain()
    # "a" is first again, before "b" and "c" which waited longer in the queue
    assert handed(e, 11.0) == [1]
    e.ack("s", [bm(1)], AckOp.ACK, 12.0)
    assert handed(e, 12.0) == [2]


def test_a_message_arriving_with_a_smaller_key_overtakes_the_waiting_ones():
    e = sorted_engine(["m", "z"])
    e.subscribe("s", 1, 10.0)
    assert handed(e, 10.0) == [0]
    e.add([Arrival(bm(2), 11.0, sort_key="a")], 11.0)
    e.ack("s", [bm(0)], AckOp.ACK, 11.0)
    assert handed(e, 11.0) == [2]


def test_sorted_queues_keep_max_deliveries_and_lease_timeouts():
    e = sorted_engine(["b", "a"], max_deliveries=2, lease_period=5.0)
    e.subscribe("s", 1, 10.0)
    assert handed(e, 10.0) == [1]
    e.tick(15.0)  # the lease times out: "a" is first again
    e.drain()
    assert handed(e, 15.0) == [1]
    e.tick(20.0)  # its second timeout: max_deliveries
    assert dones(e) == [(1, DoneReason.MAX_DELIVERIES)]
    assert handed(e, 20.0) == [0]


def test_a_sorted_queue_shows_its_contents_in_sort_order():
    e = sorted_engine(["b", None, "a"])
    assert e.available() == [bm(2), bm(0), bm(1)]


def test_a_sorted_queue_refuses_priority_and_conflation():
    for other in ("priority", "conflate"):
        with pytest.raises(ValueError, match="sort cannot be combined with priority or conflate"):
            EngineSettings(sort=True, **{other: True}).validate("q")


def test_sort_rank_puts_a_missing_value_after_every_string():
    assert sort_rank("\U0010ffff", 9.0) < sort_rank(None, 0.0)
    assert sort_rank("a", 2.0) < sort_rank("a", 3.0) < sort_rank("b", 1.0)


# -- Solace's last value queue: a spool of one (per partition) -----------------------------------


def lvq() -> QueueEngine:
    return engine(conflate=True)


def last(offset: int, t: float) -> Arrival:
    return Arrival(bm(offset), t, conflate_key=("last", 0))


def test_a_last_value_queue_keeps_only_the_newest_message():
    # Solace: "the queue spools only the last message it received, regardless of the message
    # priority value"
    e = lvq()
    e.add([last(0, 1.0), last(1, 2.0)], 2.0)
    e.add([last(2, 3.0)], 3.0)
    assert dones(e) == [(0, DoneReason.CONFLATED), (1, DoneReason.CONFLATED)]
    assert e.available() == [bm(2)]
    assert e.stats(3.0).done_total == 2
    assert e.stats(3.0).dead_lettered_total == 0  # replaced, not dead


def test_the_leased_message_stays_with_its_consumer_until_acked():
    # Solace: "the message is removed from the queue if the queue receives an acknowledgment
    # (ACK) that the message was consumed": a newer arrival does not take it from its consumer
    e = lvq()
    e.add([last(0, 1.0)], 1.0)
    e.subscribe("s", 1, 1.0)
    assert handed(e, 1.0) == [0]
    e.add([last(1, 2.0), last(2, 3.0)], 3.0)
    assert dones(e) == [(1, DoneReason.CONFLATED)]
    assert e.lease_of(bm(0)) is not None
    e.ack("s", [bm(0)], AckOp.ACK, 4.0)
    assert dones(e) == [(0, DoneReason.ACKED)]
    assert handed(e, 4.0) == [2]


def test_a_returned_message_older_than_the_last_value_leaves_as_conflated():
    e = lvq()
    e.add([last(0, 1.0)], 1.0)
    e.subscribe("s", 1, 1.0)
    assert handed(e, 1.0) == [0]
    e.add([last(1, 2.0)], 2.0)
    e.ack("s", [bm(0)], AckOp.CANCEL, 3.0)
    changes = e.drain().changes
    assert [(c.bookmark.offset, c.reason) for c in changes if isinstance(c, Done)] == [
        (0, DoneReason.CONFLATED)
    ]
    assert not [c for c in changes if isinstance(c, Returned)]
    assert handed(e, 3.0) == [1]


# -- per-message time to live --------------------------------------------------------------------


def test_a_message_expires_at_its_own_ttl():
    e = engine(message_ttl=True)
    e.add([Arrival(bm(0), 0.0, expires_at=5.0), Arrival(bm(1), 0.0)], 0.0)
    e.tick(4.9)
    assert dones(e) == []
    e.tick(5.0)
    assert dones(e) == [(0, DoneReason.EXPIRATION)]
    assert e.available() == [bm(1)]  # no TTL of its own, no queue expiration: stays


def test_the_queue_expiration_caps_a_longer_ttl():
    e = engine(message_ttl=True, expiration=10.0)
    e.add([Arrival(bm(0), 0.0, expires_at=100.0), Arrival(bm(1), 0.0, expires_at=3.0)], 0.0)
    e.tick(3.0)
    assert dones(e) == [(1, DoneReason.EXPIRATION)]
    e.tick(10.0)
    assert dones(e) == [(0, DoneReason.EXPIRATION)]


def test_an_arrival_past_its_ttl_is_done_at_once_and_never_delivered():
    e = engine(message_ttl=True)
    e.subscribe("s", 5, 10.0)
    e.add([Arrival(bm(0), 0.0, expires_at=5.0), Arrival(bm(1), 9.0, expires_at=20.0)], 10.0)
    assert handed(e, 10.0) == [1]
    assert e.stats(10.0).dead_lettered_total == 1


def test_dispatch_skips_a_message_whose_ttl_passed_since_the_last_tick():
    e = engine(message_ttl=True)
    e.add([Arrival(bm(0), 0.0, expires_at=5.0), Arrival(bm(1), 0.0)], 0.0)
    e.subscribe("s", 5, 6.0)
    assert handed(e, 6.0) == [1]
    assert dones(e) == []  # drained with the deliveries above
    assert e.stats(6.0).dead_lettered_total == 1


def test_a_leased_message_does_not_expire_until_its_lease_ends():
    e = engine(message_ttl=True, lease_period=10.0)
    e.add([Arrival(bm(0), 0.0, expires_at=5.0)], 0.0)
    e.subscribe("s", 1, 1.0)
    assert handed(e, 1.0) == [0]
    e.tick(6.0)
    assert dones(e) == []  # leased: the consumer may still ack it
    e.ack("s", [bm(0)], AckOp.CANCEL, 7.0)
    assert dones(e) == [(0, DoneReason.EXPIRATION)]


def test_a_returned_message_expires_at_its_ttl_later():
    e = engine(message_ttl=True, lease_period=10.0)
    e.add([Arrival(bm(0), 0.0, expires_at=5.0)], 0.0)
    e.subscribe("s", 1, 1.0)
    assert handed(e, 1.0) == [0]
    e.disconnect("s", 2.0)
    e.drain()
    e.tick(4.0)
    assert dones(e) == []
    e.tick(5.0)
    assert dones(e) == [(0, DoneReason.EXPIRATION)]


def test_a_delayed_message_past_its_ttl_expires_when_its_delay_ends():
    e = engine(message_ttl=True)
    e.add([Arrival(bm(0), 0.0, not_before=8.0, expires_at=5.0)], 0.0)
    e.subscribe("s", 1, 0.0)
    e.tick(5.0)
    assert dones(e) == []  # delayed, not available yet
    e.tick(8.0)
    assert dones(e) == [(0, DoneReason.EXPIRATION)]
    assert handed(e, 8.0) == []
