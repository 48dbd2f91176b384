"""A coordinator's seat in its cluster (``[coordinator] cluster``): which queues it serves.

The group (``layer.coordinator.membership``) gives each member control partitions; a queue is
served by the member holding its partition (``partition_of``). The seat takes what the group
gives (``assigned``: claim, fence the last owner, then serve), gives back what it takes away
(``revoked``: the last changes durable, then a release), keeps the standby copies of other
members' queues (``layer.coordinator.standby``), fences dead members ahead of their takeover
(``layer.coordinator.evict``) and says who serves a queue (``owner_elsewhere``,
``cluster_info``). Alone (no cluster) a coordinator's seat holds no membership and it serves
every queue.

What the seat needs of its coordinator is named in ``SeatHost``: the running configuration
and queues, the lock that changes of the queues served take, applying the definitions to
them, and stopping the member when its changelog writer may not commit any more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol, TypeVar

from connectors.kafka import (
    BrokerProfile,
    cluster_group_settings,
    consumer_settings,
    kafka_python_settings,
    producer_settings,
)
from layer.api.service import ClusterInfo, ClusterMember, QueueOwner, ReloadResult
from layer.config import Config
from layer.config.model import CoordinatorConfig
from layer.coordinator.cluster_queues import ClusterQueues
from layer.coordinator.evict import Evictions, Remover, refuses
from layer.coordinator.membership import (
    HANDOVER_WAIT_S,
    Member,
    Membership,
    handed_over,
    member_write,
    owner_write,
    partition_of,
)
from layer.coordinator.peers import Peers
from layer.coordinator.standby import Standby, standby_partitions
from layer.exceptions import BrokerError, NotOwner, StateError
from layer.state.base import Store
from layer.state.changelog import ChangelogWriter

__all__ = ["Seat", "SeatHost", "writer_id"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: the offset of a claim whose offset this member does not know: above every fence's
_UNKNOWN = 1 << 62
STANDBY_REFRESH_S = 0.5  # how often the queues a standby tails are worked out again
#: a member that loses its control partitions within this long of Kafka's reachability changing
#: (or while Kafka is away) was evicted by the outage and rides it out; otherwise it was stopped
#: past its session, and exits at once (``Seat.revoked``)
OUTAGE_MEMORY_S = 30.0
#: how long a member that lost its partitions while Kafka was reachable (it did not run for a
#: session) may take to release them and rejoin before it stops instead (``Seat.revoked``)
RELEASE_LOST_S = 10.0
#: a call naming a queue of the cluster that no member serves right now (just created, or
#: moving) waits this long for an owner before it answers NotOwner
OWNER_WAIT_S = 10.0


def writer_id(coordinator: CoordinatorConfig) -> str:
    """The transactional id of a member's changelog writer (one for all its queues)."""
    return f"{coordinator.id}-changelog"


class SeatHost(Protocol):
    """What the seat needs of its coordinator (``layer.coordinator.service.Coordinator``)."""

    #: held while the queues served change (a reload, a definition, an assignment)
    reload_lock: asyncio.Lock

    def current_config(self) -> Config:
        """The running configuration (a reload replaces it)."""
        ...

    def cluster_queues(self) -> ClusterQueues | None:
        """The cluster's queue definitions, once started."""
        ...

    def serves(self, queue: str) -> bool:
        """Whether ``queue`` runs here now."""
        ...

    def apply_definitions(self, reason: str) -> Awaitable[ReloadResult]:
        """Bring the queues served to the definitions and to what the seat owns (holding
        ``reload_lock``)."""
        ...

    def give_up(self, error: StateError) -> None:
        """Stop serving: a commit waiting on Kafka gives up, the rounds fail, the process
        exits (a supervisor starts it again)."""
        ...

    def until_reachable(self, what: str, step: Callable[[], T]) -> Awaitable[T]:
        """``step()`` on a thread, again until Kafka answers it (saying so meanwhile)."""
        ...

    def outage_lately(self) -> bool:
        """(Blocking: a probe.) Kafka is away, or was within ``OUTAGE_MEMORY_S``."""
        ...

    def failed(self) -> bool:
        """The rounds failed: this member commits nothing more."""
        ...

    def stopping(self) -> bool:
        """The coordinator is stopping."""
        ...


