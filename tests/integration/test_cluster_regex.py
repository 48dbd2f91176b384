"""A regex subscription in a cluster (issue 12), with real coordinator processes over the
embedded broker: ``client.subscribe("^prefix-")`` given one member opens one stream per
matching queue on the member serving it, merged into one iterator (``RegexSubscription``),
and each stream follows its queue when the member serving it is SIGKILLed.

Seven matching queues sit on seven control partitions of twelve, so each of two members
serves at least one of them. Every message is confirmed acked once, none confirmed comes
again, and a queue the regex does not match (or created after the subscription) is not
joined."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from layer.client import AsyncQueueClient, AsyncRegexSubscription, QueueClient, RegexSubscription
from layer.coordinator.membership import partition_of
from layer.exceptions import ClientError, LeaseLost, QLayerError
from tests.harness import CoordinatorProcess, serving
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

PER_QUEUE = 5  # messages published to each matching queue
DEADLINE_S = 150.0  # every message confirmed within this, on a loaded 2-core machine


def matching_names(prefix: str, partitions: int = 7) -> list[str]:
    """Queue names ``prefix-<i>`` on ``partitions`` distinct control partitions of twelve:
    two members holding six each both serve some of them."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < partitions:
        name = f"{prefix}-{i}"
        found.setdefault(partition_of(name), name)
        i += 1
    return sorted(found.values())


def table(q: str) -> dict[str, Any]:
    return {"name": q, "underlying_topic": q, "message_type": "bytes", "lease_period": "60s"}


@dataclass
class Cluster:
    procs: list[CoordinatorProcess]
    queues: list[str]  # the queues the regex matches
    regex: str
    other: str  # a queue of the cluster it does not match
    published: set[str]
    owners: dict[str, str]  # queue -> its owner's address before anything stopped


def two_members(coordinator_factory: Any, names: Callable[[str], str]) -> Cluster:
    """Two members of a new cluster, split, serving the matching queues (some each) and
    another one, with ``PER_QUEUE`` messages in each matching queue and one in the other."""
    cluster, prefix, other = names("cluster"), names("rx"), names("other")
    queues = matching_names(prefix)
    procs = [
        coordinator_factory([table(q) for q in [*queues, other]], cluster=cluster),
        coordinator_factory([], cluster=cluster),
    ]
    addresses = [str(p.address) for p in procs]
    with QueueClient(addresses) as admin:

        def settled() -> dict[str, str] | None:
            info = admin.cluster()
            owners = {o.queue: o.address for o in info.queues if o.queue in queues}
            split = len(info.members) == 2 and all(m.partitions for m in info.members)
            ready = split and len(owners) == len(queues) and all(owners.values())
            return owners if ready and serving(admin, [*queues, other]) else None

        owners = wait_until(settled, timeout=90, message=lambda: f"not split: {admin.cluster()}")
        assert set(owners.values()) == set(addresses), "the queues are not on both members"
        published = {
            admin.publish(q, f"{q}:{i}".encode()) for q in queues for i in range(PER_QUEUE)
        }
        admin.publish(other, b"not for the regex")
        for q in queues:
            wait_until(lambda q=q: admin.stats(q)[0].available == PER_QUEUE, timeout=60)
    return Cluster(procs, queues, f"^{re.escape(prefix)}-", other, published, owners)


def settled_after(admin: QueueClient, c: Cluster) -> bool:
    """Every matching queue done (nothing available or leased), the other one untouched
    (False while a queue's owner does not answer: it is moving)."""
    try:
        done = all((s.available, s.leased) == (0, 0) for q in c.queues for s in admin.stats(q))
        return done and admin.stats(c.other)[0].available == 1
    except QLayerError:
        return False


