"""What a client knows of a cluster of coordinators, to open each subscription on the member
that owns its queue and follow the queue when it moves (issue 12, "Clients follow the work").

Pure bookkeeping, no I/O: the faces (``sync.py``, ``aio.py``) make the ``Cluster`` calls and
feed the answers in. One ``ClusterView`` per client, shared by its subscriptions and its unary
calls (the member addresses it learns join the client's ``Addresses``).

A coordinator alone answers the ``Cluster`` call with itself, owning no control partition:
then nothing is learned and nothing changes (its advertised address may not be how this client
reaches it, so it is not added to the addresses to try).

**A member that hangs** (``SIGSTOP``, a frozen host) keeps its clients' streams open: its kernel
still keeps the TCP connection, so nothing ends them until it wakes (seconds later, fenced,
it exits), though the group gave its queues to another member a session after the stop. So in
a cluster each subscription watches its member (``HungOwner``): every ``WATCH_S`` a gRPC health
check that must be answered within ``PROBE_S``; while it is not, the other members are asked
where the queue is, and the stream is given up only when one of them answers that it serves
the queue itself now. A slow member is never left for its slowness alone: while no other
member has taken its queue, the stream stays (a member that lost its queue after a stall
ends its streams itself, or is fenced and exits). Its leases are lost with the stream
(at-least-once: the new owner delivers them again) and its unconfirmed acks are counted in
``unconfirmed_acks``, as after a kill.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from layer.api.service import ClusterInfo
from layer.client._core import Addresses, ReconnectPolicy, SubscriptionCore
from layer.exceptions import InvalidRequest, NotOwner, QLayerError, QueueRemoved, UnknownQueue
from layer.shards import parse_shard, queue_of, shards_in

__all__ = [
    "FOLLOW_FIRST_S",
    "HEALTH_METHOD",
    "PROBE_S",
    "WATCH_S",
    "ClusterView",
    "HungOwner",
    "Located",
    "is_cluster",
    "locate_timeout",
    "matching_queues",
    "may_have_moved",
    "moved_unless_asked",
    "others",
]

# How long a first subscribe follows a queue that is moving (no owner yet, or the owner
# named is not serving it yet) when the client has no timeout: then it fails with NotOwner.
FOLLOW_FIRST_S = 30.0

# A subscription in a cluster probes the member its stream is on every WATCH_S (WATCH_S / 2
# while that member does not answer); a probe not answered within PROBE_S makes the client ask
# the other members, each of which answers within ASK_S (it probes the members too: up to a
# second for a stopped one).
WATCH_S = 0.5
PROBE_S = 1.0
ASK_S = 3.0
HEALTH_METHOD = "/grpc.health.v1.Health/Check"

# a probe that ended so was not answered (any other end, even an error, is an answer)
UNANSWERED = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE})


def locate_timeout(policy: ReconnectPolicy, call_timeout: float | None) -> float:
    """How long one ``Cluster`` call asking where a queue is may take: it is answered from
    memory, so a member that does not answer within two connection attempts' time is left for
    the next (a call on a connection to a stopped process would wait the whole call timeout)."""
    limit = 2 * policy.connect_timeout
    return limit if call_timeout is None else min(limit, call_timeout)


def is_cluster(info: ClusterInfo) -> bool:
    """Whether ``info`` is a cluster's (members sharing control partitions), not a
    coordinator alone (one member, no partition)."""
    return len(info.members) > 1 or any(m.partitions for m in info.members)


def may_have_moved(error: QLayerError | None) -> bool:
    """A stream ended with ``error``: could its queue be served by another member now? A
    ``NotOwner`` says so; a ``QueueRemoved`` (a member that lost the queue ends its
    subscriptions with it, as a deleted queue does) must be checked with a ``Cluster`` call."""
    return isinstance(error, NotOwner | QueueRemoved)


def moved_unless_asked(
    core: SubscriptionCore[Any], error: QLayerError | None, clustered: bool
) -> bool | None:
    """Did ``core``'s stream end because its queue is served by another member now, as far as
    can be told without asking the cluster: False (not followed: closing, ``reconnect=False``,
    a regex subscription, an error no move gives, or a coordinator alone, where a removed
    queue is gone), True (``NotOwner``), None (a ``QueueRemoved``: moved, or deleted; a
    ``Cluster`` call tells, moved if the cluster still has the queue)."""
    if core.closing or not core.policy.enabled or core.queue.startswith("^"):
        return False
    if not may_have_moved(error):
        return False
    if isinstance(error, NotOwner):
        return True
    if not clustered:
        return False
    return None


def matching_queues(regex: str, names: Sequence[str]) -> list[str]:
    """The queues (and shards) of ``names`` (a cluster's queue list) a subscription to the
    regex ``regex`` opens one stream on: each queue whose name it matches (``re.search``, as a
    coordinator matches it), a partitioned queue by its own name (``orders``, not
    ``orders#0``) and then with every shard, so it is consumed whole. ``InvalidRequest`` for
    a bad regex, ``UnknownQueue`` when nothing matches (as a coordinator alone says)."""
    try:
        pattern = re.compile(regex)
    except re.error as exc:
        raise InvalidRequest(f"queue pattern {regex!r} is not a regex: {exc}") from None
    found = [name for name in names if pattern.search(queue_of(name))]
    if not found:
        listed = sorted({queue_of(name) for name in names})
        raise UnknownQueue(
            f"queue pattern {regex!r} matches no queue of the cluster"
            f" (its queues: {', '.join(listed) or 'none'})"
        )
    # a partitioned queue's shards in shard order (the cluster lists them by name: #10 < #2)
    return sorted(found, key=lambda n: (queue_of(n), (parse_shard(n) or ("", -1))[1]))


@dataclass(frozen=True, slots=True)
class Located:
    """Where a queue is served, as one member's ``Cluster`` answer says: ``defined`` (the
    cluster has the queue), ``address`` (its owner's, None while it moves)."""

    defined: bool
    address: str | None


class ClusterView:
    """The owners of queues as last learned, and whether the client talks to a cluster."""

    def __init__(self, addresses: Addresses) -> None:
        self.addresses = addresses
        self.clustered = False  # some answer came from a cluster: subscriptions follow owners
        self.asked = False  # a Cluster call was answered (or refused) at least once
        self._owners: dict[str, str] = {}
        self._names: list[str] = []  # the queues (and shards) of the last answer
        self._from_cluster = False  # the last answer came from a cluster (not one alone)

    def shards_of(self, queue: str) -> list[str]:
        """The shards of ``queue`` as last learned (empty: not a partitioned queue, or not
        known to be one)."""
        return shards_in(queue, self._names)

    def learn_shards(self, info: ClusterInfo, queue: str) -> list[str]:
        """Remember the queue names of ``info`` (a ``Cluster`` answer); the shards of
        ``queue`` among them."""
        self._names = [q.queue for q in info.queues]
        return self.shards_of(queue)

    def regex_streams(self, regex: str) -> list[str] | None:
        """The queues a subscription to ``regex`` opens a stream on, from the last answer
        (``matching_queues``); None when that answer came from a coordinator alone, which
        resolves the regex itself in one subscription."""
        return matching_queues(regex, self._names) if self._from_cluster else None

    def owner(self, queue: str) -> str | None:
        """The address of ``queue``'s owner as last learned (None: not known)."""
        return self._owners.get(queue)

    def learn(self, info: ClusterInfo, asked: str) -> None:
        """``info`` is the answer of the member at ``asked``: remember the owners and add the
        other members' addresses to those the client tries."""
        self.asked = True
        self._names = [q.queue for q in info.queues]
        self._from_cluster = is_cluster(info)
        if not self._from_cluster:
            return
        self.clustered = True
        self.addresses.learn(m.address for m in info.members if m.id != info.member and m.address)
        owners: dict[str, str] = {}
        for q in info.queues:
            if q.member == info.member:
                owners[q.queue] = asked  # the member asked, as this client reaches it
            elif q.address:
                owners[q.queue] = q.address
        self._owners = owners

    def locate(self, info: ClusterInfo, asked: str, queue: str) -> Located:
        """Learn ``info`` (the answer of ``asked``) and say where ``queue`` is served."""
        self.learn(info, asked)
        if not is_cluster(info):
            return Located(any(q.queue == queue for q in info.queues), asked)
        return Located(any(q.queue == queue for q in info.queues), self._owners.get(queue))


class HungOwner:
    """One subscription's watch of the member its stream is on (see the module doc): the
    face probes that member (``probe_due``, ``probed``), asks the others while it does not
    answer (``asking``), and gives the stream up for the address ``moved_to`` names."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.unanswered = 0  # probes in a row the member did not answer

    def next_wait(self) -> float:
        """Seconds until the next probe: sooner while the member does not answer."""
        return WATCH_S / 2 if self.unanswered else WATCH_S

    def probed(self, code: grpc.StatusCode | None) -> None:
        """A probe ended: answered (``code`` None, or any status but a timeout or no
        connection) or not."""
        self.unanswered = self.unanswered + 1 if code in UNANSWERED else 0

    @property
    def asking(self) -> bool:
        """Whether the other members are to be asked where the queue is (beside the next
        probe: both take up to a second with a stopped member)."""
        return self.unanswered > 0

    def moved_to(self, answers: Sequence[tuple[str, ClusterInfo]]) -> str | None:
        """After a probe the member did not answer: the address (as this client reaches it)
        of the first of ``answers`` (asked address, the member's ``Cluster`` answer) that
        serves the queue itself; None (stay) when none does."""
        if not self.unanswered:
            return None
        for asked, info in answers:
            if any(q.queue == self.queue and q.member == info.member for q in info.queues):
                return asked
        return None


def others(addresses: Addresses, current: str) -> list[str]:
    """The addresses of the members a client knows, but ``current``."""
    return [a for a in addresses.all if a != current]
