"""Calls one member of a cluster forwards to another: ``stats``, ``browse`` and ``publish`` of a
queue another member serves, so they work against any member (issue 12).

One client per peer address, made on first use and kept. The peer checks the call as its own
(the forwarding member's token: its ``admin_token``, else its ``auth_token``); the caller's
rights were checked by the member it called. Over TLS nothing is forwarded (the member's
certificate is a server's, not a client's): the caller gets ``NotOwner`` with the address.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from layer.api.service import DeliveredMessage, QueueStats
from layer.client.aio import AsyncQueueClient
from layer.engine.model import Bookmark

__all__ = ["PROBE_TIMEOUT", "Peers"]

#: how long a member waits for a peer's health check (the ``alive`` of the metadata call)
PROBE_TIMEOUT = 1.0

# The probes' channel is kept (a probe of a live member is one round trip, even on a loaded
# machine); its reconnect backoff stays short, where gRPC's grows to two minutes.
_PROBE_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 500),
]


class Peers:
    def __init__(self, token: str | None, tls: bool = False) -> None:
        self._token = token
        self._tls = tls
        self._clients: dict[str, AsyncQueueClient] = {}
        self._probes: dict[str, grpc.aio.Channel] = {}

    async def alive(self, address: str, timeout: float = PROBE_TIMEOUT) -> bool:
        """Whether the member at ``address`` answers the standard health check (no token
        needed) within ``timeout``: SERVING or not, it is up. False when it refuses the
        connection, is stopped or cut off. Over TLS (a member has no client certificate):
        whether its port accepts a connection, which a stopped process still does."""
        if self._tls:
            return await _accepts(address, timeout)
        channel = self._probes.get(address)
        if channel is None:
            channel = self._probes[address] = grpc.aio.insecure_channel(address, _PROBE_OPTIONS)
        try:
            # waits (within the timeout) for a channel that is reconnecting: a member back at
            # its address is alive at the next probe, not after gRPC's backoff
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout, wait_for_ready=True
            )
        except grpc.RpcError:
            return False
        return True

    def _client(self, address: str) -> AsyncQueueClient:
        client = self._clients.get(address)
        if client is None:
            # no reconnect loop: the owner may be gone, the caller gets that at once
            client = self._clients[address] = AsyncQueueClient(
                address, self._token, reconnect=False, client_name="qlayer-peer"
            )
        return client

    async def stats(self, address: str, queue: str) -> list[QueueStats]:
        return await self._client(address).stats(queue)

    async def browse(
        self, address: str, queue: str, filter: str | None, limit: int | None
    ) -> list[DeliveredMessage]:
        browsed = await self._client(address).browse(queue, filter, limit)
        return [
            DeliveredMessage(
                bookmark=Bookmark.parse(m.bookmark),
                key=m.key,
                value=m.value,
                headers=list(m.headers),
                timestamp_ms=m.timestamp_ms,
                deliveries=m.deliveries,
                cancels=m.cancels,
                lease_deadline_ms=None,
                barrier=m.barrier,
                queue=queue,
                parse_error=m.parse_error,
            )
            for m in browsed
        ]

    async def publish(
        self,
        address: str,
        queue: str,
        value: bytes,
        key: bytes | None,
        headers: list[tuple[str, bytes | None]],
    ) -> Bookmark:
        bookmark = await self._client(address).publish(queue, value, key, headers or None)
        return Bookmark.parse(bookmark)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()
        probes, self._probes = list(self._probes.values()), {}
        for channel in probes:
            await channel.close()


async def _accepts(address: str, timeout: float) -> bool:
    host, _, port = address.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), timeout
        )
    except (OSError, ValueError, TimeoutError):
        return False
    writer.close()
    return True
