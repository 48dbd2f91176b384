"""Several coordinators as one service: membership and queue ownership through a Kafka consumer
group (issue 12).

The unit of assignment is the queue. librdkafka offers no custom assignor to Python, so the
queues ride on a **control topic** with a fixed number of partitions (``CONTROL_PARTITIONS``):
queue ``q`` belongs to control partition ``partition_of(q)`` (a stable hash of its name), and
the member the group assigns partition ``p`` serves every queue of ``p``. The group uses the
cooperative-sticky assignor, so a member joining or leaving moves only the partitions that must
move (an eager rebalance would take every queue from every member at each change). Nothing is
ever written to the control topic: it exists for its partitions.

A second topic, the **members topic** (one partition, compacted), is the cluster's host map and
ownership record: each member writes its API address under ``member/<id>``, and each owner of a
control partition writes ``owner/<p>`` when it takes it (``released`` false) and again when it
hands it over (``released`` true, after its queues' last changes are durable): when the group
revokes it, and when the member loses it (its session ran out, e.g. while Kafka was away for
every member) and could still make those changes durable. A member that takes a partition
whose last owner did not release it (killed, or stopped and evicted by the group) **fences**
that owner before it restores anything: it starts a producer
with the old owner's transactional id, which aborts what the old owner left open and makes
every later commit of the old owner fail. The old owner then commits nothing more (its changelog
writer is not replaced when fenced, ``DurableChangelog.replace_fenced``): a woken zombie can
neither grant a lease nor confirm an ack.

Tansu answers ``DescribeConsumerGroups`` without members, so the group itself cannot be the
host map there: hence the members topic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition

from connectors.admin import TopicAdmin, TopicSpec
from layer.config.model import parse_shard
from layer.coordinator.definitions import DefinitionsLog, ReadBack, Record
from layer.definitions import Write
from layer.exceptions import BrokerError

__all__ = [
    "CONTROL_PARTITIONS",
    "ClusterMap",
    "Member",
    "Membership",
    "Owner",
    "control_topic",
    "members_topic",
    "partition_of",
]

log = logging.getLogger(__name__)

#: Control partitions, so at most this many members share the queues. Fixed for a cluster's
#: life: changing it moves queues between partitions.
CONTROL_PARTITIONS = 12

#: how long a member's handover or takeover may keep the group waiting (librdkafka's
#: ``max.poll.interval.ms``: a member that takes longer is evicted and its partitions move)
REBALANCE_BUDGET_MS = 300_000


def control_topic(cluster: str) -> str:
    return f"qlayer.control.{cluster}"


def members_topic(cluster: str) -> str:
    return f"qlayer.members.{cluster}"


def partition_of(queue: str) -> int:
    """The control partition of a queue: a stable hash of its name (the same in every
    member, every version). Shard ``i`` of a partitioned queue ``q`` (``q#i``,
    ``layer.shards``) is on the partition after shard ``i - 1``'s, so up to 12 shards are on
    12 partitions and the group spreads them as it spreads partitions."""
    parsed = parse_shard(queue)
    if parsed is not None:
        name, shard = parsed
        return (zlib.crc32(name.encode()) + shard) % CONTROL_PARTITIONS
    return zlib.crc32(queue.encode()) % CONTROL_PARTITIONS


@dataclass(frozen=True, slots=True)
class Member:
    id: str
    address: str  # host:port of its API
    transactional_id: str  # of its changelog writer: what a new owner fences


@dataclass(frozen=True, slots=True)
class Owner:
    member: str
    transactional_id: str
    released: bool


@dataclass
class ClusterMap:
    """The members topic reduced (pure): the members and each control partition's owner.
    ``taken_from[p]``: the owner ``me`` took partition ``p`` from at its last claim of it."""

    me: str
    members: dict[str, Member] = field(default_factory=dict)
    owners: dict[int, Owner] = field(default_factory=dict)
    taken_from: dict[int, Owner | None] = field(default_factory=dict)
    # member -> its id in the group (``group/<id>``, while it serves: what a survivor removes
    # from the group when the member's API refuses connections, ``layer.coordinator.evict``)
    group_ids: dict[str, str] = field(default_factory=dict)
    next_offset: int = 0

    def apply(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        self.next_offset = max(self.next_offset, offset + 1)
        name = (key or b"").decode(errors="replace")
        kind, _, rest = name.partition("/")
        try:
            body: dict[str, Any] | None = None if value is None else json.loads(value)
            if kind == "member":
                if body is None:
                    self.members.pop(rest, None)
                else:
                    self.members[rest] = Member(
                        rest, str(body["address"]), str(body["transactional_id"])
                    )
            elif kind == "group":
                if body is None:
                    self.group_ids.pop(rest, None)
                else:
                    self.group_ids[rest] = str(body["member_id"])
            elif kind == "owner":
                p = int(rest)
                if body is None:
                    self.owners.pop(p, None)
                    return
                owner = Owner(
                    str(body["member"]), str(body["transactional_id"]), bool(body["released"])
                )
                current = self.owners.get(p)
                if owner.released and current is not None and current.member != owner.member:
                    # a release written after another member claimed the partition (a member
                    # that lost it while Kafka was away): the claim stands
                    return
                if owner.member == self.me and not owner.released:
                    self.taken_from[p] = self.owners.get(p)
                self.owners[p] = owner
        except (ValueError, KeyError, TypeError) as exc:
            log.error("members topic record %r at offset %d skipped: %r", name, offset, exc)

    def owner_of(self, queue: str) -> Member | None:
        """The member serving ``queue`` as far as this map knows (None: no owner yet, or
        released and not taken since)."""
        owner = self.owners.get(partition_of(queue))
        if owner is None or owner.released:
            return None
        return self.members.get(owner.member)


def member_write(member: Member) -> Write:
    value = {"address": member.address, "transactional_id": member.transactional_id}
    return Write(f"member/{member.id}".encode(), json.dumps(value).encode())


def group_write(member: Member, group_member_id: str | None) -> Write:
    """This member's id in the group (None: a tombstone, the member is leaving)."""
    value = None if group_member_id is None else json.dumps({"member_id": group_member_id})
    return Write(f"group/{member.id}".encode(), None if value is None else value.encode())


