"""What a client knows of a cluster of coordinators, to open each subscription on the member
that owns its queue and follow the queue when it moves (issue 12, "Clients follow the work").

Pure bookkeeping, no I/O: the faces (``sync.py``, ``aio.py``) make the ``Cluster`` calls and
feed the answers in. One ``ClusterView`` per client, shared by its subscriptions and its unary
calls (the member addresses it learns join the client's ``Addresses``).

A coordinator alone answers the ``Cluster`` call with itself, owning no control partition:
then nothing is learned and nothing changes (its advertised address may not be how this client
reaches it, so it is not added to the addresses to try).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from layer.api.service import ClusterInfo
from layer.client._core import Addresses, ReconnectPolicy, SubscriptionCore
from layer.exceptions import NotOwner, QLayerError, QueueRemoved
from layer.shards import shards_in

__all__ = [
    "FOLLOW_FIRST_S",
    "ClusterView",
    "Located",
    "is_cluster",
    "locate_timeout",
    "may_have_moved",
    "moved_unless_asked",
]

# How long a first subscribe follows a queue that is moving (no owner yet, or the owner
# named is not serving it yet) when the client has no timeout: then it fails with NotOwner.
FOLLOW_FIRST_S = 30.0


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

    def shards_of(self, queue: str) -> list[str]:
        """The shards of ``queue`` as last learned (empty: not a partitioned queue, or not
        known to be one)."""
        return shards_in(queue, self._names)

    def learn_shards(self, info: ClusterInfo, queue: str) -> list[str]:
        """Remember the queue names of ``info`` (a ``Cluster`` answer); the shards of
        ``queue`` among them."""
        self._names = [q.queue for q in info.queues]
        return self.shards_of(queue)

    def owner(self, queue: str) -> str | None:
        """The address of ``queue``'s owner as last learned (None: not known)."""
        return self._owners.get(queue)

    def learn(self, info: ClusterInfo, asked: str) -> None:
        """``info`` is the answer of the member at ``asked``: remember the owners and add the
        other members' addresses to those the client tries."""
        self.asked = True
        self._names = [q.queue for q in info.queues]
        if not is_cluster(info):
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
