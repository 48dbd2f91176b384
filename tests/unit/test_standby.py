"""Which control partitions a member is a standby of (``layer.coordinator.standby``), pure."""

from __future__ import annotations

from layer.coordinator.membership import ClusterMap, Member, member_write, owner_write
from layer.coordinator.standby import standby_partitions

A, B, C = (Member(x, f"{x}:7070", f"{x}-changelog") for x in "abc")


def cluster(
    me: str, owners: dict[int, Member], released: frozenset[int] = frozenset()
) -> ClusterMap:
    cmap = ClusterMap(me)
    writes = [member_write(A), member_write(B), member_write(C)]
    writes += [owner_write(p, m, released=p in released) for p, m in owners.items()]
    for offset, w in enumerate(writes):
        cmap.apply(w.key, w.value, offset)
    return cmap


def test_the_standby_of_a_partition_is_the_next_member_in_id_order() -> None:
    owners = {0: A, 1: B, 2: C, 3: A}
    assert standby_partitions(cluster("b", owners), "b", 1) == {0, 3}
    assert standby_partitions(cluster("c", owners), "c", 1) == {1}
    assert standby_partitions(cluster("a", owners), "a", 1) == {2}  # the ring wraps
    # two replicas: every other member's partitions (never its own)
    assert standby_partitions(cluster("a", owners), "a", 2) == {1, 2}
    assert standby_partitions(cluster("a", owners), "a", 5) == {1, 2}
    assert standby_partitions(cluster("a", owners), "a", 0) == set()


def test_a_member_holding_no_partition_is_left_out_of_the_ring() -> None:
    # c was killed and a, b took its partitions over: b is a's standby again, a is b's
    owners = {0: A, 1: B, 2: A}
    assert standby_partitions(cluster("a", owners), "a", 1) == {1}
    assert standby_partitions(cluster("b", owners), "b", 1) == {0, 2}
    assert standby_partitions(cluster("c", owners), "c", 1) == set()  # not in the ring


def test_a_released_partition_has_no_standby_until_it_is_claimed_again() -> None:
    owners = {0: A, 1: A, 2: B}
    assert standby_partitions(cluster("b", owners, frozenset({1})), "b", 1) == {0}


def test_a_member_holding_nothing_yet_is_no_standby() -> None:
    assert standby_partitions(cluster("c", {0: A, 1: B}), "c", 2) == set()
