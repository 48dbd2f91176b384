"""Stats of every queue of a cluster, asked of one member (issue 12).

The member answers for the queues it serves and asks each other queue's owner for it, as a
stats call naming that queue is forwarded (``layer.coordinator.peers``): the owner's figures,
with the owner's id. A member that does not answer in time, or refuses, costs only its own
queues: they are named in ``ClusterStats.missing`` with the reason, and the rest is answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from layer.api.service import ClusterStats, QueueStats, StatsMissing
from layer.coordinator.membership import ClusterMap
from layer.exceptions import ConnectFailed, ConnectionLost

__all__ = ["ASK_TIMEOUT", "NO_OWNER", "TAKING_OVER", "gather_stats"]

log = logging.getLogger(__name__)

#: how long a member waits for another's stats of a queue (a stopped member never answers)
ASK_TIMEOUT = 5.0

NO_OWNER = "no owner right now (moving between members): ask again shortly"
TAKING_OVER = "this member is taking it over (restoring it): ask again shortly"


class StatsPeers(Protocol):
    async def stats(self, address: str, queue: str) -> list[QueueStats]: ...


async def gather_stats(
    local: Sequence[QueueStats],
    elsewhere: Sequence[str],
    cmap: ClusterMap,
    peers: StatsPeers,
    *,
    timeout: float = ASK_TIMEOUT,
) -> ClusterStats:
    """``local``: the figures of the queues served here; ``elsewhere``: the cluster's other
    queues, each asked of its owner as ``cmap`` knows it (all at once, each within
    ``timeout``)."""
    missing: dict[tuple[str, str, str], list[str]] = {}
    asks: list[tuple[str, str, str]] = []  # (member, address, queue)
    for name in elsewhere:
        owner = cmap.owner_of(name)
        if owner is None:
            missing.setdefault(("", "", NO_OWNER), []).append(name)
        elif owner.id == cmap.me:
            # the group gave it to this member, which is still restoring it
            missing.setdefault((owner.id, owner.address, TAKING_OVER), []).append(name)
        else:
            asks.append((owner.id, owner.address, name))
    answers = await asyncio.gather(
        *(asyncio.wait_for(peers.stats(address, name), timeout) for _, address, name in asks),
        return_exceptions=True,
    )
    found = list(local)
    for (member, address, name), answer in zip(asks, answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, Exception):
                raise answer  # cancelled: the call itself ends
            missing.setdefault((member, address, _reason(answer, timeout)), []).append(name)
        else:
            found.extend(answer)
    return ClusterStats(
        sorted(found, key=lambda s: s.queue),
        [StatsMissing(m, a, reason, sorted(qs)) for (m, a, reason), qs in sorted(missing.items())],
    )


def _reason(exc: Exception, timeout: float) -> str:
    """One short line: the transport's own text (gRPC's, addresses and all) goes to the log."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g}s"
    if isinstance(exc, ConnectFailed):
        log.info("stats not forwarded: %s", exc)
        return "unreachable (no connection could be made)"
    if isinstance(exc, ConnectionLost):
        log.info("stats not forwarded: %s", exc)
        return "unreachable (the connection was lost)"
    return " ".join(str(exc).split()) or type(exc).__name__
