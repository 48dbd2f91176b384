"""A member of a cluster stopped (SIGSTOP) past its session, with a lease out, while another
member takes its queue over: real coordinator processes over the embedded broker.

The new owner fences the old one's changelog writer before it restores the queue, and
redelivers what the old owner had leased (the lease returns, as on a restart). When the old
owner wakes it must grant nothing and confirm nothing for the queue it lost: its consumer's ack
is refused, no new message is leased to its consumer, and it stops serving (its commit was
fenced); what the new owner acked is never delivered again.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from layer.client import QueueClient
from layer.coordinator.membership import CONTROL_PARTITIONS
from layer.exceptions import QLayerError
from tests.harness import serving
from tests.helpers import wait_until

pytestmark = pytest.mark.fault


def owner_of(client: QueueClient, queue: str) -> str:
    for q in client.cluster().queues:
        if q.queue == queue:
            return q.member
    return ""


def sole_member(client: QueueClient) -> str:
    """The one member of the cluster if it holds every control partition, else ""."""
    members = client.cluster().members
    if len(members) == 1 and members[0].partitions == list(range(CONTROL_PARTITIONS)):
        return members[0].id
    return ""


def test_a_stopped_member_is_fenced_and_grants_nothing_when_it_wakes(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    cluster, q = names("cluster"), names("fenced")
    table = {"name": q, "underlying_topic": q, "message_type": "bytes", "lease_period": "60s"}
    procs = [
        coordinator_factory([table], cluster=cluster),
        coordinator_factory([], cluster=cluster),
    ]
    clients = [QueueClient(str(p.address), reconnect=False) for p in procs]
    ids = [c.cluster().member for c in clients]
    try:
        wait_until(
            lambda: all(owner_of(c, q) in ids and serving(c, [q]) for c in clients),
            timeout=60,
            message="no member serves the queue",
        )
        o = ids.index(owner_of(clients[0], q))
        owner, other = procs[o], procs[1 - o]
        zombie, survivor = clients[o], clients[1 - o]
        for i in range(3):
            survivor.publish(q, f"m{i}".encode())  # forwarded to the owner
        sub = zombie.subscribe(q, max_backlog=1)
        first = sub.next(timeout=30)
        assert first is not None and first.deliveries == 1
        assert owner.proc is not None
        owner.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            # the other member takes the queue (the group evicts the stopped one)
            wait_until(
                lambda: owner_of(survivor, q) == ids[1 - o] and serving(survivor, [q]),
                timeout=60,
                message="the other member did not take the queue over",
            )
            took = time.monotonic() - stopped
            got = {}
            with survivor.subscribe(q, max_backlog=10) as sub2:
                while len(got) < 3:
                    msg = sub2.next(timeout=30)
                    assert msg is not None, f"only {sorted(got)} redelivered"
                    got[msg.data] = msg
                    msg.ack(wait=True, timeout=30)
            # the lease the stopped owner granted was returned: its message came again
            assert got[first.data].deliveries == 2
            assert got[first.data].bookmark == first.bookmark
            acked_before = survivor.stats(q)[0].acked_total
            survivor.publish(q, b"after")
        finally:
            owner.proc.send_signal(signal.SIGCONT)
        # awake: its consumer's ack is not confirmed, and nothing more is leased to it
        with pytest.raises(QLayerError):
            first.ack(wait=True, timeout=30)
        try:
            late = sub.next(timeout=3)
        except QLayerError:
            late = None  # its stream ended: fine
        assert late is None, f"the fenced member leased {late.data!r} after it woke"
        wait_until(lambda: not owner.running, timeout=60, message="the fenced member serves on")
        assert owner.proc.returncode != 0
        assert "fenced" in owner.log_path.read_text(errors="replace")
        # woken, the fenced member may have rejoined the group before a commit failed (its
        # consumer rejoins as soon as it finds its session lost), so a rebalance can move the
        # queue to it and back once more after it exited; the queue then settles on the other
        # member, which delivers what was published meanwhile, once, and nothing acked again
        exited = time.monotonic()
        back = None
        acked = tried = False
        deadline = exited + 120
        while True:
            wait_until(
                lambda: sole_member(survivor) == ids[1 - o] and serving(survivor, [q]),
                timeout=max(1.0, deadline - time.monotonic()),
                message="the other member did not serve the queue after the fenced one exited",
            )
            back = time.monotonic() - exited if back is None else back
            try:
                with survivor.subscribe(q, max_backlog=10) as sub3:
                    if not acked and tried:
                        # an ack cut short by a move may have taken effect before it: then
                        # "after" is done (acked once), not to come again
                        msg = sub3.next(timeout=10)
                        if msg is None:
                            s = survivor.stats(q)[0]
                            assert (s.available, s.leased) == (0, 0), s
                            assert s.acked_total == acked_before + 1, s
                            acked = True
                        else:
                            assert msg.data == b"after"
                            msg.ack(wait=True, timeout=30)
                            acked = True
                    if not acked:
                        msg = sub3.next(timeout=30)
                        assert msg is not None and msg.data == b"after"
                        tried = True
                        msg.ack(wait=True, timeout=30)
                        acked = True
                    late = sub3.next(timeout=1)
                    assert late is None, f"{late.data!r} delivered again after its ack"
                break
            except QLayerError as exc:  # moved once more by the group (an ack cut short too)
                assert other.running, f"the other member stopped: {exc}"
                assert time.monotonic() < deadline, f"the queue kept moving: {exc}"
        print(
            f"\nstop -> the other member serves the queue: {took:.2f} s;"
            f" again {back:.2f} s after the fenced one exited"
        )
        assert other.running
    finally:
        for c in clients:
            c.close()
