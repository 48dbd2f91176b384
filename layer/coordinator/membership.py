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

**A wedged group is replaced.** Tansu keeps a leader that left the group (LeaveGroup, e.g. a
SIGTERM) in the middle of a rebalance as the leader of the next generation: every JoinGroup,
from old and new members alike, answers that departed leader, nobody sends the assignment, each
SyncGroup fails with "rebalance in progress", and the group never assigns again (the members
that still hold partitions keep them; the rest stay unowned). A fresh member id does not help.
So the group's name carries an **epoch** (``epoch`` in the members topic, 0 at first): a member
that sees the group stall (no assignment ``stall_s`` after it joined, or a control partition
released or never claimed for ``stall_s``) writes the next epoch, and every member, on reading
it, leaves the old group (handing over what it holds, as on a graceful stop) and joins the
group of the new epoch. A takeover still fences an owner that did not release. The wedge itself
is seen sooner: two JoinGroup rounds in a row led by a member known to have left the group (its
``group/<id>`` tombstoned or replaced, or removed by this member as dead) move the group at once
(``layer.coordinator.group_log``), 5-7 s after the leave instead of 8-20 s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition

from connectors.admin import TopicAdmin, TopicSpec
from layer.config.model import parse_shard
from layer.coordinator.definitions import DefinitionsLog, ReadBack, Record
from layer.coordinator.group_log import GroupLog, LeaderWatch
from layer.coordinator.session_guard import SessionGuard
from layer.definitions import Write
from layer.exceptions import BrokerError

