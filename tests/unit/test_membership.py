"""The members topic reduced (``layer.coordinator.membership.ClusterMap``), pure."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from layer.coordinator.group_log import LeaderWatch
from layer.coordinator.membership import (
    CONTROL_PARTITIONS,
    ClusterMap,
    Member,
    Membership,
    epoch_write,
    group_name,
    handed_over,
    leaving_write,
    member_write,
    owner_write,
    partition_of,
)

A = Member("a", "10.0.0.1:7070", "a-changelog")
B = Member("b", "10.0.0.2:7070", "b-changelog")


def feed(cmap: ClusterMap, *writes: object) -> None:
    for offset, w in enumerate(writes, start=cmap.next_offset):
        cmap.apply(w.key, w.value, offset)  # type: ignore[attr-defined]


def test_a_queue_has_one_stable_partition() -> None:
    # crc32 of the name: the same in every member and version (a change moves queues)
    assert partition_of("orders") == 2
    assert {partition_of(f"q{i}") for i in range(200)} == set(range(CONTROL_PARTITIONS))


def test_the_owner_of_a_queue_is_the_last_claim_not_released() -> None:
    cmap = ClusterMap("b")
    p = partition_of("orders")
    feed(cmap, member_write(A), member_write(B), owner_write(p, A, released=False))
    assert cmap.owner_of("orders") == A
    feed(cmap, owner_write(p, A, released=True))
    assert cmap.owner_of("orders") is None  # moving
    feed(cmap, owner_write(p, B, released=False))
    assert cmap.owner_of("orders") == B
    # b took it from a released claim: nothing to fence
    assert cmap.taken_from[p] is not None and cmap.taken_from[p].released  # type: ignore[union-attr]


def test_a_claim_over_an_unreleased_one_names_the_owner_to_fence() -> None:
    cmap = ClusterMap("b")
    feed(cmap, member_write(A), owner_write(3, A, released=False), owner_write(3, B, False))
    before = cmap.taken_from[3]
    assert before is not None and not before.released
    assert before.transactional_id == "a-changelog"
    # the offset of the claim taken over: a fence begun after it was read covers its writer
    assert cmap.taken_from_offset[3] == 1 and cmap.owner_offsets[3] == 2


def test_a_member_that_left_has_no_address_and_a_bad_record_is_skipped() -> None:
    cmap = ClusterMap("b")
    feed(cmap, member_write(A))
    cmap.apply(b"member/a", None, cmap.next_offset)
    cmap.apply(b"owner/x", b"{}", cmap.next_offset)  # logged and skipped
    cmap.apply(b"owner/1", b"not json", cmap.next_offset)
    assert cmap.members == {} and cmap.owners == {}


def test_a_release_written_after_another_members_claim_is_ignored() -> None:
    # a loses the partition (its session ran out) and releases it once its last changes are
    # durable; b claimed it meanwhile (and fenced a): b's claim stands
    cmap = ClusterMap("a")
    feed(cmap, member_write(A), member_write(B), owner_write(5, A, released=False))
    feed(cmap, owner_write(5, B, released=False), owner_write(5, A, released=True))
    owner = cmap.owners[5]
    assert owner.member == "b" and not owner.released
    # a's own release of a partition it still holds counts, and then a claim by b is free
    feed(cmap, owner_write(5, A, released=False), owner_write(5, A, released=True))
    feed(cmap, owner_write(5, B, released=False))
    assert cmap.owners[5].member == "b" and not cmap.owners[5].released


def test_the_group_epoch_is_the_highest_written_and_names_the_group() -> None:
    cmap = ClusterMap("a")
    assert cmap.epoch == 0 and group_name("c1", cmap.epoch) == "qlayer.c1"
    for offset, epoch in enumerate([2, 1]):  # two members moving at once: the highest holds
        w = epoch_write(epoch)
        cmap.apply(w.key, w.value, offset)
    assert cmap.epoch == 2 and group_name("c1", cmap.epoch) == "qlayer.c1.2"


def test_a_member_stopping_gracefully_is_leaving_until_it_starts_again() -> None:
    cmap = ClusterMap("b")
    feed(cmap, member_write(A), leaving_write(A))
    assert cmap.leaving == {"a"}
    feed(cmap, member_write(A))  # started again: advertises itself
    assert cmap.leaving == set()


def test_a_release_after_the_successors_claim_is_recorded_though_not_in_force() -> None:
    cmap = ClusterMap("b")
    feed(cmap, member_write(A), owner_write(3, A, False), leaving_write(A))
    feed(cmap, owner_write(3, B, False))  # b claims before a's handover ended
    feed(cmap, owner_write(3, A, released=True))
    assert cmap.owners[3].member == "b" and not cmap.owners[3].released
    assert cmap.releases[3] == ("a", 4) and cmap.taken_from_offset[3] == 1


async def never_refuses(address: str) -> bool:
    return False


async def refuses_now(address: str) -> bool:
    return True


def test_a_successor_waits_for_the_release_of_an_owner_stopping_gracefully() -> None:
    async def scenario() -> tuple[bool, bool, bool, bool]:
        cmap = ClusterMap("b")
        feed(cmap, member_write(A), owner_write(3, A, False), owner_write(3, B, False))
        before, at = cmap.taken_from[3], cmap.taken_from_offset[3]
        assert before is not None
        # not released yet: a short wait ends without it
        without = await handed_over(cmap, 3, before, at, never_refuses, within=0.05)
        # an older release (before the claim taken over) does not count
        cmap.releases[3] = ("a", 0)
        old = await handed_over(cmap, 3, before, at, never_refuses, within=0.05)
        # released while the successor waits
        asyncio.get_running_loop().call_later(
            0.05, lambda: feed(cmap, owner_write(3, A, released=True))
        )
        released = await handed_over(cmap, 3, before, at, never_refuses, within=10)
        # an owner whose API refuses connections died mid-handover: no wait
        cmap.releases.clear()
        dead = await asyncio.wait_for(
            handed_over(cmap, 3, before, at, refuses_now, within=10), timeout=5
        )
        return without, old, released, dead

    assert asyncio.run(scenario()) == (False, False, True, False)


def watch(cmap: ClusterMap, leave_seen_at: float | None) -> Any:
    """What ``Membership._stalled`` reads, of a member assigned at 0 that bumped no epoch."""
    return SimpleNamespace(
        map=cmap, epoch=0, _bumped_at=-1000.0, stall_s=20.0, left_stall_s=8.0,
        _assigned_at=0.0, _joined_at=0.0, _unowned_since={}, _leave_seen_at=leave_seen_at,
        leaders=LeaderWatch(cmap.departed),
    )  # fmt: skip


def test_a_partition_released_after_a_graceful_stop_and_not_claimed_is_a_wedge_sooner() -> None:
    cmap = ClusterMap("b")
    feed(cmap, *(owner_write(p, B, False) for p in range(CONTROL_PARTITIONS) if p != 3))
    feed(cmap, member_write(A), owner_write(3, A, False), owner_write(3, A, released=True))
    # no member stopped gracefully lately (e.g. after an outage): 20 s
    calm = watch(cmap, leave_seen_at=None)
    assert Membership._stalled(calm, 1.0) is None
    assert Membership._stalled(calm, 10.0) is None
    assert Membership._stalled(calm, 21.5) == "control partitions [3] unowned for more than 20s"
    # a's leave was read at 0.5: released and unclaimed for 8 s is taken for a wedge
    after_leave = watch(cmap, leave_seen_at=0.5)
    assert Membership._stalled(after_leave, 1.0) is None
    assert Membership._stalled(after_leave, 8.5) is None
    assert Membership._stalled(after_leave, 9.5) == (
        "control partitions [3] unowned for more than 8s"
    )
    # claimed meanwhile: no wedge
    feed(cmap, owner_write(3, B, False))
    assert Membership._stalled(after_leave, 30.0) is None
    # a partition never claimed keeps the 20 s
    cmap.owners.pop(3)
    never = watch(cmap, leave_seen_at=0.5)
    assert Membership._stalled(never, 1.0) is None
    assert Membership._stalled(never, 9.5) is None
    # a leave read more than a minute ago does not count
    feed(cmap, owner_write(3, A, False), owner_write(3, A, released=True))
    stale = watch(cmap, leave_seen_at=0.5)
    assert Membership._stalled(stale, 70.0) is None
    assert Membership._stalled(stale, 79.0) is None
    assert Membership._stalled(stale, 90.5) == "control partitions [3] unowned for more than 20s"