def test_a_regex_subscription_merges_both_members_and_follows_a_kill(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    c = two_members(coordinator_factory, names)
    given, victim = c.procs
    addresses = {str(p.address) for p in c.procs}
    confirmed: list[str] = []
    unconfirmed: list[str] = []  # LeaseLost: the kill came before the ack's answer
    again: list[str] = []  # confirmed, then delivered again
    moved: list[str] = []  # delivered after the kill from a queue the victim served
    served_by: set[str] = set()
    killed_at = 0.0
    with QueueClient(str(given.address)) as client, client.subscribe(c.regex, 10) as sub:
        assert isinstance(sub, RegexSubscription)
        assert [s.queue for s in sub.shards] == c.queues
        assert set(sub.address.split(",")) == addresses  # streams on both members
        assert [s.address for s in sub.shards] == [c.owners[q] for q in c.queues]
        # the backlog of 10 is split over the seven queues, at least 1 each
        assert [s.max_backlog for s in sub.shards] == [2, 2, 2, 1, 1, 1, 1]
        assert sub.max_backlog == 10
        deadline = time.monotonic() + DEADLINE_S
        while set(confirmed) != c.published and time.monotonic() < deadline:
            msg = sub.next(timeout=5)
            if msg is None:
                # an ack the kill cut short may have taken effect all the same: then its
                # message is done, not delivered again, and the queues show it
                if set(confirmed) | set(unconfirmed) >= c.published and settled_after(client, c):
                    break
                continue
            assert msg.queue in c.queues, f"{msg.queue} is not one of the regex's queues"
            assert msg.bookmark.startswith(f"{msg.queue}/")
            if msg.bookmark in confirmed:
                again.append(msg.bookmark)
            served_by.add(msg._subscription.address)
            if killed_at and c.owners[msg.queue] == str(victim.address):
                moved.append(msg.bookmark)  # from a queue the survivor took over
            # killed once a third is confirmed and both members have delivered, holding a
            # message of the victim's: its ack cannot be confirmed, it must come again
            third = len(confirmed) >= len(c.published) // 3
            held = msg._subscription.address == str(victim.address)
            if not killed_at and third and served_by == addresses and held:
                victim.kill()  # SIGKILL: the survivor fences it and takes its queues
                killed_at = time.monotonic()
            try:
                msg.ack(wait=True, timeout=60)
                confirmed.append(msg.bookmark)
            except LeaseLost:
                unconfirmed.append(msg.bookmark)
        finished_at = time.monotonic()
        assert killed_at, f"not killed: delivered by {served_by}"
        # every stream of the victim's follows to the survivor (one with nothing left to
        # deliver may still be on its way when the last message is confirmed; a stream shows
        # its next address as it starts reconnecting, so its reconnect is what tells)
        followed = [s for s in sub.shards if c.owners[s.queue] == str(victim.address)]
        wait_until(
            lambda: sub.address == str(given.address) and all(s.reconnects for s in followed),
            timeout=90,
            message=lambda: (
                f"not followed: {[(s.queue, s.address, s.reconnects) for s in followed]}"
            ),
        )
        assert sub.reconnects >= 1 and not sub.closed
        assert sub.acked_count == len(confirmed)
        assert sub.next(timeout=3) is None  # nothing confirmed comes back
        with QueueClient(str(given.address)) as admin:
            wait_until(lambda: settled_after(admin, c), timeout=60)
    assert served_by == addresses, "not received from both members"
    assert unconfirmed, "the ack of the message held at the kill was confirmed"
    assert set(unconfirmed) <= set(moved), "a message held at the kill did not come again"
    assert again == [], f"confirmed acks delivered again: {again}"
    assert len(confirmed) == len(set(confirmed)), "a message acked twice"
    done_unanswered = c.published - set(confirmed)  # acked, the answer lost with the kill
    assert done_unanswered <= set(unconfirmed), f"never delivered: {done_unanswered}"
    print(
        f"confirmed {len(confirmed)}, unconfirmed at the kill {len(unconfirmed)}"
        f" (of which done all the same {len(done_unanswered)}), delivered from the"
        f" victim's queues after the kill {len(moved)},"
        f" all done {finished_at - killed_at:.1f}s after the kill"
    )


def test_the_asyncio_client_merges_too_and_a_deleted_queue_leaves(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    c = two_members(coordinator_factory, names)
    addresses = {str(p.address) for p in c.procs}
    late = f"{c.queues[0]}-late"  # matches the regex, created once the subscription is open

    async def scenario() -> list[str]:
        confirmed: list[str] = []
        served_by: set[str] = set()
        async with (
            AsyncQueueClient(str(c.procs[1].address)) as client,
            client.subscribe(c.regex, 3) as sub,
        ):
            assert isinstance(sub, AsyncRegexSubscription)
            assert [s.queue for s in sub.shards] == c.queues
            assert [s.max_backlog for s in sub.shards] == [1] * len(c.queues)
            with pytest.raises(ClientError, match="open a new subscription"):
                await sub.replace(queue=f"^{c.other}$")
            # a new backlog is split over the queues again
            assert await sub.replace(max_backlog=14) == 14
            assert [s.max_backlog for s in sub.shards] == [2] * len(c.queues)
            await client.create_queue(table(late))
            await client.publish(late, b"late")
            deadline = time.monotonic() + DEADLINE_S
            n = 0
            while set(confirmed) != c.published and time.monotonic() < deadline:
                msg = await sub.next(timeout=5)
                if msg is None:
                    continue
                assert msg.queue in c.queues, f"{msg.queue} is not one of the regex's queues"
                served_by.add(msg._subscription.address)
                n += 1
                if n % 2:  # by bookmark: to the stream that delivered it
                    await sub.ack(msg.bookmark, wait=True, timeout=60)
                else:
                    await msg.ack(wait=True, timeout=60)
                confirmed.append(msg.bookmark)
            assert served_by == addresses, "not received from both members"
            assert sub.acked_count == len(confirmed)
            # a queue deleted from the cluster leaves the regex, which goes on with the others
            await client.delete_queue(c.queues[0])
            deadline = time.monotonic() + 60
            while not sub.shards[0].closed and time.monotonic() < deadline:
                assert await sub.next(timeout=1) is None
            assert sub.shards[0].closed and not sub.closed
            assert await sub.next(timeout=1) is None
            assert sub.address != ""
        return confirmed

    confirmed = asyncio.run(scenario())
    assert len(confirmed) == len(set(confirmed)), "a message acked twice"
    assert set(confirmed) == c.published


def test_a_partitioned_queue_is_taken_whole_and_a_coordinator_alone_resolves_it_itself(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    prefix = names("rx")
    plain, parts = f"{prefix}-plain", f"{prefix}-parts"
    tables = [table(plain), {**table(parts), "distribution": "partitioned", "partitions": 3}]
    member = coordinator_factory(tables, cluster=names("cluster"))  # a cluster of one
    solo = f"{prefix}-solo"
    alone = coordinator_factory([table(solo)])
    regex = f"^{re.escape(prefix)}-"
    with QueueClient(str(member.address)) as client:
        shards = [f"{parts}#{i}" for i in range(3)]
        wait_until(lambda: serving(client, [plain, *shards]), timeout=90)
        published = {client.publish(plain, b"p")}
        published |= {client.publish(parts, f"k{i}".encode(), key=f"k{i}") for i in range(9)}
        with client.subscribe(regex, 4) as sub:
            assert isinstance(sub, RegexSubscription)
            # the partitioned queue matched by its own name, with every shard
            assert [s.queue for s in sub.shards] == [*shards, plain]
            assert [s.max_backlog for s in sub.shards] == [1, 1, 1, 1]
            confirmed: list[str] = []
            deadline = time.monotonic() + DEADLINE_S
            while set(confirmed) != published and time.monotonic() < deadline:
                msg = sub.next(timeout=5)
                if msg is not None:
                    assert msg.queue in {plain, *shards}
                    sub.ack(msg.bookmark, wait=True, timeout=60)
                    confirmed.append(msg.bookmark)
            assert sorted(confirmed) == sorted(published)
    # a coordinator alone: one stream, the regex resolved by the coordinator, as before
    with QueueClient(str(alone.address)) as client:
        client.publish(solo, b"alone")
        with client.subscribe(regex, 4) as one:
            assert not isinstance(one, RegexSubscription)
            assert one.queue == regex and one.backlog == 4
            msg = one.next(timeout=60)
            assert msg is not None and msg.queue == solo and msg.data == b"alone"
            msg.ack(wait=True, timeout=60)
