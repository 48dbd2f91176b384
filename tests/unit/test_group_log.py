"""The leader of each JoinGroup round, read from librdkafka's cgrp debug log
(``layer.coordinator.group_log``), and the wedge a departed leader makes; pure."""

from __future__ import annotations

import logging

from layer.coordinator.group_log import DEAD_LEADER_ROUNDS, GroupLog, LeaderWatch, join_leader
from layer.coordinator.membership import (
    CONTROL_PARTITIONS,
    ClusterMap,
    Member,
    Membership,
    group_write,
    member_write,
    owner_write,
)
from tests.unit.test_membership import watch

# as librdkafka 2.x writes them (taken from a member's log in a history run)
FOLLOWER = (
    "JoinGroup response: GenerationId 12, Protocol cooperative-sticky, LeaderId"
    " qlayer-m2-29f02f90, my MemberId qlayer-m0-1d322e78, member metadata count 0: (no error)"
)
LEADER = (
    "JoinGroup response: GenerationId 13, Protocol cooperative-sticky, LeaderId"
    " qlayer-m0-1d322e78 (me), my MemberId qlayer-m0-1d322e78, member metadata count 3:"
    " (no error)"
)
FAILED = (
    "JoinGroup response: GenerationId -1, Protocol , LeaderId , my MemberId qlayer-m1-c8ca,"
    " member metadata count 0: Broker: Group member needs a valid member ID"
)

A = Member("a", "10.0.0.1:7070", "a-changelog")
B = Member("b", "10.0.0.2:7070", "b-changelog")


def test_the_leader_of_a_round_is_read_from_the_join_group_response_line() -> None:
    assert join_leader(FOLLOWER) == (12, "qlayer-m2-29f02f90", "qlayer-m0-1d322e78")
    assert join_leader(LEADER) == (13, "qlayer-m0-1d322e78", "qlayer-m0-1d322e78")
    assert join_leader(FAILED) is None
    assert join_leader("SyncGroup response: Broker: Group rebalance in progress") is None


def test_rounds_in_a_row_led_by_a_departed_member_are_a_wedge() -> None:
    departed = {"gone"}
    watch = LeaderWatch(departed)
    watch.joined("gone", "me")
    assert watch.rounds == 1 and not watch.wedged  # one such round happens and passes
    watch.joined("live", "me")
    assert watch.rounds == 0
    for _ in range(DEAD_LEADER_ROUNDS):
        watch.joined("gone", "me")
    assert watch.wedged and watch.leader == "gone"
    watch.joined("me", "me")
    assert not watch.wedged
    # another departed leader starts the count again
    watch.joined("gone", "me")
    departed.add("gone-too")
    watch.joined("gone-too", "me")
    assert watch.rounds == 1


def test_the_handler_reads_join_responses_and_forwards_only_what_was_asked() -> None:
    seen: list[tuple[str, str]] = []
    forwarded: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            forwarded.append(record)

    target = logging.Logger("target", logging.DEBUG)
    target.addHandler(Keep())
    log = GroupLog.logger("group", lambda *a: seen.append(a), target, debug=False)
    # confluent-kafka logs ``(facility, client name, text)``
    log.log(logging.DEBUG, "%s [%s] %s", "JOINGROUP", "c#1", FOLLOWER)
    log.log(logging.DEBUG, "%s [%s] %s", "HEARTBEAT", "c#1", "Heartbeat for group")
    log.log(logging.WARNING, "%s [%s] %s", "SESSTMOUT", "c#1", "session timed out")
    assert seen == [("qlayer-m2-29f02f90", "qlayer-m0-1d322e78")]
    assert [r.levelno for r in forwarded] == [logging.WARNING]
    loud = GroupLog.logger("group", lambda *a: None, target, debug=True)
    loud.log(logging.DEBUG, "%s [%s] %s", "HEARTBEAT", "c#1", "Heartbeat for group")
    assert len(forwarded) == 2


def test_a_group_id_tombstoned_or_replaced_has_departed() -> None:
    cmap = ClusterMap("a")
    feeds = [group_write(B, "gid-b1"), group_write(B, "gid-b2"), group_write(B, None)]
    for offset, w in enumerate(feeds):
        cmap.apply(w.key, w.value, offset)
    assert cmap.departed == {"gid-b1", "gid-b2"}
    assert "b" not in cmap.group_ids
    # a bad record is skipped: the id in force stays, nothing departs
    cmap.apply(group_write(A, "gid-a").key, group_write(A, "gid-a").value, 3)
    cmap.apply(b"group/a", b'{"no": "id"}', 4)
    assert cmap.group_ids["a"] == "gid-a" and "gid-a" not in cmap.departed


def test_a_wedge_by_a_departed_leader_is_taken_up_at_once() -> None:
    cmap = ClusterMap("a")
    writes = [member_write(A), member_write(B), group_write(B, "gid-b")]
    writes += [owner_write(p, A if p % 2 else B, False) for p in range(CONTROL_PARTITIONS)]
    for offset, w in enumerate(writes):
        cmap.apply(w.key, w.value, offset)
    w = watch(cmap, None)
    cmap.departed.add("gid-b")  # removed as dead (``Membership.removed``)
    w.leaders.joined("gid-b", "gid-a")
    assert Membership._stalled(w, 1.0) is None  # one round: it passes
    w.leaders.joined("gid-b", "gid-a")
    assert Membership._stalled(w, 1.0) == (
        "2 JoinGroup rounds in a row led by gid-b, which left the group"
    )
    # not while a new epoch is already on its way
    w._bumped_at = 0.5
    assert Membership._stalled(w, 1.0) is None


def test_partitions_held_by_a_member_removed_as_dead_are_watched_like_released_ones() -> None:
    cmap = ClusterMap("a")
    writes = [member_write(A), member_write(B), group_write(B, "gid-b")]
    writes += [owner_write(p, A if p % 2 else B, False) for p in range(CONTROL_PARTITIONS)]
    for offset, w in enumerate(writes):
        cmap.apply(w.key, w.value, offset)
    alive = watch(cmap, None)
    assert Membership._stalled(alive, 30.0) is None  # b's claims stand while b is in the group
    cmap.departed.add("gid-b")
    removed = watch(cmap, leave_seen_at=0.5)  # b removed at 0.5
    assert Membership._stalled(removed, 1.0) is None
    assert Membership._stalled(removed, 8.5) is None
    assert Membership._stalled(removed, 9.5) == (
        "control partitions [0, 2, 4, 6, 8, 10] unowned for more than 8s"
    )
    # a takes them over: no wedge
    for offset, w in enumerate(
        [owner_write(p, A, False) for p in range(0, CONTROL_PARTITIONS, 2)],
        start=cmap.next_offset,
    ):
        cmap.apply(w.key, w.value, offset)
    assert Membership._stalled(removed, 20.0) is None