class Seat:
    """The member's place in the cluster, or (``cluster`` unset) a coordinator alone."""

    def __init__(
        self,
        host: SeatHost,
        coordinator: CoordinatorConfig,
        base_settings: dict[str, Any],
        profile: BrokerProfile,
        store: Store,
        peers: Peers,
    ) -> None:
        self._host = host
        self._base_settings = base_settings
        self._profile = profile
        self._store = store
        self._peers = peers
        self._loop: asyncio.AbstractEventLoop | None = None
        # a member of a cluster serves the queues of the control partitions the group gives it;
        # None: every queue
        self._membership: Membership | None = None
        self._owned: set[int] | None = None if coordinator.cluster is None else set()
        # control partitions this member claimed and has not released: those whose queues its
        # changelog writer may hold records of
        self._claimed: set[int] = set()
        self.address = ""  # of this coordinator's API, once it serves (``join``)
        # warm copies of queues other members serve (``layer.coordinator.standby``)
        self.standby: Standby | None = None
        self._standby_task: asyncio.Task[None] | None = None
        self._evict_task: asyncio.Task[None] | None = None  # ``layer.coordinator.evict``
        self._remover: Remover | None = None
        # transactional id -> (the members topic offset read before its fence began, whether
        # the fence succeeded): fences of dead members made ahead of their takeover
        self._prefences: dict[str, tuple[int, asyncio.Future[bool]]] = {}
        self._left = False  # left the cluster's group (``leave``)

    # ----------------------------------------------------------------------------------------
    # what is served where
    # ----------------------------------------------------------------------------------------

    @property
    def membership(self) -> Membership | None:
        """The group membership; None alone (or before ``join``)."""
        return self._membership

    @property
    def clustered(self) -> bool:
        """A member of a cluster: it serves only the queues of its control partitions."""
        return self._owned is not None

    @property
    def member_id(self) -> str:
        """This member's id once it joined; "" alone."""
        return "" if self._membership is None else self._membership.member.id

    def owns(self, queue: str) -> bool:
        """Whether ``queue`` is this member's to serve."""
        return self._owned is None or partition_of(queue) in self._owned

    def not_owner(self, queue: str) -> NotOwner:
        owner = self._membership.map.owner_of(queue) if self._membership else None
        if owner is None:
            return NotOwner(
                f"queue {queue!r} is not served by this member and has no owner right now"
                " (the cluster is moving it): try again shortly"
            )
        return NotOwner(f"queue {queue!r} is served by member {owner.id!r} at {owner.address}")

    async def owner_settled(self, queue: str, within: float = OWNER_WAIT_S) -> str | None:
        """``owner_elsewhere`` once ``queue`` has an owner: while it is a queue of the
        cluster that no member serves right now (just created, or moving: a rebalance, a
        takeover), wait at most ``within`` seconds. A call naming it then goes on as usual
        (``NotOwner`` if it is still unserved)."""
        cluster, membership = self._host.cluster_queues(), self._membership
        if cluster is None or membership is None or self._owned is None:
            return self.owner_elsewhere(queue)
        deadline = time.monotonic() + within

        def unserved() -> bool:
            if self._host.serves(queue) or not cluster.is_served(queue):
                return False
            owner = membership.map.owner_of(queue)
            return owner is None or owner.id == membership.member.id

        while unserved() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.owner_elsewhere(queue)

    def owner_elsewhere(self, queue: str) -> str | None:
        """The API address of the member serving ``queue`` when another one does (calls are
        forwarded to it: ``layer.coordinator.peers``); else None."""
        if self._host.serves(queue) or self._membership is None:
            return None
        owner = self._membership.map.owner_of(queue)
        if owner is None or owner.id == self._membership.member.id:
            return None
        return owner.address

    async def cluster_info(self, served_here: list[str]) -> ClusterInfo:
        """The metadata call: the members and the owner of each queue, as this member's
        reduced members topic has them (alone: itself, serving ``served_here``); each other
        member is probed (``alive``: it answered a health check within a second)."""
        c = self._host.current_config().coordinator
        membership = self._membership
        cluster = self._host.cluster_queues()
        if membership is None or cluster is None:
            me = ClusterMember(c.id, self.address, [])
            owners = [QueueOwner(n, partition_of(n), c.id, self.address) for n in served_here]
            by_name = sorted(owners, key=lambda q: q.queue)
            return ClusterInfo(c.cluster or c.id, c.id, [me], by_name, standalone=True)
        cmap = membership.map
        held: dict[str, list[int]] = {}
        for p, claim in sorted(cmap.owners.items()):
            if not claim.released:
                held.setdefault(claim.member, []).append(p)
        others = [m for m in cmap.members.values() if m.id != c.id]
        answers = await asyncio.gather(*(self._peers.alive(m.address) for m in others))
        up = {m.id: answer for m, answer in zip(others, answers, strict=True)}
        members = [
            ClusterMember(m.id, m.address, held.get(m.id, []), up.get(m.id, True))
            for m in cmap.members.values()
        ]
        queues = []
        for name in sorted(q.name for q in cluster.served()):
            owner = cmap.owner_of(name)
            if owner is None:
                queues.append(QueueOwner(name, partition_of(name)))
            else:
                queues.append(QueueOwner(name, partition_of(name), owner.id, owner.address))
        return ClusterInfo(membership.cluster, c.id, sorted(members, key=lambda m: m.id), queues)

    # ----------------------------------------------------------------------------------------
    # whether what this member decided is still its own
    # ----------------------------------------------------------------------------------------

    async def deliverable(self) -> bool:
        """Whether messages this member pushes may be written now: False once it failed (its
        writer fenced: what it decided is another's now); a member that may have lost its
        session waits until the group confirms it or takes its partitions (False:
        ``layer.coordinator.session_guard``)."""
        if self._host.failed():
            return False
        if self._membership is None:
            return True
        return await self._membership.guard.wait() and not self._host.failed()

    async def current_since(self, made_at: float) -> bool:
        """Whether messages decided at ``made_at`` (``time.monotonic``) are still this
        member's to deliver (``SessionGuard.settled_since``)."""
        if self._host.failed():
            return False
        if self._membership is None:
            return True
        return await self._membership.guard.wait_since(made_at) and not self._host.failed()

    def stale_after_s(self) -> float:
        """How old a pushed frame must be, by its client's bound, to be asked about (0: never:
        a coordinator alone has nobody to lose its queues to)."""
        return 0.0 if self._membership is None else self._membership.guard.stale_after_s

    # ----------------------------------------------------------------------------------------
    # joining and leaving
    # ----------------------------------------------------------------------------------------

    async def join(self, address: str, timeout: float = 30.0) -> None:
        """In a cluster: advertise ``address`` (this member's API), join the group and wait
        (at most ``timeout``) for its first assignment. Alone: nothing."""
        cfg = self._host.current_config()
        cluster = cfg.coordinator.cluster
        self.address = address
        if cluster is None:
            return
        self._loop = loop = asyncio.get_running_loop()
        member = Member(cfg.coordinator.id, address, writer_id(cfg.coordinator))
        # the group's session bounds how fast a dead member's queues move: the profile's
        # unless set (a longer one rides out pauses; on Tansu each rebalance takes half of it)
        session = cluster_group_settings(self._profile, cfg.broker.session_timeout_ms)
        base = self._base_settings
        self._membership = Membership(
            cluster,
            member,
            admin_settings=base,
            group_settings=consumer_settings(
                base, self._profile, group_id=f"qlayer.{cluster}", extra=session
            ),
            log_consumer_settings=consumer_settings(base, self._profile),
            producer_settings=producer_settings(base),
            loop=loop,
            on_assigned=self.assigned,
            on_revoked=self.revoked,
        )
        await self._membership.open()
        removal = kafka_python_settings(base)
        if removal is None:
            log.warning(
                "cluster %s: a member whose API refuses connections is left to its session"
                " timeout (a [broker.kafka] setting has no kafka-python counterpart)",
                cluster,
            )
        else:
            self._remover = Remover(removal)
            evictions = Evictions(
                self._membership, self._remover, warm=self._remover.warm, fence=self._prefence
            )
            self._evict_task = asyncio.create_task(
                evictions.run(self._host.stopping), name="evictions"
            )
        if cfg.coordinator.standby_replicas > 0:
            self.standby = Standby(self._store, consumer_settings(base, self._profile))
            self.standby.start()
            self._standby_task = asyncio.create_task(self._follow_standbys(), name="standby")
        try:
            await asyncio.wait_for(self._membership.first_assignment.wait(), timeout)
        except TimeoutError:
            log.warning("cluster %s: no assignment from the group within %.0fs", cluster, timeout)

    async def leaving(self) -> None:
        """A graceful stop, while the API still serves: leave the cluster (no other member may
        take this one for dead meanwhile, ``Membership.leaving``), handing its queues over."""
        self.stop_evictions()
        if self._membership is None or self._left:
            return
        await self._membership.leaving()
        await self.leave()

    async def leave(self) -> None:
        """Stop the standby, then leave the group: the queues are handed over (their last
        changes durable, their leases returned) while the rounds still run; after a failure
        (fenced) the member leaves without handing over, so the others need not wait for its
        session to time out. Once."""
        if self._left:
            return
        self._left = True
        if self._standby_task is not None:
            self._standby_task.cancel()  # no queue is given to the standby from here on
        # the standby stops while the member leaves (not first: the group's rebalance, which
        # the leave starts, is most of a graceful stop's failover)
        closing = []
        if self.standby is not None:
            closing.append(asyncio.to_thread(self.standby.close))
        if self._membership is not None:
            closing.append(asyncio.to_thread(self._membership.close, self._host.failed()))
        await asyncio.gather(*closing)

    def stop_evictions(self) -> None:
        if self._evict_task is not None:
            self._evict_task.cancel()

    async def close(self) -> None:
        """After ``leave``: what is left of the seat's Kafka clients."""
        self.stop_evictions()
        if self._remover is not None:
            await asyncio.to_thread(self._remover.close)

    # ----------------------------------------------------------------------------------------
    # the group's assignments
    # ----------------------------------------------------------------------------------------

    async def assigned(self, partitions: set[int]) -> None:
        """The group gave this member control partitions: claim them in the members topic,
        fence each one's last owner that did not hand it over, then serve their queues."""
        membership = self._membership
        assert membership is not None and self._owned is not None
        if membership.guard.stale_assignment():
            # Given right after this member did not run for most of a session: librdkafka may
            # have queued this assignment before a stop that got the member evicted, and the
            # group given the partitions to another since. Taking them would fence that member.
            # Stop instead, as a member that lost its partitions to another does.
            membership.abandon()
            self._host.give_up(
                StateError(
                    f"control partitions {sorted(partitions)} assigned while this member's"
                    " session may be lost (session timed out): the assignment may predate its"
                    " eviction; stopping"
                )
            )
            return
        me = membership.member
        started = time.monotonic()
        await membership.write([owner_write(p, me, released=False) for p in sorted(partitions)])
        self._claimed |= partitions  # read back: in the map (its queues served only later)
        claimed = time.monotonic()
        # transactional id -> the offset of the latest unreleased claim of it taken over
        fence: dict[str, int] = {}
        handed: list[int] = []  # released by their last owner after the claim
        lately: bool | None = None  # whether Kafka was away lately: asked once, if needed
        unreleased: set[str] = set()  # owners waited for in vain: not waited for again
        for p in partitions:
            before = membership.map.taken_from.get(p)
            if before is None or before.released or before.member == me.id:
                continue
            at = membership.map.taken_from_offset.get(p)
            # An owner stopping gracefully leaves the group before its handover ends
            # (``Membership._give_up``): wait for its release rather than fence it. So for a
            # member that lost its partitions in an outage (every member's session ran out):
            # back too, it releases them once their last changes are durable (``revoked``),
            # and fenced instead it would stop, its one writer serving all its queues.
            within = HANDOVER_WAIT_S
            waits = before.member in membership.map.leaving
            if not waits and before.member in membership.map.members:
                if lately is None:
                    lately = await asyncio.to_thread(self._host.outage_lately)
                waits, within = lately, RELEASE_LOST_S
            if waits and before.member not in unreleased:
                log.info(
                    "cluster: waiting up to %.0fs for member %r to release control partition"
                    " %d before fencing it",
                    within,
                    before.member,
                    p,
                )
                if await handed_over(membership.map, p, before, at, refuses, within):
                    handed.append(p)
                    continue
                unreleased.add(before.member)
            fence[before.transactional_id] = max(
                fence.get(before.transactional_id, -1), _UNKNOWN if at is None else at
            )
        for transactional_id, claimed_at in sorted(fence.items()):
            if await self._fenced_ahead(transactional_id, claimed_at):
                log.info(
                    "cluster: the last owner was fenced when it died, transactional_id=%s",
                    transactional_id,
                )
                continue
            log.info("cluster: fencing the last owner, transactional_id=%s", transactional_id)
            await self._host.until_reachable(
                "fence the last owner", partial(self._fence, transactional_id)
            )
        fenced = time.monotonic()
        async with self._host.reload_lock:
            self._owned |= partitions
            await self._host.apply_definitions("assigned to this member")
        # the stages of a takeover, for the failover benchmark (bench/failover.py reads them)
        log.info(
            "cluster: serving control partitions %s: claimed in %.3fs, fenced %d in %.3fs,"
            " restored and serving in %.3fs (handed over after the claim: %s)",
            sorted(partitions),
            claimed - started,
            len(fence),
            fenced - claimed,
            time.monotonic() - fenced,
            sorted(handed),
            extra={"partitions": sorted(partitions)},
        )

    async def revoked(self, partitions: set[int], graceful: bool) -> None:
        """Control partitions went to another member: stop serving their queues (their last
        changes durable, leases returned) and say so in the members topic, so the next owner
        need not fence this member. Lost ones too (``graceful`` False: the session ran out,
        e.g. in a Kafka outage that evicted every member): once their last changes are
        durable this member commits nothing more for them, which is what a release says (its
        successor, when Kafka was away lately, waits ``RELEASE_LOST_S`` for it before it fences
        this member); were it fenced first, the commit fails and it exits. Without a
        release, the members that rejoin after an outage would fence each other (each member
        has one writer for all its queues) and all exit. A release written after another
        member's claim is ignored (``ClusterMap``). Lost while Kafka stayed reachable (no
        outage now or within ``OUTAGE_MEMORY_S``), or after this member did not run for most
        of a session (``SessionGuard.suspect``: stopped past its session), it exits at once if
        another member claimed them, and otherwise releases them within ``RELEASE_LOST_S``
        or exits."""
        membership = self._membership
        assert membership is not None and self._owned is not None
        # a member that did not run for most of a session was stopped, whatever its Kafka
        # probe says: a probe under way at the stop times out at the wake
        if graceful or not (
            membership.guard.suspect() or not await asyncio.to_thread(self._host.outage_lately)
        ):
            await self._release(partitions, graceful)
            return
        # Lost with Kafka reachable: this member did not run for a session (stopped, or a
        # machine too loaded to run it). If another member claimed these partitions it fences
        # this one before it restores them, so their last changes can no longer commit (on
        # Tansu the fenced writer's commit never ends): stop now, as a fenced member does (the
        # rounds fail, the process exits, a supervisor restarts it). It leaves the group at
        # once: rejoined, it would be given queues back while a commit under way runs out;
        # and that commit is interrupted. Claimed by nobody yet (every member lost its session
        # in the same stall), it releases them as after an outage and rejoins; a release that
        # does not end within RELEASE_LOST_S (fenced meanwhile) stops it all the same.
        taken = await self._claimed_elsewhere(partitions)
        if not taken:
            try:
                await asyncio.wait_for(self._release(partitions, graceful), RELEASE_LOST_S)
                return
            except TimeoutError:
                taken = f"their release did not end within {RELEASE_LOST_S:.0f}s"
        membership.abandon()
        self._host.give_up(
            StateError(
                f"control partitions {sorted(partitions)} lost (session timed out): {taken};"
                " the next owner fences this member; stopping"
            )
        )

    async def _claimed_elsewhere(self, partitions: set[int]) -> str:
        """Which of ``partitions`` another member claimed, as the members topic says once
        read to a record written now ("" for none; unknown when Kafka does not answer within
        a few seconds: taken as claimed)."""
        membership = self._membership
        assert membership is not None
        me = membership.member
        try:
            await membership.write([member_write(me)], timeout=5.0)
        except BrokerError as exc:
            return f"whether another member claimed them is unknown ({exc})"
        taken = sorted(
            p
            for p in partitions
            if (o := membership.map.owners.get(p)) is not None and o.member != me.id
        )
        return f"partitions {taken} claimed by another member" if taken else ""

    async def _release(self, partitions: set[int], graceful: bool) -> None:
        membership = self._membership
        assert membership is not None and self._owned is not None
        async with self._host.reload_lock:
            self._owned -= partitions
            await self._host.apply_definitions("moved to another member of the cluster")
        if not self._host.failed():
            me = membership.member
            # each partition this member claimed, even when its successor has claimed it
            # since: a graceful stop leaves the group before its handover ends, and a member
            # that lost its partitions in an outage may release them after the successor's
            # claim; the successor waits for this release (``Seat.assigned``, ``handed_over``)
            mine = [
                p
                for p in sorted(partitions)
                if (o := membership.map.owners.get(p)) is not None
                and (
                    (o.member == me.id and not o.released)
                    or (o.member != me.id and p in self._claimed)
                )
            ]
            if mine:
                await membership.write([owner_write(p, me, released=True) for p in mine])
            self._claimed -= partitions
            how = "handed over" if graceful else "released (lost by this member)"
            log.info("cluster: %s control partitions %s", how, mine)

    # ----------------------------------------------------------------------------------------
    # fences: the writers of members whose queues this one takes over
    # ----------------------------------------------------------------------------------------

    async def _prefence(self, member: Member) -> None:
        """``member`` refuses connections (dead, ``layer.coordinator.evict``): fence its
        changelog writer now, while the group moves its partitions, rather than after (0.1-0.6
        s of every takeover of a killed member on Tansu, a producer's first InitProducerId)."""
        assert self._membership is not None and self._loop is not None
        done: asyncio.Future[bool] = self._loop.create_future()
        self._prefences[member.transactional_id] = (self._membership.map.next_offset, done)
        log.info(
            "cluster: fencing member %r ahead of its takeover, transactional_id=%s",
            member.id,
            member.transactional_id,
        )
        try:
            await asyncio.to_thread(self._fence, member.transactional_id)
        except Exception as exc:  # its successor fences it, as without this
            log.warning("cluster: fencing member %r failed: %s", member.id, exc)
            done.set_result(False)
            return
        done.set_result(True)

    async def _fenced_ahead(self, transactional_id: str, claimed_at: int) -> bool:
        """Whether ``transactional_id`` was fenced (``_prefence``) after this member had read
        the claim at offset ``claimed_at`` of the owner it takes over from: that owner
        initialised its writer before it wrote its claim, so the fence came after and covers
        it; a later start of the same id would have claimed the partition again (the claim
        taken over would be that one). Waits for such a fence still under way."""
        found = self._prefences.get(transactional_id)
        if found is None:
            return False
        read, done = found
        return claimed_at < read and await asyncio.shield(done)

    def _fence(self, transactional_id: str) -> None:
        """Start (and close) a writer with another member's transactional id: what it left
        open is aborted and it can commit nothing more."""
        ChangelogWriter(producer_settings(self._base_settings), transactional_id).close()

    def confirm_replacement(self) -> str | None:
        """(The commit thread, a new writer started in place of one that failed.) None when
        no other member claimed a control partition this member claimed and did not release,
        as the members topic says once read to a record written now; else what was taken.
        ``StateError`` when that cannot be told yet (Kafka away again): asked again."""
        if self._membership is None or self._loop is None:
            return None
        asking = asyncio.run_coroutine_threadsafe(self._claims_taken(), self._loop)
        try:
            return asking.result(60)
        except Exception as exc:
            asking.cancel()
            raise StateError(f"cannot tell whether another member took over: {exc}") from exc

    async def _claims_taken(self) -> str | None:
        membership = self._membership
        assert membership is not None
        me = membership.member
        claimed = set(self._claimed)
        await membership.write([member_write(me)])  # read back: the map holds every claim
        taken = sorted(
            p for p in claimed if (o := membership.map.owners.get(p)) is None or o.member != me.id
        )
        if not taken:
            return None
        return f"control partitions {taken} were claimed by another member meanwhile"

    # ----------------------------------------------------------------------------------------
    # standby copies of the queues other members serve
    # ----------------------------------------------------------------------------------------

    async def _follow_standbys(self) -> None:
        """Keep the standby tailing the queues of the partitions this member is a standby of
        (not while the queues move: a handover's last commit writes the store meanwhile)."""
        while not self._host.stopping():
            if not self._host.reload_lock.locked():
                self.want_standbys()
            await asyncio.sleep(STANDBY_REFRESH_S)

    def want_standbys(self) -> None:
        """Tell the standby the queues it is to tail now: those of the partitions this member
        is a standby of, defined, and not served here."""
        membership, standby = self._membership, self.standby
        cluster = self._host.cluster_queues()
        assert membership is not None and standby is not None and cluster is not None
        c = self._host.current_config().coordinator
        mine = standby_partitions(membership.map, membership.member.id, c.standby_replicas)
        mine -= self._owned or set()
        latest = cluster.definitions.latest
        standby.want(
            {
                q.name: c.changelog_topic(q.name)
                for q in cluster.served()  # a partitioned queue's shards
                if partition_of(q.name) in mine
                and not self._host.serves(q.name)
                # not a temporary queue: its changelog topic is deleted with it, and a consumer
                # that had read a deleted topic crashed librdkafka (segfault) on the embedded
                # broker
                and not getattr(latest.get(q.name), "temporary", False)
            }
        )
