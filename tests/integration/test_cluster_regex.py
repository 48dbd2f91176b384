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
from dataclasses import dataclass, field
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


@dataclass
class KillRun:
    """A consumer of the regex given the first member, SIGKILLing the second mid-stream; the
    same bookkeeping for the blocking and the asyncio client."""

    c: Cluster
    confirmed: list[str] = field(default_factory=list)
    unconfirmed: list[str] = field(default_factory=list)  # LeaseLost: killed before the answer
    again: list[str] = field(default_factory=list)  # confirmed, then delivered again
    moved: list[str] = field(default_factory=list)  # after the kill, from a victim's queue
    served_by: set[str] = field(default_factory=set)
    killed_at: float = 0.0
    finished_at: float = 0.0

    @property
    def given(self) -> CoordinatorProcess:
        return self.c.procs[0]

    @property
    def victim(self) -> CoordinatorProcess:
        return self.c.procs[1]

    @property
    def addresses(self) -> set[str]:
        return {str(p.address) for p in self.c.procs}

    def opened(self, sub: Any) -> None:
        c = self.c
        assert [s.queue for s in sub.shards] == c.queues
        assert set(sub.address.split(",")) == self.addresses  # streams on both members
        assert [s.address for s in sub.shards] == [c.owners[q] for q in c.queues]
        # the backlog of 10 is split over the seven queues, at least 1 each
        assert [s.max_backlog for s in sub.shards] == [2, 2, 2, 1, 1, 1, 1]
        assert sub.max_backlog == 10

    def done(self) -> bool:
        return set(self.confirmed) == self.c.published

    def maybe_done(self) -> bool:
        """Nothing came for a while: an ack the kill cut short may have taken effect all the
        same; then its message is done, not delivered again, and the queues show it."""
        return set(self.confirmed) | set(self.unconfirmed) >= self.c.published

    def took(self, msg: Any) -> None:
        """A message came: checked, and the victim killed when the time has come."""
        c = self.c
        assert msg.queue in c.queues, f"{msg.queue} is not one of the regex's queues"
        assert msg.bookmark.startswith(f"{msg.queue}/")
        if msg.bookmark in self.confirmed:
            self.again.append(msg.bookmark)
        self.served_by.add(msg._subscription.address)
        victim = str(self.victim.address)
        if self.killed_at and c.owners[msg.queue] == victim:
            self.moved.append(msg.bookmark)  # from a queue the survivor took over
        # killed once a third is confirmed and both members have delivered, holding a
        # message of the victim's: its ack cannot be confirmed, it must come again
        third = len(self.confirmed) >= len(c.published) // 3
        held = msg._subscription.address == victim
        if not self.killed_at and third and self.served_by == self.addresses and held:
            self.victim.kill()  # SIGKILL: the survivor fences it and takes its queues
            self.killed_at = time.monotonic()

    def followed(self, sub: Any) -> bool:
        """Every stream of the victim's is on the survivor (a stream shows its next address
        as it starts reconnecting, so its reconnect is what tells)."""
        victim = str(self.victim.address)
        streams = [s for s in sub.shards if self.c.owners[s.queue] == victim]
        return sub.address == str(self.given.address) and all(s.reconnects for s in streams)

    def check(self) -> None:
        assert self.killed_at, f"not killed: delivered by {self.served_by}"
        assert self.served_by == self.addresses, "not received from both members"
        assert self.unconfirmed, "the ack of the message held at the kill was confirmed"
        assert set(self.unconfirmed) <= set(self.moved), "a message held did not come again"
        assert self.again == [], f"confirmed acks delivered again: {self.again}"
        assert len(self.confirmed) == len(set(self.confirmed)), "a message acked twice"
        done_unanswered = self.c.published - set(self.confirmed)  # the answer lost
        assert done_unanswered <= set(self.unconfirmed), f"never delivered: {done_unanswered}"
        print(
            f"confirmed {len(self.confirmed)}, unconfirmed at the kill {len(self.unconfirmed)}"
            f" (of which done all the same {len(done_unanswered)}), delivered from the"
            f" victim's queues after the kill {len(self.moved)},"
            f" all done {self.finished_at - self.killed_at:.1f}s after the kill"
        )


def settled(run: KillRun) -> bool:
    """``settled_after`` through a blocking client of its own (for the asyncio test)."""
    with QueueClient(str(run.given.address)) as admin:
        return settled_after(admin, run.c)


def test_a_regex_subscription_merges_both_members_and_follows_a_kill(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    c = two_members(coordinator_factory, names)
    run = KillRun(c)
    with QueueClient(str(run.given.address)) as client, client.subscribe(c.regex, 10) as sub:
        assert isinstance(sub, RegexSubscription)
        run.opened(sub)
        deadline = time.monotonic() + DEADLINE_S
        while not run.done() and time.monotonic() < deadline:
            msg = sub.next(timeout=5)
            if msg is None:
                if run.maybe_done() and settled_after(client, c):
                    break
                continue
            run.took(msg)
            try:
                msg.ack(wait=True, timeout=60)
                run.confirmed.append(msg.bookmark)
            except LeaseLost:
                run.unconfirmed.append(msg.bookmark)
        run.finished_at = time.monotonic()
        # one stream with nothing left to deliver may still be on its way
        wait_until(lambda: run.followed(sub), timeout=90, message="not followed")
        assert sub.reconnects >= 1 and not sub.closed
        assert sub.acked_count == len(run.confirmed)
        assert sub.next(timeout=3) is None  # nothing confirmed comes back
        wait_until(lambda: settled_after(client, c), timeout=60)
    run.check()


def test_an_async_regex_subscription_follows_a_kill_too(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    c = two_members(coordinator_factory, names)
    run = KillRun(c)

    async def scenario() -> None:
        async with (
            AsyncQueueClient(str(run.given.address)) as client,
            client.subscribe(c.regex, 10) as sub,
        ):
            assert isinstance(sub, AsyncRegexSubscription)
            run.opened(sub)
            deadline = time.monotonic() + DEADLINE_S
            while not run.done() and time.monotonic() < deadline:
                msg = await sub.next(timeout=5)
                if msg is None:
                    if run.maybe_done() and await asyncio.to_thread(settled, run):
                        break
                    continue
                run.took(msg)
                try:
                    await msg.ack(wait=True, timeout=60)
                    run.confirmed.append(msg.bookmark)
                except LeaseLost:
                    run.unconfirmed.append(msg.bookmark)
            run.finished_at = time.monotonic()
            deadline = time.monotonic() + 90
            while not run.followed(sub) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert run.followed(sub), "not followed"
            assert sub.reconnects >= 1 and not sub.closed
            assert sub.acked_count == len(run.confirmed)
            assert await sub.next(timeout=3) is None  # nothing confirmed comes back

    asyncio.run(scenario())
    with QueueClient(str(run.given.address)) as admin:
        wait_until(lambda: settled_after(admin, c), timeout=60)
    run.check()


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
