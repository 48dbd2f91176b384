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
import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from layer.coordinator.membership import Member, Membership

__all__ = ["PROBE_S", "RECHECK_S", "REFUSALS", "Evictions", "Remover"]

log = logging.getLogger(__name__)

PROBE_S = 0.2  # seconds between two probes of a member's API
RECHECK_S = 0.05  # ... after a refusal (the next one decides)
REFUSALS = 2  # refusals in a row that make a member dead
CONNECT_TIMEOUT_S = 1.0  # a probe that neither connects nor is refused within this: unknown


async def refuses(address: str, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether ``host:port`` refuses a TCP connection within ``timeout`` (a connection made,
    a timeout or any other error: False)."""
    host, _, port = address.rpartition(":")
    try:
        _reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), timeout
        )
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    return False


class Remover:
    """Removes a member from a group (kafka-python ``settings``), with one admin client made
    ahead (``warm``) and kept: making one (bootstrap, API versions) took 0.1-2.4 s on the
    loaded test machine, all of it between a member's death and its queues' move. Called from
    one thread at a time (``asyncio.to_thread``); a call that fails is tried once more with a
    new client (the kept one's connection may have been closed while idle)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self._settings = dict(settings)
        self._admin: Any = None
        self._lock = threading.Lock()
        self._closed = False

    def warm(self) -> None:
        with self._lock:
            self._client()
            if self._closed:
                self._drop()

    def _client(self) -> Any:
        if self._admin is None:
            from kafka import KafkaAdminClient

            self._admin = KafkaAdminClient(**self._settings)
        return self._admin

    def _drop(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()

    def __call__(self, group: str, member_id: str) -> str:
        """Remove ``member_id`` from ``group``; the broker's answer."""
        from kafka.admin import MemberToRemove

        with self._lock:
            for attempt in (1, 2):
                try:
                    result = self._client().remove_group_members(
                        group, [MemberToRemove(member_id=member_id)]
                    )
                except Exception:
                    self._drop()
                    if attempt == 2 or self._closed:
                        raise
                    continue
                finally:
                    if self._closed:
                        self._drop()
                return ", ".join(f"{k}: {v.__name__}" for k, v in result.items())
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Not blocking: a call under way (Kafka away: its bootstrap can take 30 s) drops
        the client itself when it ends."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._drop()
            finally:
                self._lock.release()


class Evictions:
    """Probes the API of every other member holding partitions; removes one that refuses
    connections ``REFUSALS`` times in a row from the group (``remove``, run in a thread)."""

    def __init__(
        self,
        membership: Membership,
        remove: Callable[[str, str], str],
        *,
        probe: Callable[[str], Any] = refuses,
        warm: Callable[[], Any] | None = None,
        fence: Callable[[Member], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self._membership = membership
        self._remove = remove
        self._probe = probe
        self._warm = warm
        self._fence = fence
        self._fences: set[asyncio.Task[None]] = set()  # under way (kept from the collector)
        self._refused: dict[str, int] = {}  # group member id -> refusals in a row
        self._removed: set[str] = set()  # group member ids removed (once each)

    async def run(self, stopping: Callable[[], bool]) -> None:
        # the client is imported (0.1-0.5 s on a loaded machine) and made now, not when a
        # member dies
        await asyncio.to_thread(importlib.import_module, "kafka.admin")
        if self._warm is not None:
            try:
                await asyncio.to_thread(self._warm)
            except Exception as exc:  # made again when needed
                log.warning("cluster: the client that removes dead members failed: %s", exc)
        while not stopping():
            try:
                await self.step()
            except Exception:
                log.exception("cluster: probing the other members failed")
            await asyncio.sleep(RECHECK_S if self.suspect else PROBE_S)

    @property
    def suspect(self) -> bool:
        """Whether a member refused the last probe without being removed yet (so it is
        probed again soon: a dead member is found 0.05 s after its first refusal, not 0.2)."""
        return any(0 < n < REFUSALS for n in self._refused.values())

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
            if self._fence is not None:
                # its changelog writer is fenced meanwhile (the rebalance takes a second or
                # more), so that its successor need not (``Seat.assigned``)
                task = asyncio.create_task(self._fence(member), name=f"fence-{member.id}")
                self._fences.add(task)
                task.add_done_callback(self._fences.discard)
            group = self._membership.group
            asked = time.monotonic()
            self._membership.removed(gid)  # gone either way: now, or when its session expires
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
                "cluster: member %r at %s refuses connections: asked the group to remove it"
                " (%s; answered in %.3fs)",
                member.id,
                member.address,
                answer,
                time.monotonic() - asked,
                extra={"member": member.id},
            )
