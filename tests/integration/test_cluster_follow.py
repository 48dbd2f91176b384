"""Clients follow the work (issue 12): a subscription opened through any member of a cluster
is served by the owner of its queue, and follows the queue when it moves, with real
coordinator processes over the embedded broker, for the blocking and the asyncio client.

- SIGTERM of the owner mid-stream (the client was given only the other member's address): the
  owner hands the queue over and ends the stream with "moved"; the same Subscription goes on
  delivering from the new owner.
- SIGKILL of the owner (the client was given only the owner's address: it learned the other
  one from the cluster): the connection drops, the group moves the queue after the session
  timeout, and the subscription follows.

Either way every message is confirmed acked, none twice; what the old owner had leased comes
again from the new one (at-least-once). The consumers ack with ``wait=True`` and take
``LeaseLost`` for an ack the move left unconfirmed, as a user's code would.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from layer.client import AsyncQueueClient, QueueClient
from layer.exceptions import LeaseLost, UnknownQueue
from tests.harness import CoordinatorProcess, qlayer, serving
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

N = 30  # messages published before the subscription opens
DEADLINE_S = 150.0  # every message confirmed within this, on a loaded 2-core machine


@dataclass
class Cluster:
    owner: CoordinatorProcess
    other: CoordinatorProcess
    queue: str
    published: set[str]


@dataclass
class Consumed:
    confirmed: list[str] = field(default_factory=list)  # bookmarks whose ack was confirmed
    unconfirmed: list[str] = field(default_factory=list)  # LeaseLost: the move came first
    addresses: list[str] = field(default_factory=list)  # where each message came from
    stopped_at: float = 0.0  # monotonic, when the owner was stopped (SIGTERM: it had exited)
    followed_at: float = 0.0  # the first message from the new owner

    def took(self, address: str | None) -> None:
        self.addresses.append(str(address))
        if self.stopped_at and not self.followed_at:
            self.followed_at = time.monotonic()


def two_members(coordinator_factory: Any, names: Callable[[str], str]) -> Cluster:
    """Two members of a new cluster, the group's split done, N messages in the one queue."""
    cluster, q = names("cluster"), names("follow")
    table = {"name": q, "underlying_topic": q, "message_type": "bytes", "lease_period": "60s"}
    procs = [
        coordinator_factory([table], cluster=cluster),
        coordinator_factory([], cluster=cluster),
    ]
    admin = QueueClient([str(p.address) for p in procs])
    try:

        def settled() -> str | None:
            info = admin.cluster()
            split = len(info.members) == 2 and all(m.partitions for m in info.members)
            owner = next((o.address for o in info.queues if o.queue == q), "")
            return owner if split and owner and serving(admin, [q]) else None

        address = wait_until(settled, timeout=90, message=lambda: f"not split: {admin.cluster()}")
        owner = next(p for p in procs if p.address == address)
        published = {admin.publish(q, f"m{i}".encode()) for i in range(N)}
    finally:
        admin.close()
    return Cluster(owner, next(p for p in procs if p is not owner), q, published)


def stop(proc: CoordinatorProcess, how: str) -> None:
    """SIGTERM (waiting for the exit: the handover is done) or SIGKILL the owner."""
    if how == "term":
        assert proc.stop() == 0
    else:
        proc.kill()


def check(c: Cluster, consumed: Consumed, how: str) -> None:
    took = consumed.followed_at - consumed.stopped_at
    print(f"{how}: first delivery from the new owner {took:.2f}s after the stop")
    assert len(consumed.confirmed) == len(set(consumed.confirmed)), "a message acked twice"
    assert set(consumed.confirmed) == c.published
    assert str(c.owner.address) in consumed.addresses, "nothing came from the first owner"
    assert consumed.unconfirmed, "the ack of the message held at the stop was confirmed"
    assert consumed.addresses[-1] == c.other.address, "the last came from another member"
    if how == "term":
        assert "cluster: handed over control partitions" in c.owner.log_path.read_text()


@pytest.mark.parametrize("how", ["term", "kill"])
def test_a_subscription_follows_its_queue_to_the_new_owner(
    coordinator_factory: Any, names: Callable[[str], str], how: str
) -> None:
    c = two_members(coordinator_factory, names)
    # SIGTERM: given only the member that does not own the queue; SIGKILL: only the owner
    given = c.other if how == "term" else c.owner
    consumed = Consumed()
    stopped = False
    if how == "term":  # the CLI's consume follows too (it uses the client): one, cancelled
        r = qlayer("consume", c.queue, "--server", str(given.address), "--count", "1", "--cancel")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["bookmark"] in c.published
    with QueueClient(str(given.address)) as client, client.subscribe(c.queue, 5) as sub:
        assert sub.address == c.owner.address  # opened on the owner
        assert set(client._addresses.all) == {c.owner.address, c.other.address}
        deadline = time.monotonic() + DEADLINE_S
        while set(consumed.confirmed) != c.published and time.monotonic() < deadline:
            msg = sub.next(timeout=5)
            if msg is None:
                continue
            consumed.took(sub.address)
            if not stopped and len(consumed.confirmed) >= N // 3:
                stop(c.owner, how)  # mid-stream: this message and others leased, unacked
                consumed.stopped_at = time.monotonic()
                stopped = True
            try:
                msg.ack(wait=True, timeout=60)
                consumed.confirmed.append(msg.bookmark)
            except LeaseLost:
                consumed.unconfirmed.append(msg.bookmark)
        assert stopped
        assert sub.reconnects >= 1 and not sub.closed
        # a queue deleted from the cluster is not followed: the subscription ends
        client.delete_queue(c.queue)
        with pytest.raises(UnknownQueue):
            sub.next(timeout=60)
    check(c, consumed, how)


@pytest.mark.parametrize("how", ["term", "kill"])
def test_an_async_subscription_follows_its_queue_to_the_new_owner(
    coordinator_factory: Any, names: Callable[[str], str], how: str
) -> None:
    c = two_members(coordinator_factory, names)
    given = c.other if how == "term" else c.owner
    consumed = Consumed()

    async def scenario() -> None:
        stopped = False
        async with (
            AsyncQueueClient(str(given.address)) as client,
            client.subscribe(c.queue, 5) as sub,
        ):
            assert sub.address == c.owner.address
            assert set(client._addresses.all) == {c.owner.address, c.other.address}
            deadline = time.monotonic() + DEADLINE_S
            while set(consumed.confirmed) != c.published and time.monotonic() < deadline:
                msg = await sub.next(timeout=5)
                if msg is None:
                    continue
                consumed.took(sub.address)
                if not stopped and len(consumed.confirmed) >= N // 3:
                    await asyncio.to_thread(stop, c.owner, how)
                    consumed.stopped_at = time.monotonic()
                    stopped = True
                try:
                    await msg.ack(wait=True, timeout=60)
                    consumed.confirmed.append(msg.bookmark)
                except LeaseLost:
                    consumed.unconfirmed.append(msg.bookmark)
            assert stopped
            assert sub.reconnects >= 1 and not sub.closed
            await client.delete_queue(c.queue)  # not followed: the subscription ends
            with pytest.raises(UnknownQueue):
                await sub.next(timeout=60)

    asyncio.run(scenario())
    check(c, consumed, how)
