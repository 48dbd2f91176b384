"""Several coordinators as one service (issue 12): real coordinator processes of one cluster
over the embedded broker.

The group splits the queues (one per control partition here, so the split is visible): each is
served by exactly one member, the others refuse a subscription with ``NotOwner`` naming the
owner's address and forward stats, browse and publish to it; a member stopped with SIGTERM
hands its queues over with nothing lost and nothing delivered twice.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from layer.client import QueueClient
from layer.coordinator.membership import CONTROL_PARTITIONS, partition_of
from layer.exceptions import NotOwner
from tests.harness import serving
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def one_per_partition(base: str) -> list[str]:
    """Queue names, one per control partition."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < CONTROL_PARTITIONS:
        name = f"{base}-{i}"
        found.setdefault(partition_of(name), name)
        i += 1
    return [found[p] for p in range(CONTROL_PARTITIONS)]


def served_by(client: QueueClient, member: str, queues: list[str]) -> set[str]:
    """The queues ``member`` serves, as the metadata call of ``client``'s member says."""
    info = client.cluster()
    return {q.queue for q in info.queues if q.member == member and q.queue in queues}


def test_two_members_split_the_queues_and_a_stopped_one_hands_them_over(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    cluster = names("cluster")
    queues = one_per_partition(names("q"))
    tables = [{"name": q, "underlying_topic": q, "message_type": "bytes"} for q in queues]
    first = coordinator_factory(tables, cluster=cluster)
    second = coordinator_factory([], cluster=cluster)
    a, b = QueueClient(str(first.address)), QueueClient(str(second.address))
    try:
        ida, idb = a.cluster().member, b.cluster().member

        def split() -> bool:
            for client in (a, b):  # both members see the same split
                mine, theirs = served_by(client, ida, queues), served_by(client, idb, queues)
                if mine | theirs != set(queues) or mine & theirs or not (mine and theirs):
                    return False
            return serving(a, queues) and serving(b, queues)

        wait_until(split, timeout=60, message=lambda: f"no split: {a.cluster()}")
        on_first = served_by(a, ida, queues)
        on_second = served_by(a, idb, queues)
        assert len(on_first) == len(on_second) == CONTROL_PARTITIONS // 2
        members = {m.id: m for m in b.cluster().members}
        assert members[ida].address == first.address
        assert members[idb].address == second.address
        assert len(members[ida].partitions) == len(members[idb].partitions) == 6
        # a non-owner names the owner and its address (to a client that does not follow
        # owners: with reconnect=False the refusal reaches the caller)
        q = sorted(on_second)[0]
        with (
            QueueClient(str(first.address), reconnect=False) as plain,
            pytest.raises(NotOwner, match=re.escape(str(second.address))),
            plain.subscribe(q) as sub,
        ):
            sub.next(timeout=5)
        # a client that does (the default) opens the subscription on the owner
        with a.subscribe(q) as sub:
            assert sub.address == second.address
        # stats, publish and browse work against either member (forwarded to the owner)
        for name in queues:
            other = b if name in on_first else a
            other.publish(name, f"{name}-1".encode())
            wait_until(
                lambda o=other, n=name: [m.value for m in o.browse(n)] == [f"{n}-1".encode()],
                timeout=30,
                message=f"{name}: not browsed through the member that does not serve it",
            )
            assert other.stats(name)[0].queue == name
        # each queue delivers through its owner, once
        for name in queues:
            client = a if name in on_first else b
            with client.subscribe(name) as sub:
                msg = sub.next(timeout=30)
                assert msg is not None and msg.data == f"{name}-1".encode()
                msg.ack(wait=True, timeout=30)
        # the first stops: the second takes every queue, with what was acked gone
        assert first.stop() == 0
        assert "cluster: handed over control partitions" in first.log_path.read_text()
        wait_until(
            lambda: served_by(b, idb, queues) == set(queues) and serving(b, queues),
            timeout=60,
            message="the second member did not take the first one's queues",
        )
        for name in queues:
            b.publish(name, f"{name}-2".encode())
        for name in queues:
            with b.subscribe(name, max_backlog=10) as sub:
                msg = sub.next(timeout=30)
                assert msg is not None and msg.data == f"{name}-2".encode(), name
                msg.ack(wait=True, timeout=30)
                assert sub.next(timeout=0.5) is None
        # a graceful handover needs no fence
        assert "fencing the last owner" not in second.log_path.read_text()
    finally:
        a.close()
        b.close()
