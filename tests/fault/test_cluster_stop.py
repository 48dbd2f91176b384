"""A SIGTERMed cluster member exits within a bound (issue 12), however the group stands.

bench.failover's teardown once waited more than 60 s for a SIGTERMed member: it stops the
members one after another right after restarting one, so each stop lands while the group still
rebalances (the restarted member joining, then the previous member's queues moving). Here three
members serving a queue: its owner is restarted, then all three get SIGTERM one after another as
soon as the one before has exited. Each must hand over and exit 0 within ``EXIT_S``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from layer.client import QueueClient
from tests.harness import CoordinatorProcess, serving
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

EXIT_S = 30.0  # a graceful stop: the handover takes well under a second; a loaded machine


def stop_within(proc: CoordinatorProcess, bound: float) -> float:
    """SIGTERM ``proc``; the seconds it took to exit 0 (killed and failed past ``bound``)."""
    started = time.monotonic()
    code = proc.stop(timeout=bound)
    took = time.monotonic() - started
    assert code == 0, (
        f"exit {code} after {took:.1f}s (bound {bound:.0f}s); where its stop waited:\n"
        f"{proc.stop_report()}\nits log's end:\n{proc.log_tail(30)}"
    )
    return took


def test_members_stopped_one_after_another_mid_rebalance_each_exit_in_time(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    cluster, q = names("cluster"), names("stop")
    table = {"name": q, "underlying_topic": q, "message_type": "bytes"}
    procs = [coordinator_factory([table], cluster=cluster)]
    procs += [coordinator_factory([], cluster=cluster) for _ in range(2)]
    with QueueClient([str(p.address) for p in procs]) as admin:

        def settled() -> bool:
            info = admin.cluster()
            return len(info.members) == 3 and all(m.partitions for m in info.members)

        wait_until(settled, timeout=90, message=lambda: f"not split: {admin.cluster()}")
        wait_until(lambda: serving(admin, [q]), timeout=60, message="queue not served")
        for i in range(10):
            admin.publish(q, f"m{i}".encode())
        # the owner restarts: its start is a rebalance, still under way at the first stop
        owner = next(o.address for o in admin.cluster().queues if o.queue == q)
        restarted = next(p for p in procs if p.address == owner)
        stop_within(restarted, EXIT_S)
        restarted.start()
    # back to back, as bench.failover's teardown: each stop lands while the group still moves
    # the queues of the one before
    took = [stop_within(proc, EXIT_S) for proc in procs]
    print(f"SIGTERM to exit, one member after another: {', '.join(f'{t:.2f}s' for t in took)}")