def owner_write(partition: int, member: Member, released: bool) -> Write:
    value = {
        "member": member.id,
        "transactional_id": member.transactional_id,
        "released": released,
    }
    return Write(f"owner/{partition}".encode(), json.dumps(value).encode())


class Membership:
    """One member's part in the group: joins it, keeps the members topic reduced, and calls
    ``on_assigned`` / ``on_revoked`` (coroutines run on ``loop``) with the control partitions
    that came or went; the group waits for each to finish (that is the handover)."""

    def __init__(
        self,
        cluster: str,
        member: Member,
        *,
        admin_settings: Mapping[str, Any],
        group_settings: Mapping[str, Any],
        log_consumer_settings: Mapping[str, Any],
        producer_settings: Mapping[str, Any],
        loop: asyncio.AbstractEventLoop,
        on_assigned: Callable[[set[int]], Awaitable[None]],
        on_revoked: Callable[[set[int], bool], Awaitable[None]],
    ) -> None:
        self.cluster = cluster
        self.member = member
        self.map = ClusterMap(member.id)
        self._admin_settings = dict(admin_settings)
        self._group_settings = {
            **group_settings,
            "group.id": f"qlayer.{cluster}",
            "partition.assignment.strategy": "cooperative-sticky",
            "max.poll.interval.ms": REBALANCE_BUDGET_MS,
            "client.id": f"qlayer-{member.id}",
        }
        self._log = DefinitionsLog(
            members_topic(cluster), admin_settings, log_consumer_settings, producer_settings
        )
        self._loop = loop
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._read_back = ReadBack()
        self._stop = threading.Event()
        self._abandon = False  # leaving after a failure: no handover (nothing can be made durable)
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self.first_assignment = asyncio.Event()
        self.owned: set[int] = set()
        self._group_id: str | None = None  # as written to the members topic
        self._leaving = False

    # --- the members topic ---------------------------------------------------------------

    async def open(self) -> None:
        """Create the topics, read the members topic, advertise this member, join the group."""
        await asyncio.to_thread(self._ensure)
        for key, value, offset in await asyncio.to_thread(self._log.catch_up):
            self.map.apply(key, value, offset)
        self._log.tail(self._on_records)
        await self.write([member_write(self.member)])
        self._thread = threading.Thread(target=self._run, name="membership", daemon=True)
        self._thread.start()

    def _ensure(self) -> None:
        self._log.ensure()
        TopicAdmin(self._admin_settings).ensure_topics(
            [TopicSpec(control_topic(self.cluster), CONTROL_PARTITIONS, {})]
        )

    def _on_records(self, records: list[Record]) -> None:
        self._loop.call_soon_threadsafe(self._take, records)

    def _take(self, records: list[Record]) -> None:
        for key, value, offset in records:
            self.map.apply(key, value, offset)
        self._read_back.reached(self.map.next_offset)

    async def write(self, writes: list[Write], timeout: float = 30.0) -> None:
        """Write to the members topic and wait until this member has read it back (so the map
        holds everything written before it)."""
        last = await asyncio.to_thread(self._log.write, writes)
        if not await self._read_back.wait(last, self.map.next_offset, timeout):
            raise BrokerError(
                f"members topic {members_topic(self.cluster)}: offset {last} not read back"
                f" within {timeout:.0f}s"
            ) from None

    # --- the group -----------------------------------------------------------------------

    def _run(self) -> None:
        consumer = self._consumer = Consumer(self._group_settings)
        consumer.subscribe(
            [control_topic(self.cluster)],
            on_assign=self._assign,
            on_revoke=self._revoke,
            on_lost=self._lost,
        )
        while not self._stop.is_set():
            try:
                consumer.poll(0.2)
            except KafkaException as exc:
                log.warning("control topic %s: %s", control_topic(self.cluster), exc)
        try:
            consumer.close()  # leaves the group: revokes (hands over) what this member owns
        except KafkaException as exc:
            log.warning("leaving the group of cluster %s: %s", self.cluster, exc)

    def _call(self, step: Awaitable[None], what: str) -> None:
        """Run a step on the loop and wait for it (the group waits with this thread)."""
        try:
            asyncio.run_coroutine_threadsafe(step, self._loop).result()  # type: ignore[arg-type]
        except Exception:
            log.exception("cluster %s: %s failed", self.cluster, what)

    def _assign(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        got = {p.partition for p in partitions}
        if got:
            log.info("cluster %s: control partitions assigned %s", self.cluster, sorted(got))
            self.owned |= got
            self._call(self._on_assigned(got), "taking over")
        self._loop.call_soon_threadsafe(self.first_assignment.set)
        group_id = consumer.memberid()
        if group_id and group_id != self._group_id and not self._leaving:
            self._group_id = group_id
            done = asyncio.run_coroutine_threadsafe(
                self.write([group_write(self.member, group_id)]), self._loop
            )
            done.add_done_callback(self._logged)

    def _logged(self, done: Any) -> None:
        if not done.cancelled() and done.exception() is not None:
            log.warning("members topic: this member's group id not written: %s", done.exception())

    async def leaving(self) -> None:
        """Before this member's API stops: take its group id out of the members topic, so
        that no survivor removes it from the group while it hands its queues over."""
        self._leaving = True
        if self._group_id is not None:
            try:
                await self.write([group_write(self.member, None)], timeout=5.0)
            except BrokerError as exc:
                log.warning("members topic: %s", exc)

    def _revoke(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        self._give_up({p.partition for p in partitions}, graceful=True)

    def _lost(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        self._give_up({p.partition for p in partitions}, graceful=False)

    def _give_up(self, gone: set[int], graceful: bool) -> None:
        if not gone:
            return
        log.info(
            "cluster %s: control partitions %s %s",
            self.cluster,
            sorted(gone),
            "revoked" if graceful else "lost",
        )
        self.owned -= gone
        if self._abandon:
            return  # failed: the next owner fences this member and restores from the changelog
        self._call(self._on_revoked(gone, graceful), "handing over")

    def abandon(self) -> None:
        """Leave the group now without handing anything over (not blocking): this member lost
        its partitions and stops; it must not rejoin and be given queues it cannot serve."""
        self._abandon = True
        self._stop.set()

    def close(self, abandon: bool = False) -> None:
        """Leave the group (blocking: the handover of what this member owns runs on the loop
        meanwhile), then stop reading the members topic. ``abandon``: this member failed (its
        changelog writer fenced or dead), so it hands nothing over and does not mark its
        partitions released; it still leaves the group at once, so the others take its queues
        now rather than after the session timeout."""
        self._abandon = self._abandon or abandon
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        try:
            gone = [Write(f"member/{self.member.id}".encode(), None)]
            if self._group_id is not None:
                gone.append(group_write(self.member, None))
            self._log.write(gone, timeout=5)
        except BrokerError as exc:
            log.warning("members topic: %s", exc)
        self._log.close()
