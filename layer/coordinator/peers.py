"""Calls one member of a cluster forwards to another: ``stats``, ``browse`` and ``publish`` of a
queue another member serves, so they work against any member (issue 12).

One client per peer address, made on first use and kept. The peer checks the call as its own
(the forwarding member's token: its ``admin_token``, else its ``auth_token``; with neither,
under mutual TLS, its certificate's subject); the caller's rights were checked by the member
it called. Over TLS (``PeerTls``) a member is a TLS client of the others: it verifies their
certificates with ``tls_peer_ca`` (else ``tls_client_ca``, else the system's roots) and
presents its own ``tls_cert`` / ``tls_key`` (which mutual TLS asks of a client), so its
certificate must be good for client authentication too (no extended key usage, or
``clientAuth`` among them) and name the host it advertises.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from layer.api.service import DeadLetter, DeliveredMessage, QueueStats
from layer.client._common import tls_credentials
from layer.config import CoordinatorConfig
from layer.coordinator.evict import refuses
from layer.engine.model import Bookmark

if TYPE_CHECKING:
    from layer.client.aio import AsyncQueueClient

__all__ = ["PROBE_TIMEOUT", "PeerTls", "Peers", "peer_tls"]

#: how long a member waits for a peer's health check (the ``alive`` of the metadata call)
PROBE_TIMEOUT = 1.0

# The probes' channel is kept (a probe of a live member is one round trip, even on a loaded
# machine); its reconnect backoff stays short, where gRPC's grows to two minutes.
_PROBE_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 500),
]


@dataclass(frozen=True, slots=True)
class PeerTls:
    """What a member presents and trusts as a TLS client of the others."""

    root_cert: bytes | None  # verifies their certificates (None: the system's roots)
    client_cert: tuple[bytes, bytes]  # (certificate chain, key): this member's own


def peer_tls(c: CoordinatorConfig) -> PeerTls | None:
    """A member's TLS as a client of the others: None when its API serves plaintext (so do
    theirs: one cluster, one setting)."""
    if c.tls_cert is None or c.tls_key is None:
        return None
    ca = c.tls_peer_ca or c.tls_client_ca
    return PeerTls(
        None if ca is None else ca.read_bytes(), (c.tls_cert.read_bytes(), c.tls_key.read_bytes())
    )


def _retrieved(task: asyncio.Future[object]) -> None:
    """Take a probe's outcome that nobody awaits (it was refused at once meanwhile)."""
    if not task.cancelled():
        task.exception()


class Peers:
    def __init__(self, token: str | None, tls: PeerTls | None = None) -> None:
        self._token = token
        self._tls = tls
        self._clients: dict[str, AsyncQueueClient] = {}
        self._probes: dict[str, grpc.aio.Channel] = {}

    async def alive(self, address: str, timeout: float = PROBE_TIMEOUT) -> bool:
        """Whether the member at ``address`` answers the standard health check (no token
        needed) within ``timeout``: SERVING or not, it is up. False when it refuses the
        connection, is stopped or cut off (over TLS too: the check goes over the members'
        TLS, ``PeerTls``)."""
        channel = self._probes.get(address)
        if channel is None:
            if self._tls is None:
                channel = grpc.aio.insecure_channel(address, _PROBE_OPTIONS)
            else:
                creds = tls_credentials(self._tls.root_cert, self._tls.client_cert)
                channel = grpc.aio.secure_channel(address, creds, _PROBE_OPTIONS)
            self._probes[address] = channel
        # waits (within the timeout) for a channel that is reconnecting: a member back at its
        # address is alive at the next probe, not after gRPC's backoff. So a killed member
        # (its port refuses connections) would cost the whole timeout: a plain connect
        # beside it says so at once (the ``Cluster`` call a client asks while following a
        # queue that moved would otherwise wait a second for its dead owner)
        check = asyncio.ensure_future(
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout, wait_for_ready=True
            )
        )
        check.add_done_callback(_retrieved)
        try:
            if await refuses(address, timeout):
                return False
            await check
        except grpc.RpcError:
            return False
        finally:
            check.cancel()
        return True

    def _client(self, address: str) -> AsyncQueueClient:
        client = self._clients.get(address)
        if client is None:
            # the asyncio client loads with the first peer asked: a coordinator alone never is
            from layer.client.aio import AsyncQueueClient

            # no reconnect loop: the owner may be gone, the caller gets that at once
            tls = self._tls
            client = self._clients[address] = AsyncQueueClient(
                address,
                self._token,
                None if tls is None else tls.root_cert,
                reconnect=False,
                client_name="qlayer-peer",
                tls_client_cert=None if tls is None else tls.client_cert,
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

    async def dead_letters(
        self, address: str, queue: str, filter: str | None, limit: int | None
    ) -> list[DeadLetter]:
        return await self._client(address).dead_letters(queue, filter, limit)

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
