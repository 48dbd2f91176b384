"""A wedged group is replaced (issue 12, the cluster liveness bug). On the embedded broker,
the group's leader leaving (SIGTERM: LeaveGroup) inside the rebalance that a joining member
starts left the group answering every JoinGroup with the departed leader: nobody assigned
again, and the leaver's queues stayed unowned for minutes. The members now move the group to
the next epoch (``layer.coordinator.membership``): every control partition is owned again and
the queue is served.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from layer.client import QueueClient
from layer.coordinator.membership import CONTROL_PARTITIONS
from tests.harness import serving
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

STALL_BOUND_S = 50.0  # the stall bound (20 s here), a rebalance and claims, on a loaded machine


def test_the_group_assigns_again_after_its_leader_leaves_mid_rebalance(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    cluster, q = names("cluster"), names("wedge")
    table = {"name": q, "underlying_topic": q, "message_type": "bytes", "lease_period": "60s"}
    leader = coordinator_factory([table], cluster=cluster)  # first in: the group's leader
    middle = coordinator_factory([], cluster=cluster)
    newcomer = coordinator_factory([], cluster=cluster, start=False)
    procs = [leader, middle, newcomer]

    def info() -> Any:
        with QueueClient(str(middle.address), reconnect=False) as c:
            return c.cluster()

    def split(members: int, each: int) -> bool:
        i = info()
        owning = [m for m in i.members if m.partitions]
        return len(owning) == members and all(len(m.partitions) == each for m in owning)

    wait_until(lambda: split(2, 6), timeout=90, message=lambda: f"not split: {info()}")
    before = {m.id for m in info().members}
    joining = threading.Thread(target=newcomer.start, kwargs={"timeout": 120}, daemon=True)
    joining.start()
    # the newcomer advertises itself, then joins: its JoinGroup starts a rebalance, held
    # half a session on Tansu; the leader leaves (LeaveGroup) inside it
    wait_until(lambda: len({m.id for m in info().members} - before) == 1, 90, message="join")
    assert leader.stop(timeout=60) == 0, leader.log_tail()
    stopped_at = time.monotonic()
    joining.join(150)

    def owned(members: int) -> bool:
        i = info()
        partitions = sorted(p for m in i.members for p in m.partitions)
        return partitions == list(range(CONTROL_PARTITIONS)) and len(i.members) == members

    # the two members left own every partition again (stalled, the group moves to the next
    # epoch: 20 s on Tansu's 2 s session, and a rebalance); before the fix, none was assigned
    # for 68-85 s
    wait_until(
        lambda: owned(2), timeout=STALL_BOUND_S, message=lambda: f"partitions unowned: {info()}"
    )
    took = time.monotonic() - stopped_at
    leader.start(timeout=120)
    wait_until(lambda: owned(3), timeout=150, message=lambda: f"not rejoined: {info()}")
    with QueueClient([str(p.address) for p in procs]) as client:
        wait_until(lambda: serving(client, [q]), timeout=60, message="queue not served")
        client.publish(q, b"after")
    print(f"every control partition owned {took:.1f}s after the leader's stop")
    moved = [p for p in procs if "the group moves to epoch" in p.log_path.read_text()]
    print(f"members that moved to a new group: {len(moved)}")
