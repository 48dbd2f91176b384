"""A member whose API refuses connections is removed from the cluster's group at once, so its
queues move now rather than when its session expires (issue 12: failover in seconds).

A killed process's port refuses connections (the kernel answers a connect with a reset at once);
a hung or stopped one still accepts them (its listen backlog does), and a slow one answers late:
so only refusals count, never slowness, and a member paused by a loaded machine is left to its
session as before. After ``REFUSALS`` refusals in a row, ``PROBE_S`` apart, each survivor that
sees them asks the group coordinator to remove the member (Kafka's LeaveGroup with the member's
id: the admin call ``remove_group_members``, which librdkafka does not offer, hence the pure
Python client kafka-python for this one call). The member's id in the group comes from the
members topic (``group/<id>``), where each member writes it once it has joined, and takes it
out before its API stops (``Membership.leaving``), so a graceful stop is never cut short. The
group then rebalances as if the member had left: the survivors take its partitions, fence its
changelog writer and restore its queues, exactly as after a session timeout.

A wrong removal costs what a spurious session timeout costs (the member loses its partitions,
is fenced, exits, and its supervisor restarts it): it needs a live member whose advertised
address refuses connections from its peers, i.e. a misadvertised address.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from layer.coordinator.membership import Membership

__all__ = ["PROBE_S", "REFUSALS", "Evictions", "remove_member"]

log = logging.getLogger(__name__)

PROBE_S = 0.2  # seconds between two probes of a member's API
REFUSALS = 2  # refusals in a row that make a member dead
CONNECT_TIMEOUT_S = 1.0  # a probe that neither connects nor is refused within this: unknown


async def refuses(address: str) -> bool:
    """Whether ``host:port`` refuses a TCP connection (a connection made, a timeout or any
    other error: False)."""
    host, _, port = address.rpartition(":")
    try:
        _reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), CONNECT_TIMEOUT_S
        )
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    return False


def remove_member(settings: Mapping[str, Any], group: str, member_id: str) -> str:
    """Remove ``member_id`` from ``group`` (kafka-python ``settings``); the broker's answer."""
    from kafka import KafkaAdminClient
    from kafka.admin import MemberToRemove

    admin = KafkaAdminClient(**settings)
    try:
        result = admin.remove_group_members(group, [MemberToRemove(member_id=member_id)])
    finally:
        admin.close()
    return ", ".join(f"{k}: {v.__name__}" for k, v in result.items())


class Evictions:
    """Probes the API of every other member holding partitions; removes one that refuses
    connections ``REFUSALS`` times in a row from the group (``remove``, run in a thread)."""

    def __init__(
        self,
        membership: Membership,
        remove: Callable[[str, str], str],
        *,
        probe: Callable[[str], Any] = refuses,
    ) -> None:
        self._membership = membership
        self._remove = remove
        self._probe = probe
        self._refused: dict[str, int] = {}  # group member id -> refusals in a row
        self._removed: set[str] = set()  # group member ids removed (once each)

    async def run(self, stopping: Callable[[], bool]) -> None:
        # the client is imported now, not when a member dies (0.1-0.5 s on a loaded machine)
        await asyncio.to_thread(importlib.import_module, "kafka.admin")
        while not stopping():
            try:
                await self.step()
            except Exception:
                log.exception("cluster: probing the other members failed")
            await asyncio.sleep(PROBE_S)

    async def step(self) -> None:
        cmap = self._membership.map
        me = self._membership.member.id
        holding = {o.member for o in cmap.owners.values() if not o.released}
        suspects = {
            gid: cmap.members[m]
            for m, gid in cmap.group_ids.items()
            if m != me and m in holding and m in cmap.members and gid not in self._removed
        }
        for gid in set(self._refused) - set(suspects):
            del self._refused[gid]
        if not suspects:
            return
        answers = await asyncio.gather(*(self._probe(m.address) for m in suspects.values()))
        for (gid, member), refused in zip(suspects.items(), answers, strict=True):
            self._refused[gid] = self._refused.get(gid, 0) + 1 if refused else 0
            if self._refused[gid] < REFUSALS:
                continue
            self._removed.add(gid)
            group = self._membership.group
            try:
                answer = await asyncio.to_thread(self._remove, group, gid)
            except Exception as exc:  # the session will expire anyway
                log.warning(
                    "cluster: member %r at %s refuses connections; removing it from the"
                    " group failed (its session will expire): %s",
                    member.id,
                    member.address,
                    exc,
                )
                continue
            log.info(
                "cluster: member %r at %s refuses connections: asked the group to remove it (%s)",
                member.id,
                member.address,
                answer,
                extra={"member": member.id},
            )