__all__ = [
    "CONTROL_PARTITIONS",
    "ClusterMap",
    "Member",
    "Membership",
    "Owner",
    "control_topic",
    "handed_over",
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

#: after a member's graceful stop (read within ``LEAVE_MEMORY_S``), a control partition
#: released and not claimed for this long (at least ``LEFT_STALL_SESSIONS`` sessions) is a
#: wedge too (``Membership._stalled``)
LEFT_STALL_MIN_S = 8.0
LEFT_STALL_SESSIONS = 4
LEAVE_MEMORY_S = 60.0

#: how long this thread's poll waits: a stop (``close``) is taken up within it
POLL_S = 0.05

#: how long a successor waits for the release of a partition whose owner stops gracefully
#: (``leaving/<id>``) before it fences that owner; and how long that owner's ``close`` waits
#: for its handover
HANDOVER_WAIT_S = 10.0

#: how long a stopping member's leave (``close``: the group's LeaveGroup, the handover, the
#: members topic's last write) may take in all, counted from the stop: a leave normally takes
#: well under a second, one during a rebalance on Tansu a few; with Kafka away every step would
#: wait for it (a successor fences this member then, as after a kill)
LEAVE_BUDGET_S = 20.0

#: the least time a group may give no assignment (or leave a control partition unowned) before
#: a member replaces it with the next epoch's; it is at least ``STALL_SESSIONS`` sessions
STALL_MIN_S = 20.0
STALL_SESSIONS = 10


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
    # the offset of each partition's owner record in force, and of the one ``taken_from`` holds
    # (a fence made after this member had read that record covers the owner that wrote it)
    owner_offsets: dict[int, int] = field(default_factory=dict)
    taken_from_offset: dict[int, int | None] = field(default_factory=dict)
    # member -> its id in the group (``group/<id>``, while it serves: what a survivor removes
    # from the group when the member's API refuses connections, ``layer.coordinator.evict``)
    group_ids: dict[str, str] = field(default_factory=dict)
    # group member ids that have left the group: tombstoned or replaced in ``group/<id>``
    # (a member stopping, or restarted), or removed by this member (``Membership.removed``);
    # a JoinGroup round they lead cannot complete (``layer.coordinator.group_log``)
    departed: set[str] = field(default_factory=set)
    # the group's epoch: members join ``group_name(cluster, epoch)``
    epoch: int = 0
    # members stopping gracefully (``leaving/<id>``, until they start again): a successor
    # waits for such a member's release instead of fencing it (``Membership.handed_over``)
    leaving: set[str] = field(default_factory=set)
    # partition -> (member, offset) of the last release of it read, in force or not (one
    # written after a successor's claim is not in ``owners``)
    releases: dict[int, tuple[str, int]] = field(default_factory=dict)
    leaves: int = 0  # ``leaving/<id>`` records read
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
                    self.leaving.discard(rest)  # (re)started
            elif kind == "leaving":
                if body is None:
                    self.leaving.discard(rest)
                else:
                    self.leaving.add(rest)
                    self.leaves += 1
            elif kind == "group":
                new = None if body is None else str(body["member_id"])  # (a bad one: skipped)
                old = self.group_ids.pop(rest, None)
                if new is not None:
                    self.group_ids[rest] = new
                if old is not None and old != new:
                    self.departed.add(old)
            elif kind == "epoch":
                if body is not None:
                    self.epoch = max(self.epoch, int(body["epoch"]))
            elif kind == "owner":
                p = int(rest)
                if body is None:
                    self.owners.pop(p, None)
                    self.owner_offsets.pop(p, None)
                    return
                owner = Owner(
                    str(body["member"]), str(body["transactional_id"]), bool(body["released"])
                )
                current = self.owners.get(p)
                if owner.released:
                    self.releases[p] = (owner.member, offset)
                if owner.released and current is not None and current.member != owner.member:
                    # a release written after another member claimed the partition (a member
                    # that lost it while Kafka was away): the claim stands
                    return
                if owner.member == self.me and not owner.released:
                    self.taken_from[p] = self.owners.get(p)
                    self.taken_from_offset[p] = self.owner_offsets.get(p)
                self.owners[p] = owner
                self.owner_offsets[p] = offset
        except (ValueError, KeyError, TypeError) as exc:
            log.error("members topic record %r at offset %d skipped: %r", name, offset, exc)

    def owner_of(self, queue: str) -> Member | None:
        """The member serving ``queue`` as far as this map knows (None: no owner yet, or
        released and not taken since)."""
        owner = self.owners.get(partition_of(queue))
        if owner is None or owner.released:
            return None
        return self.members.get(owner.member)


def group_name(cluster: str, epoch: int) -> str:
    """The consumer group of a cluster at an epoch (a wedged group is replaced by the next)."""
    return f"qlayer.{cluster}" if epoch == 0 else f"qlayer.{cluster}.{epoch}"


def epoch_write(epoch: int) -> Write:
    return Write(b"epoch", json.dumps({"epoch": epoch}).encode())


def member_write(member: Member) -> Write:
    value = {"address": member.address, "transactional_id": member.transactional_id}
    return Write(f"member/{member.id}".encode(), json.dumps(value).encode())


def group_write(member: Member, group_member_id: str | None) -> Write:
    """This member's id in the group (None: a tombstone, the member is leaving)."""
    value = None if group_member_id is None else json.dumps({"member_id": group_member_id})
    return Write(f"group/{member.id}".encode(), None if value is None else value.encode())


def leaving_write(member: Member) -> Write:
    """This member stops gracefully: it hands over what it owns, its successors wait for that."""
    return Write(f"leaving/{member.id}".encode(), b"{}")


def owner_write(partition: int, member: Member, released: bool) -> Write:
    value = {
        "member": member.id,
        "transactional_id": member.transactional_id,
        "released": released,
    }
    return Write(f"owner/{partition}".encode(), json.dumps(value).encode())


async def handed_over(
    cmap: ClusterMap,
    partition: int,
    owner: Owner,
    after: int | None,
    refuses: Callable[[str], Awaitable[bool]],
    within: float = HANDOVER_WAIT_S,
) -> bool:
    """Whether ``owner``, stopping gracefully (in ``cmap.leaving``), released ``partition`` (a
    release read at an offset after ``after``, the claim taken over) within ``within`` seconds.
    False at once if its API ``refuses`` connections: it died mid-handover."""
    member = cmap.members.get(owner.member)
    deadline = time.monotonic() + within
    probe_at = 0.0
    claimed_at = -1 if after is None else after
    while True:
        got = cmap.releases.get(partition)
        if got is not None and got[0] == owner.member and got[1] > claimed_at:
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        if member is not None and now >= probe_at:
            probe_at = now + 0.2
            if await refuses(member.address):
                return False
        await asyncio.sleep(0.02)


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
        session_s = float(group_settings.get("session.timeout.ms", 45_000)) / 1000
        self.stall_s = max(STALL_MIN_S, STALL_SESSIONS * session_s)
        heartbeat_s = float(group_settings.get("heartbeat.interval.ms", 3_000)) / 1000
        # pushes wait while this member may have lost its session (``layer.coordinator.
        # session_guard``)
        self.guard = SessionGuard(session_s, heartbeat_s)
        # who leads each JoinGroup round is only in librdkafka's cgrp debug log: a round led
        # by a member that left is watched for (``layer.coordinator.group_log``)
        self.leaders = LeaderWatch(self.map.departed)
        asked = str(group_settings.get("debug", ""))
        forward = group_settings.get("logger")
        self._group_settings = {
            **group_settings,
            "debug": ",".join(sorted({*filter(None, asked.split(",")), "cgrp"})),
            "logger": GroupLog.logger(
                f"{log.name}.group",
                self._joined,
                forward if isinstance(forward, logging.Logger) else log,
                debug=bool(asked),
            ),
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
        self._stopped_at: float | None = None  # when this member began to stop (``leaving``)
        self._abandon = False  # leaving after a failure: no handover (nothing can be made durable)
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self.first_assignment = asyncio.Event()
        self.owned: set[int] = set()
        self._group_id: str | None = None  # as written to the members topic
        self._leaving = False
        self._announced = False  # its ``leaving/<id>`` written: handovers need not block
        self._handovers: list[concurrent.futures.Future[None]] = []
        self.epoch = 0  # of the group this member's consumer is in
        self._joined_at = time.monotonic()  # when the consumer subscribed
        self._assigned_at: float | None = None  # its last assignment since
        self._unowned_since: dict[int, float] = {}
        self._bumped_at = 0.0
        self._leave_seen_at: float | None = None  # a member's graceful stop last read
        # a wedge follows a leave: released partitions are watched more closely for a while
        self.left_stall_s = max(LEFT_STALL_MIN_S, LEFT_STALL_SESSIONS * session_s)
        self._watch_task: asyncio.Task[None] | None = None
        self._look = asyncio.Event()  # set: ``_watch`` looks now, not at its next second

    @property
    def group(self) -> str:
        """The consumer group this member is in now."""
        return group_name(self.cluster, self.epoch)

    # --- the members topic ---------------------------------------------------------------

    async def open(self) -> None:
        """Create the topics, read the members topic, advertise this member, join the group."""
        await asyncio.to_thread(self._ensure)
        for key, value, offset in await asyncio.to_thread(self._log.catch_up):
            self.map.apply(key, value, offset)
        self._log.tail(self._on_records)
        await self.write([member_write(self.member)])
        self.guard.start()
        self._thread = threading.Thread(target=self._run, name="membership", daemon=True)
        self._thread.start()
        self._watch_task = asyncio.create_task(self._watch(), name="group-watch")

    def _ensure(self) -> None:
        self._log.ensure()
        TopicAdmin(self._admin_settings).ensure_topics(
            [TopicSpec(control_topic(self.cluster), CONTROL_PARTITIONS, {})]
        )

    def _on_records(self, records: list[Record]) -> None:
        self._loop.call_soon_threadsafe(self._take, records)

    def _take(self, records: list[Record]) -> None:
        leaves = self.map.leaves
        for key, value, offset in records:
            self.map.apply(key, value, offset)
        if self.map.leaves != leaves:
            self._leave_seen_at = time.monotonic()
        self._read_back.reached(self.map.next_offset)

    async def write(self, writes: list[Write], timeout: float = 30.0) -> None:
        """Write to the members topic and wait until this member has read it back (so the map
        holds everything written before it), within ``timeout`` for both."""
        deadline = time.monotonic() + timeout
        last = await asyncio.to_thread(self._log.write, writes, timeout)
        left = max(deadline - time.monotonic(), 0.1)
        if not await self._read_back.wait(last, self.map.next_offset, left):
            raise BrokerError(
                f"members topic {members_topic(self.cluster)}: offset {last} not read back"
                f" within {timeout:.0f}s"
            ) from None

    # --- the group -----------------------------------------------------------------------

    def _subscribe(self, epoch: int) -> Consumer:
        self.epoch = epoch
        settings = {**self._group_settings, "group.id": group_name(self.cluster, epoch)}
        consumer = self._consumer = Consumer(settings)
        self._assigned_at = None
        self.leaders.reset()
        self._joined_at = time.monotonic()
        consumer.subscribe(
            [control_topic(self.cluster)],
            on_assign=self._assign,
            on_revoke=self._revoke,
            on_lost=self._lost,
        )
        return consumer

    def _leave(self, consumer: Consumer) -> None:
        started = time.monotonic()
        try:
            consumer.close()  # leaves the group: revokes (hands over) what this member owns
        except KafkaException as exc:
            log.warning("leaving the group of cluster %s: %s", self.cluster, exc)
            return
        # (bench/failover.py reads it: the survivors' rebalance starts here)
        log.info(
            "cluster %s: left group %s in %.3fs",
            self.cluster,
            self.group,
            time.monotonic() - started,
        )

    def _run(self) -> None:
        consumer = self._subscribe(self.map.epoch)
        while not self._stop.is_set():
            epoch = self.map.epoch
            if epoch > self.epoch:
                log.warning(
                    "cluster %s: the group moves to epoch %d: leaving %s (handing over %s)",
                    self.cluster,
                    epoch,
                    self.group,
                    sorted(self.owned),
                )
                self._leave(consumer)
                if self._stop.is_set():
                    return
                consumer = self._subscribe(epoch)
                continue
            try:
                consumer.poll(POLL_S)
            except KafkaException as exc:
                log.warning("control topic %s: %s", control_topic(self.cluster), exc)
        self._leave(consumer)

    async def _watch(self) -> None:
        """Replace a wedged group (module doc): write the next epoch when this member had no
        assignment ``stall_s`` after joining, or a control partition stayed released or
        unclaimed that long while this member was in the group."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._look.wait(), 1.0)
            self._look.clear()
            try:
                why = self._stalled(time.monotonic())
                if why is None or self._leaving or self._stop.is_set():
                    continue
                epoch = max(self.epoch, self.map.epoch) + 1
                log.warning(
                    "cluster %s: group %s stalled (%s): moving the group to epoch %d",
                    self.cluster,
                    self.group,
                    why,
                    epoch,
                )
                self._bumped_at = time.monotonic()
                await self.write([epoch_write(epoch)])
            except Exception:
                log.exception("cluster %s: watching the group failed", self.cluster)

    def _stalled(self, now: float) -> str | None:
        """Why the group looks wedged (None: it does not)."""
        if self.map.epoch > self.epoch or now - self._bumped_at < self.stall_s:
            self._unowned_since.clear()
            return None  # moving to a new group already
        leaders = self.leaders
        if leaders.wedged:
            return (
                f"{leaders.rounds} JoinGroup rounds in a row led by {leaders.leader}, which"
                " left the group"
            )
        if self._assigned_at is None:
            self._unowned_since.clear()
            if now - self._joined_at > self.stall_s:
                return f"no assignment {now - self._joined_at:.0f}s after joining"
            return None
        # unowned: never claimed, released, or claimed by a member that has left the group
        # since (removed as dead, ``removed``): a takeover would have claimed it by now
        departed, group_ids = self.map.departed, self.map.group_ids
        unowned = {
            p
            for p in range(CONTROL_PARTITIONS)
            if (o := self.map.owners.get(p)) is None
            or o.released
            or group_ids.get(o.member) in departed
        }
        for p in set(self._unowned_since) - unowned:
            del self._unowned_since[p]
        for p in unowned:
            self._unowned_since.setdefault(p, now)
        # counted from this member's last assignment or revocation too: the group is live
        # while it moves partitions (e.g. after a Kafka outage)
        seen = self._assigned_at
        # After a member's graceful stop (its LeaveGroup) or its removal as dead (``removed``),
        # a partition released (or held by the departed) and not claimed for ``left_stall_s``
        # is taken for a wedge already: the leave is what wedges a group on Tansu, and it then
        # stalled every time (the 20 s of ``stall_s`` were most of a graceful stop's failover
        # then); a rebalance takes 1-3.5 s there, 4-5 s when its first round was led by the
        # departed member. Not after an outage (no leave): the members' rejoining takes longer.
        fast = self._leave_seen_at is not None and now - self._leave_seen_at < LEAVE_MEMORY_S
        limits = {
            p: self.left_stall_s if fast and self.map.owners.get(p) is not None else self.stall_s
            for p in self._unowned_since
        }
        old = sorted(p for p, t in self._unowned_since.items() if now - max(t, seen) > limits[p])
        if old:
            return (
                f"control partitions {old} unowned for more than {min(limits[p] for p in old):.0f}s"
            )
        return None

    def _call(self, step: Awaitable[None], what: str) -> None:
        """Run a step on the loop and wait for it (the group waits with this thread); once
        this member stops, for ``HANDOVER_WAIT_S`` at most from the stop (Kafka away, a
        handover can wait for it without end): the step goes on on the loop, this thread
        leaves the group."""
        done: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(
            step,  # type: ignore[arg-type]
            self._loop,
        )
        try:
            while True:
                try:
                    done.result(POLL_S * 10)
                    return
                except concurrent.futures.TimeoutError:
                    stopped = self._stopped_at
                    if stopped is not None and time.monotonic() - stopped > HANDOVER_WAIT_S:
                        log.warning(
                            "cluster %s: %s not done %.0fs after the stop: leaving the group"
                            " without waiting for it",
                            self.cluster,
                            what,
                            HANDOVER_WAIT_S,
                        )
                        return
        except Exception:
            log.exception("cluster %s: %s failed", self.cluster, what)

    def _assign(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        got = {p.partition for p in partitions}
        self._assigned_at = time.monotonic()
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

    def _joined(self, leader: str, me: str) -> None:
        """A JoinGroup round of this member's completed, led by ``leader`` (this thread)."""
        self.leaders.joined(leader, me)
        if self.leaders.rounds:
            log.warning(
                "cluster %s: group %s: JoinGroup round led by %s, which left the group (%d in"
                " a row)",
                self.cluster,
                self.group,
                leader,
                self.leaders.rounds,
            )
            if self.leaders.wedged:
                self._loop.call_soon_threadsafe(self._look.set)

    def removed(self, group_member_id: str) -> None:
        """This member removed ``group_member_id`` from the group (it refused connections,
        ``layer.coordinator.evict``): a leave, which may wedge the group as a graceful stop's
        does, so control partitions left unowned are watched as closely as after one."""
        self.map.departed.add(group_member_id)
        self._leave_seen_at = time.monotonic()

    async def leaving(self) -> None:
        """Before this member's API stops: take its group id out of the members topic, so
        that no survivor removes it from the group while it hands its queues over."""
        self._leaving = True
        self._mark_stop()
        # and say it is leaving: its successors wait for its releases instead of fencing it,
        # so it leaves the group before its handover ends (``_give_up``)
        writes = [leaving_write(self.member)]
        if self._group_id is not None:
            writes.append(group_write(self.member, None))
        try:
            await self.write(writes, timeout=5.0)
            self._announced = True
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
        if not graceful:
            self.guard.lose()  # what this member decided before is no longer its to push
        self._assigned_at = time.monotonic()  # the group moves partitions: it is live
        if self._abandon:
            return  # failed: the next owner fences this member and restores from the changelog
        if graceful and self._announced and self._stop.is_set():
            # A graceful stop, announced: hand over while the group already rebalances. The
            # callback returns at once, so librdkafka sends its LeaveGroup now rather than after
            # the handover (the survivors' rebalance takes a second or more on Tansu: they
            # learn of it at a heartbeat, then the broker holds their JoinGroup); the successor
            # of each partition waits for its release (``handed_over``). ``close`` waits for
            # the handover. Not when moving to a new epoch: this member rejoins at once and
            # could be given the same partitions back mid-handover.
            self._handovers.append(
                asyncio.run_coroutine_threadsafe(self._hand_over(gone), self._loop)
            )
            return
        self._call(self._on_revoked(gone, graceful), "handing over")

    async def _hand_over(self, gone: set[int]) -> None:
        await self._on_revoked(gone, True)

    def _mark_stop(self) -> float:
        """When the stop began: its first step (``leaving``, ``abandon`` or ``close``)."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        return self._stopped_at

    def abandon(self) -> None:
        """Leave the group now without handing anything over (not blocking): this member lost
        its partitions and stops; it must not rejoin and be given queues it cannot serve."""
        self._abandon = True
        self._mark_stop()
        self._stop.set()

    def close(self, abandon: bool = False) -> None:
        """Leave the group (blocking: the handover of what this member owns runs on the loop
        meanwhile), then stop reading the members topic. ``abandon``: this member failed (its
        changelog writer fenced or dead), so it hands nothing over and does not mark its
        partitions released; it still leaves the group at once, so the others take its queues
        now rather than after the session timeout."""
        self._abandon = self._abandon or abandon
        # one deadline for all of it: with Kafka away every step below would wait for it
        deadline = self._mark_stop() + LEAVE_BUDGET_S

        def left() -> float:
            return max(deadline - time.monotonic(), 0.1)

        self._stop.set()
        if self._watch_task is not None:
            self._loop.call_soon_threadsafe(self._watch_task.cancel)
        if self._thread is not None:
            self._thread.join(left())
            if self._thread.is_alive():
                log.warning(
                    "cluster %s: leaving group %s not done within %.0fs of the stop (Kafka does"
                    " not answer): stopping without it; the others take this member's queues"
                    " once its session times out",
                    self.cluster,
                    self.group,
                    LEAVE_BUDGET_S,
                )
        for handover in self._handovers:
            try:
                handover.result(min(HANDOVER_WAIT_S, left()))
            except Exception:
                log.exception("cluster %s: handing over failed", self.cluster)
        self.guard.close()
        try:
            gone = [Write(f"member/{self.member.id}".encode(), None)]
            if self._group_id is not None:
                gone.append(group_write(self.member, None))
            self._log.write(gone, timeout=min(5.0, left()))
        except BrokerError as exc:
            log.warning("members topic: %s", exc)
        self._log.close(timeout=min(5.0, left()))
